// split-column-sum: IR-text tests. Expectations follow from the pass's contract (passes/SplitColumnSum.h):
// which sums it splits, into which shapes, and that the last node keeps the original's name.
#include <gtest/gtest.h>

#include <string>

#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

// A Linear's backward on CUDA as AOTAutograd traces it: the bias gradient is a column sum of the output
// gradient, [2048, 2048] bf16.
TEST(split_column_sum, a_bias_gradient_becomes_one_column_sum_of_float_partial_sums) {
  file_check(R"(
// RUN: split-column-sum
graph backward_1 {
  %g: bf16[2048, 2048]@cuda:0 = placeholder
  %sum_2: bf16[1, 2048]@cuda:0 = aten::sum.dim_IntList(%g, [0], true)
  %view_14: bf16[2048]@cuda:0 = aten::view.default(%sum_2, [2048]) !view
  return (%view_14,)
}
// CHECK: %sum_2: bf16[1, 2048]@cuda:0 = hintbackend::column_sum.default(%g, 1, true, 32, dtype.bfloat16)
// CHECK-NEXT: %view_14: bf16[2048]@cuda:0 = aten::view.default(%sum_2, [2048]) !view
// CHECK: // note: split-column-sum graph backward_1: %sum_2 over 2048 rows of 2048 as 32 partial sums of 64 rows
)");
}

// Two leading dims of a [4, 1024, 768] float32 gradient (a bias read through a 3-d input), no keepdim:
// 4096 rows, r 32 (128 rows each); float32 needs no cast.
TEST(split_column_sum, leading_dims_of_a_float_tensor) {
  file_check(R"(
// RUN: split-column-sum
graph g {
  %g: f32[4, 1024, 768]@cuda:0 = placeholder
  %s: f32[768]@cuda:0 = aten::sum.dim_IntList(%g, [1, 0])
  return (%s,)
}
// CHECK: %s: f32[768]@cuda:0 = hintbackend::column_sum.default(%g, 2, false, 32, dtype.float32)
// CHECK-NEXT: return (%s,)
)");
}

// keepdim over two leading dims: the partial sums keep a 1 for the second one.
TEST(split_column_sum, keepdim_over_two_dims) {
  file_check(R"(
// RUN: split-column-sum
graph g {
  %g: f16[8, 512, 256]@cuda:0 = placeholder
  %s: f16[1, 1, 256]@cuda:0 = aten::sum.dim_IntList(%g, [0, 1], true)
  return (%s,)
}
// CHECK: %s: f16[1, 1, 256]@cuda:0 = hintbackend::column_sum.default(%g, 2, true, 32, dtype.float16)
)");
}

// The rows: r is the smallest of 32 .. 256 dividing N with at most 1024 rows per partial sum.
TEST(split_column_sum, picks_the_smallest_split_with_short_partial_sums) {
  file_check(R"(
// RUN: split-column-sum
graph g {
  %g: bf16[65536, 256]@cuda:0 = placeholder
  %s: bf16[256]@cuda:0 = aten::sum.dim_IntList(%g, [0])
  return (%s,)
}
// CHECK: %s: bf16[256]@cuda:0 = hintbackend::column_sum.default(%g, 1, false, 64, dtype.bfloat16)
)");
}

// What it leaves alone: the CPU, too few rows or outputs, no split that divides the rows, a trailing dim
// reduced, a non-contiguous input, a reduction over every dim.
TEST(split_column_sum, leaves_other_sums_alone) {
  for (const std::string& sum :
       {std::string("%g: bf16[2048, 2048] = placeholder\n  %s: bf16[2048] = aten::sum.dim_IntList(%g, [0])"),
        std::string("%g: bf16[256, 2048]@cuda:0 = placeholder\n  %s: bf16[2048]@cuda:0 = aten::sum.dim_IntList(%g, [0])"),
        std::string("%g: bf16[4096, 64]@cuda:0 = placeholder\n  %s: bf16[64]@cuda:0 = aten::sum.dim_IntList(%g, [0])"),
        std::string("%g: bf16[1000, 512]@cuda:0 = placeholder\n  %s: bf16[512]@cuda:0 = aten::sum.dim_IntList(%g, [0])"),
        std::string("%g: bf16[2048, 2048]@cuda:0 = placeholder\n  %s: bf16[2048]@cuda:0 = aten::sum.dim_IntList(%g, [1])"),
        std::string("%g: bf16[2048, 2048][1, 2048]@cuda:0 = placeholder\n  %s: bf16[2048]@cuda:0 = "
                    "aten::sum.dim_IntList(%g, [0])"),
        std::string("%g: bf16[2048, 2048]@cuda:0 = placeholder\n  %s: bf16[]@cuda:0 = aten::sum.dim_IntList(%g, [0, 1])"),
        std::string("%g: bf16[8, 2048, 512]@cuda:0 = placeholder\n  %s: bf16[2048]@cuda:0 = "
                    "aten::sum.dim_IntList(%g, [0, 2])")}) {
    file_check("// RUN: split-column-sum\ngraph g {\n  " + sum + "\n  return (%s,)\n}\n"
               "// CHECK-NOT: column_sum\n// CHECK-NOT: split-column-sum graph\n");
  }
}

}  // namespace
}  // namespace hb

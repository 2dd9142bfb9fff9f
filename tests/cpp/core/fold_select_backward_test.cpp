// fold-select-backward: IR-text tests (unbind's gradient as AOTAutograd traces it: select_backward per
// slice, then adds). Expectations follow from the pass's contract (passes/FoldSelectBackward.h) and from
// byte counts.
#include <gtest/gtest.h>

#include <string>

#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

// q, k, v = qkv.unbind(0) of a [3, 4, 8, 16] float32 qkv: three [4, 8, 16] gradients (2 KiB each), three
// [3, 4, 8, 16] zero-filled select_backward results (6 KiB each), summed in FX's order.
const char* kUnbind = R"(
graph backward_1 {
  %gq: f32[4, 8, 16] = placeholder
  %gk: f32[4, 8, 16] = placeholder
  %gv: f32[4, 8, 16] = placeholder
  %sb: f32[3, 4, 8, 16] = aten::select_backward.default(%gv, [3, 4, 8, 16], 0, 2)
  %sb_1: f32[3, 4, 8, 16] = aten::select_backward.default(%gk, [3, 4, 8, 16], 0, 1)
  %add: f32[3, 4, 8, 16] = aten::add.Tensor(%sb, %sb_1)
  %sb_2: f32[3, 4, 8, 16] = aten::select_backward.default(%gq, [3, 4, 8, 16], 0, 0)
  %add_1: f32[3, 4, 8, 16] = aten::add.Tensor(%add, %sb_2)
  %r: f32[4, 8, 3, 16][16, 48, 512, 1] = aten::permute.default(%add_1, [1, 2, 0, 3]) !view
  %c: f32[4, 8, 3, 16] = aten::clone.default(%r, memory_format=memory_format.contiguous_format)
  return (%c,)
}
)";

TEST(fold_select_backward, unbinds_gradient_becomes_one_stack) {
  file_check(std::string("// RUN: fold-select-backward\n") + kUnbind + R"(
// CHECK: %gv: f32[4, 8, 16] = placeholder
// CHECK-NOT: select_backward
// CHECK-NEXT: %add_1: f32[3, 4, 8, 16] = aten::stack.default([%gq, %gk, %gv], 0)
// CHECK-NEXT: %r: f32[4, 8, 3, 16][16, 48, 512, 1] = aten::permute.default(%add_1, [1, 2, 0, 3]) !view
// CHECK: // note: fold-select-backward graph backward_1: %add_1 = stack of 3 select_backward gradients (dim 0), 4 nodes removed
)");
}

TEST(fold_select_backward, the_plan_holds_one_result_not_three_zero_tensors) {
  // Traced: at least two of the 6 KiB select_backward results and sums are alive at once (the planner adds
  // in place): a 12 KiB arena; the call's peak adds the gradients (6 KiB) and the clone (6 KiB). Folded:
  // the stack alone (6 KiB) in the arena, 18 KiB in all.
  file_check(std::string("// RUN: memory-plan\n") + kUnbind + R"(
// CHECK: live peak 12288,
// CHECK: simulated call peak 24576 bytes
)");
  file_check(std::string("// RUN: fold-select-backward,memory-plan\n") + kUnbind + R"(
// CHECK: live peak 6144,
// CHECK: simulated call peak 18432 bytes
)");
}

TEST(fold_select_backward, negative_dim_and_index_count_from_the_end) {
  file_check(R"(
// RUN: fold-select-backward
graph g {
  %a: f32[5, 4] = placeholder
  %b: f32[5, 4] = placeholder
  %sa: f32[5, 4, 2] = aten::select_backward.default(%a, [5, 4, 2], -1, -2)
  %sb: f32[5, 4, 2] = aten::select_backward.default(%b, [5, 4, 2], 2, 1)
  %s: f32[5, 4, 2] = aten::add.Tensor(%sb, %sa)
  return (%s,)
}
// CHECK: %s: f32[5, 4, 2] = aten::stack.default([%a, %b], 2)
)");
}

// Two [4] gradients put into slices `ia` and `ib` of a [n, 4] zero tensor and summed (`add_kwargs` after
// the sum's two operands); `extra` is returned beside the sum. The pass must leave it alone: the sum is
// checked unchanged.
void check_left_alone(int n, int ia, int ib, const std::string& add_kwargs = "", const std::string& extra = "") {
  const std::string t = "f32[" + std::to_string(n) + ", 4]", sizes = "[" + std::to_string(n) + ", 4]";
  const std::string add = "aten::add.Tensor(%sa, %sb" + add_kwargs + ")";
  file_check("// RUN: fold-select-backward\ngraph g {\n"
             "  %a: f32[4] = placeholder\n  %b: f32[4] = placeholder\n"
             "  %sa: " + t + " = aten::select_backward.default(%a, " + sizes + ", 0, " + std::to_string(ia) + ")\n"
             "  %sb: " + t + " = aten::select_backward.default(%b, " + sizes + ", 0, " + std::to_string(ib) + ")\n"
             "  %s: " + t + " = " + add + "\n"
             "  return (%s" + extra + ")\n}\n"
             "// CHECK: %s: " + t + " = " + add + "\n// CHECK-NOT: stack\n");
}

TEST(fold_select_backward, leaves_partial_repeated_shared_and_scaled_sums_alone) {
  check_left_alone(3, 0, 2);                // index 1 of 3 missing: the sum has zeros there, not a stack
  check_left_alone(2, 0, 0);                // index 0 twice: the two slices add up
  check_left_alone(2, 0, 1, "", ", %sa");   // a select_backward that something else reads too stays
  check_left_alone(2, 0, 1, ", alpha=2");   // alpha 2 scales one slice
}

}  // namespace
}  // namespace hb

// KernelKind::View's selection rule (codegen/KernelSelect.h: view_why_not) and the storage offsets it
// computes (view_offset): which view ops the runtime makes without the dispatcher, on IR text as
// AOTAutograd traces them. The aliases themselves are made by backend/runtime/ViewCall.cpp
// (tests/cpp/runtime/executor_test.cpp runs them).
#include <gtest/gtest.h>

#include <string>

#include "backend/ir/Parser.h"
#include "codegen/KernelSelect.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::check_lines;

std::string plan_of(const std::string& text) {
  auto g = parse_graph(text);
  return print_kernel_plan(*g, select_kernels(*g));
}

TEST(view_kernel, views_read_inside_the_graph_skip_the_dispatcher_and_returned_ones_do_not) {
  // A Linear's backward as the corpus CNN's: t and view feed mm, detach feeds threshold_backward; the bias
  // gradient's view is returned, and so is the view of a view (a chain the caller rebuilds from its base).
  const std::string plan = plan_of(R"(
graph backward_1 {
  %x: bf16[8, 64, 15, 15] = placeholder
  %w: bf16[10, 14400] = placeholder
  %g: bf16[8, 10] = placeholder
  %mm: bf16[8, 14400] = aten::mm.default(%g, %w)
  %t: bf16[10, 8][1, 10] = aten::t.default(%g) !view
  %v: bf16[8, 14400] = aten::view.default(%x, [8, 14400]) !view
  %mm_1: bf16[10, 14400] = aten::mm.default(%t, %v)
  %s: bf16[1, 10] = aten::sum.dim_IntList(%g, [0], true)
  %v1: bf16[10] = aten::view.default(%s, [10]) !view
  %d1: bf16[8, 64, 15, 15] = aten::detach.default(%x) !view
  %d2: bf16[8, 64, 15, 15] = aten::detach.default(%d1) !view
  %v2: bf16[8, 64, 15, 15] = aten::view.default(%mm, [8, 64, 15, 15]) !view
  %tb: bf16[8, 64, 15, 15] = aten::threshold_backward.default(%v2, %d2, 0)
  %p: bf16[64, 8, 15, 15][225, 14400, 15, 1] = aten::permute.default(%tb, [1, 0, 2, 3]) !view
  %u: bf16[64, 8, 15, 15, 1][225, 14400, 15, 1, 1] = aten::unsqueeze.default(%p, 4) !view
  %uv: bf16[80, 1440] = aten::_unsafe_view.default(%mm_1, [80, 1440])
  %r: bf16[80, 1440] = aten::relu.default(%uv)
  %uv2: bf16[10, 8, 1800] = aten::_unsafe_view.default(%r, [10, 8, 1800])
  return (%mm_1, %v1, %u, %uv2)
}
)");
  check_lines(plan, {"%mm: aten-dispatch aten::mm.default", "%t: view aten::t.default", "%v: view aten::view.default",
                     "%v1: aten-dispatch aten::view.default", "%d1: view aten::detach.default",
                     "%d2: view aten::detach.default", "%v2: view aten::view.default",
                     "%p: aten-dispatch aten::permute.default", "%u: aten-dispatch aten::unsqueeze.default",
                     "%uv: view aten::_unsafe_view.default", "%uv2: aten-dispatch aten::_unsafe_view.default"});
}

TEST(view_kernel, slices_and_selects_at_constant_positions_add_their_offset) {
  auto g = parse_graph(R"(
graph g {
  %x: f32[4, 6] = placeholder
  %pos: symint(s0) = placeholder
  %a: f32[4, 3][6, 1] = aten::slice.Tensor(%x, 1, 2, 5) !view
  %b: f32[6] = aten::select.int(%x, 0, -1) !view
  %c: f32[2, 6] = aten::slice.Tensor(%x, 0, -2, 9223372036854775807) !view
  %d: f32[6] = aten::select.int(%x, 0, 4) !view
  %e: f32[2, 2][1, 3] = aten::as_strided.default(%x, [2, 2], [1, 3], 5) !view
  %f: f32[4, 6] = aten::slice.Tensor(%x) !view
  %h: f32[1, 6] = aten::slice.Tensor(%x, 0, %pos, 4) !view
  %y: f32[4, 3] = aten::mul.Tensor(%a, 2)
  %z: f32[6] = aten::add.Tensor(%b, %d)
  %w: f32[2, 6] = aten::mul.Tensor(%c, %f)
  %q: f32[2, 2] = aten::mul.Tensor(%e, 2)
  %r: f32[1, 6] = aten::mul.Tensor(%h, 2)
  return (%y, %z, %w, %q, %r)
}
)");
  auto offset = [&](const char* name, int64_t* absolute) { return view_offset(*g, g->nodes[g->find(name)], absolute); };
  int64_t absolute = -1;
  EXPECT_EQ(offset("a", &absolute), 2);
  EXPECT_EQ(offset("b", &absolute), 18);  // row -1 of 4, stride 6
  EXPECT_EQ(offset("c", &absolute), 12);
  EXPECT_EQ(offset("f", &absolute), 0);
  EXPECT_EQ(absolute, -1);
  EXPECT_EQ(offset("e", &absolute), std::nullopt);
  EXPECT_EQ(absolute, 5);
  EXPECT_EQ(view_why_not(*g, g->find("a")), "");
  EXPECT_EQ(view_why_not(*g, g->find("e")), "");
  // Row 4 of 4 is out of range: the node's own op raises ATen's error.
  EXPECT_EQ(view_why_not(*g, g->find("d")), "a position that is not a constant inside its dimension");
  EXPECT_EQ(view_why_not(*g, g->find("h")), "a position that is not a constant inside its dimension");
  EXPECT_EQ(view_why_not(*g, g->find("y")), "not a view op");
}

TEST(view_kernel, symbolic_layouts_and_other_dtypes_keep_the_dispatcher) {
  auto g = parse_graph(R"(
graph g {
  %n: symint(s0) = placeholder
  %x: f32[s0, 6] = placeholder
  %y: f32[4, 6] = placeholder
  %v: f32[6, s0][1, 6] = aten::t.default(%x) !view
  %t: f32[6, 4][1, 6] = aten::t.default(%y) !view
  %m: f32[6, s0] = aten::mul.Tensor(%v, 2)
  %k: f32[6, 4] = aten::mul.Tensor(%t, 2)
  return (%m, %k)
}
)");
  EXPECT_EQ(view_why_not(*g, g->find("v")), "symbolic sizes or strides");
  EXPECT_EQ(view_why_not(*g, g->find("t")), "");
}

}  // namespace
}  // namespace hb

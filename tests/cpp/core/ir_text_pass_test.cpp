// Pass tests written as IR text in, CHECK lines out (test::file_check, IrTestUtil.h). Each expectation
// follows from the pass's documented contract (its header), so a failing test reads like a dump of what
// the pass did instead of what it promises.
#include <gtest/gtest.h>

#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

TEST(ir_text, dead_code_elimination_keeps_effects_and_outputs) {
  // Unused values without effects go; a random draw and a mutation stay even when nobody reads them.
  file_check(R"(
// RUN: dead-code-elimination
graph g {
  %x: f32[4, 8] = placeholder
  %unused: f32[4, 8] = aten::relu.default(%x)
  %drop: f32[4, 8] = aten::bernoulli.p(%x, 0.5) !random
  %fill: f32[4, 8] = aten::fill_.Scalar(%x, 1.0) !mutates
  %y: f32[4, 8] = aten::exp.default(%x)
  return (%y,)
}
// CHECK: graph g {
// CHECK-NEXT: %x: f32[4, 8] = placeholder
// CHECK-NOT: %unused
// CHECK-NEXT: %drop: f32[4, 8] = aten::bernoulli.p(%x, 0.5) !random
// CHECK-NEXT: %fill: f32[4, 8] = aten::fill_.Scalar(%x, 1.0) !mutates
// CHECK-NEXT: %y: f32[4, 8] = aten::exp.default(%x)
// CHECK-NEXT: return (%y,)
)");
}

TEST(ir_text, fold_softmax_upcast_on_cuda_half_only) {
  // f16 on CUDA: the softmax reads the half input with half_to_float, the upcast goes. bf16 and CPU stay.
  file_check(R"(
// RUN: fold-softmax-upcast
graph g {
  %s: f16[2, 16]@cuda:0 = placeholder
  %up: f32[2, 16]@cuda:0 = aten::_to_copy.default(%s, dtype=dtype.float32)
  %p: f32[2, 16]@cuda:0 = aten::_softmax.default(%up, -1, false)
  %b: bf16[2, 16]@cuda:0 = placeholder
  %bup: f32[2, 16]@cuda:0 = aten::_to_copy.default(%b, dtype=dtype.float32)
  %q: f32[2, 16]@cuda:0 = aten::_softmax.default(%bup, -1, false)
  return (%p, %q)
}
// CHECK: %s: f16[2, 16]@cuda:0 = placeholder
// CHECK-NOT: %up:
// CHECK: %p: f32[2, 16]@cuda:0 = aten::_softmax.default(%s, -1, true)
// CHECK: %bup: f32[2, 16]@cuda:0 = aten::_to_copy.default(%b, dtype=dtype.float32)
// CHECK-NEXT: %q: f32[2, 16]@cuda:0 = aten::_softmax.default(%bup, -1, false)
// CHECK: // note: fold-softmax-upcast graph g: %p reads %s (float16) directly, %up removed
)");
}

TEST(ir_text, hint_propagation_marks_a_hinted_tuple_s_getitems) {
  // A getitem of a hinted multi-output node inherits its hints, so a region's results are all marked.
  file_check(R"(
// RUN: hint-propagation
graph g {
  %x: f32[4, 8] = placeholder
  %mx: (f32[4, 1], i64[4, 1]) = aten::max.dim(%x, 1, true)  {region=2 path=2 schedule=bfs}
  %v: f32[4, 1] = operator::getitem(%mx, 0)
  return (%v,)
}
// CHECK: %v: f32[4, 1] = operator::getitem(%mx, 0)  {region=2 path=2 schedule=bfs}
)");
}

TEST(ir_text, pointwise_fusion_groups_a_chain_under_its_root) {
  // exp -> mul -> relu with one user each: one fused node named after the root, whose body holds the
  // chain; the matmul before it is not elementwise and stays.
  file_check(R"(
// RUN: pointwise-fusion
graph g {
  %a: f32[8, 16] = placeholder
  %w: f32[16, 16] = placeholder
  %mm: f32[8, 16] = aten::mm.default(%a, %w)
  %e: f32[8, 16] = aten::exp.default(%mm)
  %m: f32[8, 16] = aten::mul.Tensor(%e, 2.0)
  %r: f32[8, 16] = aten::relu.default(%m)
  return (%r,)
}
// CHECK: %mm: f32[8, 16] = aten::mm.default(%a, %w)
// CHECK-NEXT: %r: f32[8, 16] = hintbackend::fused_pointwise(@fused_r, [%mm])
// CHECK-NOT: aten::exp.default(%mm)
// CHECK: graph fused_r {
// CHECK: aten::exp.default
// CHECK: aten::mul.Tensor
// CHECK: aten::relu.default
)");
}

TEST(ir_text, slice_schedule_turns_a_dfs_region_into_one_loop) {
  // A dfs region over [B=2, H=4, ...] with slices=4: one slice_loop over batch x heads (extent 8), the
  // body on per-slice shapes, the result read back through a getitem that keeps its name.
  file_check(R"(
// RUN: slice-legality,slice-schedule
graph g {
  %x: f32[2, 4, 8, 16] = placeholder
  %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 schedule=dfs slices=4}
  %s: f32[2, 4, 8, 16] = aten::mul.Tensor(%e, 2.0)  {region=0 path=0 schedule=dfs slices=4}
  return (%s,)
}
// CHECK: hintbackend::slice_loop(@slice_body_0, [%x], in_dims=[0], in_ndims=[2], slices=4, extent=8
// CHECK: %s: f32[2, 4, 8, 16] = operator::getitem(%slice_loop_0, 0)
// CHECK: graph slice_body_0 {
// CHECK: %e: f32[1, 2, 8, 16] = aten::exp.default(%x)
// CHECK: // note: slice-schedule region 0: dfs with slices=4 of extent 8 (slices hint)
)");
}

TEST(ir_text, memory_plan_reuses_a_dying_input_in_place) {
  // exp's result dies at neg, which is elementwise of the same shape: neg writes over it in place;
  // the returned value is never planned.
  file_check(R"(
// RUN: memory-plan
graph g {
  %x: f32[64, 64] = placeholder
  %e: f32[64, 64] = aten::exp.default(%x)
  %n: f32[64, 64] = aten::neg.default(%e)
  %t: f32[64, 64] = aten::tanh.default(%n)
  return (%t,)
}
// CHECK: // note: memory-plan graph g: arena 16384 bytes
// CHECK-NEXT: // note:   %e: offset 0 size 16384 live [1, 3] then %n in place
// CHECK: unplanned: %x (input), %t (output)
)");
}

TEST(ir_text, memory_plan_target_and_arena_setting_are_inputs) {
  // The same graph with the arena off: nothing is placed, each value says why.
  PassContext ctx;
  ctx.memory.arena = false;
  file_check(R"(
// RUN: memory-plan
graph g {
  %x: f32[64, 64] = placeholder
  %e: f32[64, 64] = aten::exp.default(%x)
  %t: f32[64, 64] = aten::tanh.default(%e)
  return (%t,)
}
// CHECK: arena 0 bytes
// CHECK-NOT: offset
// CHECK: %e (arena off)
)", ctx);
}

TEST(ir_text, memory_schedule_runs_a_consumer_before_a_big_allocation) {
  // Two independent chains of 4 MiB values: in the original order %a and %b are alive together (x, a, b:
  // 12 MiB); running %a's reader first frees it before %b exists (8 MiB), a gain far above the pass's
  // 1/64 threshold, so the pass must take it and say so.
  file_check(R"(
// RUN: memory-schedule
graph g {
  %x: f32[1024, 1024] = placeholder
  %a: f32[1024, 1024] = aten::exp.default(%x)
  %b: f32[1024, 1024] = aten::sin.default(%x)
  %sa: f32[] = aten::sum.default(%a)
  %sb: f32[] = aten::sum.default(%b)
  return (%sa, %sb)
}
// CHECK: %a: f32[1024, 1024] = aten::exp.default(%x)
// CHECK-NEXT: %sa: f32[] = aten::sum.default(%a)
// CHECK-NEXT: %b: f32[1024, 1024] = aten::sin.default(%x)
// CHECK-NEXT: %sb: f32[] = aten::sum.default(%b)
// CHECK: // note: memory-schedule graph g:
)");
}

}  // namespace
}  // namespace hb

// Pass tests written as IR text in, CHECK lines out (test::file_check, IrTestUtil.h). Each expectation
// follows from the pass's documented contract (its header), so a failing test reads like a dump of what
// the pass did instead of what it promises.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>

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

TEST(ir_text, dead_code_elimination_removes_a_dead_chain_whole) {
  // Once %b goes, %a and the constant it reads have no users either: the whole chain goes in one run.
  // An unread placeholder stays (it is the calling convention).
  file_check(R"(
// RUN: dead-code-elimination
graph g {
  %x: f32[8] = placeholder
  %unread: f32[8] = placeholder
  %c: f32[8] = get_attr _tensor_constant0 constant#0
  %a: f32[8] = aten::add.Tensor(%x, %c)
  %b: f32[8] = aten::relu.default(%a)
  %y: f32[8] = aten::exp.default(%x)
  return (%y,)
}
// CHECK: %x: f32[8] = placeholder
// CHECK-NEXT: %unread: f32[8] = placeholder
// CHECK-NEXT: %y: f32[8] = aten::exp.default(%x)
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

TEST(ir_text, pointwise_fusion_leaves_a_value_read_outside_the_chain) {
  // %e is returned as well as read by %m: a producer joins only when all its users are in the group,
  // so the group is %m -> %r with %e as its input, and %e is computed once, outside.
  file_check(R"(
// RUN: pointwise-fusion
graph g {
  %a: f32[8, 16] = placeholder
  %e: f32[8, 16] = aten::exp.default(%a)
  %m: f32[8, 16] = aten::mul.Tensor(%e, 2.0)
  %r: f32[8, 16] = aten::relu.default(%m)
  return (%r, %e)
}
// CHECK: %e: f32[8, 16] = aten::exp.default(%a)
// CHECK-NEXT: %r: f32[8, 16] = hintbackend::fused_pointwise(@fused_r, [%e])
// CHECK-NEXT: return (%r, %e)
// CHECK: graph fused_r {
// CHECK-NEXT: %e: f32[8, 16] = placeholder
// CHECK-NEXT: %m: f32[8, 16] = aten::mul.Tensor(%e, 2.0)
// CHECK-NEXT: %r: f32[8, 16] = aten::relu.default(%m)
// CHECK-NEXT: return %r
)");
}

TEST(ir_text, row_softmax_fusion_makes_the_attention_chain_one_row_kernel) {
  // x * c -> .to(float32) -> _softmax(-1) -> .to(bf16): one row_softmax(x, c, bf16) named after the
  // downcast, so its readers see the same value; the chain's four ops are gone.
  file_check(R"(
// RUN: row-softmax-fusion
graph g {
  %s: bf16[2, 4, 16, 16] = placeholder
  %mul: bf16[2, 4, 16, 16] = aten::mul.Tensor(%s, 0.25)
  %up: f32[2, 4, 16, 16] = aten::_to_copy.default(%mul, dtype=dtype.float32)
  %p: f32[2, 4, 16, 16] = aten::_softmax.default(%up, -1, false)
  %down: bf16[2, 4, 16, 16] = aten::_to_copy.default(%p, dtype=dtype.bfloat16)
  return (%down,)
}
// CHECK: %s: bf16[2, 4, 16, 16] = placeholder
// CHECK-NEXT: %down: bf16[2, 4, 16, 16] = hintbackend::row_softmax.default(%s, 0.25, dtype.bfloat16)
// CHECK-NEXT: return (%down,)
// CHECK: // note: row-softmax-fusion graph g: %down = row_softmax(%s) from %mul %up %p %down
)");
}

TEST(ir_text, row_softmax_fusion_keeps_what_others_read) {
  // A mul read elsewhere does not join (the kernel reads its result); a float32 softmax read elsewhere
  // makes the kernel row_softmax2, which returns it too, read back by getitems with the old names.
  file_check(R"(
// RUN: row-softmax-fusion
graph g {
  %s: bf16[2, 4, 16, 16] = placeholder
  %mul: bf16[2, 4, 16, 16] = aten::mul.Tensor(%s, 0.25)
  %up: f32[2, 4, 16, 16] = aten::_to_copy.default(%mul, dtype=dtype.float32)
  %p: f32[2, 4, 16, 16] = aten::_softmax.default(%up, -1, false)
  %down: bf16[2, 4, 16, 16] = aten::_to_copy.default(%p, dtype=dtype.bfloat16)
  return (%down, %mul)
}
// CHECK: %mul: bf16[2, 4, 16, 16] = aten::mul.Tensor(%s, 0.25)
// CHECK-NEXT: %down: bf16[2, 4, 16, 16] = hintbackend::row_softmax.default(%mul,
// CHECK-NOT: aten::_softmax
// CHECK: // note: row-softmax-fusion graph g: %down = row_softmax(%mul) from %up %p %down
)");
  file_check(R"(
// RUN: row-softmax-fusion
graph g {
  %s: bf16[2, 4, 16, 16] = placeholder
  %mul: bf16[2, 4, 16, 16] = aten::mul.Tensor(%s, 0.25)
  %up: f32[2, 4, 16, 16] = aten::_to_copy.default(%mul, dtype=dtype.float32)
  %p: f32[2, 4, 16, 16] = aten::_softmax.default(%up, -1, false)
  %down: bf16[2, 4, 16, 16] = aten::_to_copy.default(%p, dtype=dtype.bfloat16)
  return (%down, %p)
}
// CHECK: = hintbackend::row_softmax2.default(%s, 0.25)
// CHECK-NEXT: %p: f32[2, 4, 16, 16] = operator::getitem(
// CHECK-NEXT: %down: bf16[2, 4, 16, 16] = operator::getitem(
// CHECK-NEXT: return (%down, %p)
)");
}

TEST(ir_text, slice_legality_ends_at_a_reduction_over_a_sliced_dim) {
  // Sliced along batch x heads (extent 2 * 4 = 8): the sum over the heads ends the sliceable subgraph,
  // so only %e is sliceable and its value leaves it. Every divisor of 8 gives a box of [2, 4]. The pass
  // is an analysis: the IR stays as it is.
  file_check(R"(
// RUN: slice-legality
graph g {
  %x: f32[2, 4, 8, 16] = placeholder
  %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 schedule=dfs}
  %s: f32[2, 8, 16] = aten::sum.dim_IntList(%e, [1])  {region=0 path=0 schedule=dfs}
  %r: f32[2, 8, 16] = aten::relu.default(%s)  {region=0 path=0 schedule=dfs}
  return (%r,)
}
// CHECK: %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 schedule=dfs}
// CHECK-NEXT: %s: f32[2, 8, 16] = aten::sum.dim_IntList(%e, [1])  {region=0 path=0 schedule=dfs}
// CHECK: // note: slice-legality region 0 (schedule=dfs): 1 of 3 nodes sliceable
// CHECK-NEXT: // note:   inputs: %x dims[0:2]
// CHECK-NEXT: // note:   outputs: %e
// CHECK-NEXT: // note:   ends at %s (aten::sum.dim_IntList)
// CHECK-NEXT: // note:   slice counts: 1,2,4,8
)");
}

TEST(ir_text, slice_legality_ends_where_a_node_outside_the_region_reads_a_sliced_value) {
  // %t is outside the region and reads %e: the loop replacing the subgraph must run in one place, so
  // the subgraph stops at %t although %a after it has a rule; %e and %m leave it.
  file_check(R"(
// RUN: slice-legality
graph g {
  %x: f32[2, 4, 8, 16] = placeholder
  %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 schedule=dfs}
  %m: f32[2, 4, 8, 16] = aten::mul.Tensor(%e, 2.0)  {region=0 path=0 schedule=dfs}
  %t: f32[2, 4, 8, 16] = aten::tanh.default(%e)
  %a: f32[2, 4, 8, 16] = aten::add.Tensor(%m, %t)  {region=0 path=0 schedule=dfs}
  return (%a,)
}
// CHECK: // note: slice-legality region 0 (schedule=dfs): 2 of 3 nodes sliceable
// CHECK: // note:   outputs: %e, %m
// CHECK-NEXT: // note:   ends at %t (aten::tanh.default)
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

TEST(ir_text, slice_schedule_loops_over_the_sliceable_part_and_leaves_the_rest) {
  // Plain dfs without a count: one slice per batch x head (slices = extent = 8). The loop holds %e
  // only; the sum over the heads and what follows stay after it, reading %e through the getitem.
  file_check(R"(
// RUN: slice-legality,slice-schedule
graph g {
  %x: f32[2, 4, 8, 16] = placeholder
  %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 schedule=dfs}
  %s: f32[2, 8, 16] = aten::sum.dim_IntList(%e, [1])  {region=0 path=0 schedule=dfs}
  %r: f32[2, 8, 16] = aten::relu.default(%s)  {region=0 path=0 schedule=dfs}
  return (%r,)
}
// CHECK: %slice_loop_0: (f32[2, 4, 8, 16]) = hintbackend::slice_loop(@slice_body_0, [%x], in_dims=[0], in_ndims=[2], slices=8, extent=8,
// CHECK-NEXT: %e: f32[2, 4, 8, 16] = operator::getitem(%slice_loop_0, 0)
// CHECK-NEXT: %s: f32[2, 8, 16] = aten::sum.dim_IntList(%e, [1])
// CHECK-NEXT: %r: f32[2, 8, 16] = aten::relu.default(%s)
// CHECK: graph slice_body_0 {
// CHECK-NEXT: %x: f32[1, 1, 8, 16][512, 128, 16, 1] = placeholder
// CHECK-NEXT: %e: f32[1, 1, 8, 16] = aten::exp.default(%x)
// CHECK-NEXT: return (%e,)
// CHECK-NEXT: }
// CHECK: // note: slice-schedule region 0: dfs with slices=8 of extent 8
)");
}

// A flex backward whose score_mod adds a learned relative bias lb[q - kv + 7, h] (it reads the head
// index, so slice_dims=[0]: along batch only), returning lb's gradient: each slice reads lb whole and
// computes its batch's part of the gradient, so the loop sums it (out_dims -2, the contract in
// backend/ir/SliceLoop.h); the q/k/v gradients are split by slice as usual.
const char* kFlexBackwardWithBufferGrad = R"(
graph g {
  %q: f32[2, 2, 8, 16] = placeholder
  %k: f32[2, 2, 8, 16] = placeholder
  %v: f32[2, 2, 8, 16] = placeholder
  %out: f32[2, 2, 8, 16] = placeholder
  %lse: f32[2, 2, 8] = placeholder
  %dout: f32[2, 2, 8, 16] = placeholder
  %lb: f32[15, 2] = placeholder
  %kvn: i32[1, 1, 1] = placeholder
  %kvi: i32[1, 1, 1, 1] = placeholder
  %fb: (f32[2, 2, 8, 16], f32[2, 2, 8, 16], f32[2, 2, 8, 16], (f32[15, 2])) = higher_order::flex_attention_backward(%q, %k, %v, %out, %lse, %dout, none, @fw0, @joint0, (8, 8, %kvn, %kvi, none, none, none, none, none, none, 128, 128, @mask0), 0.25, {}, (%lb,), ())  {region=0 path=0 schedule=dfs slice_dims=[0]}
  %dq: f32[2, 2, 8, 16] = operator::getitem(%fb, 0)  {region=0 path=0 schedule=dfs slice_dims=[0]}
  %grads: (f32[15, 2]) = operator::getitem(%fb, 3)  {region=0 path=0 schedule=dfs slice_dims=[0]}
  %dlb: f32[15, 2] = operator::getitem(%grads, 0)  {region=0 path=0 schedule=dfs slice_dims=[0]}
  TAIL
}
graph fw0 {
  %s: f32[] = placeholder
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %lb: f32[15, 2] = placeholder
  %sub: i32[] = aten::sub.Tensor(%qi, %ki)
  %add: i32[] = aten::add.Tensor(%sub, 7)
  %index: f32[] = aten::index.Tensor(%lb, [%add, %h])
  %add_1: f32[] = aten::add.Tensor(%s, %index)
  return %add_1
}
graph joint0 {
  %s: f32[] = placeholder
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %g: f32[] = placeholder
  %lb: f32[15, 2] = placeholder
  %sub: i32[] = aten::sub.Tensor(%qi, %ki)
  %add: i32[] = aten::add.Tensor(%sub, 7)
  %scatter: f32[15, 2] = flex_lib::zeros_and_scatter.default([15, 2], [%add, %h], %g)
  return [%g, none, none, none, none, %scatter]
}
graph mask0 {
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %ge: b8[] = aten::ge.Tensor(%qi, %ki)
  return (%ge,)
}
)";

std::string with_tail(const std::string& checks, const std::string& tail) {
  std::string test = std::string("// RUN: slice-legality,slice-schedule") + kFlexBackwardWithBufferGrad + checks;
  test.replace(test.find("TAIL"), 4, tail);
  return test;
}

TEST(ir_text, slice_schedule_sums_a_captured_buffer_gradient_over_the_slices) {
  file_check(with_tail(R"(
// CHECK: %slice_loop_0: (f32[2, 2, 8, 16], f32[15, 2]) = hintbackend::slice_loop(@slice_body_0, [%q, %k, %v, %out, %lse, %dout, %lb, %kvn, %kvi], in_dims=[0, 0, 0, 0, 0, 0, -1, -1, -1], in_ndims=[1, 1, 1, 1, 1, 1, 0, 0, 0], slices=2, extent=2, out_dims=[0, -2], out_ndims=[1, 0])
// CHECK-NEXT: %dq: f32[2, 2, 8, 16] = operator::getitem(%slice_loop_0, 0)
// CHECK-NEXT: %dlb: f32[15, 2] = operator::getitem(%slice_loop_0, 1)
// CHECK: graph slice_body_0 {
// CHECK: %fb: (f32[1, 2, 8, 16], f32[1, 2, 8, 16], f32[1, 2, 8, 16], (f32[15, 2])) = higher_order::flex_attention_backward(
// CHECK: %dlb: f32[15, 2] = operator::getitem(%grads, 0)
// CHECK: // note:   outputs: %dq, %dlb (summed)
// CHECK-NEXT: // note:   the whole region is sliceable
)", "return (%dq, %dlb)"));
}

TEST(ir_text, slice_legality_ends_where_a_summed_gradient_is_read_inside_the_loop) {
  // %scaled reads the summed gradient inside the region: only the sum of all slices' parts is lb's
  // gradient, so the sliceable part ends before it and %dlb leaves the loop summed.
  file_check(with_tail(R"(
// CHECK: out_dims=[0, -2]
// CHECK: %scaled: f32[15, 2] = aten::mul.Tensor(%dlb, 2.0)
// CHECK: // note:   outputs: %dq, %dlb (summed)
// CHECK-NEXT: // note:   ends at %scaled (aten::mul.Tensor) in graph 'g': reads %dlb, a gradient summed over the slices, complete only after the loop
)", "%scaled: f32[15, 2] = aten::mul.Tensor(%dlb, 2.0)  {region=0 path=0 schedule=dfs slice_dims=[0]}\n  return (%dq, %scaled)"));
}

TEST(ir_text, slice_schedule_gives_a_head_reading_score_mod_the_global_head_index) {
  // Along batch and heads (slice_dims=[0,1]): inside a slice, h is the slice's local head. The loop gets
  // an index table [B, H] holding each element's head, sliced like q; the body's score_mod and joint
  // read lb[..., table[b, h]] (copies named *_global), take the table as one more buffer, and the joint
  // returns one more (empty) gradient.
  std::string test = with_tail(R"(
// CHECK: %slice_head_index: i32[2] = aten::arange.default(2, dtype=
// CHECK-NEXT: %slice_head_index_view: i32[1, 2] = aten::view.default(%slice_head_index, [1, 2]) !view
// CHECK-NEXT: %slice_head_index_table: i32[2, 2][0, 1] = aten::expand.default(%slice_head_index_view, [2, 2]) !view
// CHECK-NEXT: %slice_loop_0: (f32[2, 2, 8, 16], f32[15, 2]) = hintbackend::slice_loop(@slice_body_0, [%q, %k, %v, %out, %lse, %dout, %lb, %kvn, %kvi, %slice_head_index_table], in_dims=[0, 0, 0, 0, 0, 0, -1, -1, -1, 0], in_ndims=[2, 2, 2, 2, 2, 2, 0, 0, 0, 2], slices=4, extent=4, out_dims=[0, -2], out_ndims=[2, 0])
// CHECK: graph slice_body_0 {
// CHECK: %slice_head_index_table: i32[1, 1][0, 1] = placeholder
// CHECK-NEXT: %fb: (f32[1, 1, 8, 16], f32[1, 1, 8, 16], f32[1, 1, 8, 16], (f32[15, 2], none)) = higher_order::flex_attention_backward(%q, %k, %v, %out, %lse, %dout, none, @fw0_global, @joint0_global, (8, 8, %kvn, %kvi, none, none, none, none, none, none, 128, 128, @mask0), 0.25, {}, (%lb, %slice_head_index_table), ())
// CHECK: %grads: (f32[15, 2], none) = operator::getitem(%fb, 3)
// CHECK: graph slice_body_0/fw0_global {
// CHECK: %lb: f32[15, 2] = placeholder
// CHECK-NEXT: %slice_head_index: i32[1, 1][0, 1] = placeholder
// CHECK-NEXT: %global_h: i32[] = aten::index.Tensor(%slice_head_index, [%b, %h])
// CHECK: %index: f32[] = aten::index.Tensor(%lb, [%add, %global_h])
// CHECK: graph slice_body_0/joint0_global {
// CHECK: %scatter: f32[15, 2] = flex_lib::zeros_and_scatter.default([15, 2], [%add, %global_h], %g)
// CHECK-NEXT: return [%g, none, none, none, none, %scatter, none]
// CHECK: // note:   %fb (higher_order::flex_attention_backward) in graph 'g' reads the head index: each slice reads the global one from an index table
)", "return (%dq, %dlb)");
  for (size_t at; (at = test.find("slice_dims=[0]")) != std::string::npos;) test.replace(at, 14, "slice_dims=[0,1]");
  file_check(test);
}

TEST(ir_text, slice_legality_narrows_the_default_dims_to_batch_for_a_head_reading_score_mod) {
  // No slice_dims hint: the default (batch and heads) would refuse the score_mod's read of h, so the
  // region slices along batch only and the note says why.
  std::string test = with_tail(R"(
// CHECK: slices=2, extent=2, out_dims=[0, -2]
// CHECK: // note: slice-legality region 0 (schedule=dfs): 4 of 4 nodes sliceable along dims [0], extent 2
// CHECK-NEXT: // note:   no slice_dims hint: batch only: @fw0 reads the head index
// CHECK: one slice per batch (batch only: @fw0 reads the head index)
)", "return (%dq, %dlb)");
  for (size_t at; (at = test.find(" slice_dims=[0]")) != std::string::npos;) test.erase(at, 15);
  file_check(test);
}

TEST(ir_text, slice_legality_keeps_the_default_dims_for_a_batch_of_one) {
  // B = 1: narrowing to batch would leave nothing to slice, so the default (batch and heads) stays and
  // the body reads global head indices.
  std::string test = with_tail(R"(
// CHECK: slices=2, extent=2, out_dims=[0, -2]
// CHECK: // note: slice-legality region 0 (schedule=dfs): 4 of 4 nodes sliceable along dims batch,heads, extent 2
// CHECK-NOT: no slice_dims hint
// CHECK: reads the head index: each slice reads the global one from an index table
)", "return (%dq, %dlb)");
  for (size_t at; (at = test.find(" slice_dims=[0]")) != std::string::npos;) test.erase(at, 15);
  for (size_t at; (at = test.find("[2, 2, 8")) != std::string::npos;) test.replace(at, 8, "[1, 2, 8");
  file_check(test);
}

TEST(ir_text, slice_schedule_leaves_bfs_and_single_slice_regions_alone) {
  // bfs is op-major over whole tensors, and 1 slice is BFS: neither writes a loop.
  for (const char* hints : {"schedule=bfs", "schedule=dfs slices=1"}) {
    SCOPED_TRACE(hints);
    std::string test = R"(
// RUN: slice-legality,slice-schedule
graph g {
  %x: f32[2, 4, 8, 16] = placeholder
  %e: f32[2, 4, 8, 16] = aten::exp.default(%x)  {region=0 path=0 HINTS}
  %m: f32[2, 4, 8, 16] = aten::mul.Tensor(%e, 2.0)  {region=0 path=0 HINTS}
  return (%m,)
}
// CHECK: %e: f32[2, 4, 8, 16] = aten::exp.default(%x)
// CHECK-NEXT: %m: f32[2, 4, 8, 16] = aten::mul.Tensor(%e, 2.0)
// CHECK-NOT: slice_loop
// CHECK: left as is
)";
    for (size_t at; (at = test.find("HINTS")) != std::string::npos;) test.replace(at, 5, hints);
    file_check(test);
  }
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
// CHECK: unplanned:
// CHECK-NEXT: // note:     %x (input)
// CHECK-NEXT: // note:     %t (output)
)");
}

TEST(ir_text, memory_plan_writes_in_place_over_an_input_read_through_a_reshape) {
  // A matmul's [2048, 2048]-shaped result read as [4, 512, 2048] by gelu_backward (an MLP's backward): the
  // same elements in the same order, so the gradient takes over the dying product's buffer. A transposed
  // view (another order) and a narrowed one (fewer elements) keep buffers of their own.
  file_check(R"(
// RUN: memory-plan
graph g {
  %a: f32[64, 32] = placeholder
  %b: f32[32, 64] = placeholder
  %x: f32[2, 32, 64] = placeholder
  %mm: f32[64, 64] = aten::mm.default(%a, %b)
  %v: f32[2, 32, 64] = aten::view.default(%mm, [2, 32, 64]) !view
  %gb: f32[2, 32, 64] = aten::gelu_backward.default(%v, %x)
  %s: f32[] = aten::sum.default(%gb)
  return (%s,)
}
// CHECK: // note:   %mm: offset 0 size 16384 live [3, 6] then %gb in place
)");
  for (const std::string view : {"%v: f32[64, 64][1, 64] = aten::t.default(%mm) !view",
                                 "%v: f32[32, 64] = aten::slice.Tensor(%mm, 0, 0, 32) !view"}) {
    const std::string shape = view.find("slice") != std::string::npos ? "f32[32, 64]" : "f32[64, 64]";
    std::string test = R"(
// RUN: memory-plan
graph g {
  %a: f32[64, 32] = placeholder
  %b: f32[32, 64] = placeholder
  %x: SHAPE = placeholder
  %mm: f32[64, 64] = aten::mm.default(%a, %b)
  VIEW
  %gb: SHAPE = aten::gelu_backward.default(%v, %x)
  %s: f32[] = aten::sum.default(%gb)
  return (%s,)
}
// CHECK-NOT: in place
// CHECK: %gb: offset
)";
    for (size_t at; (at = test.find("SHAPE")) != std::string::npos;) test.replace(at, 5, shape);
    test.replace(test.find("VIEW"), 4, view);
    file_check(test);
  }
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

TEST(ir_text, fold_transpose_pairs_in_a_linear_backward) {
  // AOTAutograd's linear backward: mm reads t(t(w)), and the weight's gradient is t(t(mm_1)). Both pairs
  // read as their source, and the four views go.
  file_check(R"(
// RUN: fold-transpose-pairs
graph g {
  %w: f32[16, 8] = placeholder
  %x: f32[4, 8] = placeholder
  %grad: f32[4, 16] = placeholder
  %t_3: f32[8, 16][1, 8] = aten::t.default(%w) !view
  %t_4: f32[16, 8] = aten::t.default(%t_3) !view
  %mm: f32[4, 8] = aten::mm.default(%grad, %t_4)
  %t_5: f32[16, 4][1, 16] = aten::t.default(%grad) !view
  %mm_1: f32[16, 8] = aten::mm.default(%t_5, %x)
  %t_6: f32[8, 16][1, 8] = aten::t.default(%mm_1) !view
  %t_7: f32[16, 8] = aten::t.default(%t_6) !view
  return (%mm, %t_7)
}
// CHECK-NOT: %t_3
// CHECK-NOT: %t_4
// CHECK: %mm: f32[4, 8] = aten::mm.default(%grad, %w)
// CHECK-NEXT: %t_5: f32[16, 4][1, 16] = aten::t.default(%grad) !view
// CHECK-NEXT: %mm_1: f32[16, 8] = aten::mm.default(%t_5, %x)
// CHECK-NEXT: return (%mm, %mm_1)
// CHECK-NEXT: }
// CHECK-NEXT: // note: fold-transpose-pairs graph g: 2 pairs (%t_4 reads %w, %t_7 reads %mm_1)
)");
}

TEST(ir_text, fold_zero_inputs_reads_an_add_of_zeros_as_its_other_operand) {
  // tangents_2 and tangents_3 are passed as zeros: add(tangents_2, grad) of grad's own type reads as grad
  // (returned in its place); the add that broadcasts tangents_3 keeps reading it, and the note says so;
  // tangents_1, not named, is left alone.
  PassContext ctx;
  ctx.zero_inputs = {"tangents_2", "tangents_3"};
  file_check(R"(
// RUN: fold-zero-inputs
graph g {
  %saved: f32[4, 8] = placeholder
  %tangents_1: f32[4, 8] = placeholder
  %tangents_2: f32[4, 8] = placeholder
  %tangents_3: f32[8] = placeholder
  %g: f32[4, 8] = aten::mul.Tensor(%saved, %tangents_1)
  %grad: f32[4, 8] = aten::exp.default(%saved)
  %add: f32[4, 8] = aten::add.Tensor(%tangents_2, %grad)
  %bc: f32[4, 8] = aten::add.Tensor(%grad, %tangents_3)
  return (%g, %add, %bc)
}
// CHECK: %grad: f32[4, 8] = aten::exp.default(%saved)
// CHECK-NEXT: %bc: f32[4, 8] = aten::add.Tensor(%grad, %tangents_3)
// CHECK-NEXT: return (%g, %grad, %bc)
// CHECK: // note: fold-zero-inputs graph g: %tangents_2 is zero: 1 add folded; %tangents_3 is zero: 0 adds folded, still read by %bc (%add reads %grad)
)",
             ctx);
}

TEST(ir_text, fold_zero_inputs_leaves_adds_that_would_return_an_input_or_convert) {
  // add(zero, saved) returned would return the input saved itself; an add of another dtype (type
  // promotion) or with alpha is not x. Without zero inputs the pass does nothing and says nothing.
  PassContext ctx;
  ctx.zero_inputs = {"tangents_1"};
  file_check(R"(
// RUN: fold-zero-inputs
graph g {
  %saved: f32[4, 8] = placeholder
  %half: f16[4, 8] = placeholder
  %tangents_1: f32[4, 8] = placeholder
  %a: f32[4, 8] = aten::add.Tensor(%tangents_1, %saved)
  %b: f32[4, 8] = aten::add.Tensor(%tangents_1, %half)
  %c: f32[4, 8] = aten::add.Tensor(%tangents_1, %saved, alpha=2)
  return (%a, %b, %c)
}
// CHECK: %a: f32[4, 8] = aten::add.Tensor(%tangents_1, %saved)
// CHECK-NEXT: %b: f32[4, 8] = aten::add.Tensor(%tangents_1, %half)
// CHECK-NEXT: %c: f32[4, 8] = aten::add.Tensor(%tangents_1, %saved, alpha=2)
// CHECK: // note: fold-zero-inputs graph g: %tangents_1 is zero: 0 adds folded, still read by %a, %b, %c
)",
             ctx);
  file_check(R"(
// RUN: fold-zero-inputs
graph g {
  %tangents_1: f32[4, 8] = placeholder
  %x: f32[4, 8] = aten::exp.default(%tangents_1)
  %a: f32[4, 8] = aten::add.Tensor(%tangents_1, %x)
  return (%a,)
}
// CHECK: %a: f32[4, 8] = aten::add.Tensor(%tangents_1, %x)
// CHECK-NOT: // note:
)");
}

TEST(ir_text, fold_transpose_pairs_leaves_outputs_that_would_alias) {
  // The outer view returned while its source is an input, or returned too: left as is (an output would
  // be the input itself, or two outputs one tensor). Other dims, or a transpose after t, are not a pair;
  // transpose(transpose(x, 0, 2), 2, 0) is, and a triple folds into one transpose.
  file_check(R"(
// RUN: fold-transpose-pairs
graph g {
  %w: f32[16, 8] = placeholder
  %y: f32[2, 3, 4] = placeholder
  %a: f32[8, 16][1, 8] = aten::t.default(%w) !view
  %b: f32[16, 8] = aten::t.default(%a) !view
  %r: f32[2, 3, 4] = aten::relu.default(%y)
  %p: f32[4, 3, 2][1, 4, 12] = aten::transpose.int(%r, 0, 2) !view
  %q: f32[2, 3, 4] = aten::transpose.int(%p, 2, 0) !view
  %u: f32[3, 4, 2][4, 1, 12] = aten::transpose.int(%p, 0, 1) !view
  %e: f32[2, 3, 4] = aten::exp.default(%q)
  %m: f32[8, 16] = aten::relu.default(%a)
  %t1: f32[16, 8][1, 16] = aten::t.default(%m) !view
  %t2: f32[8, 16] = aten::t.default(%t1) !view
  %t3: f32[16, 8][1, 16] = aten::t.default(%t2) !view
  return (%b, %e, %u, %t3)
}
// CHECK: %b: f32[16, 8] = aten::t.default(%a) !view
// CHECK: %p: f32[4, 3, 2][1, 4, 12] = aten::transpose.int(%r, 0, 2) !view
// CHECK-NOT: %q:
// CHECK: %u: f32[3, 4, 2][4, 1, 12] = aten::transpose.int(%p, 0, 1) !view
// CHECK-NEXT: %e: f32[2, 3, 4] = aten::exp.default(%r)
// CHECK-NEXT: %m: f32[8, 16] = aten::relu.default(%a)
// CHECK-NEXT: %t3: f32[16, 8][1, 16] = aten::t.default(%m) !view
// CHECK-NEXT: return (%b, %e, %u, %t3)
)");
}

// The helper itself: each kind of CHECK line fails when its text is where it must not be, or is not
// where it must be.
TEST(file_check, fails_on_a_missing_a_misplaced_or_a_forbidden_line) {
  EXPECT_NONFATAL_FAILURE(file_check(R"(
graph g {
  %x: f32[4] = placeholder
  return (%x,)
}
// CHECK: aten::relu
)"), "CHECK: 'aten::relu' not found");
  EXPECT_NONFATAL_FAILURE(file_check(R"(
graph g {
  %x: f32[4] = placeholder
  %y: f32[4] = aten::relu.default(%x)
  return (%y,)
}
// CHECK: graph g {
// CHECK-NEXT: %y
)"), "CHECK-NEXT: '%y' not found after: graph g {");
  EXPECT_NONFATAL_FAILURE(file_check(R"(
graph g {
  %x: f32[4] = placeholder
  %y: f32[4] = aten::relu.default(%x)
  return (%y,)
}
// CHECK: %x
// CHECK-NOT: relu
// CHECK: return
)"), "CHECK-NOT: 'relu' found");
}

TEST(ir_text, fold_scaled_add_undoes_the_decomposition_of_alpha) {
  // `ema.mul_(0.75).add_(x, alpha=0.25)` as AOTAutograd traces it: the second mul goes and the add takes
  // alpha (on the right of an add or a sub, and on the left of an add); what would change a type or a
  // value read elsewhere stays: a mul read twice, a mul returned, an integer tensor times a float, a mul
  // that promotes (bf16 times a float32 tensor is not a constant), an add with an alpha of its own.
  file_check(R"(
// RUN: fold-scaled-add
graph inference_0 {
  %ema: f32[8] = placeholder
  %x: f32[8] = placeholder
  %n: i64[8] = placeholder
  %h: bf16[8] = placeholder
  %m: f32[8] = aten::mul.Tensor(%ema, 0.75)
  %m1: f32[8] = aten::mul.Tensor(%x, 0.25)
  %add: f32[8] = aten::add.Tensor(%m, %m1)
  %m2: f32[8] = aten::mul.Tensor(%x, 2)
  %sub: f32[8] = aten::sub.Tensor(%ema, %m2)
  %m3: f32[8] = aten::mul.Tensor(%x, 3)
  %left: f32[8] = aten::add.Tensor(%m3, %ema)
  %m4: f32[8] = aten::mul.Tensor(%x, 5)
  %twice: f32[8] = aten::add.Tensor(%ema, %m4)
  %again: f32[8] = aten::add.Tensor(%m4, %twice)
  %m5: f32[8] = aten::mul.Tensor(%x, 7)
  %kept: f32[8] = aten::add.Tensor(%ema, %m5)
  %mi: f32[8] = aten::mul.Tensor(%n, 0.5)
  %ai: f32[8] = aten::add.Tensor(%x, %mi)
  %mh: f32[8] = aten::mul.Tensor(%h, %x)
  %ah: f32[8] = aten::add.Tensor(%x, %mh)
  %m6: f32[8] = aten::mul.Tensor(%x, 9)
  %al: f32[8] = aten::add.Tensor(%ema, %m6, alpha=2)
  return (%add, %sub, %left, %again, %kept, %m5, %ai, %ah, %al)
}
// CHECK: %m: f32[8] = aten::mul.Tensor(%ema, 0.75)
// CHECK-NEXT: %add: f32[8] = aten::add.Tensor(%m, %x, alpha=0.25)
// CHECK-NEXT: %sub: f32[8] = aten::sub.Tensor(%ema, %x, alpha=2)
// CHECK-NEXT: %left: f32[8] = aten::add.Tensor(%ema, %x, alpha=3)
// CHECK-NEXT: %m4: f32[8] = aten::mul.Tensor(%x, 5)
// CHECK: %m5: f32[8] = aten::mul.Tensor(%x, 7)
// CHECK-NEXT: %kept: f32[8] = aten::add.Tensor(%ema, %m5)
// CHECK-NEXT: %mi: f32[8] = aten::mul.Tensor(%n, 0.5)
// CHECK: %mh: f32[8] = aten::mul.Tensor(%h, %x)
// CHECK: %m6: f32[8] = aten::mul.Tensor(%x, 9)
// CHECK: // note: fold-scaled-add graph inference_0: 3 muls folded (%add reads %x with alpha 0.25, %sub reads %x with alpha 2, %left reads %x with alpha 3)
)");
}

}  // namespace
}  // namespace hb

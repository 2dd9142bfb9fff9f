// call-invariance: IR-text tests. Expectations follow from the pass's contract (passes/CallInvariance.h):
// what reads only constants runs once, what the per-call nodes read of it is kept, and nothing is when a
// mutating op writes into such a value.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "passes/CallInvariance.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

// A trimmed default BlockMask: built from a constant on every call, then read by the per-call op.
const char* kMaskFromConstants = R"(
graph forward_0 {
  %x: f32[4] = placeholder
  %c: i64[4] = get_attr _tensor_constant0 constant#0
  %a: i64[4] = aten::add.Tensor(%c, 1)
  %s: i64[4] = aten::mul.Tensor(%a, %a)
  %f: f32[4] = aten::_to_copy.default(%s, dtype=dtype.float32)
  %y: f32[4] = aten::add.Tensor(%x, %f)
  return (%y, %s)
}
)";

TEST(call_invariance, what_reads_only_constants_runs_once_and_what_per_call_nodes_read_is_kept) {
  // %a, %s, %f run once; %f (read by %y) and %s (returned) are kept; the constant itself is not a step;
  // the returned %s is copied each call (output 1).
  file_check(std::string("// RUN: call-invariance\n") + kMaskFromConstants + R"(
// CHECK: %y: f32[4] = aten::add.Tensor(%x, %f)
// CHECK: // note: call-invariance graph forward_0: 3 nodes run once (%a, %s, %f), 2 values kept (%s, %f), returned copies: 1
)");
}

TEST(call_invariance, a_mutation_of_an_invariant_value_leaves_everything_per_call) {
  file_check(R"(
// RUN: call-invariance
graph g {
  %x: f32[3] = placeholder
  %z: f32[3] = aten::zeros.default([3], dtype=dtype.float32)
  %a: f32[3] = aten::add_.Scalar(%z, 1) !mutates
  %y: f32[3] = aten::add.Tensor(%x, %z)
  return (%y,)
}
// CHECK: %y: f32[3]
// CHECK-NOT: call-invariance
)");
}

TEST(call_invariance, random_ops_custom_ops_and_inputs_are_per_call) {
  // rand draws numbers (and so does what reads it); a custom op may read state no argument shows; the
  // placeholder's consumers are per call. Nothing runs once.
  file_check(R"(
// RUN: call-invariance
graph g {
  %x: f32[3] = placeholder
  %r: f32[3] = aten::rand.default([3], dtype=dtype.float32) !random
  %m: f32[3] = aten::mul.Tensor(%r, 2)
  %k: f32[3] = mylib::state.default([3])
  %y: f32[3] = aten::add.Tensor(%x, %m)
  %w: f32[3] = aten::add.Tensor(%y, %k)
  return (%w,)
}
// CHECK: %w: f32[3]
// CHECK-NOT: call-invariance
)");
}

TEST(call_invariance, nothing_is_kept_under_cuda_graphs) {
  PassContext ctx;
  ctx.keep_across_calls = false;
  file_check(std::string("// RUN: call-invariance\n") + kMaskFromConstants + R"(
// CHECK: // note: call-invariance graph forward_0: off (values are not kept across calls: CUDA graphs)
// CHECK-NOT: run once
)",
             ctx);
}

TEST(call_invariance, the_compiled_program_carries_the_result) {
  // Through the whole pipeline: memory-plan writes the returned %s (and %y) straight into a caller's
  // result when one is passed, so %s runs every call, and so does %f, which reads it; %a runs once and
  // is kept for %s.
  auto g = parse_graph(kMaskFromConstants);
  PassContext ctx;
  // pointwise-fusion would make the chain one hintbackend::fused_pointwise node, which stays per call
  // (only ATen's own ops run once).
  ctx.disabled.insert("pointwise-fusion");
  const Program p = compile_program(std::move(g), ctx);
  ASSERT_NE(p.invariants, nullptr);
  const Graph& out = *p.graph;
  auto at = [&](const char* name) { return out.find(name); };
  EXPECT_TRUE(p.invariants->runs_once[at("a")]);
  EXPECT_TRUE(p.invariants->kept[at("a")]);
  EXPECT_FALSE(p.invariants->runs_once[at("c")]);  // a constant: not a step
  for (const char* n : {"s", "f", "y"}) EXPECT_FALSE(p.invariants->runs_once[at(n)]) << n;
  EXPECT_TRUE(p.invariants->copied_outputs.empty());
  EXPECT_FALSE(p.invariants->copy_all_outputs);
  EXPECT_NE(std::find(p.notes.begin(), p.notes.end(),
                      "call-invariance graph forward_0: 1 node runs once (%a), 1 value kept (%a), returned copies: none"),
            p.notes.end());
}

}  // namespace
}  // namespace hb

// fold-cross-entropy-forward: IR-text tests (a half-precision language model's loss, as AOTAutograd
// traces F.cross_entropy's forward on logits.float() once save-logsumexp added the row maxima).
// Expectations follow from the pass's contract (passes/FoldCrossEntropyForward.h) and from byte counts.
#include <gtest/gtest.h>

#include <string>

#include "backend/ir/CrossEntropy.h"
#include "codegen/TargetModel.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

// N x C: 1024 x 65536 float32 (256 MiB), so the op takes 256 rows a chunk (64 MiB a temporary). The row
// maxima come before the loss in FX's order (save-logsumexp puts them right after the log-softmax).
const char* kForward = R"(
graph forward_0 {
  %logits: bf16[4, 256, 65536] = placeholder
  %labels: i64[4, 256] = placeholder
  %c: f32[4, 256, 65536] = prims::convert_element_type.default(%logits, dtype.float32)
  %x: f32[1024, 65536] = aten::view.default(%c, [-1, 65536]) !view
  %t: i64[1024] = aten::view.default(%labels, [-1]) !view
  %lsm: f32[1024, 65536] = aten::_log_softmax.default(%x, 1, false)
  %a: f32[1024, 1] = aten::amax.default(%lsm, [1], true)
  %nll: (f32[], f32[]) = aten::nll_loss_forward.default(%lsm, %t, none, 1, -100)
  %loss: f32[] = operator::getitem(%nll, 0)
  %tw: f32[] = operator::getitem(%nll, 1)
  return (%loss, %logits, %a, %t, %tw)
}
)";

TEST(fold_cross_entropy_forward, the_loss_reads_the_logits_a_chunk_at_a_time) {
  // The op reads the bf16 logits (the upcast and its view go), writes the row maxima as its third result
  // (the amax becomes a getitem behind it), and takes 256 rows a chunk.
  ASSERT_EQ(cross_entropy_chunk_rows(1024, 65536, 4), 256);
  file_check(std::string("// RUN: fold-cross-entropy-forward\n") + kForward + R"(
// CHECK: %labels: i64[4, 256] = placeholder
// CHECK-NOT: convert_element_type
// CHECK: %t: i64[1024] = aten::view.default(%labels, [-1]) !view
// CHECK-NOT: _log_softmax
// CHECK-NEXT: %nll: (f32[], f32[], f32[1024, 1]) = hintbackend::cross_entropy_forward.default(%logits, %t, 1, -100, dtype.float32, 256)
// CHECK-NEXT: %a: f32[1024, 1] = operator::getitem(%nll, 2)
// CHECK-NEXT: %loss: f32[] = operator::getitem(%nll, 0)
// CHECK: return (%loss, %logits, %a, %t, %tw)
// CHECK: // note: fold-cross-entropy-forward graph forward_0: %nll = cross_entropy_forward(%logits, %t), mean, 256 rows a chunk; %a = its row maxima; %c, %x and %lsm removed
)");
}

TEST(fold_cross_entropy_forward, the_plan_holds_two_chunks_not_two_whole_tensors) {
  // Traced: the upcast (256 MiB) and the log-probabilities (256 MiB) are alive together. Folded: no [N, C]
  // value at all; the op's workspace is its two 64 MiB temporaries (the runtime target's model).
  file_check(std::string("// RUN: memory-plan\n") + kForward + R"(
// CHECK: live peak 536870912,
)");
  file_check(std::string("// RUN: fold-cross-entropy-forward,memory-plan\n") + kForward + R"(
// CHECK: live peak 0,
)");
  std::shared_ptr<Graph> g = parse_graph(kForward);
  PassContext ctx;
  run_passes(*g, {"fold-cross-entropy-forward"}, ctx);
  int op = -1;
  for (int i = 0; i < static_cast<int>(g->nodes.size()); ++i)
    if (g->nodes[i].target == kCrossEntropyForwardTarget) op = i;
  ASSERT_GE(op, 0);
  EXPECT_EQ(kernel_workspace_bytes(*g, g->nodes[op]), int64_t{2} * 256 * 65536 * 4);
}

TEST(fold_cross_entropy_forward, float32_logits_and_the_sum_and_none_reductions) {
  // No upcast: the op reads x itself; no row maxima (save-logsumexp off); reductions kept; 8 x 32 fits
  // one chunk.
  file_check(R"(
// RUN: fold-cross-entropy-forward
graph g {
  %x: f32[8, 32] = placeholder
  %t: i64[8] = placeholder
  %lsm: f32[8, 32] = aten::_log_softmax.default(%x, -1, false)
  %nll: (f32[8], f32[]) = aten::nll_loss_forward.default(%lsm, %t, none, 0, 3)
  %loss: f32[8] = operator::getitem(%nll, 0)
  return (%loss,)
}
// CHECK: %nll: (f32[8], f32[], f32[8, 1]) = hintbackend::cross_entropy_forward.default(%x, %t, 0, 3, dtype.float32, 8)
// CHECK: %nll = cross_entropy_forward(%x, %t), none, 8 rows a chunk; %lsm removed
)");
}

TEST(fold_cross_entropy_forward, a_half_to_float_log_softmax_folds_reading_its_half_input) {
  // fold-softmax-upcast turns log_softmax(x.float()) of an fp16 x on CUDA into half_to_float: the op
  // reads x and upcasts a chunk at a time the same way.
  file_check(R"(
// RUN: fold-softmax-upcast,fold-cross-entropy-forward
graph g {
  %h: f16[8, 32]@cuda:0 = placeholder
  %t: i64[8]@cuda:0 = placeholder
  %x: f32[8, 32]@cuda:0 = prims::convert_element_type.default(%h, dtype.float32)
  %lsm: f32[8, 32]@cuda:0 = aten::_log_softmax.default(%x, 1, false)
  %nll: (f32[]@cuda:0, f32[]@cuda:0) = aten::nll_loss_forward.default(%lsm, %t, none, 1, -100)
  %loss: f32[]@cuda:0 = operator::getitem(%nll, 0)
  return (%loss,)
}
// CHECK-NOT: _log_softmax
// CHECK: %nll: (f32[]@cuda:0, f32[]@cuda:0, f32[8, 1]@cuda:0) = hintbackend::cross_entropy_forward.default(%h, %t, 1, -100, dtype.float32, 8)
)");
}

TEST(fold_cross_entropy_forward, leaves_log_probabilities_that_something_else_reads) {
  // %lsm_r is returned (the default partition saves it); %lsm_w's loss has a class weight; %lsm_d's
  // log-softmax is over dim 0; %lsm_m's row maximum is read before its loss. None folds.
  file_check(R"(
// RUN: fold-cross-entropy-forward
graph g {
  %x: f32[8, 32] = placeholder
  %t: i64[8] = placeholder
  %w: f32[32] = placeholder
  %lsm_r: f32[8, 32] = aten::_log_softmax.default(%x, 1, false)
  %nll_r: (f32[], f32[]) = aten::nll_loss_forward.default(%lsm_r, %t, none, 1, -100)
  %lsm_w: f32[8, 32] = aten::_log_softmax.default(%x, 1, false)
  %nll_w: (f32[], f32[]) = aten::nll_loss_forward.default(%lsm_w, %t, %w, 1, -100)
  %lsm_d: f32[8, 32] = aten::_log_softmax.default(%x, 0, false)
  %nll_d: (f32[], f32[]) = aten::nll_loss_forward.default(%lsm_d, %t, none, 1, -100)
  %lsm_m: f32[8, 32] = aten::_log_softmax.default(%x, 1, false)
  %m: f32[8, 1] = aten::amax.default(%lsm_m, [1], true)
  %early: f32[8, 1] = aten::neg.default(%m)
  %nll_m: (f32[], f32[]) = aten::nll_loss_forward.default(%lsm_m, %t, none, 1, -100)
  return (%nll_r, %lsm_r, %nll_w, %nll_d, %early, %nll_m)
}
// CHECK-NOT: cross_entropy_forward
// CHECK: %nll_r: (f32[], f32[]) = aten::nll_loss_forward.default
// CHECK: %nll_m: (f32[], f32[]) = aten::nll_loss_forward.default
// CHECK-NOT: fold-cross-entropy-forward
)");
}

}  // namespace
}  // namespace hb

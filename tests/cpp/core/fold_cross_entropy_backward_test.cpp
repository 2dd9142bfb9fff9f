// fold-cross-entropy-backward: IR-text tests (the loss gradient of a language model, as AOTAutograd
// traces F.cross_entropy's backward; the first one is trimmed from a small HF Llama's backward_1 dump).
// Expectations follow from the pass's contract (passes/FoldCrossEntropyBackward.h) and from byte counts.
#include <gtest/gtest.h>

#include <string>

#include "codegen/TargetModel.h"
#include "passes/FoldCrossEntropyBackward.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::file_check;

// A bf16 model's loss gradient: [64, 256] float32 log-probabilities (64 KiB), the gradient cast back
// to bf16 (32 KiB) and added to the tangent autograd materializes for the unused logits.
const char* kBf16Backward = R"(
graph backward_1 (inputs owned) {
  %lsm: f32[64, 256] = placeholder
  %target: i64[64] = placeholder
  %tw: f32[] = placeholder
  %t: f32[] = placeholder
  %tangent: bf16[2, 32, 256] = placeholder
  %w: bf16[256, 16] = placeholder
  %nll: f32[64, 256] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %d: f32[64, 256] = aten::detach.default(%lsm) !view
  %g: f32[64, 256] = aten::_log_softmax_backward_data.default(%nll, %d, 1, dtype.float32)
  %v: f32[2, 32, 256] = aten::view.default(%g, [2, 32, 256]) !view
  %c: bf16[2, 32, 256] = prims::convert_element_type.default(%v, dtype.bfloat16)
  %a: bf16[2, 32, 256] = aten::add.Tensor(%tangent, %c)
  %v2: bf16[64, 256] = aten::view.default(%a, [64, 256]) !view
  %mm: bf16[64, 16] = aten::mm.default(%v2, %w)
  return (%mm,)
}
)";

TEST(fold_cross_entropy_backward, mean_folds_into_one_op_and_the_nll_gradient_goes) {
  // The op takes nll's tangent, target, reduction, ignore_index and total_weight, and the log-softmax
  // gradient's log-probabilities (through its detach); it keeps the gradient's name and type.
  file_check(std::string("// RUN: fold-cross-entropy-backward\n") + kBf16Backward + R"(
// CHECK: %w: bf16[256, 16] = placeholder
// CHECK-NOT: nll_loss_backward
// CHECK: %d: f32[64, 256] = aten::detach.default(%lsm) !view
// CHECK-NEXT: %g: f32[64, 256] = hintbackend::cross_entropy_backward.default(%t, %d, %target, 1, -100, %tw)
// CHECK-NOT: _log_softmax_backward_data
// CHECK: %c: bf16[2, 32, 256] = prims::convert_element_type.default(%v, dtype.bfloat16)
// CHECK: // note: fold-cross-entropy-backward graph backward_1: %g = cross_entropy_backward(%t, %d, %target), mean, %nll removed
)");
}

TEST(fold_cross_entropy_backward, the_planned_peak_holds_one_float32_gradient_not_two) {
  // Unfolded, nll (64 KiB) and the log-softmax gradient (64 KiB) are alive together: 128 KiB. Folded, the
  // peak is the gradient and its bf16 copy (32 KiB) while the cast reads it: 96 KiB; the tangent add
  // writes over the copy in place.
  file_check(std::string("// RUN: memory-plan\n") + kBf16Backward + R"(
// CHECK: live peak 131072,
// CHECK: %nll: offset
// CHECK: %g: offset
)");
  file_check(std::string("// RUN: fold-cross-entropy-backward,memory-plan\n") + kBf16Backward + R"(
// CHECK: live peak 98304,
// CHECK-NOT: %nll:
// CHECK: %g: offset
// CHECK: then %a in place
)");
}

// The logits form: the forward saved each row's max logit and max log-probability (python/hintbackend/
// partition.py), so the backward recomputes the log-probabilities from the bf16 logits (sub promotes to
// float32) for the pair.
const char* kLogitsBackward = R"(
graph backward_1 (inputs owned) {
  %logits: bf16[2, 32, 256] = placeholder
  %m: f32[64, 1] = placeholder
  %a: f32[64, 1] = placeholder
  %target: i64[64] = placeholder
  %tw: f32[] = placeholder
  %t: f32[] = placeholder
  %tangent: bf16[2, 32, 256] = placeholder
  %w: bf16[256, 16] = placeholder
  %x: bf16[64, 256] = aten::view.default(%logits, [64, 256]) !view
  %shifted: f32[64, 256] = aten::sub.Tensor(%x, %m)
  %lsm: f32[64, 256] = aten::add.Tensor(%shifted, %a)
  %nll: f32[64, 256] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %g: f32[64, 256] = aten::_log_softmax_backward_data.default(%nll, %lsm, 1, dtype.float32)
  %v: f32[2, 32, 256] = aten::view.default(%g, [2, 32, 256]) !view
  %c: bf16[2, 32, 256] = prims::convert_element_type.default(%v, dtype.bfloat16)
  %sum: bf16[2, 32, 256] = aten::add.Tensor(%tangent, %c)
  %v2: bf16[64, 256] = aten::view.default(%sum, [64, 256]) !view
  %mm: bf16[64, 16] = aten::mm.default(%v2, %w)
  return (%mm,)
}
)";

TEST(fold_cross_entropy_backward, the_logits_form_reads_the_logits_and_drops_the_log_probabilities) {
  // The op reads the bf16 logits and the two row values; the sub and add that recomputed the
  // log-probabilities go. It writes the gradient's bf16 conversion (computed in float32, rounded once)
  // in its [2, 32, 256] shape, so the view and the conversion go too, and the tangent add reads it.
  file_check(std::string("// RUN: fold-cross-entropy-backward\n") + kLogitsBackward + R"(
// CHECK: %x: bf16[64, 256] = aten::view.default(%logits, [64, 256]) !view
// CHECK-NOT: aten::sub.Tensor
// CHECK-NOT: nll_loss_backward
// CHECK: %g: bf16[2, 32, 256] = hintbackend::cross_entropy_backward.logits(%t, %x, %m, %a, %target, 1, -100, %tw, dtype.bfloat16, [2, 32, 256])
// CHECK-NOT: _log_softmax_backward_data
// CHECK-NOT: convert_element_type
// CHECK-NEXT: %sum: bf16[2, 32, 256] = aten::add.Tensor(%tangent, %g)
// CHECK: // note: fold-cross-entropy-backward graph backward_1: %g = cross_entropy_backward.logits(%t, %x, %m, %a, %target), mean, %nll, %shifted and %lsm removed; it writes %c's bfloat16 value: %v and %c removed
)");
}

TEST(fold_cross_entropy_backward, the_logits_form_plans_no_log_probabilities) {
  // Unfolded, the recomputed log-probabilities (the add over the sub in place), nll and the gradient
  // (64 KiB each, float32) overlap: 192 KiB. Folded, one bf16 gradient (32 KiB), which the tangent add
  // then writes over in place.
  file_check(std::string("// RUN: memory-plan\n") + kLogitsBackward + R"(
// CHECK: live peak 196608,
)");
  file_check(std::string("// RUN: fold-cross-entropy-backward,memory-plan\n") + kLogitsBackward + R"(
// CHECK: live peak 32768,
// CHECK-NOT: %lsm:
// CHECK-NOT: %shifted:
// CHECK: %g: offset 0 size 32768 live [9, 12] then %sum in place
)");
  // On the CPU the op computes its bf16 result in float32 chunks: its workspace is one chunk, here all
  // 64 rows of 256 floats.
  std::shared_ptr<Graph> g = parse_graph(kLogitsBackward);
  PassContext ctx;
  run_passes(*g, {"fold-cross-entropy-backward"}, ctx);
  const Node* op = nullptr;
  for (const Node& n : g->nodes)
    if (n.target == kCrossEntropyBackwardLogitsTarget) op = &n;
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(kernel_workspace_bytes(*g, *op), 64 * 256 * 4);
}

TEST(fold_cross_entropy_backward, a_log_probability_read_elsewhere_keeps_the_plain_form) {
  // %lsm is also returned, so it is computed anyway: the op reads it (the plain form), and the add and
  // sub stay. %lsm2's sub is read twice, %lsm3's row values are [8, 32] (not one per row): plain forms too.
  file_check(R"(
// RUN: fold-cross-entropy-backward
graph g {
  %x: f32[8, 32] = placeholder
  %m: f32[8, 1] = placeholder
  %a: f32[8, 1] = placeholder
  %full: f32[8, 32] = placeholder
  %target: i64[8] = placeholder
  %tw: f32[] = placeholder
  %t: f32[] = placeholder
  %s: f32[8, 32] = aten::sub.Tensor(%x, %m)
  %lsm: f32[8, 32] = aten::add.Tensor(%s, %a)
  %nll: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %g: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll, %lsm, 1, dtype.float32)
  %s2: f32[8, 32] = aten::sub.Tensor(%x, %m)
  %lsm2: f32[8, 32] = aten::add.Tensor(%s2, %a)
  %nll2: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm2, %target, none, 1, -100, %tw)
  %g2: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll2, %lsm2, 1, dtype.float32)
  %s3: f32[8, 32] = aten::sub.Tensor(%x, %full)
  %lsm3: f32[8, 32] = aten::add.Tensor(%s3, %a)
  %nll3: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm3, %target, none, 1, -100, %tw)
  %g3: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll3, %lsm3, 1, dtype.float32)
  return (%g, %lsm, %g2, %s2, %g3)
}
// CHECK: %lsm: f32[8, 32] = aten::add.Tensor(%s, %a)
// CHECK-NEXT: %g: f32[8, 32] = hintbackend::cross_entropy_backward.default(%t, %lsm, %target, 1, -100, %tw)
// CHECK: %lsm2: f32[8, 32] = aten::add.Tensor(%s2, %a)
// CHECK-NEXT: %g2: f32[8, 32] = hintbackend::cross_entropy_backward.default(%t, %lsm2, %target, 1, -100, %tw)
// CHECK: %lsm3: f32[8, 32] = aten::add.Tensor(%s3, %a)
// CHECK-NEXT: %g3: f32[8, 32] = hintbackend::cross_entropy_backward.default(%t, %lsm3, %target, 1, -100, %tw)
// CHECK-NOT: .logits
)");
}

TEST(fold_cross_entropy_backward, sum_and_none_fold_too) {
  // sum: a scalar tangent, no division; none: one tangent per row (dim -1 is dim 1). Both keep their
  // reduction and ignore_index arguments.
  file_check(R"(
// RUN: fold-cross-entropy-backward
graph g {
  %lsm: f32[8, 32] = placeholder
  %target: i64[8] = placeholder
  %tw: f32[] = placeholder
  %ts: f32[] = placeholder
  %tn: f32[8] = placeholder
  %nll_s: f32[8, 32] = aten::nll_loss_backward.default(%ts, %lsm, %target, none, 2, -1, %tw)
  %gs: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_s, %lsm, 1, dtype.float32)
  %nll_n: f32[8, 32] = aten::nll_loss_backward.default(%tn, %lsm, %target, none, 0, 3, %tw)
  %gn: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_n, %lsm, -1, dtype.float32)
  return (%gs, %gn)
}
// CHECK-NOT: nll_loss_backward
// CHECK: %gs: f32[8, 32] = hintbackend::cross_entropy_backward.default(%ts, %lsm, %target, 2, -1, %tw)
// CHECK-NEXT: %gn: f32[8, 32] = hintbackend::cross_entropy_backward.default(%tn, %lsm, %target, 0, 3, %tw)
// CHECK: %gs = cross_entropy_backward(%ts, %lsm, %target), sum, %nll_s removed
// CHECK: %gn = cross_entropy_backward(%tn, %lsm, %target), none, %nll_n removed
)");
}

TEST(fold_cross_entropy_backward, half_precision_folds_on_every_device) {
  // bf16 logits' loss (HF BERT's masked LM): the op computes in float32 and rounds once (one kernel on
  // CUDA, chunks of rows on the CPU), so it folds on both.
  const std::string body = R"(
  %lsm: bf16[8, 32]DEV = placeholder
  %target: i64[8]DEV = placeholder
  %tw: bf16[]DEV = placeholder
  %t: bf16[]DEV = placeholder
  %nll: bf16[8, 32]DEV = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %g: bf16[8, 32]DEV = aten::_log_softmax_backward_data.default(%nll, %lsm, 1, dtype.bfloat16)
  return (%g,)
}
)";
  auto on = [&](const std::string& dev) {
    std::string b = body;
    for (size_t at = b.find("DEV"); at != std::string::npos; at = b.find("DEV")) b.replace(at, 3, dev);
    return b;
  };
  file_check("// RUN: fold-cross-entropy-backward\ngraph g {" + on("@cuda:0") +
             "// CHECK-NOT: nll_loss_backward\n"
             "// CHECK: %g: bf16[8, 32]@cuda:0 = hintbackend::cross_entropy_backward.default(%t, %lsm, %target, 1, -100, %tw)\n");
  file_check("// RUN: fold-cross-entropy-backward\ngraph g {" + on("") +
             "// CHECK-NOT: nll_loss_backward\n"
             "// CHECK: %g: bf16[8, 32] = hintbackend::cross_entropy_backward.default(%t, %lsm, %target, 1, -100, %tw)\n");
}

TEST(fold_cross_entropy_backward, leaves_what_it_cannot_fold_as_traced) {
  // %nll_u has a second reader (returned); %nll_w has a class weight; %nll_h is a bf16 gradient of
  // float32 log-probabilities (dtypes differ); %nll_d's gradient is over dim 0; %nll_l (label smoothing's
  // shape) reaches the log-softmax gradient through an add. None folds, and no note is left.
  file_check(R"(
// RUN: fold-cross-entropy-backward
graph g {
  %lsm: f32[8, 32] = placeholder
  %target: i64[8] = placeholder
  %tw: f32[] = placeholder
  %tw_h: bf16[] = placeholder
  %t: f32[] = placeholder
  %t_h: bf16[] = placeholder
  %weight: f32[32] = placeholder
  %smooth: f32[8, 32] = placeholder
  %nll_u: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %g_u: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_u, %lsm, 1, dtype.float32)
  %nll_w: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, %weight, 1, -100, %tw)
  %g_w: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_w, %lsm, 1, dtype.float32)
  %nll_h: bf16[8, 32] = aten::nll_loss_backward.default(%t_h, %lsm, %target, none, 1, -100, %tw_h)
  %g_h: bf16[8, 32] = aten::_log_softmax_backward_data.default(%nll_h, %lsm, 1, dtype.bfloat16)
  %nll_d: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %g_d: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_d, %lsm, 0, dtype.float32)
  %nll_l: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, none, 1, -100, %tw)
  %sum_l: f32[8, 32] = aten::add.Tensor(%nll_l, %smooth)
  %g_l: f32[8, 32] = aten::_log_softmax_backward_data.default(%sum_l, %lsm, 1, dtype.float32)
  return (%g_u, %nll_u, %g_w, %g_h, %g_d, %g_l)
}
// CHECK-NOT: cross_entropy_backward
// CHECK: %g_u: f32[8, 32] = aten::_log_softmax_backward_data.default(%nll_u, %lsm, 1, dtype.float32)
// CHECK: %nll_w: f32[8, 32] = aten::nll_loss_backward.default(%t, %lsm, %target, %weight, 1, -100, %tw)
// CHECK: %nll_h: bf16[8, 32] = aten::nll_loss_backward.default
// CHECK: %nll_d: f32[8, 32] = aten::nll_loss_backward.default
// CHECK: %nll_l: f32[8, 32] = aten::nll_loss_backward.default
// CHECK: return (%g_u, %nll_u, %g_w, %g_h, %g_d, %g_l)
// CHECK-NOT: fold-cross-entropy-backward
)");
}

}  // namespace
}  // namespace hb

// fold-cross-entropy-backward: the gradient of cross-entropy, as AOTAutograd traces it,
//   %nll: f32[N, C] = aten::nll_loss_backward.default(%t, %lsm, %target, none, reduction, ignore_index, %total_weight)
//   %g:   f32[N, C] = aten::_log_softmax_backward_data.default(%nll, %lsm2, 1, dtype.float32)
// becomes one op that writes one [N, C] buffer:
//   %g:   f32[N, C] = hintbackend::cross_entropy_backward.default(%t, %lsm2, %target, reduction, ignore_index, %total_weight)
// (backend/runtime/CrossEntropyBackward.h has its exact semantics).
//
// Why: nll_loss_backward writes a [N, C] tensor that is zero but for one element per row, and the
// log-softmax gradient reads it whole to write a second [N, C] tensor; both are alive at once. At a
// language model's loss (N = batch x sequence, C = the vocabulary) they are the backward's largest
// buffers (500 MiB each for B4 S1024 V32000) and its peak (docs/memory.md). From ATen's definitions
// (weight None): nll[i, j] = -s_i [j == target_i] for rows whose target is not ignore_index, 0 for the
// others, with s_i = t / total_weight (mean), t (sum) or t[i] (none); and _log_softmax_backward_data is
// nll - exp(lsm2) * sum_j nll[i, j]. So g[i, j] = s_i (exp(lsm2[i, j]) - [j == target_i]) on kept rows,
// 0 on ignored ones: computed straight into g's buffer.
//
// Folds only: a 2-D input with the classes on dim 1, no class weight, reduction none/mean/sum, one float
// dtype throughout (float16 and bfloat16 are computed in float32 and rounded once, as ATen's log-softmax
// gradient does: a bf16 model's loss taken on bf16 logits, such as HF BERT's masked LM; one kernel on
// CUDA, chunks of rows elsewhere), a contiguous gradient, and nll read by nothing but the log-softmax
// gradient's grad_output. Anything else (a class weight, label smoothing, which adds other terms to the
// gradient, nll_loss2d) is left as traced. lsm (nll's input) is only its shape: nll_loss_backward reads
// no value of it.
//
// The logits form. Where the partition had the forward save each row's maximum logit m and
// log-probability maximum a (= -log sum_j exp(x_ij - m): the logsumexp is m - a) instead of the
// log-probabilities (python/hintbackend/partition.py, save_logsumexp_for_cross_entropy), the backward
// recomputes them as %lsm2 = aten::add.Tensor(aten::sub.Tensor(%logits, %m), %a), ATen's own two roundings,
// and reads them only in the pair above; then
//   %g: f32[N, C] = hintbackend::cross_entropy_backward.logits(%t, %logits, %m, %a, %target, reduction, ignore_index, %total_weight)
// computes g[i, j] = s_i (exp((logits[i, j] - m_i) + a_i) - [j == target_i]) from the logits (any float
// dtype: HF's bf16 logits before their float32 upcast) and m, a [N, 1] in g's dtype, and the add and sub
// go too: no [N, C] log-probabilities exist in the backward at all.
//
// Runs after slice-schedule (slice-legality's rules read the plain ops; loop bodies are folded too) and
// before pointwise-fusion and the memory passes, which then plan one buffer where there were two.
//
// The note lists each fold:
//   fold-cross-entropy-backward graph backward_1: %_log_softmax_backward_data = cross_entropy_backward(%tangents_5, %detach_8, %view_26), mean, %nll_loss_backward removed
//   fold-cross-entropy-backward graph backward_1: %_log_softmax_backward_data = cross_entropy_backward.logits(%tangents_1, %view_5, %amax, %amax_1, %view_1), mean, %nll_loss_backward, %sub and %add removed
#pragma once
#include "backend/ir/CrossEntropy.h"
#include "passes/Pipeline.h"

namespace hb {


bool fold_cross_entropy_backward(Graph& g, PassContext& ctx);

}  // namespace hb

// The gradient of cross-entropy in one op: what passes/FoldCrossEntropyBackward.h folds
// nll_loss_backward and _log_softmax_backward_data into, registered with the dispatcher (namespace
// `hintbackend`) so the executor runs it like any ATen op, arena placement through its out= overload
// included.
//
//   cross_entropy_backward(grad, log_probs, target, reduction, ignore_index, total_weight)
//     log_probs [N, C] (float32 or float64; on CUDA also float16 and bfloat16), target [N] int64,
//     total_weight a scalar tensor;
//     grad a scalar (reduction 1 mean, 2 sum) or [N] (0 none).
//     s_i = grad / total_weight (mean), grad (sum), grad[i] (none)
//     result[i, j] = s_i * (exp(log_probs[i, j]) - [j == target_i])   where target_i != ignore_index
//                  = 0                                                 where target_i == ignore_index
//   which is _log_softmax_backward_data(nll_loss_backward(grad, log_probs, target, None, reduction,
//   ignore_index, total_weight), log_probs, 1, dtype) by ATen's definitions of the two (no class weight).
//
// On CUDA (float16, bfloat16, float32): one kernel pass (codegen/cuda/CrossEntropyBackward.cu) computing
// in float32 and rounding once. Elsewhere, ATen ops into the one result: exp, a multiply by the per-row
// scale, then the target column's element less that scale (gather, scatter); the only other tensors are
// [N]. The result's element
// (i, j) reads only log_probs[i, j] (and row i's scalars), so `out` may be log_probs itself (the
// planner's in-place rule, backend/ir/Aliasing.cpp).
//
//   cross_entropy_backward.logits(grad, logits, row_max, log_probs_max, target, reduction, ignore_index,
//                                 total_weight, dtype=None, shape=None)
//     the same gradient from the logits themselves: log_probs[i, j] = (logits[i, j] - row_max[i]) +
//     log_probs_max[i], ATen's log-softmax with its roundings (row_max the row's largest logit,
//     log_probs_max its largest log-probability, minus the log-sum), with logits [N, C] of any float dtype
//     (bf16 logits before their float32 upcast) and row_max, log_probs_max [N, 1] of the result's dtype.
//     What the fold writes where the forward saved those two instead of the log-probabilities
//     (passes/FoldCrossEntropyBackward.h). `dtype`, `shape`: the result's, when the fold took in the
//     gradient's view and conversion (a bf16 model's gradient back to its logits' dtype): computed in
//     row_max's dtype and rounded once. Same kernel on CUDA (computing in float32); elsewhere, in the
//     result's own dtype, logits - row_max is written into the result first (so out may be logits itself),
//     then as above; in another dtype a chunk of rows at a time (backend/ir/CrossEntropy.h's chunk).
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the op is linked in (hb_runtime is a static
// library: an object file nothing references would be dropped).
void link_cross_entropy_backward_ops();

}  // namespace hb::rt

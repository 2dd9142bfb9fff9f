// F.cross_entropy's forward in one op, a chunk of rows at a time: what passes/FoldCrossEntropyForward.h
// folds _log_softmax and nll_loss_forward into, registered with the dispatcher (namespace `hintbackend`)
// so the executor runs it like any ATen op.
//
//   cross_entropy_forward(logits, target, reduction, ignore_index, dtype, chunk_rows)
//       -> (loss, total_weight, log_probs_max)
//     logits [..., C] contiguous, any float dtype (N rows of C: a model's bf16 logits before their upcast);
//     target [N] int64; reduction 0 none, 1 mean, 2 sum; dtype the log-softmax's (float32 for an upcast).
//     With log_probs = _log_softmax(logits.view(N, C).to(dtype), 1):
//     (loss, total_weight) = nll_loss_forward(log_probs, target, None, reduction, ignore_index), and
//     log_probs_max [N, 1] = amax(log_probs, 1, keepdim) (what save-logsumexp saves for the backward).
//   chunk_rows rows at a time: their upcast, their log-softmax (ATen's, row by row, so the same values),
//   its row maxima, and the target column's log-probability (gather); then nll_loss_forward over those
//   [N, 1] values (targets of ignored rows ignored, the others column 0): ATen's loss of the same values.
//   Temporaries: two [chunk_rows, C] tensors of dtype; results: three small tensors.
//   A target outside [0, C) that is not ignore_index is eager's error: IndexError "Target t is out of
//   bounds." on the CPU, a device-side assert on CUDA (gather's, where eager's is nll_loss's).
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the op is linked in (hb_runtime is a static
// library: an object file nothing references would be dropped).
void link_cross_entropy_forward_ops();

}  // namespace hb::rt

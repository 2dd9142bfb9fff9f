// fold-cross-entropy-forward: F.cross_entropy's forward, as AOTAutograd traces it,
//   %x:    f32[N, C] = aten::view.default(prims::convert_element_type.default(%logits, dtype.float32), [N, C])
//   %lsm:  f32[N, C] = aten::_log_softmax.default(%x, 1, false)
//   %a:    f32[N, 1] = aten::amax.default(%lsm, [1], true)          (save-logsumexp's, when present)
//   %nll:  (f32[], f32[]) = aten::nll_loss_forward.default(%lsm, %target, none, reduction, ignore_index)
// becomes one op that never holds the [N, C] log-probabilities (nor the upcast logits) whole:
//   %nll:  (f32[], f32[], f32[N, 1]) = hintbackend::cross_entropy_forward.default(%logits, %target, reduction,
//                                        ignore_index, dtype.float32, rows)
//   %a:    f32[N, 1] = operator::getitem(%nll, 2)
// (backend/runtime/CrossEntropyForward.h has its exact semantics.) The op takes `rows` rows at a time:
// upcast, log-softmax, their row maxima and the target column's log-probability, then nll_loss_forward
// over those N values: the same numbers as the traced ops (the log-softmax is row by row), with two
// [rows, C] temporaries instead of two [N, C] tensors (1.5 GiB for GPT-2's vocabulary at B4 S1024 in
// float32). `rows` comes from backend/ir/CrossEntropy.h's rule (64 MiB a temporary), and the target's
// workspace model counts the two temporaries (codegen/TargetModel.cpp).
//
// Why: once save-logsumexp (python/hintbackend/partition.py) keeps the log-probabilities out of what the
// forward saves, the loss's upcast logits and log-probabilities are the forward's largest transients,
// alive at its end when every saved activation is too.
//
// Folds only: a log-softmax over dim 1 of a row-major [N, C] tensor with static sizes, read by nothing
// but the loss (one nll_loss_forward without a class weight) and row maxima amax(lsm, [1], true) whose
// readers come after the loss; the upcast (a dtype conversion, then views, each read once) is taken into
// the op where the logits it reads are contiguous, else the op reads x. A log-softmax the graph returns
// or saves for the backward (save-logsumexp off or not applicable) stays as traced: it exists anyway.
//
// Runs beside fold-cross-entropy-backward (after slice-schedule, whose loop bodies it folds too, and
// before pointwise-fusion and the memory passes, which then plan without the [N, C] values).
//
// The note lists each fold:
//   fold-cross-entropy-forward graph forward_0: %nll_loss_forward = cross_entropy_forward(%view_3, %view_5), mean, 262 rows a chunk; %amax_default = its row maxima; %_to_copy, %view_4 and %_log_softmax removed
#pragma once
#include "backend/ir/CrossEntropy.h"
#include "passes/Pipeline.h"

namespace hb {

bool fold_cross_entropy_forward(Graph& g, PassContext& ctx);

}  // namespace hb

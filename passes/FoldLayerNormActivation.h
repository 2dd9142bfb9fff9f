// fold-layer-norm-activation: on CUDA, an activation whose only reader is a layer norm becomes part of
// the layer norm, forward and backward, so the activation's result is never stored and its two elementwise
// kernels (and their dispatches) are gone.
//
// Forward (a Linear, then GELU, then LayerNorm: the corpus MLP, BERT's masked-LM head):
//   %a = aten::gelu.default(%h)                       only the layer norm reads %a
//   %ln = aten::native_layer_norm.default(%a, [n], %w, %b, eps)
// becomes, in place (%ln keeps its name, index and type; %a goes)
//   %ln = hintbackend::layer_norm_act.default(%h, [n], %w, %b, eps, "gelu")
// Backward, where the partition recomputes the activation (recompute-materialized) rather than save it:
//   %a2 = aten::gelu.default(%h)                      only the layer norm's backward reads %a2
//   %lnb = aten::native_layer_norm_backward.default(%gy, %a2, [n], %mean, %rstd, %w, %b, [true, ..])
//   %dx = operator::getitem(%lnb, 0)                  only the activation's backward reads %dx
//   %dh = aten::gelu_backward.default(%dx, %h)
// becomes (%dh's readers read %dx, now h's gradient; %a2 and %dh go)
//   %lnb = hintbackend::layer_norm_act_backward.default(%gy, %h, [n], %mean, %rstd, %w, %b, [true, ..], "gelu")
// The activations: gelu (approximate "none" or "tanh": "gelu", "gelu_tanh") and silu (silu_backward).
// backend/runtime/LayerNormAct.h defines the ops as the ATen ops they replace; LayerNormRows' kernels
// (codegen/cuda/LayerNorm.cu) compute act(h) in float without rounding it to h's dtype, and h's gradient
// from the unrounded normalized input's, so results differ from eager's by rounding (closer to float64,
// tests/python/test_layer_norm_rows.py).
//
// The pass folds only where the rewritten node is one LayerNormRows takes (codegen/KernelSelect.h:
// layer_norm_rows_why_not) and the target runs those kernels (Target::cuda_kernels): elsewhere the fold
// would only trade ATen's ops for the same ops under another name. Both nodes of a fold must be in one
// hinted_context region; the nodes of a slice loop's body (a DFS region) are left as they are. After slice-schedule (whose legality rules read the plain ops), before
// pointwise-fusion (which could take the activation into a group) and the memory passes.
//
// The note lists what it folded:
//   fold-layer-norm-activation graph forward_0: %gelu into %native_layer_norm (gelu)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_layer_norm_activation(Graph& g, PassContext& ctx);

}  // namespace hb

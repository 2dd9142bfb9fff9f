// hintbackend::layer_norm_act and hintbackend::layer_norm_act_backward, the ops
// passes/FoldLayerNormActivation.h rewrites an activation and the layer norm that reads it into (and, in
// the backward, the activation's recompute, the layer norm's backward and the activation's backward),
// registered with the dispatcher (namespace `hintbackend`):
//
//   layer_norm_act(h, normalized_shape, weight?, bias?, eps, act) -> (y, mean, rstd)
//       aten::native_layer_norm(act(h), normalized_shape, weight, bias, eps)
//   layer_norm_act_backward(grad_out, h, normalized_shape, mean, rstd, weight?, bias?, output_mask, act)
//       -> (grad_h, grad_weight, grad_bias)
//       aten::native_layer_norm_backward(grad_out, act(h), ...) with its input gradient taken through
//       act: act's backward op (gelu_backward, silu_backward) of it and h
//
// act is a RowActivation's name (backend/ir/KernelPlan.h): "gelu", "gelu_tanh" or "silu". These
// composites are the ops' definitions, and what runs wherever LayerNormRows' kernels do not (the CPU,
// a tensor the kernels refuse at run time): the same ATen ops eager runs, so the same bits. On CUDA the
// executor runs the nodes on LayerNormRows' kernels (LayerNormCall.cpp), which compute act(h) in float
// without rounding or storing it.
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the ops is linked in (see RowSoftmax.h).
void link_layer_norm_act_ops();

}  // namespace hb::rt

// Row softmax kernels: the ops passes/RowSoftmaxFusion.h rewrites a softmax chain and its gradient
// into, registered with the dispatcher (namespace `hintbackend`) so the executor runs them like any
// ATen op, arena placement through their out= overloads included.
//
// Over the last dim, with T the dtype of x (and of grad), computing in float32:
//   v = scale ? T(float(x) * scale) : float(x)           x * scale in T, then the float32 upcast
//   y = exp(v - max(v)) / sum(exp(v - max(v)))           _softmax in float32
//   row_softmax(x, scale, dtype)        -> y in dtype (float32, or T: the chain's downcast)
//   row_softmax2(x, scale)              -> (y in float32, y in T)
//   row_softmax_backward(grad, y, scale, dtype)
//       g = float(grad); r = y * (g - sum(g * y))       _softmax_backward_data in float32
//       -> dtype(r), then times scale in dtype when given   (the downcast, then the chain's mul)
//   row_softmax_recompute_backward(grad, x, x_scale, scale, dtype)
//       the same with y = row_softmax(x, x_scale, float32) recomputed in the kernel, never stored.
//   row_softmax_recompute_backward_(grad, x, x_scale, scale)
//       in place: grad becomes that (in grad's dtype), x becomes y in x's dtype; returns grad.
// On CUDA, one dtype T for x, grad and the T-typed results (float16, bfloat16 or float32) and
// contiguous rows run the fused kernels (codegen/cuda/RowSoftmax.cu): one pass over each row.
// Anything else (CPU, other dtypes, strides, rows longer than the CUDA kernel takes) runs the same
// chain as ATen ops: eager's exact result. A scalar CPU row loop lost to ATen's vectorized,
// multithreaded ops at every size tried on the 2-core CI machine (2x to 10x), so CPU has none.
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the ops is linked in (hb_runtime is a
// static library: an object file nothing references would be dropped).
void link_row_softmax_ops();

}  // namespace hb::rt

// CUDA kernels for the row softmax ops (backend/runtime/RowSoftmax.h has their semantics): one
// thread block per row, the row held in registers, so each row is read once and written once. Part
// of hb_runtime, built only where nvcc and a CUDA torch exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

namespace hb::cuda {

// Each returns false, launching nothing, when the kernels do not take these tensors (a row longer
// than 16384 elements, or fewer for float32 and misaligned rows); the caller then runs ATen ops.
// Preconditions (the caller's): every tensor contiguous on one CUDA device; x, grad and `low` of one
// dtype T (float16, bfloat16 or float32); `y32` float32; `out` of T; same shapes.
bool row_softmax_forward(const at::Tensor& x, bool has_scale, float scale, const at::Tensor& y32,
                         const at::Tensor& low);
// y32 given: read it; else recompute it from x with x_scale, and write it in T to `low` when defined.
// `out` may be grad and `low` may be x (in place): a row is read whole before any of it is written.
bool row_softmax_backward(const at::Tensor& grad, const at::Tensor& y32, const at::Tensor& x, bool has_x_scale,
                          float x_scale, bool has_scale, float scale, const at::Tensor& out,
                          const at::Tensor& low = at::Tensor());

}  // namespace hb::cuda

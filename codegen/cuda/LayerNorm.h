// CUDA kernels for LayerNorm over narrow rows (backend/runtime/LayerNormCall.cpp runs them for
// aten::native_layer_norm and its backward): several rows a warp, each row held in registers, the
// statistics and the gradient's row sums reduced by warp shuffles, the weight and bias gradients summed
// per block in registers and then over the blocks in a fixed order (deterministic). ATen's kernels are
// slow on narrow rows: for the corpus MLP's [262144, 32] bf16 rows they took 286 us (forward) and 238 us
// (backward) on the H200, these 12 and 25 (benchmarks/layer_norm.py, docs/memory.md). Part of hb_runtime, built only where nvcc and a CUDA torch
// exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "backend/ir/KernelPlan.h"

namespace hb::cuda {

// The widest row (elements of the normalized shape) the kernels take: the selection rule's bound.
constexpr int64_t kLayerNormMaxColumns = kLayerNormRowsMaxColumns;

// Each returns false, launching nothing, when the kernels do not take these tensors; the caller then
// runs ATen's op. They take: x (and grad) contiguous, float16, bfloat16 or float32, 16-byte aligned,
// rows of n elements, n a multiple of 8 (float16, bfloat16) or 4 (float32) and at most
// kLayerNormMaxColumns; weight and bias (either may be undefined) contiguous, n elements of x's dtype;
// mean and rstd float32, one per row.
// With an activation, x is the activation's input h and the rows normalized are act(h), computed in
// float (never rounded to x's dtype, never stored): hintbackend::layer_norm_act and its backward.
// Forward: y (x's dtype and shape), mean and rstd written.
bool layer_norm_forward(const at::Tensor& x, int64_t n, const at::Tensor& weight, const at::Tensor& bias, double eps,
                        const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd,
                        RowActivation act = RowActivation::None);
// Backward: each of dx (x's dtype and shape), dweight and dbias (weight's) written where defined;
// dweight and dbias need weight. With an activation, dx is h's gradient: the normalized input's times
// act'(h).
bool layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, int64_t n, const at::Tensor& mean,
                         const at::Tensor& rstd, const at::Tensor& weight, const at::Tensor& dx,
                         const at::Tensor& dweight, const at::Tensor& dbias, RowActivation act = RowActivation::None);

}  // namespace hb::cuda

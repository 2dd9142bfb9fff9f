// The CUDA kernel for fused pointwise programs (codegen/PointwiseProgram.h): one thread per output
// element walks the program in registers. Part of hb_runtime, built only where nvcc and a CUDA torch
// exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "codegen/PointwiseProgram.h"

namespace hb::cuda {

constexpr int kMaxProgram = 96;  // instructions
constexpr int kMaxInputs = 16;
constexpr int kMaxDims = 8;

// Whether the kernel can run p at all (sizes within the limits above).
bool fits(const PointwiseProgram& p, int64_t ndim);

// out = p(inputs), broadcasting the inputs to out's shape; out is preallocated (any strides), every
// tensor on the same CUDA device with one dtype (f16, bf16, f32, f64). Runs on the current stream.
void fused_pointwise(const PointwiseProgram& p, const std::vector<at::Tensor>& inputs, const at::Tensor& out);

}  // namespace hb::cuda

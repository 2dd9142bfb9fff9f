// The CUDA kernel for fused pointwise programs (codegen/PointwiseProgram.h): one thread per output
// element walks the program in registers. Part of hb_runtime, built only where nvcc and a CUDA torch
// exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "codegen/PointwiseProgram.h"

namespace hb::cuda {

constexpr int kMaxProgram = 96;  // instructions
constexpr int kMaxInputs = 16;
constexpr int kMaxDims = 8;

// The program in the kernel's parameter layout, built once per fused node (not per launch).
struct DeviceProgram;
// nullptr when p, or a result of `ndim` dims, is over the limits above (the body then runs op by op).
std::shared_ptr<const DeviceProgram> make_device_program(const PointwiseProgram& p, int64_t ndim);

// out = p(inputs), broadcasting the inputs to out's shape; out is preallocated (any strides), every
// tensor on the same CUDA device with one dtype (f16, bf16, f32, f64). Runs on the current stream.
void fused_pointwise(const DeviceProgram& p, const std::vector<at::Tensor>& inputs, const at::Tensor& out);

}  // namespace hb::cuda

// The kernels for hintbackend::fused_pointwise nodes (passes/PointwiseFusion.h). CPU: a TensorIterator
// over the inputs (broadcasting, any strides, the output laid out as eager would) whose inner loop
// evaluates the group's PointwiseProgram (codegen/PointwiseProgram.h) chunk by chunk. CUDA (when
// built with it): codegen/cuda/FusedPointwise.cu into an output with the node's static shape and
// strides (eager's layout, from the IR), else a contiguous one of the broadcast shape.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "codegen/PointwiseProgram.h"

namespace hb::cuda {
struct DeviceProgram;  // codegen/cuda/FusedPointwise.h (CUDA builds)
}  // namespace hb::cuda

namespace hb::rt {

class FusedPointwiseKernel {
 public:
  FusedPointwiseKernel(PointwiseProgram program, const TensorType& result);
  // Whether run() handles these inputs: all on CPU, or all on one CUDA device in a CUDA build, with a
  // result within the device's size limit (kCpuMaxElements, kCudaMaxElements: where the kernel beats
  // ATen's per-op kernels); one floating dtype the program computes in. Otherwise the caller
  // runs the body op by op.
  bool accepts(const std::vector<at::Tensor>& inputs) const;
  // `out`: a preallocated result of the broadcast shape (an arena view), or undefined to allocate one.
  at::Tensor run(const std::vector<at::Tensor>& inputs, const at::Tensor& out = at::Tensor()) const;
  const PointwiseProgram& program() const { return program_; }

 private:
  PointwiseProgram program_;
  // The result's traced layout, when static: the CUDA kernel writes into eager's layout.
  std::vector<int64_t> static_shape_, static_stride_;
  int64_t static_numel_ = -1;  // -1: symbolic
  // Built once in CUDA builds; null without CUDA or when the program is over the kernel's limits.
  std::shared_ptr<const cuda::DeviceProgram> device_program_;
};

}  // namespace hb::rt

// The CPU kernel for hintbackend::fused_pointwise nodes (passes/PointwiseFusion.h): a TensorIterator
// over the inputs (broadcasting, any strides, the output laid out as eager would) whose inner loop
// evaluates the group's PointwiseProgram (codegen/PointwiseProgram.h) chunk by chunk.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "codegen/PointwiseProgram.h"

namespace hb::rt {

class FusedPointwiseKernel {
 public:
  explicit FusedPointwiseKernel(PointwiseProgram program) : program_(std::move(program)) {}
  // Whether run() handles these inputs: all on CPU, one floating dtype the program computes in.
  bool accepts(const std::vector<at::Tensor>& inputs) const;
  at::Tensor run(const std::vector<at::Tensor>& inputs) const;
  const PointwiseProgram& program() const { return program_; }

 private:
  PointwiseProgram program_;
};

}  // namespace hb::rt

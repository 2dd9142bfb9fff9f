// FlexAttention on the GPU without an S x S buffer: the tiled CUDA kernels with the user's score_mod,
// mask_mod and joint graph inlined (codegen/cuda/FlexTiledKernel.cuh, specialized and built at compile
// time by codegen/FlexKernelGen.h and codegen/HostCompiler.h). This side fills the kernels' arguments
// (codegen/FlexKernelAbi.h: HbFlexCudaArgs) from the tensors and launches them on torch's current stream.
//
// Results follow the reference (backend/runtime/FlexAttention.h): the same outputs, dtypes, layouts and
// base-2 logsumexp. Extra memory: none forward; backward a float dQ accumulator and delta rows
// ([B, Hq, Sq] x (D + 1) floats) and float accumulators for the buffer gradients. The backward adds dQ
// and buffer gradients with atomics: not bitwise repeatable (deterministic=True keeps it off).
// A generated function's error (an index out of range) is read back after the launch when the source
// can report one, and raised as eager raises it.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "backend/runtime/FlexAttention.h"
#include "backend/runtime/FlexTiledCpu.h"
#include "codegen/FlexKernelAbi.h"

namespace hb::rt {

struct FlexCudaFns {
  FlexCudaLaunch forward = nullptr;
  FlexCudaLaunch backward = nullptr;
  FlexCudaErrorString error_string = nullptr;
  int head_dim = 0;           // the head dim the kernels were built for
  int elem_bytes = 0;         // q/k/v's element size they were built for (2: bf16/fp16, 4: float32); 0 unchecked
  bool reports_errors = true;  // the generated code can report an error (it reads buffers or divides)
  bool run_joint = true;       // false: a row shift's backward, whose buffer gradients are exactly zero
  bool deterministic = false;  // deterministic=True: the backward adds dQ in key-tile order (dq_order)
  bool row_shift = false;      // the kernels run a row shift once per row (the backward takes row_lse)
};

// -> (out, logsumexp base 2, max_scores base 2), as flex_attention_forward.
std::vector<at::Tensor> flex_cuda_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const FlexCudaFns& fns, const FlexBlocks& blocks, double scale,
                                          const std::vector<at::Tensor>& score_buffers,
                                          const std::vector<at::Tensor>& mask_buffers);

FlexBackwardResult flex_cuda_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& grad_out,
                                      const std::optional<at::Tensor>& grad_logsumexp, const FlexCudaFns& fns,
                                      const FlexBlocks& blocks, double scale,
                                      const std::vector<at::Tensor>& score_buffers,
                                      const std::vector<at::Tensor>& mask_buffers,
                                      const std::vector<bool>& buffer_grads);

}  // namespace hb::rt

// FlexAttention on the CPU without an S x S buffer: FlashAttention's tiling with an online softmax, over the
// blocks the BlockMask lists (masked-out blocks are skipped, full blocks skip mask_mod), with the user's
// score_mod, mask_mod and joint graph as generated code (codegen/FlexKernelGen.h, called per tile through
// codegen/FlexKernelAbi.h). The tile products go to the BLAS that libtorch carries; everything runs in
// float (double for float64 q/k/v), threaded over torch's intra-op thread count. Extra memory is O(B*H*S*D) (working
// copies of q/k/v, the gradient accumulators) plus one tile per task.
//
// Results follow the reference (backend/runtime/FlexAttention.h): the same outputs, dtypes, layouts and
// base-2 logsumexp; buffer gradients are accumulated in double per worker thread and summed in a fixed order, so
// two runs with the same thread count give bitwise-equal results (deterministic=True holds by design).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "backend/runtime/FlexAttention.h"
#include "codegen/FlexKernelAbi.h"

namespace hb::rt {

// The generated entry points (null: the identity score_mod, no mask_mod, the identity joint).
struct FlexKernelFns {
  FlexScoreF32 score_f32 = nullptr;
  FlexScoreF64 score_f64 = nullptr;
  FlexMaskFn mask = nullptr;
  FlexJointF32 joint_f32 = nullptr;
  FlexJointF64 joint_f64 = nullptr;
};

// The BlockMask's kv block lists ([Bm, Hm, nQ] counts, [Bm, Hm, nQ, nKV] indices; Bm, Hm 1 or B, H;
// the full_* lists undefined when the mask has none) and its block sizes.
struct FlexBlocks {
  at::Tensor kv_num, kv_idx, full_num, full_idx;
  // The same blocks by key block ([Bm, Hm, nKV] counts, [Bm, Hm, nKV, nQ] query block indices): the CUDA
  // backward walks them; the CPU kernel does not read them.
  at::Tensor q_num, q_idx, full_q_num, full_q_idx;
  int64_t q_block = 128, kv_block = 128;
};

// -> (out, logsumexp base 2, max_scores base 2), as flex_attention_forward.
std::vector<at::Tensor> flex_tiled_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FlexKernelFns& fns, const FlexBlocks& blocks, double scale,
                                           const std::vector<at::Tensor>& score_buffers,
                                           const std::vector<at::Tensor>& mask_buffers);

// As flex_attention_backward; buffer_grads[i]: the joint scatters a gradient into score buffer i.
FlexBackwardResult flex_tiled_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& grad_out,
                                       const std::optional<at::Tensor>& grad_logsumexp, const FlexKernelFns& fns,
                                       const FlexBlocks& blocks, double scale,
                                       const std::vector<at::Tensor>& score_buffers,
                                       const std::vector<at::Tensor>& mask_buffers,
                                       const std::vector<bool>& buffer_grads);

}  // namespace hb::rt

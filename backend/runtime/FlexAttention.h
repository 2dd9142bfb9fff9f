// FlexAttention with PyTorch's reference semantics (torch/_higher_order_ops/flex_attention.py:
// math_attention and sdpa_dense_backward), in C++ over ATen, on CPU and CUDA. The score_mod,
// mask_mod, fw and joint subgraphs are evaluated once on broadcast index tensors
// b:[B,1,1,1] h:[1,H,1,1] q_idx:[1,1,Sq,1] kv_idx:[1,1,1,Skv] instead of vmap; their results are
// broadcast to [B,H,Sq,Skv]. This is the correct (not fast) path that later kernels are checked against.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

namespace hb::rt {

// Runs a compiled subgraph: inputs in placeholder order, outputs as the graph returns them
// (flattened: one IValue per element of the output tuple/list).
using SubgraphFn = std::function<std::vector<c10::IValue>(std::vector<c10::IValue>)>;

struct FlexMask {
  SubgraphFn mask_mod;          // (b, h, q_idx, kv_idx, *mask_buffers) -> bool; empty: no mask
  std::vector<at::Tensor> buffers;
};

// flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs)
// -> (out [B,Hq,Sq,Dv] in q's dtype, logsumexp [B,Hq,Sq] base 2 fp32, max_scores [B,Hq,Sq] base 2 fp32)
// GQA: Hq a multiple of Hkv. Fully masked rows give out 0 and logsumexp -inf.
std::vector<at::Tensor> flex_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const SubgraphFn& score_mod, const FlexMask& mask,
                                               double scale, const std::vector<at::Tensor>& score_buffers);

// flex_attention_backward(q, k, v, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
//   block_mask, scale, kernel_options, score_bufs, mask_bufs) -> (dq, dk, dv, [buffer grads])
// buffer grads: one entry per score buffer, undefined where the joint graph returns None.
struct FlexBackwardResult {
  at::Tensor dq, dk, dv;
  std::vector<at::Tensor> buffer_grads;
};
FlexBackwardResult flex_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& out, const at::Tensor& logsumexp,
                                           const at::Tensor& grad_out,
                                           const c10::optional<at::Tensor>& grad_logsumexp,
                                           const SubgraphFn& fw_graph, const SubgraphFn& joint_graph,
                                           const FlexMask& mask, double scale,
                                           const std::vector<at::Tensor>& score_buffers);

// The captured buffers' gradients of a score_mod whose score gradient is `grad_score` (broadcastable to
// [B, H, Sq, Skv]): the joint graph's trailing outputs evaluated on the index grid, with `scores` as its
// score argument, each cast to its buffer's dtype and shape (undefined where the joint returns None).
// Kernels that compute the score gradient themselves (cuDNN's dBias) scatter it into the buffers here.
std::vector<at::Tensor> flex_buffer_grads(const SubgraphFn& joint_graph, const at::Tensor& scores,
                                          const at::Tensor& grad_score, at::IntArrayRef bhqk,
                                          const std::vector<at::Tensor>& score_buffers);

// The shape rules every FlexAttention kernel checks: 4-d q, k, v [B, H, S, D]; k and v agreeing; Bkv 1 or
// Bq; Hq a multiple of Hkv (GQA).
void check_flex_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// t with its dims laid out in the order of ref_strides (flex's fake implementation's layout for out, dq,
// dk, dv: _permute_strides): t itself where it has that layout already, else a copy. t must be a fresh
// result (never a view of an input): the kernels return it as their own.
at::Tensor like_strides_of(const at::Tensor& t, at::IntArrayRef ref_strides);
// The strides like_strides_of gives a tensor of `sizes` (for kernels that write that layout directly).
std::vector<int64_t> flex_layout_strides(at::IntArrayRef sizes, at::IntArrayRef ref_strides);

// A flex node's captured values (the score_mod's or mask_mod's tuple) as tensors: tensors as they are, the
// Python numbers a dynamic-shape score_mod captures (SymInts: a sequence length) as 0-dim CPU tensors of
// int64, float64 or bool. None gives none.
std::vector<at::Tensor> captured_tensors(const c10::IValue& tuple);
// `fn` with its inputs from `base` on replaced by `captured` as they are (numbers stay numbers): the
// reference's subgraphs take the captured values in the types they were traced with.
SubgraphFn with_captured(SubgraphFn fn, size_t base, std::vector<c10::IValue> captured);

// flex_lib::zeros_and_scatter(shape, indices, values) = zeros(shape).index_put_(indices, values,
// accumulate=True), with indices and values first broadcast to one shape (they arrive as broadcast
// index tensors from the joint graph). The gradient scatter into captured buffers.
at::Tensor zeros_and_scatter(at::IntArrayRef shape, const std::vector<at::Tensor>& indices,
                             const at::Tensor& values);

}  // namespace hb::rt

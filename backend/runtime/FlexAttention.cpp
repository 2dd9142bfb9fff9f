// FlexAttention forward/backward with PyTorch's reference semantics, over plain ATen ops so it runs
// on any device. Mirrors torch/_higher_order_ops/flex_attention.py step by step (_math_attention_inner,
// math_attention, sdpa_dense_backward), keeping its casts: scores in fp32 (fp64 for fp64 inputs), the
// P@V and dS@K products in the input dtype. Subgraphs run once on broadcast index tensors (int32, as
// FlexAttention traces them) instead of under vmap; results are expanded to [B, H, Sq, Skv].
#include "backend/runtime/FlexAttention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_safe_softmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/broadcast_tensors.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace hb::rt {
namespace {

// The kernels report logsumexp/max in base 2; the reference divides natural logs by ln 2.
constexpr double kLn2 = 0.693147180559945309417232121458176568;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The index arguments of score_mod / mask_mod, shaped to broadcast against [B, H, Sq, Skv].
struct IndexGrid {
  at::Tensor b, h, q_idx, kv_idx;
  std::vector<int64_t> shape;  // [B, H, Sq, Skv]
};

IndexGrid make_index_grid(int64_t B, int64_t H, int64_t Sq, int64_t Skv, const at::Device& device) {
  // int32 like the 0-dim example values FlexAttention traces the subgraphs with.
  auto opts = at::TensorOptions().dtype(at::kInt).device(device);
  return {at::arange(B, opts).view({B, 1, 1, 1}), at::arange(H, opts).view({1, H, 1, 1}),
          at::arange(Sq, opts).view({1, 1, Sq, 1}), at::arange(Skv, opts).view({1, 1, 1, Skv}),
          {B, H, Sq, Skv}};
}

at::ScalarType working_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor first_tensor(const std::vector<c10::IValue>& outs, const char* what) {
  TORCH_CHECK(!outs.empty() && outs[0].isTensor(), what, " must return a tensor first, got ",
              outs.empty() ? "nothing" : outs[0].tagKind());
  return outs[0].toTensor();
}

// mask_mod(b, h, q_idx, kv_idx, *buffers) as a bool [B, H, Sq, Skv]; undefined when there is no mask.
at::Tensor eval_mask(const FlexMask& mask, const IndexGrid& g) {
  if (!mask.mask_mod) return {};
  std::vector<c10::IValue> in{g.b, g.h, g.q_idx, g.kv_idx};
  in.insert(in.end(), mask.buffers.begin(), mask.buffers.end());
  return first_tensor(mask.mask_mod(std::move(in)), "mask_mod").to(at::kBool).expand(g.shape);
}

// score_mod(score, b, h, q_idx, kv_idx, *buffers) expanded to [B, H, Sq, Skv]; an empty fn is identity.
at::Tensor eval_score_mod(const SubgraphFn& score_mod, const at::Tensor& scores, const IndexGrid& g,
                          const std::vector<at::Tensor>& buffers) {
  if (!score_mod) return scores;
  std::vector<c10::IValue> in{scores, g.b, g.h, g.q_idx, g.kv_idx};
  in.insert(in.end(), buffers.begin(), buffers.end());
  // Cast back: a buffer of a wider dtype must not change the working precision.
  return first_tensor(score_mod(std::move(in)), "score_mod").to(scores.scalar_type()).expand(g.shape);
}

// Brings k or v to q's batch and head count: GQA repeats each kv head G times, Bkv = 1 broadcasts.
at::Tensor broadcast_kv(const at::Tensor& kv, int64_t Bq, int64_t G) {
  at::Tensor out = G == 1 ? kv : kv.repeat_interleave(G, /*dim=*/1);
  return out.expand({Bq, out.size(1), out.size(2), out.size(3)});
}

// _math_attention_inner: scaled scores before score_mod, and after score_mod with masked entries -inf.
struct InnerScores {
  at::Tensor scores, post_mod, mask;  // mask undefined when there is none
};

InnerScores math_attention_inner(const at::Tensor& q, const at::Tensor& k, const SubgraphFn& score_mod,
                                 const FlexMask& mask, double scale, const std::vector<at::Tensor>& buffers,
                                 const IndexGrid& g) {
  const auto wp = working_dtype(q);
  at::Tensor scores = q.to(wp).matmul(k.to(wp).transpose(-2, -1)).mul(scale);
  at::Tensor post_mod = eval_score_mod(score_mod, scores, g, buffers);
  at::Tensor keep = eval_mask(mask, g);
  if (keep.defined()) post_mod = post_mod.masked_fill(keep.logical_not(), -kInf);
  return {scores, post_mod, keep};
}

// Buffer gradients from the joint graph's trailing outputs, cast to each buffer's dtype and layout.
std::vector<at::Tensor> collect_buffer_grads(const std::vector<c10::IValue>& joint_out,
                                             const std::vector<at::Tensor>& buffers) {
  TORCH_CHECK(joint_out.size() == 5 + buffers.size(), "flex_attention_backward: joint graph returned ",
              joint_out.size(), " outputs, expected 5 + ", buffers.size(), " score buffers");
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const c10::IValue& grad = joint_out[5 + i];
    if (grad.isNone()) {
      grads.emplace_back();
      continue;
    }
    const at::Tensor& buf = buffers[i];
    grads.push_back(grad.toTensor().to(buf.scalar_type()).expand(buf.sizes()).contiguous());
  }
  return grads;
}

// joint_graph(score, b, h, q_idx, kv_idx, grad_score, *buffers): the score gradient expanded to
// [B, H, Sq, Skv] (zeros if the joint returns None) and the flat outputs for the buffer gradients.
std::pair<at::Tensor, std::vector<c10::IValue>> eval_joint(const SubgraphFn& joint, const at::Tensor& scores,
                                                           const at::Tensor& grad_score, const IndexGrid& g,
                                                           const std::vector<at::Tensor>& buffers) {
  if (!joint) {  // identity score_mod
    std::vector<c10::IValue> out(5 + buffers.size());
    return {grad_score, out};
  }
  std::vector<c10::IValue> in{scores, g.b, g.h, g.q_idx, g.kv_idx, grad_score};
  in.insert(in.end(), buffers.begin(), buffers.end());
  std::vector<c10::IValue> out = joint(std::move(in));
  TORCH_CHECK(!out.empty(), "flex_attention_backward: joint graph returned nothing");
  at::Tensor grad = out[0].isNone() ? at::zeros_like(scores) : out[0].toTensor().expand(g.shape);
  return {grad, std::move(out)};
}

}  // namespace

void check_flex_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flex_attention expects 4-d q, k, v [B, H, S, D], got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2),
              "flex_attention: k ", k.sizes(), " and v ", v.sizes(), " must agree in B, H and S");
  TORCH_CHECK(q.size(3) == k.size(3), "flex_attention: q and k head dims differ: ", q.size(3), " vs ",
              k.size(3));
  TORCH_CHECK(q.size(0) == k.size(0) || (q.size(0) > 1 && k.size(0) == 1),
              "Bq and Bkv must broadcast. Got Bq=", q.size(0), " and Bkv=", k.size(0));
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "flex_attention: Hq=", q.size(1),
              " must be a multiple of Hkv=", k.size(1));
}

// _permute_strides: dims laid out in the same order as the strides of ref (ties keep inner dims inner),
// with the last dim kept unit-stride. Matches the fake impl's layout.
std::vector<int64_t> flex_layout_strides(at::IntArrayRef sizes, at::IntArrayRef ref_strides) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> fill(n);  // innermost dim first
  std::iota(fill.begin(), fill.end(), 0);
  std::stable_sort(fill.begin(), fill.end(), [&](int64_t a, int64_t b) { return ref_strides[a] > ref_strides[b]; });
  std::reverse(fill.begin(), fill.end());
  if (fill.front() != n - 1) {
    fill.erase(std::find(fill.begin(), fill.end(), n - 1));
    fill.insert(fill.begin(), n - 1);
  }
  std::vector<int64_t> strides(n);
  int64_t running = 1;
  for (int64_t d : fill) {
    strides[d] = running;
    running *= sizes[d];
  }
  return strides;
}

at::Tensor like_strides_of(const at::Tensor& t, at::IntArrayRef ref_strides) {
  const std::vector<int64_t> strides = flex_layout_strides(t.sizes(), ref_strides);
  bool same = true;  // already laid out so (strides of size-1 dims aside): the tensor itself, no copy
  for (int64_t d = 0; d < t.dim() && same; ++d) same = t.size(d) == 1 || t.stride(d) == strides[d];
  return same ? t : at::empty_strided(t.sizes(), strides, t.options()).copy_(t);
}

std::vector<at::Tensor> flex_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const SubgraphFn& score_mod, const FlexMask& mask,
                                               double scale, const std::vector<at::Tensor>& score_buffers) {
  check_flex_shapes(q, k, v);
  const int64_t B = q.size(0), H = q.size(1), G = q.size(1) / k.size(1);
  const at::Tensor key = broadcast_kv(k, B, G), value = broadcast_kv(v, B, G);
  const IndexGrid g = make_index_grid(B, H, q.size(2), k.size(2), q.device());
  const at::Tensor s = math_attention_inner(q, key, score_mod, mask, scale, score_buffers, g).post_mod;

  // Fully masked rows: logsumexp -inf (logsumexp alone could give nan there), probabilities 0.
  const at::Tensor masked_rows = s.eq(-kInf).all(-1);
  const at::Tensor lse = s.logsumexp(-1).masked_fill(masked_rows, -kInf);
  const at::Tensor max_scores = std::get<0>(s.max(-1));
  const at::Tensor p = at::_safe_softmax(s, -1);
  const at::Tensor out = p.to(q.scalar_type()).matmul(value.to(q.scalar_type()));
  return {like_strides_of(out, q.strides()), lse / kLn2, max_scores / kLn2};
}

FlexBackwardResult flex_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& out, const at::Tensor& logsumexp,
                                           const at::Tensor& grad_out,
                                           const c10::optional<at::Tensor>& grad_logsumexp,
                                           const SubgraphFn& fw_graph, const SubgraphFn& joint_graph,
                                           const FlexMask& mask, double scale,
                                           const std::vector<at::Tensor>& score_buffers) {
  check_flex_shapes(q, k, v);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "Backward pass with mixed query, key, and value dtype is not supported, got ", q.scalar_type(),
              ", ", k.scalar_type(), ", ", v.scalar_type());
  const auto dtype = q.scalar_type();
  const auto wp = working_dtype(q);
  const int64_t B = q.size(0), H = q.size(1), G = q.size(1) / k.size(1);
  const at::Tensor key = broadcast_kv(k, B, G), value = broadcast_kv(v, B, G);
  const IndexGrid g = make_index_grid(B, H, q.size(2), k.size(2), q.device());

  const at::Tensor d_out = grad_out.defined() ? grad_out : at::zeros_like(out);
  // Undo the forward's change to base 2, for the value and for its gradient.
  const at::Tensor lse = logsumexp.to(wp) * kLn2;
  const at::Tensor d_lse = grad_logsumexp.has_value() && grad_logsumexp->defined()
                               ? grad_logsumexp->to(wp) / kLn2
                               : at::zeros_like(lse);

  // Recompute P from the saved logsumexp; rows the forward fully masked have P = 0.
  const InnerScores inner = math_attention_inner(q, key, fw_graph, mask, scale, score_buffers, g);
  const at::Tensor p = (inner.post_mod - lse.unsqueeze(-1)).exp().masked_fill(lse.eq(-kInf).unsqueeze(-1), 0);

  // Softmax backward, plus the logsumexp gradient (d lse / d s = P).
  const at::Tensor d_value = p.to(dtype).transpose(-2, -1).matmul(d_out);
  const at::Tensor d_p = d_out.to(wp).matmul(value.to(wp).transpose(-2, -1));
  const at::Tensor delta = (out.to(wp) * d_out.to(wp)).sum(-1, /*keepdim=*/true);
  const at::Tensor d_post_mod = p * (d_p - delta + d_lse.unsqueeze(-1));

  // Through score_mod (the joint graph also scatters the captured buffers' gradients), then the mask.
  auto [d_scores, joint_out] = eval_joint(joint_graph, inner.scores, d_post_mod, g, score_buffers);
  d_scores = (d_scores * scale).to(dtype);
  if (inner.mask.defined()) d_scores = d_scores.masked_fill(inner.mask.logical_not(), 0);

  // Fold the broadcast kv heads (GQA) and batch (Bkv = 1) back by summing.
  const at::Tensor d_query = d_scores.matmul(key);
  const auto fold_heads = [&](const at::Tensor& t) {
    return t.view({B, -1, G, t.size(-2), t.size(-1)}).sum(2);
  };
  at::Tensor d_key = like_strides_of(fold_heads(d_scores.transpose(-2, -1).matmul(q)), k.strides());
  at::Tensor d_val = like_strides_of(fold_heads(d_value), v.strides());
  if (k.size(0) != B) {
    d_key = d_key.sum(0, /*keepdim=*/true);
    d_val = d_val.sum(0, /*keepdim=*/true);
  }
  return {like_strides_of(d_query, q.strides()), d_key, d_val, collect_buffer_grads(joint_out, score_buffers)};
}

std::vector<at::Tensor> flex_buffer_grads(const SubgraphFn& joint_graph, const at::Tensor& scores,
                                          const at::Tensor& grad_score, at::IntArrayRef bhqk,
                                          const std::vector<at::Tensor>& score_buffers) {
  TORCH_CHECK(bhqk.size() == 4, "flex_buffer_grads: [B, H, Sq, Skv] expected");
  const IndexGrid g = make_index_grid(bhqk[0], bhqk[1], bhqk[2], bhqk[3], grad_score.device());
  return collect_buffer_grads(eval_joint(joint_graph, scores, grad_score, g, score_buffers).second, score_buffers);
}

std::vector<at::Tensor> captured_tensors(const c10::IValue& tuple) {
  std::vector<at::Tensor> out;
  if (tuple.isNone()) return out;
  for (const c10::IValue& x : tuple.toTupleRef().elements()) {
    if (x.isTensor()) out.push_back(x.toTensor());
    else if (x.isInt() || x.isSymInt()) out.push_back(at::scalar_tensor(x.isInt() ? x.toInt() : x.toSymInt().guard_int(__FILE__, __LINE__), at::kLong));
    else if (x.isDouble()) out.push_back(at::scalar_tensor(x.toDouble(), at::kDouble));
    else if (x.isBool()) out.push_back(at::scalar_tensor(x.toBool(), at::kBool));
    else TORCH_CHECK(false, "flex_attention: a captured value of type ", x.tagKind(), " is not supported");
  }
  return out;
}

SubgraphFn with_captured(SubgraphFn fn, size_t base, std::vector<c10::IValue> captured) {
  if (!fn) return fn;
  return [fn = std::move(fn), base, captured = std::move(captured)](std::vector<c10::IValue> in) {
    for (size_t k = 0; k < captured.size() && base + k < in.size(); ++k) in[base + k] = captured[k];
    return fn(std::move(in));
  };
}

at::Tensor zeros_and_scatter(at::IntArrayRef shape, const std::vector<at::Tensor>& indices,
                             const at::Tensor& values) {
  // The indices come as broadcast grids ([1,H,1,1], [1,1,Sq,Skv], ...) while values are full; vmap's
  // batching rule expands each index to the values' shape, which broadcasting all of them reproduces.
  std::vector<at::Tensor> operands(indices);
  operands.push_back(values);
  std::vector<at::Tensor> expanded = at::broadcast_tensors(operands);
  c10::List<std::optional<at::Tensor>> index_list;
  for (size_t i = 0; i < indices.size(); ++i) index_list.push_back(expanded[i]);
  return at::zeros(shape, values.options()).index_put_(index_list, expanded.back(), /*accumulate=*/true);
}

}  // namespace hb::rt

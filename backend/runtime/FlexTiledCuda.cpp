#include "backend/runtime/FlexTiledCuda.h"

#include <c10/util/Exception.h>

#ifdef HB_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>
#include <limits>
#endif

namespace hb::rt {

#ifdef HB_WITH_CUDA
namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;

// A [B, H, S, D] operand as the kernels read it: the last dim contiguous, rows 16-byte aligned (a copy
// otherwise).
at::Tensor readable(const at::Tensor& t) {
  const int64_t e = t.element_size();
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int d = 0; d < 3 && ok; ++d) ok = (t.stride(d) * e) % 16 == 0 || t.size(d) == 1;
  return ok ? t : t.contiguous();
}

// q, k, v (and the backward's out and dO) with zero columns up to the head dim the kernels were built
// for (codegen/FlexKernelAbi.h, flex_cuda_head_dim); as they are where they have it.
at::Tensor padded(const at::Tensor& t, int head_dim) {
  return t.size(3) == head_dim ? t : at::constant_pad_nd(t, {0, head_dim - t.size(3)}, 0);
}

// The first `d` columns of a padded result, in a fresh tensor laid out like `ref` (flex_layout_strides).
at::Tensor unpadded(const at::Tensor& t, int64_t d, at::IntArrayRef ref_strides) {
  if (t.size(3) == d) return like_strides_of(t, ref_strides);
  const at::Tensor cut = t.narrow(3, 0, d);
  at::Tensor r = at::empty_strided(cut.sizes(), flex_layout_strides(cut.sizes(), ref_strides), cut.options());
  return r.copy_(cut);
}

void strides3(const at::Tensor& t, long long (&s)[3]) {
  for (int d = 0; d < 3; ++d) s[d] = t.size(d) == 1 ? 0 : t.stride(d);
}

// One BlockMask list pair as int32 on the device (kept alive in `keep`).
HbFlexBlockList block_list(const at::Tensor& num, const at::Tensor& idx, const at::Tensor& q,
                           std::vector<at::Tensor>& keep, const char* what) {
  HbFlexBlockList l{};
  if (!num.defined() || !idx.defined()) return l;
  TORCH_CHECK(num.dim() == 3 && idx.dim() == 4, "flex_attention: the block mask's ", what, " lists have ", num.dim(),
              " and ", idx.dim(), " dims, expected 3 and 4");
  TORCH_CHECK((num.size(0) == 1 || num.size(0) == q.size(0)) && (num.size(1) == 1 || num.size(1) == q.size(1)) &&
                  idx.size(0) == num.size(0) && idx.size(1) == num.size(1) && idx.size(2) == num.size(2),
              "flex_attention: the block mask's ", what, " lists ", num.sizes(), " / ", idx.sizes(),
              " do not fit B=", q.size(0), ", H=", q.size(1), " (was the BlockMask made for other shapes?)");
  const at::Tensor n = num.to(q.device(), at::kInt).contiguous(), i = idx.to(q.device(), at::kInt).contiguous();
  keep.push_back(n);
  keep.push_back(i);
  l.num = n.data_ptr<int>();
  l.idx = i.data_ptr<int>();
  l.bm = n.size(0), l.hm = n.size(1), l.rows = n.size(2), l.cols = i.size(3);
  return l;
}

// Captured buffers as the generated code reads them: device tensors (a captured number, a 0-dim CPU
// tensor, moves to the GPU), described by sizes and strides.
void describe(const std::vector<at::Tensor>& bufs, const at::Tensor& q, HbFlexBuffer* out,
              std::vector<at::Tensor>& keep, const char* what) {
  TORCH_CHECK(static_cast<int>(bufs.size()) <= kFlexMaxCudaBuffers, "flex_attention: ", bufs.size(), " ", what,
              " buffers (the CUDA kernel takes ", kFlexMaxCudaBuffers, ")");
  for (size_t i = 0; i < bufs.size(); ++i) {
    at::Tensor b = bufs[i];
    if (b.device() != q.device()) {
      TORCH_CHECK(b.dim() == 0 || b.device().is_cpu(), "flex_attention: ", what, " buffer ", i, " is on ",
                  b.device(), ", q on ", q.device());
      b = b.to(q.device());
    }
    TORCH_CHECK(b.dim() <= 8, "flex_attention: ", what, " buffer ", i, " has rank ", b.dim(), " (at most 8)");
    keep.push_back(b);
    HbFlexBuffer& d = out[i];
    std::memset(&d, 0, sizeof d);
    d.data = b.data_ptr();
    d.rank = static_cast<int>(b.dim());
    for (int64_t k = 0; k < b.dim(); ++k) d.sizes[k] = b.size(k), d.strides[k] = b.stride(k);
  }
}

// The arguments both directions share: sizes, scale, block sizes and the captured buffers.
HbFlexCudaArgs common(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlexCudaFns& fns,
                      double scale, const FlexBlocks& blocks, const std::vector<at::Tensor>& score_buffers,
                      const std::vector<at::Tensor>& mask_buffers, std::vector<at::Tensor>& keep) {
  check_flex_shapes(q, k, v);
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device(),
              "flex_attention: the generated CUDA kernel needs q, k, v on one GPU, got ", q.device(), ", ", k.device(),
              ", ", v.device());
  TORCH_CHECK(q.size(3) == fns.head_dim && k.size(3) == fns.head_dim && v.size(3) == fns.head_dim,
              "flex_attention: the CUDA kernel was built for head dim ", fns.head_dim, ", got q ", q.sizes(), ", k ",
              k.sizes(), " and v ", v.sizes());
  TORCH_CHECK(blocks.q_block > 0 && blocks.kv_block > 0, "flex_attention: bad block sizes");
  // The kernels read q, k, v (and the backward's out and dO, converted to q's dtype) as the element type
  // they were built for: float32 (the SIMT kernels) or a 2-byte one.
  TORCH_CHECK(fns.elem_bytes == 0 || (q.element_size() == fns.elem_bytes && k.scalar_type() == q.scalar_type() &&
                                      v.scalar_type() == q.scalar_type()),
              "flex_attention: the CUDA kernel was built for ", fns.elem_bytes, "-byte q/k/v, got ", q.scalar_type(),
              ", ", k.scalar_type(), ", ", v.scalar_type());
  HbFlexCudaArgs a;
  std::memset(&a, 0, sizeof a);
  a.B = q.size(0), a.Hq = q.size(1), a.Sq = q.size(2);
  a.Bkv = k.size(0), a.Hkv = k.size(1), a.Skv = k.size(2);
  a.scale = static_cast<float>(scale);
  a.q_block = blocks.q_block, a.kv_block = blocks.kv_block;
  describe(score_buffers, q, a.score_buffers, keep, "score_mod");
  describe(mask_buffers, q, a.mask_buffers, keep, "mask_mod");
  return a;
}

// The first error the generated code reported, raised as eager raises it.
void raise_reported(const at::Tensor& err, size_t nscore) {
  const at::Tensor h = err.cpu();
  const int64_t* e = h.data_ptr<int64_t>();
  if (e[0] == 0) return;
  if (e[0] == kFlexErrorIndex) {
    const bool mask = e[1] >= static_cast<int64_t>(nscore);
    TORCH_CHECK_INDEX(false, "flex_attention: the ", mask ? "mask_mod" : "score_mod", " indexes captured buffer ",
                      mask ? e[1] - static_cast<int64_t>(nscore) : e[1], " out of range: index ", e[2],
                      " is out of bounds for dimension with size ", e[3], " (at b=", e[4], ", h=", e[5], ")");
  }
  TORCH_CHECK(e[0] != kFlexErrorWindow, "flex_attention: deterministic=True: internal error in the generated CUDA "
              "backward: buffer gradient window ", e[2], " of row ", e[1], " starts ", e[3], " keys from its row's "
              "first, off the row; please report it with a dump (dump_dir), and drop deterministic=True meanwhile");
  TORCH_CHECK(e[0] != kFlexErrorOrder, "flex_attention: deterministic=True: in the generated CUDA backward, key tile ",
              e[3], " waited past its turn to add into dQ at query row ", e[2], " (b=", e[4], ", h=", e[5],
              "): the BlockMask's kv and q block lists do not describe the same blocks. Build the BlockMask with "
              "create_block_mask (or fix its q lists), or drop deterministic=True");
  TORCH_CHECK(false, "flex_attention: integer division or modulo by zero in the score_mod or mask_mod (at b=", e[4],
              ", h=", e[5], ")");
}

// Launches on torch's current stream; where the generated code can report an error, reads it back and
// raises it.
void launch(FlexCudaLaunch fn, const FlexCudaFns& fns, HbFlexCudaArgs& a, const at::Tensor& q, size_t nscore) {
  at::Tensor err;
  if (fns.reports_errors || a.dq_order) {
    err = at::zeros({6}, q.options().dtype(at::kLong));
    a.error = reinterpret_cast<long long*>(err.data_ptr<int64_t>());
  }
  const int rc = fn(&a, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  TORCH_CHECK(rc == 0, "flex_attention: launching the generated CUDA kernel failed: ",
              fns.error_string ? fns.error_string(rc) : std::to_string(rc));
  if (err.defined()) raise_reported(err, nscore);
}

}  // namespace

std::vector<at::Tensor> flex_cuda_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                          const FlexCudaFns& fns, const FlexBlocks& blocks, double scale,
                                          const std::vector<at::Tensor>& score_buffers,
                                          const std::vector<at::Tensor>& mask_buffers) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  check_flex_shapes(q_in, k_in, v_in);
  const int hd = fns.head_dim;
  const at::Tensor q = readable(padded(q_in, hd)), k = readable(padded(k_in, hd)), v = readable(padded(v_in, hd));
  std::vector<at::Tensor> keep;
  HbFlexCudaArgs a = common(q, k, v, fns, scale, blocks, score_buffers, mask_buffers, keep);
  a.kv_list = block_list(blocks.kv_num, blocks.kv_idx, q, keep, "kv");
  a.kv_full_list = block_list(blocks.full_num, blocks.full_idx, q, keep, "full kv");
  TORCH_CHECK(a.kv_list.num != nullptr, "flex_attention: the block mask has no kv block lists");
  const std::vector<int64_t> sizes = {a.B, a.Hq, a.Sq, v.size(3)};
  at::Tensor out = at::empty_strided(sizes, flex_layout_strides(sizes, q_in.strides()), q.options());
  const int64_t dv = v_in.size(3);
  at::Tensor lse = at::empty({a.B, a.Hq, a.Sq}, q.options().dtype(at::kFloat));
  at::Tensor mx = at::empty({a.B, a.Hq, a.Sq}, q.options().dtype(at::kFloat));
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v = v.data_ptr(), a.out = out.data_ptr();
  strides3(q, a.q_strides), strides3(k, a.k_strides), strides3(v, a.v_strides), strides3(out, a.o_strides);
  a.lse = lse.data_ptr<float>(), a.max_scores = mx.data_ptr<float>();
  launch(fns.forward, fns, a, q, score_buffers.size());
  if (dv != hd) out = unpadded(out, dv, q_in.strides());
  return {out, lse, mx};
}

FlexBackwardResult flex_cuda_backward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                      const at::Tensor& out_in, const at::Tensor& logsumexp, const at::Tensor& grad_out,
                                      const std::optional<at::Tensor>& grad_logsumexp, const FlexCudaFns& fns,
                                      const FlexBlocks& blocks, double scale,
                                      const std::vector<at::Tensor>& score_buffers,
                                      const std::vector<at::Tensor>& mask_buffers,
                                      const std::vector<bool>& buffer_grads) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  TORCH_CHECK(q_in.scalar_type() == k_in.scalar_type() && q_in.scalar_type() == v_in.scalar_type(),
              "Backward pass with mixed query, key, and value dtype is not supported, got ", q_in.scalar_type(), ", ",
              k_in.scalar_type(), ", ", v_in.scalar_type());
  check_flex_shapes(q_in, k_in, v_in);
  const int hd = fns.head_dim;
  const at::Tensor q = readable(padded(q_in, hd)), k = readable(padded(k_in, hd)), v = readable(padded(v_in, hd));
  std::vector<at::Tensor> keep;
  HbFlexCudaArgs a = common(q, k, v, fns, scale, blocks, score_buffers, mask_buffers, keep);
  a.q_list = block_list(blocks.q_num, blocks.q_idx, q, keep, "q");
  a.q_full_list = block_list(blocks.full_q_num, blocks.full_q_idx, q, keep, "full q");
  TORCH_CHECK(a.q_list.num != nullptr, "flex_attention: the block mask has no q block lists");
  const at::Tensor out = readable(padded(out_in.to(q.scalar_type()), hd));
  const at::Tensor dout = grad_out.defined() ? readable(padded(grad_out.to(q.scalar_type()), hd)) : at::zeros_like(out);
  const at::Tensor lse = logsumexp.to(at::kFloat).contiguous();
  const bool has_dlse = grad_logsumexp.has_value() && grad_logsumexp->defined();
  const at::Tensor dlse = has_dlse ? grad_logsumexp->to(at::kFloat).contiguous() : at::Tensor();
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor delta = at::empty({a.B, a.Hq, a.Sq}, f32);
  // dQ summed in float a launch of (b, kv head) pairs at a time (flex_dq_pairs), in a workspace the
  // launcher zeroes before each launch and rounds into dq.
  a.dq_pairs = flex_dq_pairs(a.B * a.Hkv, a.Skv);
  at::Tensor dq_acc = at::empty({a.dq_pairs * (a.Hq / a.Hkv) * a.Sq, q.size(3)}, f32);
  at::Tensor dq = at::empty({a.B, a.Hq, a.Sq, q.size(3)}, q.options());
  at::Tensor dk = at::empty({a.B, a.Hkv, a.Skv, k.size(3)}, q.options());
  at::Tensor dv = at::empty({a.B, a.Hkv, a.Skv, v.size(3)}, q.options());
  std::vector<at::Tensor> grads(score_buffers.size());
  for (size_t i = 0; i < score_buffers.size(); ++i)
    if (i < buffer_grads.size() && buffer_grads[i]) {
      grads[i] = at::zeros(score_buffers[i].sizes(), f32);
      a.score_buffers[i].grad = grads[i].data_ptr<float>();
    }
  a.q = q.data_ptr(), a.k = k.data_ptr(), a.v = v.data_ptr(), a.out = const_cast<void*>(out.data_ptr());
  a.dout = dout.data_ptr();
  strides3(q, a.q_strides), strides3(k, a.k_strides), strides3(v, a.v_strides), strides3(out, a.o_strides);
  strides3(dout, a.do_strides);
  a.lse = const_cast<float*>(lse.data_ptr<float>());
  a.dlse = has_dlse ? dlse.data_ptr<float>() : nullptr;
  a.run_joint = fns.run_joint ? 1 : 0;
  a.delta = delta.data_ptr<float>(), a.dq = dq_acc.data_ptr<float>(), a.dq_out = dq.data_ptr();
  a.dk = dk.data_ptr(), a.dv = dv.data_ptr();
  // deterministic=True: a counter per 64 query rows, then each key tile's rank per query block
  // (FlexTiledKernel.cuh, dq_turn_wait).
  at::Tensor order;
  if (fns.deterministic) {
    a.kv_list = block_list(blocks.kv_num, blocks.kv_idx, q, keep, "kv");
    a.kv_full_list = block_list(blocks.full_num, blocks.full_idx, q, keep, "full kv");
    TORCH_CHECK(a.kv_list.num != nullptr, "flex_attention: the block mask has no kv block lists");
    const int64_t counters = a.B * a.Hq * ((a.Sq + 63) / 64);
    const int64_t ranks = std::max(a.kv_list.bm, a.kv_full_list.bm) * std::max(a.kv_list.hm, a.kv_full_list.hm) *
                          a.kv_list.rows * ((a.Skv + 63) / 64);
    order = at::zeros({counters + ranks}, q.options().dtype(at::kInt));
    a.dq_order = order.data_ptr<int>();
    a.dq_rank = a.dq_order + counters;
  }
  // deterministic=True with a buffer gradient: the line sums' windows, one per (b, q head, 64-key tile), each
  // long enough for every row (FlexTiledKernel.cuh, line_reduce; about B Hq Sq Skv / 16 bytes), then the
  // merged rows (flex_window_rows); flex_window_len and flex_window_floats (FlexKernelAbi.h) size them.
  at::Tensor windows, starts;
  const bool any_grad = std::find(buffer_grads.begin(), buffer_grads.end(), true) != buffer_grads.end();
  if (fns.deterministic && any_grad && fns.run_joint) {
    const int64_t rows = a.B * a.Hq, tiles = (a.Skv + 63) / 64;
    a.scatter_len = flex_window_len(a.Sq);
    windows = at::zeros({flex_window_floats(rows, tiles, a.scatter_len)}, f32);
    starts = at::full({rows * (tiles + 1)}, std::numeric_limits<int64_t>::min(), q.options().dtype(at::kLong));
    a.scatter_win = windows.data_ptr<float>();
    a.scatter_start = reinterpret_cast<long long*>(starts.data_ptr<int64_t>());
  }
  at::Tensor row_lse;  // a row shift: the identity's logsumexp, which the kernels compute first
  if (fns.row_shift) {
    row_lse = at::empty({a.B, a.Hq, a.Sq}, f32);
    a.row_lse = row_lse.data_ptr<float>();
  }
  launch(fns.backward, fns, a, q, score_buffers.size());
  if (a.Bkv != a.B) {  // k, v broadcast over the batch: their gradients sum over it
    dk = dk.sum(0, /*keepdim=*/true);
    dv = dv.sum(0, /*keepdim=*/true);
  }
  dq_acc.reset();
  FlexBackwardResult r{unpadded(dq, q_in.size(3), q_in.strides()),
                       unpadded(dk, k_in.size(3), k_in.strides()), unpadded(dv, v_in.size(3), v_in.strides()), {}};
  for (size_t i = 0; i < score_buffers.size(); ++i)
    r.buffer_grads.push_back(grads[i].defined() ? grads[i].to(score_buffers[i].scalar_type()) : at::Tensor());
  return r;
}

#else  // a build without CUDA: kernel selection never picks these

std::vector<at::Tensor> flex_cuda_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const FlexCudaFns&,
                                          const FlexBlocks&, double, const std::vector<at::Tensor>&,
                                          const std::vector<at::Tensor>&) {
  TORCH_CHECK(false, "flex_attention: this hintbackend was built without CUDA");
}

FlexBackwardResult flex_cuda_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      const FlexCudaFns&, const FlexBlocks&, double, const std::vector<at::Tensor>&,
                                      const std::vector<at::Tensor>&, const std::vector<bool>&) {
  TORCH_CHECK(false, "flex_attention: this hintbackend was built without CUDA");
}

#endif

}  // namespace hb::rt

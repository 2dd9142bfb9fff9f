// FlexAttention on cuDNN's SDPA (KernelKind::FlexCudnnForward / FlexCudnnBackward), through the
// header-only cudnn-frontend graph API. Kernel selection (codegen/KernelSelect.cpp, cudnn_why_not in
// codegen/FlexLowering.h) sends here only what cuDNN computes exactly as flex defines it: fp16/bf16
// q, k, v, no mask / causal / causal sliding window (a band on q_idx - kv_idx, top-left aligned, as the
// mask_mod compares absolute indices), the identity score_mod or a row shift (score + t(b, h, q_idx):
// the identity's output and q/k/v gradients, the logsumexp moved by t, zero gradients for t's buffers).
//
// Semantics kept: flex's logsumexp is base 2 (natural / ln 2); cuDNN's Stats are natural, so the forward
// scales them by log2(e) and the backward by ln 2 (B x H x S floats: negligible). The forward's third
// result (max_scores) is not produced: selection requires that nothing reads it. One cuDNN graph per
// (shapes, strides, dtype, band, scale, deterministic), built on first use and cached in the Call;
// its workspace comes from the caching allocator per call.
#include "backend/runtime/Call.h"

#ifdef HB_WITH_CUDNN

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cudnn/Handle.h>
#include <cudnn_frontend.h>

#include <dlfcn.h>

#include <cmath>
#include <map>
#include <mutex>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Executor.h"
#include "codegen/FlexLowering.h"

// cudnn-frontend's dynamic loading (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): the library it calls into.
// torch has loaded libcudnn.so.9 already; this process uses that one.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace hb::rt {

namespace {

namespace fe = cudnn_frontend;

void load_cudnn(const std::string& where) {
  static std::once_flag once;
  std::call_once(once, [] {
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (!fe::cudnn_dlhandle) fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW);
  });
  HB_USER_CHECK(fe::cudnn_dlhandle) << where << ": libcudnn.so.9 cannot be loaded (" << dlerror()
                                    << "); run the region with hinted_context(kernel=\"aten\")";
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct CudnnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

std::string check(fe::error_t e) { return e.is_good() ? std::string() : e.get_message(); }

class CudnnFlexCall : public Call {
 public:
  bool backward = false;
  bool deterministic = false;
  FlexBand band;
  double scale = 1.0;
  std::string where;
  std::vector<ArgSpec> tensors;  // fw: q k v; bw: q k v out lse grad_out
  // A row-shifting score_mod (score + t(b, h, q_idx)): cuDNN runs the identity and t moves the logsumexp.
  std::shared_ptr<Executor> shift;  // the score_mod, evaluated with score = 0 and kv_idx = 0
  ArgSpec score_buffers;
  std::vector<bool> buffer_grads;   // bw: which captured buffers get a gradient (zero: see FlexLowering.h)

  // t as [B, H, S, 1] float32, in the scores' (natural) units.
  at::Tensor row_shift(const std::vector<c10::IValue>& slots, const at::Tensor& q) const {
    const int64_t B = q.size(0), H = q.size(1), S = q.size(2);
    const auto i32 = q.options().dtype(at::kInt);
    std::vector<c10::IValue> in{at::zeros({}, q.options().dtype(at::kFloat)), at::arange(B, i32).view({B, 1, 1, 1}),
                                at::arange(H, i32).view({1, H, 1, 1}), at::arange(S, i32).view({1, 1, S, 1}),
                                at::zeros({1, 1, 1, 1}, i32)};
    const c10::IValue bufs = build_arg(score_buffers, slots);
    if (!bufs.isNone())
      for (const c10::IValue& b : bufs.toTupleRef().elements()) in.push_back(b);
    std::vector<c10::IValue> out = shift->run(std::move(in));
    HB_INTERNAL_CHECK(!out.empty() && out[0].isTensor()) << where << ": score_mod returned no tensor";
    return out[0].toTensor().to(at::kFloat).expand({B, H, S, 1});
  }

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    std::vector<at::Tensor> t;
    for (const ArgSpec& a : tensors) t.push_back(build_arg(a, slots).toTensor());
    const at::Tensor &q = t[0], &k = t[1], &v = t[2];
    load_cudnn(where);
    const c10::cuda::CUDAGuard guard(q.device());
    cudnnHandle_t handle = at::native::getCudnnHandle();
    HB_INTERNAL_CHECK(fe::detail::set_stream(handle, at::cuda::getCurrentCUDAStream()) == CUDNN_STATUS_SUCCESS)
        << where << ": cudnnSetStream failed";
    const int64_t B = q.size(0), H = q.size(1), S = q.size(2);
    std::unordered_map<int64_t, void*> pack;
    pack[kQ] = q.data_ptr();
    pack[kK] = k.data_ptr();
    pack[kV] = v.data_ptr();
    if (!backward) {
      at::Tensor out = at::empty_like(q);
      at::Tensor stats = at::empty({B, H, S, 1}, q.options().dtype(at::kFloat));
      pack[kO] = out.data_ptr();
      pack[kStats] = stats.data_ptr();
      execute(handle, {q, k, v, out}, pack);
      if (shift) stats.add_(row_shift(slots, q));
      at::Tensor lse = stats.squeeze(-1).mul_(1.0 / std::log(2.0));  // flex's logsumexp is base 2
      return c10::ivalue::Tuple::create({out, lse, at::Tensor()});
    }
    const at::Tensor &out = t[3], &grad_out = t[5];
    at::Tensor stats = t[4].mul(std::log(2.0)).unsqueeze(-1).contiguous();  // base 2 -> natural
    if (shift) stats.sub_(row_shift(slots, q));  // the identity attention's statistics
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    pack[kO] = out.data_ptr();
    pack[kStats] = stats.data_ptr();
    pack[kDO] = grad_out.data_ptr();
    pack[kDQ] = dq.data_ptr();
    pack[kDK] = dk.data_ptr();
    pack[kDV] = dv.data_ptr();
    execute(handle, {q, k, v, out, grad_out, dq, dk, dv}, pack);
    // A row shift's buffers: sum_j dS_ij = 0 on every row, so their gradient is exactly zero.
    std::vector<c10::IValue> grads;
    if (!buffer_grads.empty()) {
      const c10::IValue bufs = build_arg(score_buffers, slots);
      const auto& b = bufs.toTupleRef().elements();
      for (size_t i = 0; i < buffer_grads.size(); ++i)
        grads.push_back(buffer_grads[i] ? c10::IValue(at::zeros_like(b[i].toTensor())) : c10::IValue());
    }
    return c10::ivalue::Tuple::create({dq, dk, dv, c10::ivalue::Tuple::create(std::move(grads))});
  }

 private:
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const CudnnGraph>> cache_;

  void execute(cudnnHandle_t handle, const std::vector<at::Tensor>& shaped, std::unordered_map<int64_t, void*>& pack) const {
    const std::shared_ptr<const CudnnGraph> g = graph_for(handle, shaped);
    at::Tensor ws;
    if (g->workspace > 0) ws = at::empty({g->workspace}, shaped[0].options().dtype(at::kByte));
    const std::string err = check(g->graph->execute(handle, pack, ws.defined() ? ws.data_ptr() : nullptr));
    HB_USER_CHECK(err.empty()) << where << ": cuDNN's SDPA failed: " << err
                               << ". Run the region with hinted_context(kernel=\"aten\") to use the reference.";
  }

  // The graph for these shapes and strides (q, k, v, out[, grad_out, dq, dk, dv]), built once.
  std::shared_ptr<const CudnnGraph> graph_for(cudnnHandle_t handle, const std::vector<at::Tensor>& ts) const {
    std::ostringstream key;
    key << static_cast<int>(ts[0].scalar_type()) << " " << ts[0].device().index();
    for (const at::Tensor& x : ts) key << " " << x.sizes() << x.strides();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key.str());
    if (it != cache_.end()) return it->second;
    auto built = std::make_shared<CudnnGraph>(build(handle, ts));
    cache_[key.str()] = built;
    return built;
  }

  CudnnGraph build(cudnnHandle_t handle, const std::vector<at::Tensor>& ts) const {
    namespace fg = fe::graph;
    CudnnGraph r;
    r.graph = std::make_shared<fg::Graph>();
    fg::Graph& g = *r.graph;
    const bool half = ts[0].scalar_type() == at::kHalf;
    g.set_io_data_type(half ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, const at::Tensor& x, int64_t uid) {
      return g.tensor(fg::Tensor_attributes().set_name(name).set_uid(uid).set_dim(x.sizes().vec()).set_stride(
          x.strides().vec()));
    };
    auto Q = tensor("Q", ts[0], kQ), K = tensor("K", ts[1], kK), V = tensor("V", ts[2], kV);
    const int64_t B = ts[0].size(0), H = ts[0].size(1), S = ts[0].size(2);
    auto set_band = [&](auto& attrs) {
      if (band.unbounded()) return;
      attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
      if (band.hi != FlexBand::kNoBound) attrs.set_diagonal_band_left_bound(static_cast<int>(band.hi + 1));
    };
    if (!backward) {
      fg::SDPA_attributes a;
      a.set_name("flex_attention").set_generate_stats(true).set_attn_scale(static_cast<float>(scale));
      set_band(a);
      auto [O, Stats] = g.sdpa(Q, K, V, a);
      O->set_output(true).set_uid(kO).set_dim(ts[3].sizes().vec()).set_stride(ts[3].strides().vec());
      Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, S, 1}).set_stride(
          {H * S, S, 1, 1});
    } else {
      auto O = tensor("O", ts[3], kO), dO = tensor("dO", ts[4], kDO);
      auto Stats = g.tensor(fg::Tensor_attributes().set_name("Stats").set_uid(kStats).set_data_type(
          fe::DataType_t::FLOAT).set_dim({B, H, S, 1}).set_stride({H * S, S, 1, 1}));
      fg::SDPA_backward_attributes a;
      a.set_name("flex_attention_backward").set_attn_scale(static_cast<float>(scale));
      a.set_deterministic_algorithm(deterministic);
      set_band(a);
      auto [dQ, dK, dV] = g.sdpa_backward(Q, K, V, O, dO, Stats, a);
      dQ->set_output(true).set_uid(kDQ).set_dim(ts[5].sizes().vec()).set_stride(ts[5].strides().vec());
      dK->set_output(true).set_uid(kDK).set_dim(ts[6].sizes().vec()).set_stride(ts[6].strides().vec());
      dV->set_output(true).set_uid(kDV).set_dim(ts[7].sizes().vec()).set_stride(ts[7].strides().vec());
    }
    std::string err = check(g.validate());
    if (err.empty()) err = check(g.build_operation_graph(handle));
    if (err.empty()) err = check(g.create_execution_plans({fe::HeurMode_t::A}));
    if (err.empty()) err = check(g.check_support(handle));
    if (err.empty()) err = check(g.build_plans(handle));
    HB_USER_CHECK(err.empty()) << where << ": cuDNN cannot build this SDPA graph (" << ts[0].sizes() << ", "
                               << ts[0].scalar_type() << "): " << err
                               << ". Run the region with hinted_context(kernel=\"aten\") to use the reference.";
    HB_INTERNAL_CHECK(g.get_workspace_size(r.workspace).is_good()) << where << ": no workspace size";
    return r;
  }
};

}  // namespace

std::shared_ptr<const Call> lower_cudnn_flex_attention(const LowerContext& ctx) {
  const Node& n = ctx.n();
  auto call = std::make_shared<CudnnFlexCall>();
  call->backward = n.target == "higher_order::flex_attention_backward";
  call->where = ctx.where;
  const FlexAnalysis a = analyze_flex(ctx.graph(), ctx.node);
  HB_INTERNAL_CHECK(cudnn_why_not(ctx.graph(), ctx.node, a).empty()) << ctx.where << ": selected for cuDNN, but "
                                                                     << cudnn_why_not(ctx.graph(), ctx.node, a);
  call->band = a.band;
  call->deterministic = n.hints.deterministic.value_or(false);
  call->scale = float_arg(n.args[call->backward ? 10 : 5], ctx.where);
  for (int k = 0; k < (call->backward ? 6 : 3); ++k) call->tensors.push_back(convert_untyped(n.args[k], ctx.where));
  if (a.score_row_shift) {
    call->shift = ctx.subgraph(n.args[call->backward ? 7 : 3]);  // the backward's fw_graph is the score_mod
    call->score_buffers = convert_untyped(n.args[call->backward ? 12 : 7], ctx.where);
    if (call->backward) {
      // The joint graph returns (grad_score, None x4, *buffer grads): which buffers get one.
      const Arg& joint = n.args[8];
      const Graph& jg = *ctx.graph().subgraphs.at(joint.s);
      const Node& ret = jg.nodes[jg.output_node()];
      const Arg& items = ret.args.at(0);
      for (size_t k = 5; k < items.items.size(); ++k) call->buffer_grads.push_back(items.items[k].kind == Arg::Kind::Ref);
      HB_INTERNAL_CHECK(call->buffer_grads.size() == n.args[12].items.size())
          << ctx.where << ": the joint graph returns " << call->buffer_grads.size() << " buffer gradients for "
          << n.args[12].items.size() << " buffers";
    }
  }
  return call;
}

}  // namespace hb::rt

#else  // no cuDNN in this build: selection never picks it (the runtime's Target says so)

#include "backend/ir/Error.h"

namespace hb::rt {
std::shared_ptr<const Call> lower_cudnn_flex_attention(const LowerContext& ctx) {
  HB_INTERNAL_CHECK(false) << ctx.where << ": cuDNN FlexAttention selected in a build without cuDNN";
  return nullptr;
}
}  // namespace hb::rt

#endif

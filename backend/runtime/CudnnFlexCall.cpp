// FlexAttention on cuDNN's SDPA (KernelKind::FlexCudnnForward / FlexCudnnBackward), through the
// header-only cudnn-frontend graph API. Kernel selection (codegen/KernelSelect.cpp, cudnn_why_not in
// codegen/FlexLowering.h) sends here only what cuDNN computes exactly as flex defines it: fp16/bf16
// q, k, v, no mask / causal / causal sliding window (a band on q_idx - kv_idx, top-left aligned, as the
// mask_mod compares absolute indices), no mask or causal with a kv padding (kv_idx < lengths[b]: cuDNN's
// padding mask, with an identity or row-shift score_mod), and a score_mod that is the identity, a row shift
// (score + t(b, h, q_idx): the identity's output and q/k/v gradients, the logsumexp moved by t, zero
// gradients for t's buffers), pointwise (emitted as cuDNN pointwise nodes in its score-modifier
// subgraph, the band after it; the backward only where its derivative is 1, see score_pointwise) or an
// additive bias (score + t(b, h, q_idx, kv_idx)).
//
// An additive bias is materialized as a [B|1, H, Sq, Skv] tensor that cuDNN adds after the scale, in q's
// dtype when its buffer has that dtype (exact), else in float32 (in q's dtype where this cuDNN refuses
// float32, with a warning): a dense buffer is the bias itself, a
// Toeplitz table is gathered along diagonals (codegen/cuda/ToeplitzBias.cu), anything else is the
// score_mod run once on the index grid with score = 0 (through the executor, like the reference's
// subgraphs). The backward asks cuDNN for dBias (the score gradient) when a buffer of t wants a gradient:
// it is the dense buffer's gradient, the Toeplitz table's summed along diagonals, or the grid layout's
// through the joint graph's zeros_and_scatter.
//
// Semantics kept: flex's logsumexp is base 2 (natural / ln 2); cuDNN's Stats are natural, so the forward
// scales them by log2(e) and the backward by ln 2 (B x H x S floats: negligible). The forward's third
// result (max_scores) is not produced: selection requires that nothing reads it. One cuDNN graph per
// operand shapes, strides and dtype, built on first use and cached in the Call; its workspace comes from
// the caching allocator per call.
#include "backend/runtime/Call.h"

#ifdef HB_WITH_CUDNN

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cudnn/Handle.h>
#include <cudnn_frontend.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <mutex>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/FlexAttention.h"
#include "codegen/FlexLowering.h"
#include "codegen/cuda/ToeplitzBias.h"

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

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias, kDBias, kSeqQ, kSeqKV };

struct CudnnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

std::string check(fe::error_t e) { return e.is_good() ? std::string() : e.get_message(); }

// The tensors one cuDNN SDPA call reads and writes (undefined: absent). Their shapes, strides and dtype
// key the graph cache.
struct Operands {
  at::Tensor q, k, v, o, stats, bias;     // forward and backward
  at::Tensor d_o, dq, dk, dv, dbias;      // backward
  at::Tensor seq_q, seq_kv;               // a kv padding: int32 [B, 1, 1, 1] query and key lengths
  std::map<int64_t, at::Tensor> score_inputs;  // a pointwise score_mod's buffers, by uid
  std::vector<std::pair<int64_t, const at::Tensor*>> by_uid() const {
    std::vector<std::pair<int64_t, const at::Tensor*>> r = {
        {kQ, &q}, {kK, &k}, {kV, &v}, {kO, &o}, {kStats, &stats}, {kBias, &bias},
        {kDO, &d_o}, {kDQ, &dq}, {kDK, &dk}, {kDV, &dv}, {kDBias, &dbias}, {kSeqQ, &seq_q}, {kSeqKV, &seq_kv}};
    for (const auto& [uid, t] : score_inputs) r.emplace_back(uid, &t);
    return r;
  }
};

using TA = std::shared_ptr<fe::graph::Tensor_attributes>;

// The uid of the broadcast input for buffer k read by index placeholder p (1 b, 2 h, 3 q_idx, 4 kv_idx).
int64_t buffer_uid(int k, int p) { return 100 + 4 * k + (p - 1); }

// q_idx (axis 2) or kv_idx (axis 3) of `like`'s elements, as float32.
TA generated_index(fe::graph::Graph& g, const TA& like, int axis) {
  namespace fg = fe::graph;
  using M = fe::PointwiseMode_t;
  TA i = g.pointwise(like, fg::Pointwise_attributes().set_mode(M::GEN_INDEX).set_axis(axis).set_compute_data_type(
                               fe::DataType_t::INT32));
  i->set_data_type(fe::DataType_t::INT32);
  TA f = g.pointwise(i, fg::Pointwise_attributes().set_mode(M::IDENTITY).set_compute_data_type(fe::DataType_t::FLOAT));
  f->set_data_type(fe::DataType_t::FLOAT);
  return f;
}

// Emits subgraph `sub` (a score_mod, or a joint graph's score gradient) as cuDNN pointwise nodes of `g`
// over the score tensor `like` ([B, H, Sq, Skv]): placeholders bound by position in `in` (null: b, h or
// a buffer, which only buf[index] reads: `bufs` has those inputs by (buffer, index placeholder); q_idx
// and kv_idx, when null, generated along `like`'s axes 2 and 3). Everything computes in float32, as
// flex's scores do; comparisons give booleans. Selection (score_pointwise in codegen/FlexLowering.cpp)
// admitted only what this maps. Returns the first output.
TA emit_pointwise(fe::graph::Graph& g, const Graph& sub, std::vector<TA> in, int bufs_from,
                  const std::map<std::pair<int, int>, TA>& bufs, const TA& like, const std::string& where) {
  namespace fg = fe::graph;
  using M = fe::PointwiseMode_t;
  const std::vector<int> ph = sub.placeholders();
  std::vector<TA> val(sub.nodes.size());
  for (size_t k = 0; k < ph.size() && k < in.size(); ++k) val[ph[k]] = in[k];
  if (ph.size() > 4) {
    if (!val[ph[3]]) val[ph[3]] = generated_index(g, like, 2);
    if (!val[ph[4]]) val[ph[4]] = generated_index(g, like, 3);
  }
  auto ph_pos = [&](int node) { return static_cast<int>(std::find(ph.begin(), ph.end(), node) - ph.begin()); };
  auto arg = [&](const Arg& a) -> TA {
    switch (a.kind) {
      case Arg::Kind::Ref: return val[a.ref];
      case Arg::Kind::Int: return g.tensor(static_cast<float>(a.i));
      case Arg::Kind::Float: return g.tensor(static_cast<float>(a.f));
      case Arg::Kind::Bool: return g.tensor(a.b ? 1.f : 0.f);
      default: return nullptr;
    }
  };
  auto pw = [&](M mode, const TA& x, const TA& y = nullptr, const TA& z = nullptr) {
    auto attrs = fg::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
    TA r = z ? g.pointwise(x, y, z, attrs) : y ? g.pointwise(x, y, attrs) : g.pointwise(x, attrs);
    const bool boolean = mode == M::CMP_GE || mode == M::CMP_GT || mode == M::CMP_LE || mode == M::CMP_LT ||
                         mode == M::CMP_EQ || mode == M::CMP_NEQ || mode == M::LOGICAL_AND || mode == M::LOGICAL_OR;
    r->set_data_type(boolean ? fe::DataType_t::BOOLEAN : fe::DataType_t::FLOAT);
    return r;
  };
  for (size_t i = 0; i < sub.nodes.size(); ++i) {
    const Node& n = sub.nodes[i];
    if (n.op == OpKind::Output) {
      const Arg& out = n.args.at(0).items.empty() ? n.args.at(0) : n.args.at(0).items.at(0);
      HB_INTERNAL_CHECK(out.kind == Arg::Kind::Ref && val[out.ref]) << where << ": a pointwise score_mod returns no tensor";
      return val[out.ref];
    }
    if (n.op != OpKind::CallFunction) continue;
    ScorePw op;
    HB_INTERNAL_CHECK(score_pw_op(n.target, &op)) << where << ": " << n.target << " has no cuDNN pointwise node";
    std::vector<TA> x;
    if (op != ScorePw::Index)
      for (const Arg& a : n.args) x.push_back(arg(a));
    auto need = [&](size_t k) {
      HB_INTERNAL_CHECK(x.size() >= k) << where << ": " << n.target << " with " << x.size() << " operands";
      for (size_t j = 0; j < k; ++j) HB_INTERNAL_CHECK(x[j]) << where << ": operand " << j << " of " << n.target;
    };
    TA r;
    switch (op) {
      case ScorePw::Add:
      case ScorePw::Sub: {
        need(2);
        TA y = x[1];
        if (const Arg* al = n.kwarg("alpha"); al && !(al->kind == Arg::Kind::Int && al->i == 1))
          y = pw(M::MUL, y, arg(*al));
        const bool rsub = n.target == "aten::rsub.Scalar";
        r = op == ScorePw::Add ? pw(M::ADD, x[0], y) : rsub ? pw(M::SUB, y, x[0]) : pw(M::SUB, x[0], y);
        break;
      }
      case ScorePw::Mul: need(2); r = pw(M::MUL, x[0], x[1]); break;
      case ScorePw::Div: need(2); r = pw(M::DIV, x[0], x[1]); break;
      case ScorePw::Neg: need(1); r = pw(M::NEG, x[0]); break;
      case ScorePw::Abs: need(1); r = pw(M::ABS, x[0]); break;
      case ScorePw::Exp: need(1); r = pw(M::EXP, x[0]); break;
      case ScorePw::Log: need(1); r = pw(M::LOG, x[0]); break;
      case ScorePw::Tanh: need(1); r = pw(M::TANH_FWD, x[0]); break;
      case ScorePw::Sigmoid: need(1); r = pw(M::SIGMOID_FWD, x[0]); break;
      case ScorePw::Max: need(2); r = pw(M::MAX, x[0], x[1]); break;
      case ScorePw::Min: need(2); r = pw(M::MIN, x[0], x[1]); break;
      case ScorePw::Ge: need(2); r = pw(M::CMP_GE, x[0], x[1]); break;
      case ScorePw::Gt: need(2); r = pw(M::CMP_GT, x[0], x[1]); break;
      case ScorePw::Le: need(2); r = pw(M::CMP_LE, x[0], x[1]); break;
      case ScorePw::Lt: need(2); r = pw(M::CMP_LT, x[0], x[1]); break;
      case ScorePw::Eq: need(2); r = pw(M::CMP_EQ, x[0], x[1]); break;
      case ScorePw::Ne: need(2); r = pw(M::CMP_NEQ, x[0], x[1]); break;
      case ScorePw::And: need(2); r = pw(M::LOGICAL_AND, x[0], x[1]); break;
      case ScorePw::Or: need(2); r = pw(M::LOGICAL_OR, x[0], x[1]); break;
      case ScorePw::Where: need(3); r = pw(M::BINARY_SELECT, x[1], x[2], x[0]); break;  // cond ? x1 : x2
      case ScorePw::Cast: need(1); r = x[0]; break;  // everything is float32 already
      case ScorePw::Index: {
        const int k = ph_pos(n.args.at(0).ref) - bufs_from, p = ph_pos(n.args.at(1).items.at(0).ref);
        auto it = bufs.find({k, p});
        HB_INTERNAL_CHECK(it != bufs.end()) << where << ": no input for buffer " << k << " read by index " << p;
        r = it->second;
        break;
      }
    }
    val[i] = r;
  }
  HB_INTERNAL_CHECK(false) << where << ": a pointwise score_mod without an output";
  return nullptr;
}

// The (buffer, index placeholder) pairs a pointwise subgraph reads, as buf[index].
void buffer_reads(const Graph& sub, int bufs_from, std::set<std::pair<int, int>>* reads) {
  const std::vector<int> ph = sub.placeholders();
  auto ph_pos = [&](int node) { return static_cast<int>(std::find(ph.begin(), ph.end(), node) - ph.begin()); };
  for (const Node& n : sub.nodes)
    if (n.target == "aten::index.Tensor" && n.args.size() == 2 && n.args[0].kind == Arg::Kind::Ref &&
        n.args[1].items.size() == 1 && n.args[1].items[0].kind == Arg::Kind::Ref)
      reads->insert({ph_pos(n.args[0].ref) - bufs_from, ph_pos(n.args[1].items[0].ref)});
}

class CudnnFlexCall : public Call {
 public:
  bool backward = false;
  bool deterministic = false;
  FlexBand band;
  double scale = 1.0;
  std::string where;
  std::vector<ArgSpec> tensors;  // fw: q k v; bw: q k v out lse grad_out
  // score_mod = score + t. A row shift (t reads no kv_idx): cuDNN runs the identity and t moves the
  // logsumexp. A bias (t reads kv_idx): t is materialized over the indices it reads and added by cuDNN;
  // the backward scatters cuDNN's dBias into t's buffers through the joint graph.
  // Pointwise: the score_mod as cuDNN pointwise nodes, the mask band applied after it inside the same
  // subgraph (cuDNN takes no built-in mask with a score_mod); its backward is cuDNN's default identity
  // bprop, or the Softcap modifier's.
  enum class Mod { Identity, RowShift, Bias, Pointwise } mod = Mod::Identity;
  std::shared_ptr<const Graph> score_graph;  // Pointwise
  std::set<std::pair<int, int>> reads;                    // Pointwise: (buffer, index placeholder) inputs
  double softcap = 0;                                     // Pointwise: c * tanh(score / c) through cuDNN's Softcap
  bool bias_per_batch = false;        // t reads b: a [B, H, Sq, Skv] bias, else [1, H, Sq, Skv]
  FlexBiasLayout layout;              // Dense, Toeplitz: t is one read of one buffer (no grid, no scatter)
  std::shared_ptr<Executor> score_mod;  // t's source: the score_mod, evaluated with score = 0
  std::shared_ptr<Executor> joint;      // bw, Bias: the buffers' gradients from dBias
  ArgSpec score_buffers;
  std::vector<bool> buffer_grads;       // bw: which captured buffers get a gradient
  // The mask's kv padding (FlexAnalysis::pad_kv): kv_idx < mask buffer pad_kv [b], cuDNN's padding mask
  // with these key lengths (clamped to [1, Skv]: a batch whose length is 0 or less, every score masked,
  // gets flex's results, zeros and a logsumexp of -inf, written over cuDNN's after it runs).
  int pad_kv = -1;
  ArgSpec mask_buffers;
  bool cache_index_tensors = true;  // Program::keep_across_calls: index_grid and query_lengths made once

  // t on the index grid (score = 0), float32, in the scores' (natural) units: [B|1, H|1, S|1, Skv|1].
  at::Tensor additive_term(const std::vector<c10::IValue>& slots, const at::Tensor& q, int64_t Skv) const {
    const std::array<at::Tensor, 5> grid = index_grid(q, Skv);
    std::vector<c10::IValue> in(grid.begin(), grid.end());
    const c10::IValue bufs = build_arg(score_buffers, slots);
    if (!bufs.isNone())
      for (const c10::IValue& b : bufs.toTupleRef().elements()) in.push_back(b);
    std::vector<c10::IValue> out = score_mod->run(std::move(in));
    HB_INTERNAL_CHECK(!out.empty() && out[0].isTensor()) << where << ": score_mod returned no tensor";
    return out[0].toTensor().to(at::kFloat);
  }

  // The score_mod's inputs on the index grid, made once per shape and device (a per-call rebuild was ten
  // small launches, host time on the critical path of a short step): a float32 zero score of rank 4 (not
  // 0-d, so that t's type promotion is the one flex computes in), then b, h, q_idx and kv_idx as int32
  // along axes 0-3. The subgraph only reads them.
  // (Made every call where the program keeps nothing across calls: under CUDA graphs.)
  std::array<at::Tensor, 5> index_grid(const at::Tensor& q, int64_t Skv) const {
    const int64_t B = q.size(0), H = q.size(1), S = q.size(2);
    const std::array<int64_t, 5> key{B, H, S, Skv, q.device().index()};
    std::lock_guard<std::mutex> lock(grid_mu_);
    if (auto it = grids_.find(key); it != grids_.end()) return it->second;
    const auto i32 = q.options().dtype(at::kInt);
    std::array<at::Tensor, 5> grid{at::zeros({1, 1, 1, 1}, q.options().dtype(at::kFloat)),
                                   at::arange(B, i32).view({B, 1, 1, 1}), at::arange(H, i32).view({1, H, 1, 1}),
                                   at::arange(S, i32).view({1, 1, S, 1}), at::arange(Skv, i32).view({1, 1, 1, Skv})};
    if (cache_index_tensors) grids_.emplace(key, grid);
    return grid;
  }

  // cuDNN's query lengths for a kv padding: S for every batch, int32 [B, 1, 1, 1], made once per shape.
  at::Tensor query_lengths(int64_t B, int64_t S, const at::Tensor& q) const {
    const std::array<int64_t, 5> key{B, 1, S, 0, q.device().index()};
    std::lock_guard<std::mutex> lock(grid_mu_);
    if (auto it = seq_q_.find(key); it != seq_q_.end()) return it->second;
    at::Tensor lengths = at::full({B, 1, 1, 1}, S, q.options().dtype(at::kInt));
    if (cache_index_tensors) seq_q_.emplace(key, lengths);
    return lengths;
  }

  // The row shift t as [B, H, S, 1] (kv_idx = 0: t does not read it).
  at::Tensor row_shift(const std::vector<c10::IValue>& slots, const at::Tensor& q) const {
    return additive_term(slots, q, 1).expand({q.size(0), q.size(1), q.size(2), 1});
  }

  // The bias cuDNN adds: t as [B|1, H, Sq, Skv] contiguous (cuDNN reduces dBias over a broadcast batch,
  // and needs every head). In q's dtype when t is a buffer of that dtype read as is (Dense, Toeplitz):
  // exact, and half the bytes cuDNN reads (its forward and dBias backward run faster on a bf16 bias than
  // on a float32 one); else in float32, flex's score dtype (run() casts it where this cuDNN takes q's
  // dtype only).
  at::Tensor bias(const std::vector<c10::IValue>& slots, const at::Tensor& q, int64_t Skv) const {
    const int64_t B = bias_per_batch ? q.size(0) : 1, H = q.size(1), Sq = q.size(2);
    auto exact = [&](const at::Tensor& buf) { return buf.scalar_type() == q.scalar_type() ? buf.scalar_type() : at::kFloat; };
    if (const at::Tensor buf = dense(slots, q, Skv); buf.defined())
      return buf.to(exact(buf)).reshape({B, H, Sq, Skv}).contiguous();
    if (ToeplitzIndex ix; toeplitz(slots, q, Skv, &ix)) {
      const at::Tensor table = buffers(slots).at(layout.buffer).toTensor();
      at::Tensor t = at::empty({1, H, Sq, Skv}, q.options().dtype(exact(table)));
      cuda::toeplitz_bias(table, ix, t);
      return t;
    }
    return additive_term(slots, q, Skv).expand({B, H, Sq, Skv}).contiguous();
  }

  // The buffer of a Dense layout when it holds exactly the [B|1, H, Sq, Skv] bias, else undefined (the grid
  // evaluation then runs t as written).
  at::Tensor dense(const std::vector<c10::IValue>& slots, const at::Tensor& q, int64_t Skv) const {
    if (layout.kind != FlexBiasLayout::Kind::Dense) return {};
    const at::Tensor buf = buffers(slots).at(layout.buffer).toTensor();
    const int64_t B = bias_per_batch ? q.size(0) : 1, H = q.size(1), Sq = q.size(2);
    const bool fits = buf.dim() >= 3 && buf.numel() == B * H * Sq * Skv && buf.size(-1) == Skv &&
                      buf.size(-2) == Sq && buf.size(-3) == H;
    return fits ? buf : at::Tensor();
  }

  using ToeplitzIndex = cuda::ToeplitzIndex;
  // Whether t is a Toeplitz read of a table whose every row the Sq x Skv grid reads exists (else the
  // grid evaluation runs it, with eager's index semantics: wrapped negatives, errors out of range).
  bool toeplitz(const std::vector<c10::IValue>& slots, const at::Tensor& q, int64_t Skv, ToeplitzIndex* ix) const {
    if (layout.kind != FlexBiasLayout::Kind::Toeplitz) return false;
    const at::Tensor buf = buffers(slots).at(layout.buffer).toTensor();
    if (!buf.is_cuda() || buf.dim() != (layout.h_dim < 0 ? 1 : 2)) return false;
    if (layout.h_map >= 0) {
      // Head h reads column map[h] (or map[b, h], the same for every b: a slice's global head).
      const at::Tensor m = buffers(slots).at(layout.h_map).toTensor();
      const bool same_for_every_b = !layout.h_map_reads_b ||
                                    (m.dim() == 2 && m.size(0) == q.size(0) && (m.size(0) == 1 || m.stride(0) == 0));
      if (!m.is_cuda() || m.dim() != (layout.h_map_reads_b ? 2 : 1) || m.size(-1) != q.size(1) || !same_for_every_b ||
          (m.scalar_type() != at::kLong && m.scalar_type() != at::kInt))
        return false;
      ix->h_map = m.data_ptr();
      ix->h_map_int64 = m.scalar_type() == at::kLong;
      ix->h_map_stride = m.stride(-1);
      ix->h_bound = buf.size(layout.h_dim);
    } else if (layout.h_dim >= 0 && buf.size(layout.h_dim) != q.size(1)) {
      return false;
    }
    const int64_t Sq = q.size(2);
    const int64_t lo = layout.sign > 0 ? layout.offset - (Skv - 1) : layout.offset - (Sq - 1);
    const int64_t hi = layout.sign > 0 ? layout.offset + (Sq - 1) : layout.offset + (Skv - 1);
    if (lo < 0 || hi >= buf.size(layout.d_dim)) return false;
    ix->sign = layout.sign;
    ix->offset = layout.offset;
    ix->stride_d = buf.stride(layout.d_dim);
    ix->stride_h = layout.h_dim < 0 ? 0 : buf.stride(layout.h_dim);
    return true;
  }

  std::vector<c10::IValue> buffers(const std::vector<c10::IValue>& slots) const {
    const c10::IValue bufs = build_arg(score_buffers, slots);
    if (bufs.isNone()) return {};
    return bufs.toTupleRef().elements().vec();
  }

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats& stats) const override {
    std::vector<at::Tensor> t;
    for (const ArgSpec& a : tensors) t.push_back(build_arg(a, slots).toTensor());
    Operands x;
    x.q = t[0];
    x.k = t[1];
    x.v = t[2];
    load_cudnn(where);
    const c10::cuda::CUDAGuard guard(x.q.device());
    cudnnHandle_t handle = at::native::getCudnnHandle();
    HB_INTERNAL_CHECK(fe::detail::set_stream(handle, at::cuda::getCurrentCUDAStream()) == CUDNN_STATUS_SUCCESS)
        << where << ": cudnnSetStream failed";
    const int64_t B = x.q.size(0), H = x.q.size(1), S = x.q.size(2), Skv = x.k.size(2);
    at::Tensor empty_batches;  // a kv padding: bool [B, 1, 1, 1], the batches whose every score is masked
    if (pad_kv >= 0) {
      const at::Tensor len = build_arg(mask_buffers, slots).toTupleRef().elements().at(pad_kv).toTensor().narrow(0, 0, B);
      x.seq_kv = len.clamp(1, Skv).to(at::kInt).view({B, 1, 1, 1}).contiguous();
      x.seq_q = query_lengths(B, S, x.q);
      empty_batches = len.le(0).view({B, 1, 1, 1});
    }
    const bool any_grad = std::find(buffer_grads.begin(), buffer_grads.end(), true) != buffer_grads.end();
    if (!backward) {
      x.o = at::empty_like(x.q);
      x.stats = at::empty({B, H, S, 1}, x.q.options().dtype(at::kFloat));
    } else {
      x.o = t[3];
      x.d_o = t[5];
      x.stats = t[4].mul(std::log(2.0)).unsqueeze(-1).contiguous();  // base 2 -> natural
      if (mod == Mod::RowShift) x.stats.sub_(row_shift(slots, x.q));  // the identity attention's statistics
      x.dq = at::empty_like(x.q);
      x.dk = at::empty_like(x.k);
      x.dv = at::empty_like(x.v);
    }
    if (mod == Mod::Pointwise && !reads.empty()) {
      // buf[index] as a broadcast float32 input: [1, 1, Sq, 1] for buf[q_idx], etc.
      const std::vector<c10::IValue> bufs = buffers(slots);
      const int64_t extent[5] = {0, B, H, S, Skv};
      for (const auto& [k, p] : reads) {
        const at::Tensor buf = bufs.at(k).toTensor();
        HB_USER_CHECK(buf.dim() == 1 && buf.size(0) >= extent[p])
            << where << ": the score_mod reads captured buffer " << k << " " << buf.sizes() << " by "
            << (p == 1 ? "b" : p == 2 ? "h" : p == 3 ? "q_idx" : "kv_idx") << ", which reaches " << extent[p] - 1;
        x.score_inputs[buffer_uid(k, p)] = buf.narrow(0, 0, extent[p]).to(at::kFloat).contiguous();
      }
    }
    if (mod == Mod::Bias) {
      // The bias as bias() makes it (q's dtype where that is exact, else float32: t and the logsumexp as
      // flex computes them) and dBias in float32 where this cuDNN takes them (the buffers' gradients
      // exact to float32), else dBias, then both, in q's dtype.
      const at::Tensor t = bias(slots, x.q, Skv);
      for (;;) {
        const int m = bias_mode_;
        x.bias = m < 2 ? t : t.to(x.q.scalar_type());
        if (backward && any_grad) x.dbias = at::empty_like(x.bias, m == 0 ? at::kFloat : x.q.scalar_type());
        if (m == 2 || graph_builds(handle, x)) break;
        bias_mode_ = m + 1;
        if (m + 1 == 2 || (m + 1 == 1 && backward && any_grad))
          TORCH_WARN_ONCE("hintbackend: ", where, ": this cuDNN takes FlexAttention's additive bias ",
                          m + 1 == 1 ? "gradient" : "", " in ", x.q.scalar_type(), " only, not float32: ",
                          m + 1 == 1 ? "the buffers' gradients carry its rounding" : "the bias is rounded to it");
      }
    }
    const CudnnBackwardGroup grp = backward && mod != Mod::Bias ? cudnn_backward_group(B, x.k.size(1), Skv)
                                                                : CudnnBackwardGroup{B, x.k.size(1), 1};
    if (grp.calls > 1) execute_in_groups(handle, x, grp, stats);
    else execute(handle, x, stats);
    if (!backward) {
      if (mod == Mod::RowShift) x.stats.add_(row_shift(slots, x.q));
      at::Tensor lse = x.stats.squeeze(-1).mul_(1.0 / std::log(2.0));  // flex's logsumexp is base 2
      if (empty_batches.defined()) {
        x.o.masked_fill_(empty_batches, 0);
        lse.masked_fill_(empty_batches.view({B, 1, 1}), -std::numeric_limits<double>::infinity());
      }
      return c10::ivalue::Tuple::create({x.o, lse, at::Tensor()});
    }
    if (empty_batches.defined())  // every score masked: no gradient (cuDNN read a -inf logsumexp there)
      for (at::Tensor* g : {&x.dq, &x.dk, &x.dv}) g->masked_fill_(empty_batches, 0);
    std::vector<c10::IValue> grads;
    if (!buffer_grads.empty()) {
      const std::vector<c10::IValue> bufs = buffers(slots);
      std::vector<at::Tensor> flat;
      for (const c10::IValue& b : bufs) flat.push_back(b.toTensor());
      ToeplitzIndex ix;
      if (x.dbias.defined() && layout.kind != FlexBiasLayout::Kind::Grid) {
        // t reads one buffer once: its gradient is dBias itself (Dense) or dBias summed along the
        // diagonals (Toeplitz); the other buffers get none (lowering checked).
        const at::Tensor& buf = flat.at(layout.buffer);
        at::Tensor g;
        if (dense(slots, x.q, Skv).defined()) {
          g = x.dbias.to(buf.scalar_type()).reshape(buf.sizes());
        } else if (toeplitz(slots, x.q, Skv, &ix)) {
          at::Tensor acc = at::zeros(buf.sizes(), buf.options().dtype(at::kFloat));
          ix.stride_d = acc.stride(layout.d_dim);
          ix.stride_h = layout.h_dim < 0 ? 0 : acc.stride(layout.h_dim);
          cuda::toeplitz_bias_backward(x.dbias, ix, acc, deterministic);
          g = acc.to(buf.scalar_type());
        }
        if (g.defined()) {
          for (size_t i = 0; i < flat.size(); ++i) grads.push_back(i == static_cast<size_t>(layout.buffer) ? c10::IValue(g) : c10::IValue());
        }
      }
      if (!grads.empty()) {
        // done above
      } else if (x.dbias.defined()) {
        // dBias is the score gradient: the joint graph scatters it into t's buffers.
        const at::Tensor zero = at::zeros({1, 1, 1, 1}, x.q.options().dtype(at::kFloat));
        for (const at::Tensor& g : flex_buffer_grads(fn_of(joint), zero, x.dbias.to(at::kFloat), {B, H, S, Skv}, flat))
          grads.push_back(g.defined() ? c10::IValue(g) : c10::IValue());
      } else {
        // A row shift's buffers: sum_j dS_ij = 0 on every row, so their gradient is exactly zero.
        for (size_t i = 0; i < buffer_grads.size(); ++i)
          grads.push_back(buffer_grads[i] ? c10::IValue(at::zeros_like(flat[i])) : c10::IValue());
      }
    }
    return c10::ivalue::Tuple::create({x.dq, x.dk, x.dv, c10::ivalue::Tuple::create(std::move(grads))});
  }

 private:
  mutable std::mutex mu_;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<const CudnnGraph>> cache_;
  mutable std::mutex grid_mu_;
  mutable std::map<std::array<int64_t, 5>, std::array<at::Tensor, 5>> grids_;  // index_grid's, by shape
  mutable std::map<std::array<int64_t, 5>, at::Tensor> seq_q_;                   // query_lengths', by shape
  mutable std::atomic<int> bias_mode_{0};  // 0: float32 bias and dBias; 1: float32 bias; 2: neither

  // Whether cuDNN builds a graph for these operands (a failed build is not cached).
  bool graph_builds(cudnnHandle_t handle, const Operands& x) const {
    try {
      graph_for(handle, x);
      return true;
    } catch (const UserError&) {
      return false;
    }
  }

  static SubgraphFn fn_of(const std::shared_ptr<Executor>& e) {
    return [e](std::vector<c10::IValue> in) { return e->run(std::move(in)); };
  }

  // The side stream of execute_in_groups: one per device for the process, taken from the pool once. A
  // stream taken per call would be the pool's next one each time (round robin over 32), and the caching
  // allocator keeps a freed block for the stream it was allocated on, so each call's workspace on a stream
  // it had not used would be a new allocation.
  static c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
    static std::mutex mu;
    static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
    const std::lock_guard<std::mutex> lock(mu);
    auto it = streams.find(device);
    if (it == streams.end()) it = streams.emplace(device, at::cuda::getStreamFromPool(false, device)).first;
    return it->second;
  }

  // The backward in calls of grp's (b, kv head) pairs (cudnn_backward_group), so cuDNN's workspace is a
  // call's, two calls in flight: even calls on the current stream, odd ones on a side stream that waits
  // for the current one first and that it waits for after. Under a causal mask cuDNN's CTAs of the first
  // key tiles run longest, so each call ends on a tail of few CTAs; the other stream's call fills it
  // (B4 H16 S4096 causal on an H100, queued: 4 calls on one stream cost 14% at D128 and 20% at D64, on
  // two 3% and 2%; docs/flex-attention.md). While a CUDA graph is captured, every call runs on the
  // current stream.
  void execute_in_groups(cudnnHandle_t handle, const Operands& x, const CudnnBackwardGroup& grp, CallStats& stats) const {
    const int64_t Hkv = x.k.size(1), r = x.q.size(1) / Hkv;
    std::vector<Operands> calls;  // views of x (packed_view)
    for (int64_t b0 = 0; b0 < x.q.size(0); b0 += grp.batches)
      for (int64_t h0 = 0; h0 < Hkv; h0 += grp.kv_heads) calls.push_back(group(x, b0, grp.batches, h0, grp.kv_heads, r));
    const c10::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream();
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
      for (const Operands& y : calls) execute(handle, y, stats);
      return;
    }
    const c10::cuda::CUDAStream side = side_stream(main.device_index());
    at::cuda::CUDAEvent ready, done;
    ready.record(main);
    ready.block(side);
    for (size_t i = 0; i < calls.size(); ++i) {
      const c10::cuda::CUDAStream s = i % 2 ? side : main;
      const c10::cuda::CUDAStreamGuard on(s);  // the workspace is allocated on, and reused by, this stream
      HB_INTERNAL_CHECK(fe::detail::set_stream(handle, s) == CUDNN_STATUS_SUCCESS) << where << ": cudnnSetStream failed";
      execute(handle, calls[i], stats);
    }
    HB_INTERNAL_CHECK(fe::detail::set_stream(handle, main) == CUDNN_STATUS_SUCCESS) << where << ": cudnnSetStream failed";
    done.record(side);
    done.block(main);
  }

  // The operands of batches [b0, b0 + nb) and kv heads [h0, h0 + nh) (query heads [h0 r, (h0 + nh) r)):
  // views of x's tensors, the pointwise score_mod's buf[h] inputs narrowed alike.
  Operands group(const Operands& x, int64_t b0, int64_t nb, int64_t h0, int64_t nh, int64_t r) const {
    auto qs = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, b0, nb).narrow(1, h0 * r, nh * r) : t; };
    auto ks = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, b0, nb).narrow(1, h0, nh) : t; };
    auto bs = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, b0, nb) : t; };
    Operands y;
    // The statistics with packed strides, as cuDNN below 9.26 takes them (packed_view).
    y.q = qs(x.q), y.o = qs(x.o), y.stats = packed_view(qs(x.stats)), y.d_o = qs(x.d_o);
    y.dq = qs(x.dq);
    y.k = ks(x.k), y.v = ks(x.v), y.dk = ks(x.dk), y.dv = ks(x.dv);
    y.seq_q = bs(x.seq_q), y.seq_kv = bs(x.seq_kv);
    HB_INTERNAL_CHECK(!x.bias.defined() && !x.dbias.defined()) << where << ": a bias's backward runs whole";
    for (const auto& [k, p] : reads) {
      const at::Tensor& t = x.score_inputs.at(buffer_uid(k, p));
      y.score_inputs[buffer_uid(k, p)] = p == 2 ? t.narrow(0, h0 * r, nh * r) : t;  // (buf[b]: not on cuDNN)
    }
    return y;
  }

  // t with packed strides: t itself restrided where only its size-1 dimensions' strides differ from packed
  // ones (the same memory: a batch group's statistics, and a head group's, whose batch dimension is 1),
  // else a packed copy.
  static at::Tensor packed_view(const at::Tensor& t) {
    std::vector<int64_t> stride(t.dim());
    bool same = true;
    for (int64_t d = t.dim() - 1, e = 1; d >= 0; e *= t.size(d), --d) {
      stride[d] = e;
      same = same && (t.size(d) == 1 || t.stride(d) == e);
    }
    return same ? t.as_strided(t.sizes(), stride) : t.clone(at::MemoryFormat::Contiguous);
  }

  // Runs the graph for x with a workspace of the size cuDNN asks for, reported through `stats` (the plan's
  // model of it: cudnn_sdpa_workspace_bytes, codegen/FlexLowering.h).
  void execute(cudnnHandle_t handle, const Operands& x, CallStats& stats) const {
    const std::shared_ptr<const CudnnGraph> g = graph_for(handle, x);
    stats.workspace = std::max(stats.workspace, g->workspace);
    std::unordered_map<int64_t, void*> pack;
    for (const auto& [uid, t] : x.by_uid())
      if (t->defined()) pack[uid] = t->data_ptr();
    at::Tensor ws;
    if (g->workspace > 0) ws = at::empty({g->workspace}, x.q.options().dtype(at::kByte));
    const std::string err = check(g->graph->execute(handle, pack, ws.defined() ? ws.data_ptr() : nullptr));
    HB_USER_CHECK(err.empty()) << where << ": cuDNN's SDPA failed: " << err
                               << ". Run the region with hinted_context(kernel=\"aten\") to use the reference.";
  }

  // The graph for these operands' shapes and strides, built once.
  std::shared_ptr<const CudnnGraph> graph_for(cudnnHandle_t handle, const Operands& x) const {
    // The key: dtype, device, then each defined operand's uid, dtype, rank, sizes and strides (numbers, not
    // text: this runs on every call).
    std::vector<int64_t> key{static_cast<int64_t>(x.q.scalar_type()), x.q.device().index()};
    for (const auto& [uid, t] : x.by_uid()) {
      if (!t->defined()) continue;
      key.insert(key.end(), {uid, static_cast<int64_t>(t->scalar_type()), t->dim()});
      key.insert(key.end(), t->sizes().begin(), t->sizes().end());
      key.insert(key.end(), t->strides().begin(), t->strides().end());
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    auto built = std::make_shared<CudnnGraph>(build(handle, x));
    cache_[key] = built;
    return built;
  }

  CudnnGraph build(cudnnHandle_t handle, const Operands& x) const {
    namespace fg = fe::graph;
    CudnnGraph r;
    r.graph = std::make_shared<fg::Graph>();
    fg::Graph& g = *r.graph;
    const bool half = x.q.scalar_type() == at::kHalf;
    g.set_io_data_type(half ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, const at::Tensor& t, int64_t uid) {
      auto a = fg::Tensor_attributes().set_name(name).set_uid(uid).set_dim(t.sizes().vec()).set_stride(t.strides().vec());
      if (t.scalar_type() == at::kFloat) a.set_data_type(fe::DataType_t::FLOAT);
      if (t.scalar_type() == at::kInt) a.set_data_type(fe::DataType_t::INT32);
      return g.tensor(a);
    };
    auto output = [&](const std::shared_ptr<fg::Tensor_attributes>& o, const at::Tensor& t, int64_t uid) {
      o->set_output(true).set_uid(uid).set_dim(t.sizes().vec()).set_stride(t.strides().vec());
    };
    auto Q = tensor("Q", x.q, kQ), K = tensor("K", x.k, kK), V = tensor("V", x.v, kV);
    std::shared_ptr<fg::Tensor_attributes> Bias;
    if (x.bias.defined()) Bias = tensor("Bias", x.bias, kBias);
    // A pointwise score_mod: buffer inputs on the main graph, the score_mod (then the band) in cuDNN's
    // score-modifier subgraph. Its backward has no bprop of ours: score_pointwise admits a backward
    // only where d score_mod / d score = 1, which is cuDNN's default.
    std::map<std::pair<int, int>, TA> bufs;
    for (const auto& [k, p] : reads) {
      const at::Tensor& t = x.score_inputs.at(buffer_uid(k, p));
      std::vector<int64_t> dim{1, 1, 1, 1}, stride{1, 1, 1, 1};
      dim[p - 1] = t.size(0);
      for (int d = 2; d >= 0; --d) stride[d] = stride[d + 1] * dim[d + 1];
      bufs[{k, p}] = g.tensor(fg::Tensor_attributes().set_name("score_buffer").set_uid(buffer_uid(k, p)).set_dim(dim)
                                  .set_stride(stride).set_data_type(fe::DataType_t::FLOAT));
    }
    auto apply_band = [this](std::shared_ptr<fg::Graph> sg, TA out) -> TA {
      if (band.unbounded()) return out;
      if (band.hi == FlexBand::kNoBound) return fg::attn::score_modifiers::causal_mask(sg, out);
      return fg::attn::score_modifiers::sliding_window_mask(sg, out, fe::DiagonalAlignment_t::TOP_LEFT, band.hi + 1, 0,
                                                            0, 0, nullptr, nullptr, nullptr, nullptr);
    };
    // A soft cap: cuDNN's own modifier (it saves its tanh input for the bprop), the band after it.
    auto cap = std::make_shared<fg::attn::score_modifiers::Softcap>();
    TA cap_scalar = softcap > 0 ? g.tensor(static_cast<float>(softcap)) : nullptr;
    auto softcap_fn = [cap, cap_scalar, apply_band](std::shared_ptr<fg::Graph> sg, TA score) -> TA {
      return apply_band(sg, cap->forward(sg, score, cap_scalar));
    };
    auto softcap_bprop = [cap, cap_scalar](std::shared_ptr<fg::Graph> sg, TA d_score) -> TA {
      return cap->backward(sg, d_score, cap_scalar);
    };
    auto score_mod_fn = [this, bufs, apply_band](std::shared_ptr<fg::Graph> sg, TA input) -> TA {
      TA score = sg->pointwise(input, fg::Pointwise_attributes().set_mode(fe::PointwiseMode_t::IDENTITY)
                                          .set_compute_data_type(fe::DataType_t::FLOAT));
      score->set_data_type(fe::DataType_t::FLOAT);
      return apply_band(sg, emit_pointwise(*sg, *score_graph, {score, nullptr, nullptr, generated_index(*sg, score, 2),
                                                               generated_index(*sg, score, 3)},
                                           5, bufs, score, where));
    };
    std::shared_ptr<fg::Tensor_attributes> SeqQ, SeqKV;
    if (x.seq_kv.defined()) {
      SeqQ = tensor("seq_q", x.seq_q, kSeqQ);
      SeqKV = tensor("seq_kv", x.seq_kv, kSeqKV);
    }
    auto set_band = [&](auto& attrs) {
      if (SeqKV) attrs.set_padding_mask(true).set_seq_len_q(SeqQ).set_seq_len_kv(SeqKV);
      if (mod == Mod::Pointwise) {
        if (softcap > 0) attrs.set_score_mod(softcap_fn);
        else attrs.set_score_mod(score_mod_fn);
        return;
      }
      if (band.unbounded()) return;
      attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
      if (band.hi != FlexBand::kNoBound) attrs.set_diagonal_band_left_bound(static_cast<int>(band.hi + 1));
    };
    if (!backward) {
      fg::SDPA_attributes a;
      a.set_name("flex_attention").set_generate_stats(true).set_attn_scale(static_cast<float>(scale));
      set_band(a);
      if (Bias) a.set_bias(Bias);
      auto [O, Stats] = g.sdpa(Q, K, V, a);
      output(O, x.o, kO);
      output(Stats, x.stats, kStats);
      Stats->set_data_type(fe::DataType_t::FLOAT);
    } else {
      auto O = tensor("O", x.o, kO), dO = tensor("dO", x.d_o, kDO);
      auto Stats = tensor("Stats", x.stats, kStats);  // float32
      fg::SDPA_backward_attributes a;
      a.set_name("flex_attention_backward").set_attn_scale(static_cast<float>(scale));
      a.set_deterministic_algorithm(deterministic);
      set_band(a);
      if (mod == Mod::Pointwise && softcap > 0) a.set_score_mod_bprop(softcap_bprop);
      if (Bias) a.set_bias(Bias);
      if (x.dbias.defined()) {
        auto dBias = tensor("dBias", x.dbias, kDBias);  // in the bias's dtype
        dBias->set_output(true);
        a.set_dbias(dBias);
      }
      auto [dQ, dK, dV] = g.sdpa_backward(Q, K, V, O, dO, Stats, a);
      output(dQ, x.dq, kDQ);
      output(dK, x.dk, kDK);
      output(dV, x.dv, kDV);
    }
    std::string err = check(g.validate());
    if (err.empty()) err = check(g.build_operation_graph(handle));
    if (err.empty()) err = check(g.create_execution_plans({fe::HeurMode_t::A}));
    if (err.empty()) err = check(g.check_support(handle));
    if (err.empty()) err = check(g.build_plans(handle));
    HB_USER_CHECK(err.empty()) << where << ": cuDNN cannot build this SDPA graph (" << x.q.sizes() << ", "
                               << x.q.scalar_type() << (x.bias.defined() ? ", bias " : "")
                               << (x.bias.defined() ? c10::str(x.bias.sizes()) : std::string()) << "): " << err
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
  call->pad_kv = a.pad_kv;
  call->cache_index_tensors = ctx.program.keep_across_calls;
  if (a.pad_kv >= 0) call->mask_buffers = convert_untyped(n.args[call->backward ? 13 : 8], ctx.where);
  call->deterministic = n.hints.deterministic.value_or(false);
  call->scale = float_arg(n.args[call->backward ? 10 : 5], ctx.where);
  for (int k = 0; k < (call->backward ? 6 : 3); ++k) call->tensors.push_back(convert_untyped(n.args[k], ctx.where));
  if (!a.score_identity && !a.score_row_shift && a.score_pointwise) {
    call->mod = CudnnFlexCall::Mod::Pointwise;
    call->softcap = a.softcap;
    call->score_graph = ctx.graph().subgraphs.at(n.args[call->backward ? 7 : 3].s);
    buffer_reads(*call->score_graph, 5, &call->reads);
    call->score_buffers = convert_untyped(n.args[call->backward ? 12 : 7], ctx.where);
    if (call->backward) call->buffer_grads.assign(n.args[12].items.size(), false);  // score_pointwise: none wants one
  } else if (a.score_row_shift || a.score_bias) {
    call->mod = a.score_bias ? CudnnFlexCall::Mod::Bias : CudnnFlexCall::Mod::RowShift;
    call->bias_per_batch = a.bias_reads_b;
    call->layout = a.bias_layout;
    call->score_mod = ctx.subgraph(n.args[call->backward ? 7 : 3]);  // the backward's fw_graph is the score_mod
    call->score_buffers = convert_untyped(n.args[call->backward ? 12 : 7], ctx.where);
    if (call->backward) {
      // The joint graph returns (grad_score, None x4, *buffer grads): which buffers get one.
      const Arg& joint = n.args[8];
      if (a.score_bias) call->joint = ctx.subgraph(joint);
      const Graph& jg = *ctx.graph().subgraphs.at(joint.s);
      const Node& ret = jg.nodes[jg.output_node()];
      const Arg& items = ret.args.at(0);
      for (size_t k = 5; k < items.items.size(); ++k) call->buffer_grads.push_back(items.items[k].kind == Arg::Kind::Ref);
      HB_INTERNAL_CHECK(call->buffer_grads.size() == n.args[12].items.size())
          << ctx.where << ": the joint graph returns " << call->buffer_grads.size() << " buffer gradients for "
          << n.args[12].items.size() << " buffers";
      // The direct layouts give only their own buffer a gradient: any other one goes through the joint graph.
      for (size_t k = 0; k < call->buffer_grads.size(); ++k)
        if (call->buffer_grads[k] && static_cast<int>(k) != call->layout.buffer) call->layout = FlexBiasLayout{};
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

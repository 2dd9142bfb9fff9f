#include "backend/runtime/FlexTiledCpu.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace hb::rt {

namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;

// ---- tile products: row-major C[M, N] = alpha * op(A) op(B) + beta * C, through the BLAS libtorch
// carries (its Fortran sgemm_/dgemm_, MKL in the x86 wheels), or plain loops where it exports none. Weak
// references: resolved from libtorch_cpu when the module loads, null where absent.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // the C form (mkl_set_num_threads_local is Fortran)
// MKL's vector math (exp over an array) with an explicit mode.
void vmsExp(int, const float*, float*, long long) __attribute__((weak));
void vmdExp(int, const double*, double*, long long) __attribute__((weak));
}
// High accuracy, denormal results flushed to zero, no error reporting (mkl_vml_defines.h: VML_HA,
// VML_FTZDAZ_ON, VML_ERRMODE_NOERR). Far-below-max scores underflow constantly (ALiBi, long rows): with
// VML's default mode every underflow takes its error path, and denormal probabilities slow the next
// GEMM; flushed, they are 0, which they are to working precision.
constexpr long long kVmlMode = 0x00000002 | 0x00280000 | 0x00002000;

// y[e] = exp(x[e]) in place over n values: MKL's vector exp where libtorch carries it (exp(-inf) = 0).
template <typename T>
void exp_inplace(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (vmsExp) return vmsExp(static_cast<int>(n), x, x, kVmlMode);
  } else {
    if (vmdExp) return vmdExp(static_cast<int>(n), x, x, kVmlMode);
  }
  for (int64_t e = 0; e < n; ++e) x[e] = std::exp(x[e]);
}

template <typename T>
bool have_blas() {
  if constexpr (std::is_same_v<T, float>) return sgemm_ != nullptr;
  else return dgemm_ != nullptr;
}

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (have_blas<T>()) {
    // Column-major BLAS on row-major data: C^T = op(B)^T op(A)^T.
    const char ca = ta ? 'T' : 'N', cb = tb ? 'T' : 'N';
    const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
    if (K == 0) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
      return;
    }
    if constexpr (std::is_same_v<T, float>)
      sgemm_(&cb, &ca, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
    else
      dgemm_(&cb, &ca, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < K; ++p)
        acc += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      C[i * ldc + j] = alpha * acc + (beta == T(0) ? T(0) : beta * C[i * ldc + j]);
    }
}

// ---- threads: task i runs on worker i % nt, nt = torch's intra-op thread count (std::thread, not
// at::parallel_for: its OpenMP form is header code that runs serially in a library built without
// -fopenmp, and a second OpenMP runtime beside torch's is worse). The assignment is fixed for a given
// thread count, so per-worker partial sums, added in worker order, are deterministic. Errors thrown by
// a worker are rethrown here.
template <typename F>
void for_each_task(int64_t n, const F& f) {  // f(worker, first task, stride)
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  std::vector<std::exception_ptr> errors(nt);
  auto work = [&](int64_t w) {
    // One BLAS thread per worker: the workers are the parallelism (MKL would start its own per call).
    const int before = MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0;
    try {
      f(w, w, nt);
    } catch (...) {
      errors[w] = std::current_exception();
    }
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(before);
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < nt; ++w) threads.emplace_back(work, w);
  work(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// ---- the generated functions, by working type
template <typename T>
struct Fns;
template <>
struct Fns<float> {
  static void score(const FlexKernelFns& f, float* s, HbFlexTile* t) { f.score_f32(s, t); }
  static bool has_score(const FlexKernelFns& f) { return f.score_f32 != nullptr; }
  static void joint(const FlexKernelFns& f, const float* s, float* ds, HbFlexTile* t) { f.joint_f32(s, ds, t); }
  static bool has_joint(const FlexKernelFns& f) { return f.joint_f32 != nullptr; }
};
template <>
struct Fns<double> {
  static void score(const FlexKernelFns& f, double* s, HbFlexTile* t) { f.score_f64(s, t); }
  static bool has_score(const FlexKernelFns& f) { return f.score_f64 != nullptr; }
  static void joint(const FlexKernelFns& f, const double* s, double* ds, HbFlexTile* t) { f.joint_f64(s, ds, t); }
  static bool has_joint(const FlexKernelFns& f) { return f.joint_f64 != nullptr; }
};

std::vector<HbFlexBuffer> describe_buffers(const std::vector<at::Tensor>& bufs, const char* what) {
  std::vector<HbFlexBuffer> out(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    const at::Tensor& b = bufs[i];
    TORCH_CHECK(b.device().is_cpu(), "flex_attention: ", what, " buffer ", i, " is on ", b.device(),
                "; the generated CPU kernel reads CPU buffers");
    TORCH_CHECK(b.dim() <= 8, "flex_attention: ", what, " buffer ", i, " has rank ", b.dim(), " (at most 8)");
    HbFlexBuffer& d = out[i];
    d.data = b.data_ptr();
    d.grad = nullptr;
    d.rank = static_cast<int>(b.dim());
    for (int64_t k = 0; k < b.dim(); ++k) {
      d.sizes[k] = b.size(k);
      d.strides[k] = b.stride(k);
    }
  }
  return out;
}

// The first error a generated function reported, raised as eager raises it.
struct ErrorSink {
  std::mutex mu;
  HbFlexTile first{};
  bool set = false;
  void take(const HbFlexTile& t) {
    if (!t.error) return;
    std::lock_guard<std::mutex> lock(mu);
    if (!set) first = t, set = true;
  }
  void raise(size_t nscore) const {
    if (!set) return;
    if (first.error == kFlexErrorIndex) {
      const bool mask = first.error_buffer >= static_cast<int>(nscore);
      TORCH_CHECK_INDEX(false, "flex_attention: the ", mask ? "mask_mod" : "score_mod", " indexes captured buffer ",
                        mask ? first.error_buffer - nscore : first.error_buffer, " out of range: index ",
                        first.error_index, " is out of bounds for dimension with size ", first.error_size,
                        " (at b=", first.b, ", h=", first.h, ")");
    }
    TORCH_CHECK(false, "flex_attention: integer division or modulo by zero in the score_mod or mask_mod (at b=",
                first.b, ", h=", first.h, ")");
  }
};

// The blocks a q block attends to: the partial ones (mask_mod applies), then the full ones.
struct BlockLists {
  const int* kv_num;
  const int* kv_idx;
  const int* full_num;
  const int* full_idx;
  int64_t Bm, Hm, nQ, nKV, fBm, fHm, fnQ, fnKV;

  template <typename F>
  void for_each(int64_t b, int64_t h, int64_t qblk, int64_t n_kv_blocks, F&& f) const {
    auto walk = [&](const int* num, const int* idx, int64_t bm, int64_t hm, int64_t nq, int64_t nkv, bool full) {
      if (!num) return;
      const int64_t row = ((bm == 1 ? 0 : b) * hm + (hm == 1 ? 0 : h)) * nq + qblk;
      const int64_t count = std::min<int64_t>(num[row], nkv);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t c = idx[row * nkv + j];
        TORCH_CHECK(c >= 0 && c < n_kv_blocks, "flex_attention: the block mask lists kv block ", c, " of ",
                    n_kv_blocks);
        f(c, full);
      }
    };
    walk(kv_num, kv_idx, Bm, Hm, nQ, nKV, false);
    walk(full_num, full_idx, fBm, fHm, fnQ, fnKV, true);
  }
};

struct Setup {
  int64_t B, Hq, Sq, D, Bkv, Hkv, Skv, Dv, G;
  int64_t QB, KB, Tq, Tk, nQB, nKB;
  at::Tensor kv_num, kv_idx, full_num, full_idx;  // int32, contiguous (kept alive)
  BlockLists lists{};
};

Setup setup(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlexBlocks& blocks) {
  check_flex_shapes(q, k, v);
  Setup s;
  s.B = q.size(0), s.Hq = q.size(1), s.Sq = q.size(2), s.D = q.size(3);
  s.Bkv = k.size(0), s.Hkv = k.size(1), s.Skv = k.size(2), s.Dv = v.size(3);
  s.G = s.Hq / s.Hkv;
  s.QB = blocks.q_block, s.KB = blocks.kv_block;
  s.Tq = std::min<int64_t>(s.QB, 128);
  s.Tk = std::min<int64_t>(s.KB, 256);
  s.nQB = (s.Sq + s.QB - 1) / s.QB;
  s.nKB = (s.Skv + s.KB - 1) / s.KB;
  auto prep = [&](const at::Tensor& t, int dim, const char* what) {
    if (!t.defined()) return at::Tensor();
    TORCH_CHECK(t.dim() == dim, "flex_attention: block mask ", what, " has ", t.dim(), " dims, expected ", dim);
    return t.to(at::kInt).contiguous();
  };
  s.kv_num = prep(blocks.kv_num, 3, "kv_num_blocks");
  s.kv_idx = prep(blocks.kv_idx, 4, "kv_indices");
  s.full_num = prep(blocks.full_num, 3, "full_kv_num_blocks");
  s.full_idx = prep(blocks.full_idx, 4, "full_kv_indices");
  TORCH_CHECK(s.kv_num.defined() && s.kv_idx.defined(), "flex_attention: the block mask has no kv block lists");
  auto check_lists = [&](const at::Tensor& num, const at::Tensor& idx, const char* what) {
    TORCH_CHECK((num.size(0) == 1 || num.size(0) == s.B) && (num.size(1) == 1 || num.size(1) == s.Hq) &&
                    num.size(2) >= s.nQB && idx.size(0) == num.size(0) && idx.size(1) == num.size(1) &&
                    idx.size(2) == num.size(2),
                "flex_attention: the block mask's ", what, " lists ", num.sizes(), " / ", idx.sizes(),
                " do not fit B=", s.B, ", H=", s.Hq, " and ", s.nQB, " query blocks of ", s.QB,
                " (was the BlockMask made for other sequence lengths?)");
  };
  check_lists(s.kv_num, s.kv_idx, "kv");
  s.lists.kv_num = s.kv_num.data_ptr<int>();
  s.lists.kv_idx = s.kv_idx.data_ptr<int>();
  s.lists.Bm = s.kv_num.size(0), s.lists.Hm = s.kv_num.size(1), s.lists.nQ = s.kv_num.size(2),
  s.lists.nKV = s.kv_idx.size(3);
  if (s.full_num.defined() && s.full_idx.defined()) {
    check_lists(s.full_num, s.full_idx, "full kv");
    s.lists.full_num = s.full_num.data_ptr<int>();
    s.lists.full_idx = s.full_idx.data_ptr<int>();
    s.lists.fBm = s.full_num.size(0), s.lists.fHm = s.full_num.size(1), s.lists.fnQ = s.full_num.size(2),
    s.lists.fnKV = s.full_idx.size(3);
  } else {
    s.lists.full_num = s.lists.full_idx = nullptr;
  }
  return s;
}

// The query tiles: [q0, q0 + nq) inside query block qblk.
struct QTile {
  int64_t q0, nq, qblk;
};
std::vector<QTile> q_tiles(const Setup& s) {
  std::vector<QTile> t;
  for (int64_t blk = 0; blk < s.nQB; ++blk) {
    const int64_t end = std::min(s.Sq, (blk + 1) * s.QB);
    for (int64_t q0 = blk * s.QB; q0 < end; q0 += s.Tq) t.push_back({q0, std::min(s.Tq, end - q0), blk});
  }
  return t;
}

// Calls f(k0, nk, full) for every key tile of query tile `qt` of (b, h).
template <typename F>
void for_each_kv_tile(const Setup& s, int64_t b, int64_t h, const QTile& qt, F&& f) {
  s.lists.for_each(b, h, qt.qblk, s.nKB, [&](int64_t c, bool full) {
    const int64_t end = std::min(s.Skv, (c + 1) * s.KB);
    for (int64_t k0 = c * s.KB; k0 < end; k0 += s.Tk) f(k0, std::min(s.Tk, end - k0), full);
  });
}

// A row's maximum and sum over 8 partial results: a serial max or add waits out the instruction's latency
// at every element (the row max alone was a quarter of the forward's time), and the partials vectorize.
// The max ignores NaN as std::max(m, x) does; the sum's order is fixed, so results stay repeatable.
template <typename T>
T row_max(const T* x, int64_t n, T init) {
  T p[8];
  for (int u = 0; u < 8; ++u) p[u] = init;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) p[u] = std::max(p[u], x[j + u]);
  for (; j < n; ++j) p[0] = std::max(p[0], x[j]);
  for (int u = 1; u < 8; ++u) p[0] = std::max(p[0], p[u]);
  return p[0];
}

template <typename T>
T row_sum(const T* x, int64_t n) {
  T p[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) p[u] += x[j + u];
  for (; j < n; ++j) p[0] += x[j];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

template <typename T>
void apply_mask(T* x, const unsigned char* keep, int64_t n, T fill) {
  for (int64_t e = 0; e < n; ++e)
    if (!keep[e]) x[e] = fill;
}

template <typename T>
std::vector<at::Tensor> forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const FlexKernelFns& fns, const Setup& s, double scale_d,
                                     std::vector<HbFlexBuffer>& sbuf, std::vector<HbFlexBuffer>& mbuf) {
  const auto wp = std::is_same_v<T, double> ? at::kDouble : at::kFloat;
  const at::Tensor qf = q.to(wp).contiguous(), kf = k.to(wp).contiguous(), vf = v.to(wp).contiguous();
  at::Tensor out = at::empty({s.B, s.Hq, s.Sq, s.Dv}, qf.options());
  at::Tensor lse = at::empty({s.B, s.Hq, s.Sq}, qf.options());
  at::Tensor mx = at::empty({s.B, s.Hq, s.Sq}, qf.options());
  const T* Qp = qf.data_ptr<T>();
  const T* Kp = kf.data_ptr<T>();
  const T* Vp = vf.data_ptr<T>();
  T* Op = out.data_ptr<T>();
  T* Lp = lse.data_ptr<T>();
  T* Mp = mx.data_ptr<T>();
  const std::vector<QTile> tiles = q_tiles(s);
  const int64_t ntiles = static_cast<int64_t>(tiles.size());
  const T scale = static_cast<T>(scale_d), ninf = -std::numeric_limits<T>::infinity();
  ErrorSink errors;
  for_each_task(s.B * s.Hq * ntiles, [&](int64_t, int64_t first, int64_t stride) {
    std::vector<T> S(s.Tq * s.Tk), acc(s.Tq * s.Dv), m(s.Tq), l(s.Tq), mnew(s.Tq);
    std::vector<unsigned char> keep(s.Tq * s.Tk);
    for (int64_t task = first; task < s.B * s.Hq * ntiles; task += stride) {
      const QTile& qt = tiles[task % ntiles];
      const int64_t bh = task / ntiles, b = bh / s.Hq, h = bh % s.Hq;
      const int64_t bk = s.Bkv == 1 ? 0 : b, hk = h / s.G;
      const T* Q = Qp + ((b * s.Hq + h) * s.Sq + qt.q0) * s.D;
      const T* K = Kp + (bk * s.Hkv + hk) * s.Skv * s.D;
      const T* V = Vp + (bk * s.Hkv + hk) * s.Skv * s.Dv;
      HbFlexTile tile{};
      tile.b = b, tile.h = h, tile.q0 = qt.q0, tile.nq = static_cast<int>(qt.nq);
      tile.score_buffers = sbuf.data(), tile.mask_buffers = mbuf.data();
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m.begin(), m.end(), ninf);
      std::fill(l.begin(), l.end(), T(0));
      for_each_kv_tile(s, b, h, qt, [&](int64_t k0, int64_t nk, bool full) {
        gemm<T>(false, true, qt.nq, nk, s.D, scale, Q, s.D, K + k0 * s.D, s.D, T(0), S.data(), nk);
        tile.k0 = k0, tile.nk = static_cast<int>(nk), tile.ld = static_cast<int>(nk);
        if (Fns<T>::has_score(fns)) Fns<T>::score(fns, S.data(), &tile);
        if (!full && fns.mask) {
          fns.mask(keep.data(), &tile);
          apply_mask(S.data(), keep.data(), qt.nq * nk, ninf);
        }
        // Online softmax: the new row maxima, the scores shifted by them, one vector exp over the tile.
        for (int64_t i = 0; i < qt.nq; ++i) {
          T* row = S.data() + i * nk;
          mnew[i] = std::max(m[i], row_max(row, nk, ninf));
          const T shift = mnew[i] == ninf ? T(0) : mnew[i];  // everything masked so far: exp(-inf) = 0
          for (int64_t j = 0; j < nk; ++j) row[j] -= shift;
        }
        exp_inplace(S.data(), qt.nq * nk);
        for (int64_t i = 0; i < qt.nq; ++i) {
          const T* row = S.data() + i * nk;
          const T sum = row_sum(row, nk);
          if (mnew[i] == ninf) continue;
          const T corr = std::exp(m[i] - mnew[i]);
          l[i] = l[i] * corr + sum;
          m[i] = mnew[i];
          if (corr != T(1))
            for (int64_t d = 0; d < s.Dv; ++d) acc[i * s.Dv + d] *= corr;
        }
        gemm<T>(false, false, qt.nq, s.Dv, nk, T(1), S.data(), nk, V + k0 * s.Dv, s.Dv, T(1), acc.data(), s.Dv);
      });
      errors.take(tile);
      const int64_t row0 = (b * s.Hq + h) * s.Sq + qt.q0;
      for (int64_t i = 0; i < qt.nq; ++i) {
        const bool empty = l[i] == T(0);
        const T inv = empty ? T(0) : T(1) / l[i];
        for (int64_t d = 0; d < s.Dv; ++d) Op[(row0 + i) * s.Dv + d] = acc[i * s.Dv + d] * inv;
        Lp[row0 + i] = empty ? ninf : static_cast<T>((m[i] + std::log(l[i])) / kLn2);
        Mp[row0 + i] = empty ? ninf : static_cast<T>(m[i] / kLn2);
      }
    }
  });
  errors.raise(sbuf.size());
  return {like_strides_of(out.to(q.scalar_type()), q.strides()), lse, mx};
}

template <typename T>
FlexBackwardResult backward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& logsumexp, const at::Tensor& grad_out,
                                 const std::optional<at::Tensor>& grad_lse, const FlexKernelFns& fns, const Setup& s,
                                 double scale_d, const std::vector<at::Tensor>& score_buffers,
                                 std::vector<HbFlexBuffer>& sbuf, std::vector<HbFlexBuffer>& mbuf,
                                 const std::vector<bool>& buffer_grads) {
  const auto wp = std::is_same_v<T, double> ? at::kDouble : at::kFloat;
  const at::Tensor qf = q.to(wp).contiguous(), kf = k.to(wp).contiguous(), vf = v.to(wp).contiguous();
  const at::Tensor of = out.to(wp).contiguous();
  const at::Tensor dof = grad_out.defined() ? grad_out.to(wp).contiguous() : at::zeros_like(of);
  const at::Tensor lf = logsumexp.to(wp).contiguous();
  const bool has_dlse = grad_lse.has_value() && grad_lse->defined();
  const at::Tensor dlf = has_dlse ? grad_lse->to(wp).contiguous() : at::Tensor();
  at::Tensor dq = at::empty({s.B, s.Hq, s.Sq, s.D}, qf.options());
  at::Tensor dk = at::empty({s.B, s.Hkv, s.Skv, s.D}, qf.options());
  at::Tensor dv = at::empty({s.B, s.Hkv, s.Skv, s.Dv}, qf.options());
  const T *Qp = qf.data_ptr<T>(), *Kp = kf.data_ptr<T>(), *Vp = vf.data_ptr<T>(), *Op = of.data_ptr<T>(),
          *dOp = dof.data_ptr<T>(), *Lp = lf.data_ptr<T>(), *dLp = has_dlse ? dlf.data_ptr<T>() : nullptr;
  T *dQp = dq.data_ptr<T>(), *dKp = dk.data_ptr<T>(), *dVp = dv.data_ptr<T>();
  const std::vector<QTile> tiles = q_tiles(s);
  const T scale = static_cast<T>(scale_d), ninf = -std::numeric_limits<T>::infinity();
  const bool joint = Fns<T>::has_joint(fns);

  // Buffer gradients: one dense double accumulator per worker, summed in worker order afterwards.
  const int64_t ntasks = s.B * s.Hkv;
  std::vector<std::vector<std::vector<double>>> partial(ntasks);  // [worker][buffer] -> accumulator
  ErrorSink errors;
  for_each_task(ntasks, [&](int64_t worker, int64_t first, int64_t stride) {
    std::vector<HbFlexBuffer> my = sbuf;
    std::vector<std::vector<double>>& acc_bufs = partial[worker];
    acc_bufs.resize(sbuf.size());
    for (size_t i = 0; i < sbuf.size(); ++i)
      if (i < buffer_grads.size() && buffer_grads[i]) {
        acc_bufs[i].assign(score_buffers[i].numel(), 0.0);
        my[i].grad = acc_bufs[i].data();
      }
    std::vector<T> S0(s.Tq * s.Tk), P(s.Tq * s.Tk), dP(s.Tq * s.Tk), dQ(s.Tq * s.D), delta(s.Tq), lse(s.Tq),
        dlse(s.Tq), dK(s.Skv * s.D), dV(s.Skv * s.Dv);
    std::vector<unsigned char> keep(s.Tq * s.Tk);
    for (int64_t task = first; task < ntasks; task += stride) {
      const int64_t b = task / s.Hkv, hk = task % s.Hkv, bk = s.Bkv == 1 ? 0 : b;
      const T* K = Kp + (bk * s.Hkv + hk) * s.Skv * s.D;
      const T* V = Vp + (bk * s.Hkv + hk) * s.Skv * s.Dv;
      std::fill(dK.begin(), dK.end(), T(0));
      std::fill(dV.begin(), dV.end(), T(0));
      HbFlexTile tile{};
      tile.b = b, tile.score_buffers = my.data(), tile.mask_buffers = mbuf.data();
      for (int64_t g = 0; g < s.G; ++g) {
        const int64_t h = hk * s.G + g;
        tile.h = h;
        for (const QTile& qt : tiles) {
          const int64_t row0 = (b * s.Hq + h) * s.Sq + qt.q0;
          const T* Q = Qp + row0 * s.D;
          const T* dO = dOp + row0 * s.Dv;
          for (int64_t i = 0; i < qt.nq; ++i) {
            T dsum = 0;
            for (int64_t d = 0; d < s.Dv; ++d) dsum += Op[(row0 + i) * s.Dv + d] * dO[i * s.Dv + d];
            delta[i] = dsum;
            lse[i] = Lp[row0 + i] * static_cast<T>(kLn2);
            dlse[i] = dLp ? dLp[row0 + i] / static_cast<T>(kLn2) : T(0);
          }
          std::fill(dQ.begin(), dQ.end(), T(0));
          tile.q0 = qt.q0, tile.nq = static_cast<int>(qt.nq);
          for_each_kv_tile(s, b, h, qt, [&](int64_t k0, int64_t nk, bool full) {
            const int64_t n = qt.nq * nk;
            gemm<T>(false, true, qt.nq, nk, s.D, scale, Q, s.D, K + k0 * s.D, s.D, T(0), S0.data(), nk);
            tile.k0 = k0, tile.nk = static_cast<int>(nk), tile.ld = static_cast<int>(nk);
            std::copy(S0.begin(), S0.begin() + n, P.begin());
            if (Fns<T>::has_score(fns)) Fns<T>::score(fns, P.data(), &tile);
            const bool masked = !full && fns.mask;
            if (masked) {
              fns.mask(keep.data(), &tile);
              apply_mask(P.data(), keep.data(), n, ninf);
            }
            // P = exp(score - lse): rows the forward fully masked (lse = -inf) are zero.
            for (int64_t i = 0; i < qt.nq; ++i) {
              T* row = P.data() + i * nk;
              const T shift = lse[i];  // a local: the loop then vectorizes (row might alias lse[i])
              if (shift == ninf) std::fill(row, row + nk, ninf);
              else
                for (int64_t j = 0; j < nk; ++j) row[j] -= shift;
            }
            exp_inplace(P.data(), n);
            gemm<T>(true, false, nk, s.Dv, qt.nq, T(1), P.data(), nk, dO, s.Dv, T(1), dV.data() + k0 * s.Dv, s.Dv);
            gemm<T>(false, true, qt.nq, nk, s.Dv, T(1), dO, s.Dv, V + k0 * s.Dv, s.Dv, T(0), dP.data(), nk);
            for (int64_t i = 0; i < qt.nq; ++i)
              for (int64_t j = 0; j < nk; ++j) {
                T& d = dP[i * nk + j];
                d = P[i * nk + j] * (d - delta[i] + dlse[i]);
              }
            if (joint) Fns<T>::joint(fns, S0.data(), dP.data(), &tile);
            if (masked) apply_mask(dP.data(), keep.data(), n, T(0));
            gemm<T>(false, false, qt.nq, s.D, nk, scale, dP.data(), nk, K + k0 * s.D, s.D, T(1), dQ.data(), s.D);
            gemm<T>(true, false, nk, s.D, qt.nq, scale, dP.data(), nk, Q, s.D, T(1), dK.data() + k0 * s.D, s.D);
          });
          std::copy(dQ.begin(), dQ.begin() + qt.nq * s.D, dQp + row0 * s.D);
        }
      }
      std::copy(dK.begin(), dK.end(), dKp + (b * s.Hkv + hk) * s.Skv * s.D);
      std::copy(dV.begin(), dV.end(), dVp + (b * s.Hkv + hk) * s.Skv * s.Dv);
      errors.take(tile);
    }
  });
  errors.raise(sbuf.size());

  if (s.Bkv != s.B) {  // k, v broadcast over the batch: their gradients sum over it
    dk = dk.sum(0, /*keepdim=*/true);
    dv = dv.sum(0, /*keepdim=*/true);
  }
  FlexBackwardResult r{like_strides_of(dq.to(q.scalar_type()), q.strides()),
                       like_strides_of(dk.to(k.scalar_type()), k.strides()),
                       like_strides_of(dv.to(v.scalar_type()), v.strides()),
                       {}};
  for (size_t i = 0; i < score_buffers.size(); ++i) {
    if (i >= buffer_grads.size() || !buffer_grads[i]) {
      r.buffer_grads.emplace_back();
      continue;
    }
    at::Tensor total = at::zeros(score_buffers[i].sizes(), qf.options().dtype(at::kDouble));
    double* t = total.data_ptr<double>();
    for (const auto& chunk : partial)  // worker order: fixed for a given thread count
      if (!chunk.empty() && !chunk[i].empty())
        for (size_t e = 0; e < chunk[i].size(); ++e) t[e] += chunk[i][e];
    r.buffer_grads.push_back(total.to(score_buffers[i].scalar_type()));
  }
  return r;
}

bool is_double(const at::Tensor& q) { return q.scalar_type() == at::kDouble; }

}  // namespace

std::vector<at::Tensor> flex_tiled_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const FlexKernelFns& fns, const FlexBlocks& blocks, double scale,
                                           const std::vector<at::Tensor>& score_buffers,
                                           const std::vector<at::Tensor>& mask_buffers) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "flex_attention: the generated tiled kernel runs on the CPU, got q on ", q.device());
  const Setup s = setup(q, k, v, blocks);
  std::vector<HbFlexBuffer> sbuf = describe_buffers(score_buffers, "score_mod");
  std::vector<HbFlexBuffer> mbuf = describe_buffers(mask_buffers, "mask_mod");
  return is_double(q) ? forward_impl<double>(q, k, v, fns, s, scale, sbuf, mbuf)
                      : forward_impl<float>(q, k, v, fns, s, scale, sbuf, mbuf);
}

FlexBackwardResult flex_tiled_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& grad_out,
                                       const std::optional<at::Tensor>& grad_logsumexp, const FlexKernelFns& fns,
                                       const FlexBlocks& blocks, double scale,
                                       const std::vector<at::Tensor>& score_buffers,
                                       const std::vector<at::Tensor>& mask_buffers,
                                       const std::vector<bool>& buffer_grads) {
  TORCH_CHECK(q.device().is_cpu(), "flex_attention: the generated tiled kernel runs on the CPU, got q on ", q.device());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "Backward pass with mixed query, key, and value dtype is not supported, got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type());
  const Setup s = setup(q, k, v, blocks);
  std::vector<HbFlexBuffer> sbuf = describe_buffers(score_buffers, "score_mod");
  std::vector<HbFlexBuffer> mbuf = describe_buffers(mask_buffers, "mask_mod");
  return is_double(q) ? backward_impl<double>(q, k, v, out, logsumexp, grad_out, grad_logsumexp, fns, s, scale,
                                              score_buffers, sbuf, mbuf, buffer_grads)
                      : backward_impl<float>(q, k, v, out, logsumexp, grad_out, grad_logsumexp, fns, s, scale,
                                             score_buffers, sbuf, mbuf, buffer_grads);
}

}  // namespace hb::rt

// The generated FlexAttention CUDA kernels (codegen/cuda/FlexTiledKernel.cuh) on their own: no torch, no
// framework, so a change to the template is timed and checked in seconds on the GPU machine. It builds
// the template as the generator would for the identity score_mod (no mask_mod, no joint), fills random
// q/k/v/dO, checks out, logsumexp, dq, dk and dv at a small size against a float64 reference kernel, then
// times the forward and the backward at the benchmark size (CUDA events, median of --iters).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I<cutlass include> -I. -DHB_D=128 benchmarks/flex_kernel_lab.cu -o lab
//   ./lab [B H S] [iters] [mask]
//
// mask: 0 every 128-block full, 1 block-causal, 2 no mask as torch passes block_mask=None (one partial block
// of 2^30 rows each way, so a walk's tiles are tiles of one block).
//
// -DHB_LAB_TEMPLATE='"file"' builds another copy of the template (an experiment); -DHB_DETERMINISTIC=1 the
// deterministic=True kernels (dQ added in key-tile order), whose two backward runs must give the same bits. benchmarks/gpu_session.sh lab
// builds and runs it for D 64 and 128. Not part of the build or of CI: a developer's tool.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codegen/FlexKernelAbi.h"

HB_FLEX_KERNEL_ABI  // the generated unit declares these at global scope

#define HB_FN static __device__ __forceinline__
#ifndef HB_HALF
#define HB_HALF 0
#endif
#ifdef HB_LAB_MODS
// An experiment's score_mod and joint (HB_SCORE_MOD, HB_JOINT, hb_score_mod, hb_joint, and
// lab_buffers(HbFlexCudaArgs&, B, H, S) that sets up the captured buffers); the check is skipped.
#include HB_LAB_MODS
#else
#define HB_SCORE_MOD 0
#define HB_JOINT 0
#endif
#define HB_MASK_MOD 0
#ifndef HB_LAB_TEMPLATE
#define HB_LAB_TEMPLATE "codegen/cuda/FlexTiledKernel.cuh"
#endif
#include HB_LAB_TEMPLATE
#if HB_SIMT_FWD || HB_SIMT_BWD  // float32 (-DHB_F32=1), or the backward at D 256: the generator pastes this too
#include "codegen/cuda/FlexSimtKernel.cuh"
#endif

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

using hbk::Elem;

// Reference, one thread per (b, h, q) row, float64: out, lse (base 2), dq; dk and dv by atomics.
__global__ void ref_rows(const Elem* q, const Elem* k, const Elem* v, const Elem* dout, long long H, long long S,
                         double scale, bool causal, double* out, double* lse, double* dq, double* dk, double* dv,
                         double* p) {
  const long long local = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (local >= H * S) return;
  const long long row = blockIdx.y * H * S + local;
  const int D = HB_D;
  const long long bh = row / S, qi = row % S;
  const Elem* qr = q + row * D;
  const Elem* kb = k + bh * S * D;
  const Elem* vb = v + bh * S * D;
  const Elem* dor = dout + row * D;
  double* pr = p + row * S;
  double mx = -INFINITY;
  for (long long j = 0; j < S; ++j) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += double(qr[d]) * double(kb[j * D + d]);
    s *= scale;
    if (causal && j / 128 > qi / 128) s = -INFINITY;  // block-causal, as the lists
    pr[j] = s;
    mx = fmax(mx, s);
  }
  double sum = 0;
  for (long long j = 0; j < S; ++j) sum += exp(pr[j] - mx);
  for (long long j = 0; j < S; ++j) pr[j] = exp(pr[j] - mx) / sum;
  lse[row] = (mx + log(sum)) / log(2.0);
  double o[HB_D] = {}, delta = 0;
  for (long long j = 0; j < S; ++j)
    for (int d = 0; d < D; ++d) o[d] += pr[j] * double(vb[j * D + d]);
  for (int d = 0; d < D; ++d) out[row * D + d] = o[d], delta += o[d] * double(dor[d]);
  for (long long j = 0; j < S; ++j) {
    if (pr[j] == 0) continue;
    double dp = 0;
    for (int d = 0; d < D; ++d) dp += double(dor[d]) * double(vb[j * D + d]);
    const double ds = pr[j] * (dp - delta) * scale;
    for (int d = 0; d < D; ++d) {
      dq[row * D + d] += ds * double(kb[j * D + d]);
      atomicAdd(&dk[(bh * S + j) * D + d], ds * double(qr[d]));
      atomicAdd(&dv[(bh * S + j) * D + d], pr[j] * double(dor[d]));
    }
  }
}

struct Lists {
  std::vector<int> kv_num, kv_idx, q_num, q_idx;
};

// Full blocks only (no partial ones): every block, or block-causal (kv block <= q block).
Lists make_lists(long long nblk, bool causal) {
  Lists l;
  for (long long r = 0; r < nblk; ++r) {
    long long n = 0;
    for (long long c = 0; c < nblk; ++c)
      if (!causal || c <= r) l.kv_idx.push_back((int)c), ++n;
    for (long long c = n; c < nblk; ++c) l.kv_idx.push_back(0);
    l.kv_num.push_back((int)n);
  }
  for (long long c = 0; c < nblk; ++c) {  // q lists: per kv block, the q blocks that see it
    long long n = 0;
    for (long long r = 0; r < nblk; ++r)
      if (!causal || c <= r) l.q_idx.push_back((int)r), ++n;
    for (long long r = n; r < nblk; ++r) l.q_idx.push_back(0);
    l.q_num.push_back((int)n);
  }
  return l;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

double to_float_any(float x) { return x; }
#if !HB_F32  // (float32: Elem is float)
double to_float_any(Elem x) { return double(float(x)); }
#endif

struct Problem {
  long long B, H, S;
  bool causal, one_block;
  Elem *q, *k, *v, *dout, *out, *dk, *dv, *dq_out;
  float *lse, *mx, *delta, *dq;
  int *lists[8];
  int* order = nullptr;  // HB_DETERMINISTIC: the dQ turn counters, then the rank table (FlexTiledKernel.cuh)
  long long counters = 0;
  HbFlexCudaArgs a;

  Problem(long long B_, long long H_, long long S_, int mask, unsigned seed)
      : B(B_), H(H_), S(S_), causal(mask == 1), one_block(mask == 2) {
    const long long n = B * H * S * HB_D;
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto rnd = [&]() {
      std::vector<Elem> h(n);
      for (auto& x : h) x = Elem(nd(gen));
      return upload(h);
    };
    q = rnd(), k = rnd(), v = rnd(), dout = rnd();
    CK(cudaMalloc(&out, n * sizeof(Elem)));
    CK(cudaMalloc(&dk, n * sizeof(Elem)));
    CK(cudaMalloc(&dv, n * sizeof(Elem)));
    CK(cudaMalloc(&dq_out, n * sizeof(Elem)));
    CK(cudaMalloc(&lse, B * H * S * sizeof(float)));
    CK(cudaMalloc(&mx, B * H * S * sizeof(float)));
    CK(cudaMalloc(&delta, B * H * S * sizeof(float)));
    CK(cudaMalloc(&dq, n * sizeof(float)));  // room for every pair (dq_pairs = 0: one launch)
    const long long blk = 128, nblk = (S + blk - 1) / blk;
    Lists l = make_lists(nblk, causal);
    std::vector<int> zeros(nblk, 0);
    lists[0] = upload(zeros), lists[1] = upload(l.kv_idx), lists[2] = upload(l.kv_num), lists[3] = upload(l.kv_idx);
    lists[4] = upload(zeros), lists[5] = upload(l.q_idx), lists[6] = upload(l.q_num), lists[7] = upload(l.q_idx);
    std::memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.out = out, a.dout = dout, a.lse = lse, a.max_scores = mx, a.delta = delta, a.dq = dq;
    a.dq_out = dq_out, a.dk = dk, a.dv = dv;
    const long long st[3] = {H * S * HB_D, S * HB_D, HB_D};
    for (int i = 0; i < 3; ++i)
      a.q_strides[i] = a.k_strides[i] = a.v_strides[i] = a.o_strides[i] = a.do_strides[i] = st[i];
    a.B = a.Bkv = B, a.Hq = a.Hkv = H, a.Sq = a.Skv = S;
    a.scale = 1.f / std::sqrt((float)HB_D);
    a.q_block = a.kv_block = blk;
    a.dq_pairs = flex_dq_pairs(B * H, S);  // as backend/runtime/FlexTiledCuda.cpp sets it
    auto list = [&](int* num, int* idx) { return HbFlexBlockList{num, idx, 1, 1, nblk, nblk}; };
    a.kv_list = list(lists[0], lists[1]), a.kv_full_list = list(lists[2], lists[3]);
    a.q_list = list(lists[4], lists[5]), a.q_full_list = list(lists[6], lists[7]);
    if (one_block) {  // torch's empty BlockMask: kv_num_blocks [1], kv_indices [0], no full lists
      a.q_block = a.kv_block = 1LL << 30;
      a.kv_list = a.q_list = HbFlexBlockList{upload(std::vector<int>{1}), upload(std::vector<int>{0}), 1, 1, 1, 1};
      a.kv_full_list = a.q_full_list = HbFlexBlockList{nullptr, nullptr, 1, 1, 1, 1};
    }
#ifdef HB_LAB_MODS
    lab_buffers(a, B, H, S);
    a.run_joint = 1;
#endif
#if HB_DETERMINISTIC
    counters = B * H * ((S + 63) / 64);
    CK(cudaMalloc(&order, (counters + nblk * ((S + 63) / 64)) * sizeof(int)));
    a.dq_order = order, a.dq_rank = order + counters;
#if HB_SCATTER
    // The buffer gradient's windows (FlexTiledKernel.cuh, line_reduce), as backend/runtime/FlexTiledCuda.cpp
    // sizes them.
    const long long tiles = (S + 63) / 64;
    windows = B * H * tiles;
    a.scatter_len = flex_window_len(S);
    win_floats = flex_window_floats(B * H, tiles, a.scatter_len);
    starts = windows + B * H;
    CK(cudaMalloc(&a.scatter_win, win_floats * sizeof(float)));
    CK(cudaMalloc(&a.scatter_start, starts * sizeof(long long)));
#endif
#endif
  }

  long long windows = 0, win_floats = 0, starts = 0;
  long long grad_numel() const {
    long long n = 1;
    for (int d = 0; d < a.score_buffers[0].rank; ++d) n *= a.score_buffers[0].sizes[d];
    return n;
  }

  void forward() { CK((cudaError_t)hb_flex_cuda_forward(&a, nullptr)); }
  void backward() {
    if (order) CK(cudaMemsetAsync(order, 0, counters * sizeof(int)));
    if (windows) {
      static std::vector<long long> unset;
      unset.assign(starts, LLONG_MIN);
      CK(cudaMemsetAsync(a.scatter_win, 0, win_floats * sizeof(float)));
      CK(cudaMemcpyAsync(a.scatter_start, unset.data(), starts * sizeof(long long), cudaMemcpyHostToDevice));
    }
    CK((cudaError_t)hb_flex_cuda_backward(&a, nullptr));
  }
};

// max |x - ref| / max |ref| over n values.
template <typename T>
double rel_err(const std::vector<T>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::fabs(double(to_float_any(x[i])) - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return num / den;
}

const char* mask_name(int mask) { return mask == 1 ? " block-causal" : mask == 2 ? " one 2^30 block" : ""; }

// pairs: dQ's pairs a launch (0: flex_dq_pairs); with B 2, pairs 2 takes the two streams (HB_DQ_STREAMS)
bool check(long long S, int mask, long long pairs = 0, long long B = 1) {
  Problem p(B, 2, S, mask, 1);
  const bool causal = mask == 1;
  if (pairs) p.a.dq_pairs = pairs;
  p.forward();
  p.backward();
  CK(cudaDeviceSynchronize());
  const long long rows = p.B * p.H * S, n = rows * HB_D;
  double *out, *lse, *dq, *dk, *dv, *pm;
  CK(cudaMalloc(&out, n * 8)); CK(cudaMalloc(&lse, rows * 8)); CK(cudaMalloc(&dq, n * 8));
  CK(cudaMalloc(&dk, n * 8)); CK(cudaMalloc(&dv, n * 8)); CK(cudaMalloc(&pm, rows * S * 8));
  CK(cudaMemset(dq, 0, n * 8)); CK(cudaMemset(dk, 0, n * 8)); CK(cudaMemset(dv, 0, n * 8));
  ref_rows<<<dim3((unsigned)((p.H * S + 63) / 64), (unsigned)p.B), 64>>>(p.q, p.k, p.v, p.dout, p.H, S, p.a.scale,
                                                                         causal, out, lse, dq, dk, dv, pm);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const double e[5] = {rel_err(download(p.out, n), download(out, n)), rel_err(download(p.lse, rows), download(lse, rows)),
                       rel_err(download(p.dq_out, n), download(dq, n)), rel_err(download(p.dk, n), download(dk, n)),
                       rel_err(download(p.dv, n), download(dv, n))};
  const bool ok = e[0] < 2e-2 && e[1] < 1e-3 && e[2] < 2e-2 && e[3] < 2e-2 && e[4] < 2e-2;
  std::printf("check B%lld D%d S%lld%s, dQ %lld of %lld pairs a launch: max rel err out %.2e lse %.2e dq %.2e dk %.2e "
              "dv %.2e: %s\n", B, HB_D, S, mask_name(mask), p.a.dq_pairs, 2 * B, e[0], e[1], e[2], e[3],
              e[4], ok ? "ok" : "FAILED");
  return ok;
}

template <typename F>
float time_ms(F f, int iters) {
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
  f();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(t0));
    f();
    CK(cudaEventRecord(t1));
    CK(cudaEventSynchronize(t1));
    float x;
    CK(cudaEventElapsedTime(&x, t0, t1));
    ms.push_back(x);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long long B = argc > 3 ? std::atoll(argv[1]) : 4, H = argc > 3 ? std::atoll(argv[2]) : 16,
                  S = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  const int mask = argc > 5 ? std::atoi(argv[5]) : 0;
  const bool causal = mask == 1;
#ifdef HB_LAB_MODS
  bool ok = true;
#else
  bool ok = check(320, 0) && check(320, 2) && check(384, 1) && check(384, 1, 1) && check(384, 1, 2, 2);
#endif
  Problem p(B, H, S, mask, 2);
  const double flops = 4.0 * B * H * S * S * HB_D * (causal ? 0.5 : 1.0);
  const float f = time_ms([&] { p.forward(); }, iters), b = time_ms([&] { p.backward(); }, iters);
  std::printf("time D%d B%lld H%lld S%lld%s: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s), "
              "both %.0f TFLOP/s (dQ summed %lld of %lld pairs a launch)\n", HB_D, B, H, S,
              mask_name(mask), f, flops / f * 1e-9, b, 2.5 * flops / b * 1e-9,
              3.5 * flops / (f + b) * 1e-9, p.a.dq_pairs, B * H);
  if (p.a.dq_pairs < B * H) {  // the same backward in one launch, its dQ workspace every pair's
    const long long pairs = p.a.dq_pairs;
    p.a.dq_pairs = 0;
    const float one = time_ms([&] { p.backward(); }, iters);
    std::printf("time D%d B%lld H%lld S%lld%s: backward in one launch %.3f ms (%.0f TFLOP/s): %.3fx\n", HB_D, B, H,
                S, mask_name(mask), one, 2.5 * flops / one * 1e-9, b / one);
    p.a.dq_pairs = pairs;
  }
#if HB_DETERMINISTIC
  const size_t n = (size_t)B * H * S * HB_D;
  p.backward();
  const std::vector<Elem> dq1 = download(p.dq_out, n);
  const std::vector<Elem> dk1 = download(p.dk, n);
  std::vector<float> g1;  // the window sums overwrite the buffer gradient (no accumulation across runs)
  if (p.windows) g1 = download((float*)p.a.score_buffers[0].grad, p.grad_numel());
  p.backward();
  bool same = std::memcmp(dq1.data(), download(p.dq_out, n).data(), n * sizeof(Elem)) == 0 &&
              std::memcmp(dk1.data(), download(p.dk, n).data(), n * sizeof(Elem)) == 0;
  if (p.windows)
    same = same && std::memcmp(g1.data(), download((float*)p.a.score_buffers[0].grad, p.grad_numel()).data(),
                               g1.size() * sizeof(float)) == 0;
  std::printf("deterministic: dq and dk%s of two runs bitwise equal: %s\n", p.windows ? " and the buffer gradient" : "",
              same ? "yes" : "NO");
  ok = ok && same;
#endif
  return ok ? 0 : 1;
}

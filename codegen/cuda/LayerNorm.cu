#include "codegen/cuda/LayerNorm.h"
#include "codegen/cuda/TensorData.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace hb::cuda {
namespace {

constexpr int kThreads = 256;

// VEC elements of T loaded or stored as one 16-byte access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// A row's threads: TPR consecutive lanes of a warp (a power of two up to 32), each holding C chunks of
// VEC elements; chunk c of the row's thread s starts at column (c * TPR + s) * VEC. Every lane of a warp
// runs the reductions (rows past the end hold zeros), so the shuffles see full warps.
template <int TPR>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int TPR, int VEC>
__device__ __forceinline__ int column(int c, int sub) {
  return (c * TPR + sub) * VEC;
}

// Loads this thread's chunks of a row into floats (zeros past the row's end or for a row that is not).
template <typename T, int VEC, int TPR, int C>
__device__ __forceinline__ void load_row(const T* row, int n, bool live, int sub, float (&v)[C][VEC]) {
  Vec<T, VEC> in[C];
#pragma unroll
  for (int c = 0; c < C; ++c)  // every load issued before any value is used
    if (live && column<TPR, VEC>(c, sub) < n) in[c] = *reinterpret_cast<const Vec<T, VEC>*>(row + column<TPR, VEC>(c, sub));
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[c][k] = live && column<TPR, VEC>(c, sub) < n ? static_cast<float>(in[c].v[k]) : 0.f;
}

template <typename T, int VEC, int TPR, int C>
__device__ __forceinline__ void load_params(const T* p, int n, int sub, float fill, float (&v)[C][VEC]) {
  load_row<T, VEC, TPR, C>(p, n, p != nullptr, sub, v);
  if (p == nullptr)
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[c][k] = fill;
}

template <typename T, int VEC, int TPR, int C>
__device__ __forceinline__ void store_row(T* row, int n, int sub, const float (&v)[C][VEC]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (column<TPR, VEC>(c, sub) >= n) continue;
    Vec<T, VEC> out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = static_cast<T>(v[c][k]);
    *reinterpret_cast<Vec<T, VEC>*>(row + column<TPR, VEC>(c, sub)) = out;
  }
}

// The activation the fused ops apply to the input (RowActivation, as an int for the templates) and its
// derivative, in float, as ATen's CUDA kernels compute gelu, gelu(approximate="tanh") and silu and their
// backward ops. FAST (16-bit inputs and outputs): the exponential and the division as the hardware's
// approximations (__expf, __fdividef: a few float ulps, far below a bf16 or f16 rounding step). act(0) = 0
// for each, so the zeros past a row's end stay zeros.
template <bool FAST>
__device__ __forceinline__ float exp_(float v) {
  return FAST ? __expf(v) : expf(v);
}

template <bool FAST>
__device__ __forceinline__ float div_(float a, float b) {
  return FAST ? __fdividef(a, b) : a / b;
}

// act(h) and act'(h) together, sharing what both need (erf, tanh, the sigmoid).
template <int ACT, bool FAST>
__device__ __forceinline__ void act_and_grad(float h, float& a, float& d) {
  if constexpr (ACT == static_cast<int>(RowActivation::Gelu)) {
    constexpr float kAlpha = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);
    const float cdf = 0.5f * (1.f + erff(h * static_cast<float>(M_SQRT1_2)));
    a = h * cdf;
    d = cdf + h * kAlpha * exp_<FAST>(-0.5f * h * h);
  } else if constexpr (ACT == static_cast<int>(RowActivation::GeluTanh)) {
    constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
    const float t = tanhf(kBeta * (h + kKappa * h * h * h));
    a = 0.5f * h * (1.f + t);
    d = 0.5f * (1.f + t) + 0.5f * h * (1.f - t * t) * kBeta * (1.f + 3.f * kKappa * h * h);
  } else if constexpr (ACT == static_cast<int>(RowActivation::Silu)) {
    const float sig = div_<FAST>(1.f, 1.f + exp_<FAST>(-h));
    a = h * sig;
    d = sig * (1.f + h * (1.f - sig));
  } else {
    a = h;
    d = 1.f;
  }
}

// act(h) alone (the forward's; the compiler drops the derivative's own terms).
template <int ACT, bool FAST>
__device__ __forceinline__ float act(float h) {
  float a, d;
  act_and_grad<ACT, FAST>(h, a, d);
  return a;
}

// y = (x - mean) * rstd * w + b over each row of n, in float32: the mean first, then the variance as the
// mean of squared deviations (the row is in registers, so two passes cost no memory traffic; ATen's
// Welford update gives the same up to rounding). Biased variance, as layer_norm's. With ACT, x is act(h)
// of the input h, computed in float and never stored.
template <typename T, int VEC, int TPR, int C, int ACT>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, int64_t rows, int n,
                   float eps, T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd) {
  constexpr int kRows = kThreads / TPR;  // rows a block
  const int sub = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / TPR;
  const bool live = row < rows;
  float v[C][VEC];
  load_row<T, VEC, TPR, C>(x + (live ? row : 0) * n, n, live, sub, v);
  if constexpr (ACT != 0)
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[c][k] = act<ACT, !std::is_same_v<T, float>>(v[c][k]);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += v[c][k];
  const float mu = row_sum<TPR>(s) / static_cast<float>(n);
  float q = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = column<TPR, VEC>(c, sub) < n ? v[c][k] - mu : 0.f;
      q += d * d;
    }
  const float rs = rsqrtf(row_sum<TPR>(q) / static_cast<float>(n) + eps);
  if (!live) return;  // after the shuffles
  // A chunk's weight and bias at a time: fewer registers live than whole rows of them.
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int i = column<TPR, VEC>(c, sub);
    if (i >= n) continue;
    float wv[1][VEC], bv[1][VEC];
    load_params<T, VEC, 1, 1>(w ? w + i : nullptr, VEC, 0, 1.f, wv);
    load_params<T, VEC, 1, 1>(b ? b + i : nullptr, VEC, 0, 0.f, bv);
    Vec<T, VEC> out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = static_cast<T>((v[c][k] - mu) * rs * wv[0][k] + bv[0][k]);
    *reinterpret_cast<Vec<T, VEC>*>(y + row * n + i) = out;
  }
  if (sub == 0) mean[row] = mu, rstd[row] = rs;
}

// The input gradient of each row, dx = rstd * (g w - mean(g w) - xhat mean(g w xhat)) with
// xhat = (x - mean) rstd, and, where `partial` is given, this block's sums of g xhat and of g per column
// (the weight's and the bias's gradients over its rows): partial[blockIdx.x][0, n) and [n, 2n).
// Blocks walk the rows in strides of the grid, so a block's sums cover many rows and the partials are
// few (param_grads_kernel adds them). With ACT, x is act(h) of the input h (recomputed here), and the
// gradient written is h's: the layer norm's input gradient times act'(h), rounded once.
template <typename T, int VEC, int TPR, int C, int ACT>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const float* __restrict__ mean,
                    const float* __restrict__ rstd, const T* __restrict__ w, int64_t rows, int n,
                    T* __restrict__ dx, float* __restrict__ partial) {
  constexpr int kRows = kThreads / TPR;
  const int sub = threadIdx.x % TPR;
  float wv[C][VEC], aw[C][VEC] = {}, ab[C][VEC] = {};
  load_params<T, VEC, TPR, C>(w, n, sub, 1.f, wv);
  const float inv_n = 1.f / static_cast<float>(n);
  // `base` is the same for the whole block: every warp runs every turn, so its shuffles see full warps.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRows; base < rows; base += static_cast<int64_t>(gridDim.x) * kRows) {
    const int64_t row = base + threadIdx.x / TPR;
    const bool live = row < rows;
    float gv[C][VEC], xv[C][VEC];
    load_row<T, VEC, TPR, C>(g + (live ? row : 0) * n, n, live, sub, gv);
    load_row<T, VEC, TPR, C>(x + (live ? row : 0) * n, n, live, sub, xv);
    const float mu = live ? mean[row] : 0.f, rs = live ? rstd[row] : 0.f;
    float dact[ACT != 0 ? C : 1][VEC];  // act'(h), computed with act(h)
    if constexpr (ACT != 0)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < VEC; ++k) act_and_grad<ACT, !std::is_same_v<T, float>>(xv[c][k], xv[c][k], dact[c][k]);
    float a = 0.f, bsum = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        xv[c][k] = (xv[c][k] - mu) * rs;  // xhat; past a row's end, or for no row, g is 0: those terms add 0
        if (partial) aw[c][k] += gv[c][k] * xv[c][k], ab[c][k] += gv[c][k];
        gv[c][k] *= wv[c][k];
        a += gv[c][k];
        bsum += gv[c][k] * xv[c][k];
      }
    a = row_sum<TPR>(a) * inv_n;
    bsum = row_sum<TPR>(bsum) * inv_n;
    if (dx && live) {
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          gv[c][k] = rs * (gv[c][k] - a - xv[c][k] * bsum);
          if constexpr (ACT != 0) gv[c][k] *= dact[c][k];
        }
      store_row<T, VEC, TPR, C>(dx + row * n, n, sub, gv);
    }
  }
  if (!partial) return;
  // The lanes of a warp that hold the same columns (lane, lane + TPR, ...), then the warps in order.
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k)
#pragma unroll
      for (int o = TPR; o < 32; o <<= 1) {
        aw[c][k] += __shfl_xor_sync(0xffffffffu, aw[c][k], o);
        ab[c][k] += __shfl_xor_sync(0xffffffffu, ab[c][k], o);
      }
  __shared__ float red[2 * kLayerNormMaxColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int turn = 0; turn < kThreads / 32; ++turn) {
    if (warp == turn && lane < TPR)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const int i = column<TPR, VEC>(c, lane) + k;
          if (column<TPR, VEC>(c, lane) < n) {
            red[i] = (turn ? red[i] : 0.f) + aw[c][k];
            red[n + i] = (turn ? red[n + i] : 0.f) + ab[c][k];
          }
        }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < 2 * n; i += kThreads) partial[static_cast<int64_t>(blockIdx.x) * 2 * n + i] = red[i];
}

// dweight and dbias: the partials of `parts` blocks summed per column, the parts split over the block's
// warps and their sums added in warp order (the same order every run), rounded once into T.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    param_grads_kernel(const float* __restrict__ partial, int parts, int n, T* __restrict__ dw, T* __restrict__ db) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int i = blockIdx.x * 32 + lane;  // a column of [dw | db]
  float s = 0.f;
  if (i < 2 * n)
    for (int p = warp; p < parts; p += kThreads / 32) s += partial[static_cast<int64_t>(p) * 2 * n + i];
  __shared__ float red[kThreads];
  red[threadIdx.x] = s;
  __syncthreads();
  if (warp != 0 || i >= 2 * n) return;
  for (int w = 1; w < kThreads / 32; ++w) s += red[w * 32 + lane];
  if (i < n) {
    if (dw) dw[i] = static_cast<T>(s);
  } else if (db) {
    db[i - n] = static_cast<T>(s);
  }
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// Calls f(TPR, C) as integral constants for rows of n elements of T: the fewest lanes a row that give
// each lane one 16-byte chunk, up to a warp, then 2, 4 or 8 chunks a lane. False when n does not fit.
template <typename T, typename F>
bool dispatch_shape(int64_t n, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  if (n <= 0 || n % kVec != 0 || n > kLayerNormMaxColumns) return false;
  const int64_t vecs = n / kVec;
  using std::integral_constant;
  if (vecs <= 1) return f(integral_constant<int, 1>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 2) return f(integral_constant<int, 2>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 4) return f(integral_constant<int, 4>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 8) return f(integral_constant<int, 8>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 16) return f(integral_constant<int, 16>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 32) return f(integral_constant<int, 32>{}, integral_constant<int, 1>{}), true;
  if (vecs <= 64) return f(integral_constant<int, 32>{}, integral_constant<int, 2>{}), true;
  if (vecs <= 128) return f(integral_constant<int, 32>{}, integral_constant<int, 4>{}), true;
  if constexpr (kVec == 4) {  // float32: 1024 columns are 8 chunks a lane
    if (vecs <= 256) return f(integral_constant<int, 32>{}, integral_constant<int, 8>{}), true;
  }
  return false;
}

bool takes(const at::Tensor& x, int64_t n, std::initializer_list<const at::Tensor*> like_x,
           std::initializer_list<const at::Tensor*> params, std::initializer_list<const at::Tensor*> stats) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  // (rows <= 2^31: a forward's blocks, rows * TPR / 256, then fit the grid's 2^31 - 1)
  if (rows == 0 || rows * n != x.numel() || rows > INT32_MAX) return false;
  auto fits = [&](const at::Tensor* t, at::ScalarType dtype, int64_t numel) {
    return !t->defined() || (t->is_contiguous() && t->scalar_type() == dtype && t->device() == x.device() &&
                             t->numel() == numel && aligned16(*t));
  };
  for (const at::Tensor* t : like_x)
    if (!fits(t, x.scalar_type(), x.numel())) return false;
  for (const at::Tensor* t : params)
    if (!fits(t, x.scalar_type(), n)) return false;
  for (const at::Tensor* t : stats)
    if (!t->defined() || !fits(t, at::kFloat, rows)) return false;
  return true;
}

template <typename T, int ACT>
bool forward_typed(const at::Tensor& x, int64_t n, const at::Tensor& w, const at::Tensor& b, float eps,
                   const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd) {
  const int64_t rows = x.numel() / n;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  return dispatch_shape<T>(n, [&](auto tpr, auto c) {
    constexpr int kTpr = decltype(tpr)::value, kC = decltype(c)::value, kVec = 16 / sizeof(T);
    const int64_t blocks = (rows + kThreads / kTpr - 1) / (kThreads / kTpr);
    forward_kernel<T, kVec, kTpr, kC, ACT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        ptr<T>(x), ptr<T>(w), ptr<T>(b), rows, static_cast<int>(n), eps, mut_ptr<T>(y), mut_ptr<float>(mean),
        mut_ptr<float>(rstd));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T, int ACT>
bool backward_typed(const at::Tensor& grad, const at::Tensor& x, int64_t n, const at::Tensor& mean,
                    const at::Tensor& rstd, const at::Tensor& w, const at::Tensor& dx, const at::Tensor& dw,
                    const at::Tensor& db) {
  const int64_t rows = x.numel() / n;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool params = dw.defined() || db.defined();
  return dispatch_shape<T>(n, [&](auto tpr, auto c) {
    constexpr int kTpr = decltype(tpr)::value, kC = decltype(c)::value, kVec = 16 / sizeof(T);
    const int64_t need = (rows + kThreads / kTpr - 1) / (kThreads / kTpr);
    // With parameter gradients, a few blocks an SM walk all rows (the fewer blocks, the fewer partials);
    // without, a block per 256 / TPR rows (rows <= 2^31 - 1, so the grid fits: takes()).
    const int64_t cap = kLayerNormRowsBlocksPerSm * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t blocks = params && cap < need ? cap : need;
    at::Tensor partial;
    if (params) partial = at::empty({blocks, 2 * n}, x.options().dtype(at::kFloat));
    backward_kernel<T, kVec, kTpr, kC, ACT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        ptr<T>(grad), ptr<T>(x), ptr<float>(mean), ptr<float>(rstd), ptr<T>(w), rows, static_cast<int>(n),
        mut_ptr<T>(dx), mut_ptr<float>(partial));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (params) {
      param_grads_kernel<T><<<static_cast<unsigned>((2 * n + 31) / 32), kThreads, 0, stream>>>(
          ptr<float>(partial), static_cast<int>(blocks), static_cast<int>(n), mut_ptr<T>(dw), mut_ptr<T>(db));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

template <typename F>
bool by_dtype(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    case at::kFloat: return f(float{});
    default: return false;
  }
}

// Calls f(dtype, activation) with both as compile-time values.
template <typename F>
bool by_dtype_and_act(at::ScalarType t, RowActivation a, F&& f) {
  return by_dtype(t, [&](auto dtype) {
    using std::integral_constant;
    switch (a) {
      case RowActivation::None: return f(dtype, integral_constant<int, 0>{});
      case RowActivation::Gelu: return f(dtype, integral_constant<int, static_cast<int>(RowActivation::Gelu)>{});
      case RowActivation::GeluTanh: return f(dtype, integral_constant<int, static_cast<int>(RowActivation::GeluTanh)>{});
      case RowActivation::Silu: return f(dtype, integral_constant<int, static_cast<int>(RowActivation::Silu)>{});
    }
    return false;
  });
}

}  // namespace

bool layer_norm_forward(const at::Tensor& x, int64_t n, const at::Tensor& weight, const at::Tensor& bias, double eps,
                        const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd, RowActivation act) {
  if (!x.is_cuda() || !takes(x, n, {&x, &y}, {&weight, &bias}, {&mean, &rstd}) || !y.defined()) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  return by_dtype_and_act(x.scalar_type(), act, [&](auto t, auto a) {
    return forward_typed<decltype(t), decltype(a)::value>(x, n, weight, bias, static_cast<float>(eps), y, mean, rstd);
  });
}

bool layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, int64_t n, const at::Tensor& mean,
                         const at::Tensor& rstd, const at::Tensor& weight, const at::Tensor& dx,
                         const at::Tensor& dweight, const at::Tensor& dbias, RowActivation act) {
  if ((dweight.defined() || dbias.defined()) && !weight.defined()) return false;
  if (!x.is_cuda() || !takes(x, n, {&x, &grad, &dx}, {&weight, &dweight, &dbias}, {&mean, &rstd}) ||
      !grad.defined())
    return false;
  const c10::cuda::CUDAGuard guard(x.device());
  return by_dtype_and_act(x.scalar_type(), act, [&](auto t, auto a) {
    return backward_typed<decltype(t), decltype(a)::value>(grad, x, n, mean, rstd, weight, dx, dweight, dbias);
  });
}

}  // namespace hb::cuda

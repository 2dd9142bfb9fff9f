#include "codegen/cuda/RowSoftmax.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace hb::cuda {
namespace {

// Threads per row at most: 8 warps. 128 and 512 were slower on the H200 (benchmarks/row_softmax.py,
// rows of 4096), and so was one block reduction of online-softmax statistics (max and rescaled sum
// together) in place of the max's and the sum's: its expf per step cost more than a reduction saves.
// A warp per row (values kept packed, exps recomputed per pass, no block barrier) was slower still:
// row_softmax 0.49 ms against 0.39, the in-place recompute backward 2.8 against 0.67.
constexpr int kMaxThreads = 256;
constexpr int kMaxChunks = 8;     // vectors per thread

// VEC elements of T loaded or stored as one access (16 bytes when VEC > 1).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// The sum (or max) over the block, returned to every thread. `red` holds one float per warp.
template <bool MAX>
__device__ float block_reduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  __syncthreads();  // `red` may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < warps; ++w) v = MAX ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

// Row `row` of x into r[] (the scaled, upcast values; -inf past the row's end), then y = softmax
// in place. C chunks of VEC elements per thread: chunk c of thread t starts at (c * threads + t) * VEC.
template <typename T, int VEC, int C>
__device__ void softmax_row(const T* x, int64_t n, bool has_scale, float scale, float (&r)[C][VEC], float* red) {
  using V = Vec<T, VEC>;
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i < n) {
      const V in = *reinterpret_cast<const V*>(x + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float v = static_cast<float>(in.v[k]);
        if (has_scale) v = static_cast<float>(static_cast<T>(v * scale));  // x * scale rounds to T
        r[c][k] = v;
        m = fmaxf(m, v);
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) r[c][k] = -INFINITY;
    }
  }
  m = block_reduce<true>(m, red);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC + k;
      r[c][k] = i < n ? expf(r[c][k] - m) : 0.f;
      s += r[c][k];
    }
  s = block_reduce<false>(s, red);
  const float inv = 1.f / s;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) r[c][k] *= inv;
}

template <typename T, int VEC, int C>
__global__ void __launch_bounds__(kMaxThreads)
    forward_kernel(const T* x, int64_t n, bool has_scale, float scale, float* y32, T* low) {
  __shared__ float red[kMaxThreads / 32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float r[C][VEC];
  softmax_row<T, VEC, C>(x + base, n, has_scale, scale, r, red);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) continue;
    if (y32) {
      Vec<float, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = r[c][k];
      // float32 rows of a 16-byte-aligned T row are 16-byte aligned only in VEC * 4-byte pieces.
      if constexpr (VEC * sizeof(float) <= 16) {
        *reinterpret_cast<Vec<float, VEC>*>(y32 + base + i) = o;
      } else {
#pragma unroll
        for (int h = 0; h < VEC; h += 4)
          *reinterpret_cast<Vec<float, 4>*>(y32 + base + i + h) = *reinterpret_cast<Vec<float, 4>*>(&o.v[h]);
      }
    }
    if (low) {
      Vec<T, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = static_cast<T>(r[c][k]);
      *reinterpret_cast<Vec<T, VEC>*>(low + base + i) = o;
    }
  }
}

// out = T(y * (g - sum(g * y))) [* scale in T]; y read from y32, or recomputed from x.
template <typename T, int VEC, int C>
__global__ void __launch_bounds__(kMaxThreads)
    backward_kernel(const T* grad, const float* y32, const T* x, int64_t n, bool has_x_scale, float x_scale,
                    bool has_scale, float scale, T* out, T* low) {
  __shared__ float red[kMaxThreads / 32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float y[C][VEC];
  if (y32 == nullptr) {
    softmax_row<T, VEC, C>(x + base, n, has_x_scale, x_scale, y, red);
  } else {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
      if (i < n) {
#pragma unroll
        for (int h = 0; h < VEC; h += (VEC < 4 ? VEC : 4)) {  // 16-byte pieces, as the forward stored them
          if constexpr (VEC >= 4) {
            const Vec<float, 4> p = *reinterpret_cast<const Vec<float, 4>*>(y32 + base + i + h);
#pragma unroll
            for (int k = 0; k < 4; ++k) y[c][h + k] = p.v[k];
          } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) y[c][k] = y32[base + i + k];
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[c][k] = 0.f;
      }
    }
  }
  float g[C][VEC];
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i < n) {
      const Vec<T, VEC> in = *reinterpret_cast<const Vec<T, VEC>*>(grad + base + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) g[c][k] = static_cast<float>(in.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) g[c][k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) dot += g[c][k] * y[c][k];
  }
  dot = block_reduce<false>(dot, red);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) continue;
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      T v = static_cast<T>(y[c][k] * (g[c][k] - dot));
      if (has_scale) v = static_cast<T>(static_cast<float>(v) * scale);
      o.v[k] = v;
    }
    *reinterpret_cast<Vec<T, VEC>*>(out + base + i) = o;
    if (low) {  // the recomputed probabilities in T, as forward_kernel writes them
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = static_cast<T>(y[c][k]);
      *reinterpret_cast<Vec<T, VEC>*>(low + base + i) = o;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads per row and the chunk count for rows of n elements: false when over the limits.
template <int VEC>
bool launch_shape(int64_t n, int* threads, int* chunks) {
  const int64_t vecs = (n + VEC - 1) / VEC;
  int t = 32;
  while (t < kMaxThreads && t < vecs) t *= 2;
  int c = 1;
  while (c < kMaxChunks && static_cast<int64_t>(c) * t < vecs) c *= 2;
  if (static_cast<int64_t>(c) * t < vecs) return false;
  *threads = t;
  *chunks = c;
  return true;
}

// Calls f(std::integral_constant<int, VEC>{}, std::integral_constant<int, C>{}) for the row shape.
template <typename T, typename F>
bool dispatch_shape(int64_t n, bool vector_ok, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  int threads = 0, chunks = 0;
  auto with_chunks = [&](auto vec) {
    switch (chunks) {
      case 1: f(vec, std::integral_constant<int, 1>{}, threads); return true;
      case 2: f(vec, std::integral_constant<int, 2>{}, threads); return true;
      case 4: f(vec, std::integral_constant<int, 4>{}, threads); return true;
      case 8: f(vec, std::integral_constant<int, 8>{}, threads); return true;
    }
    return false;
  };
  if (vector_ok && n % kVec == 0 && launch_shape<kVec>(n, &threads, &chunks))
    return with_chunks(std::integral_constant<int, kVec>{});
  if (launch_shape<1>(n, &threads, &chunks)) return with_chunks(std::integral_constant<int, 1>{});
  return false;
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<const T*>(t.const_data_ptr()) : nullptr;
}
template <typename T>
T* mut_ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.mutable_data_ptr()) : nullptr;
}

template <typename T>
bool forward_typed(const at::Tensor& x, bool has_scale, float scale, const at::Tensor& y32, const at::Tensor& low) {
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  if (rows == 0) return true;
  bool vec = aligned16(x.const_data_ptr()) && (!low.defined() || aligned16(low.const_data_ptr())) &&
             (!y32.defined() || aligned16(y32.const_data_ptr()));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  return dispatch_shape<T>(n, vec, [&](auto v, auto c, int threads) {
    forward_kernel<T, decltype(v)::value, decltype(c)::value><<<rows, threads, 0, stream>>>(
        ptr<T>(x), n, has_scale, scale, mut_ptr<float>(y32), mut_ptr<T>(low));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
bool backward_typed(const at::Tensor& grad, const at::Tensor& y32, const at::Tensor& x, bool has_x_scale,
                    float x_scale, bool has_scale, float scale, const at::Tensor& out, const at::Tensor& low) {
  const int64_t n = grad.size(-1), rows = n ? grad.numel() / n : 0;
  if (rows == 0) return true;
  bool vec = aligned16(grad.const_data_ptr()) && aligned16(out.const_data_ptr()) &&
             (!x.defined() || aligned16(x.const_data_ptr())) && (!y32.defined() || aligned16(y32.const_data_ptr())) &&
             (!low.defined() || aligned16(low.const_data_ptr()));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  return dispatch_shape<T>(n, vec, [&](auto v, auto c, int threads) {
    backward_kernel<T, decltype(v)::value, decltype(c)::value><<<rows, threads, 0, stream>>>(
        ptr<T>(grad), ptr<float>(y32), ptr<T>(x), n, has_x_scale, x_scale, has_scale, scale, mut_ptr<T>(out),
        mut_ptr<T>(low));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

bool row_softmax_forward(const at::Tensor& x, bool has_scale, float scale, const at::Tensor& y32,
                         const at::Tensor& low) {
  if (x.numel() > 0 && x.numel() / x.size(-1) > INT32_MAX) return false;  // one block per row
  const c10::cuda::CUDAGuard guard(x.device());
  switch (x.scalar_type()) {
    case at::kBFloat16: return forward_typed<c10::BFloat16>(x, has_scale, scale, y32, low);
    case at::kHalf: return forward_typed<c10::Half>(x, has_scale, scale, y32, low);
    case at::kFloat: return forward_typed<float>(x, has_scale, scale, y32, low);
    default: return false;
  }
}

bool row_softmax_backward(const at::Tensor& grad, const at::Tensor& y32, const at::Tensor& x, bool has_x_scale,
                          float x_scale, bool has_scale, float scale, const at::Tensor& out, const at::Tensor& low) {
  if (grad.numel() > 0 && grad.numel() / grad.size(-1) > INT32_MAX) return false;
  const c10::cuda::CUDAGuard guard(grad.device());
  switch (grad.scalar_type()) {
    case at::kBFloat16:
      return backward_typed<c10::BFloat16>(grad, y32, x, has_x_scale, x_scale, has_scale, scale, out, low);
    case at::kHalf: return backward_typed<c10::Half>(grad, y32, x, has_x_scale, x_scale, has_scale, scale, out, low);
    case at::kFloat: return backward_typed<float>(grad, y32, x, has_x_scale, x_scale, has_scale, scale, out, low);
    default: return false;
  }
}

}  // namespace hb::cuda

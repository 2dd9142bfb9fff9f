#include "codegen/cuda/RowSoftmax.h"
#include "codegen/cuda/TensorData.h"

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
// row_softmax 0.49 ms against 0.39, the in-place recompute backward 2.8 against 0.67 (the kernels of
// then; those below take 0.28 and 0.53).
constexpr int kMaxThreads = 256;
constexpr int kMaxChunks = 8;     // vectors per thread

// VEC elements of T loaded or stored as one access (16 bytes when VEC > 1).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// The sum (or max) over the block, returned to every thread. `red` holds one float per warp, padded
// with the identity to kMaxThreads / 32 so that every thread reads it as two 16-byte loads: a loop to
// blockDim.x / 32 compiled to one shared load per warp and reduction. These kernels issue few
// instructions per byte, so such overheads show: this and compile-time flags (on() below) took
// row_softmax from 0.387 to 0.317 ms for 65536 rows of 4096 bf16 on the H200 (benchmarks/row_softmax.py).
template <bool MAX>
__device__ float block_reduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // `red` may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  if (threadIdx.x >= (blockDim.x >> 5) && threadIdx.x < kMaxThreads / 32) red[threadIdx.x] = MAX ? -INFINITY : 0.f;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kMaxThreads / 32; ++w) v = MAX ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

// Blocks take rows from the end: the rows a matrix product wrote last are the likeliest still in L2
// (its last tiles), so the first blocks read them from there. A DFS slice's scores (128 MB for 4 heads
// of 4096 x 4096 bf16) are about twice the H200's L2: its row kernels took 3% less time (1.195 to
// 1.158 ms forward, 3.372 to 3.286 fw+bw, benchmarks/profile_slicing.py); BFS's did not change.
__device__ __forceinline__ unsigned row_of_block() { return gridDim.x - 1 - blockIdx.x; }

// Launched with programmatic stream serialization (launch() below), a kernel's blocks may start while
// the previous kernel in the stream (the matrix product that wrote the scores) finishes: they wait
// here for it to complete and its writes to be visible, and the launch latency between the two is
// hidden.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Flags of a kernel: 0 or 1 when fixed at compile time (the vectorized shapes attention uses: no
// per-element tests), kRuntime when read from the arguments (the one generic instantiation per shape).
constexpr int kRuntime = 2;
__device__ __forceinline__ bool on(int flag, bool runtime) { return flag == kRuntime ? runtime : flag == 1; }

// This thread's chunks of a row, every load issued before any value is used: with a use between
// them the second load waited for the first (row_softmax 0.317 ms, 0.284 loading first; the in-place
// recompute backward 0.582, 0.529). C chunks of VEC elements per thread: chunk c of thread t starts at
// (c * threads + t) * VEC; chunks past the row's end are not loaded.
template <typename T, int VEC, int C>
__device__ void load_row(const T* row, int64_t n, Vec<T, VEC> (&in)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i < n) in[c] = *reinterpret_cast<const Vec<T, VEC>*>(row + i);
  }
}

// The loaded row `in` into r[] (the scaled, upcast values; -inf past the row's end), then y = softmax
// in place. Past the row's end exp(-inf - max) is 0, so the sum needs no test (a row of only -inf
// gives NaN, as ATen's softmax does).
template <typename T, int VEC, int C, int SCALE>
__device__ void softmax_row(const Vec<T, VEC> (&in)[C], int64_t n, bool has_scale, float scale, float (&r)[C][VEC],
                            float* red) {
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i < n) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float v = static_cast<float>(in[c].v[k]);
        if (on(SCALE, has_scale)) v = static_cast<float>(static_cast<T>(v * scale));  // x * scale rounds to T
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
      r[c][k] = expf(r[c][k] - m);
      s += r[c][k];
    }
  s = block_reduce<false>(s, red);
  const float inv = 1.f / s;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) r[c][k] *= inv;
}

template <typename T, int VEC, int C, int SCALE, int Y32, int LOW>
__global__ void __launch_bounds__(kMaxThreads)
    forward_kernel(const T* x, int64_t n, bool has_scale, float scale, float* y32, T* low) {
  __shared__ alignas(16) float red[kMaxThreads / 32];
  wait_for_previous_kernel();
  const int64_t base = static_cast<int64_t>(row_of_block()) * n;
  Vec<T, VEC> in[C];
  load_row<T, VEC, C>(x + base, n, in);
  float r[C][VEC];
  softmax_row<T, VEC, C, SCALE>(in, n, has_scale, scale, r, red);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) continue;
    if (on(Y32, y32 != nullptr)) {
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
    if (on(LOW, low != nullptr)) {
      Vec<T, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = static_cast<T>(r[c][k]);
      *reinterpret_cast<Vec<T, VEC>*>(low + base + i) = o;
    }
  }
}

// out = T(y * (g - sum(g * y))) [* scale in T]; y read from y32 (SAVED), or recomputed from x.
template <typename T, int VEC, int C, int SAVED, int XSCALE, int SCALE, int LOW>
__global__ void __launch_bounds__(kMaxThreads)
    backward_kernel(const T* grad, const float* y32, const T* x, int64_t n, bool has_x_scale, float x_scale,
                    bool has_scale, float scale, T* out, T* low) {
  __shared__ alignas(16) float red[kMaxThreads / 32];
  wait_for_previous_kernel();
  const int64_t base = static_cast<int64_t>(row_of_block()) * n;
  const bool saved = on(SAVED, y32 != nullptr);
  Vec<T, VEC> xin[C], gin[C];
  if (!saved) load_row<T, VEC, C>(x + base, n, xin);
  load_row<T, VEC, C>(grad + base, n, gin);
  float y[C][VEC];
  if (!saved) {
    softmax_row<T, VEC, C, XSCALE>(xin, n, has_x_scale, x_scale, y, red);
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
#pragma unroll
      for (int k = 0; k < VEC; ++k) g[c][k] = static_cast<float>(gin[c].v[k]);
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
      if (on(SCALE, has_scale)) v = static_cast<T>(static_cast<float>(v) * scale);
      o.v[k] = v;
    }
    *reinterpret_cast<Vec<T, VEC>*>(out + base + i) = o;
    if (on(LOW, low != nullptr)) {  // the recomputed probabilities in T, as forward_kernel writes them
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

// Calls f(std::integral_constant<int, F>{}) with F the flag's compile-time value: 0 or 1 when
// Fixed (the vectorized shapes), else kRuntime.
template <bool Fixed, typename F>
void with_flag(bool value, F&& f) {
  if constexpr (!Fixed) {
    f(std::integral_constant<int, kRuntime>{});
  } else if (value) {
    f(std::integral_constant<int, 1>{});
  } else {
    f(std::integral_constant<int, 0>{});
  }
}

// One block per row, with programmatic stream serialization (wait_for_previous_kernel): the DFS 16
// forward of benchmarks/slicing.py spent 0.093 ms idle between kernels instead of 0.119 and ran in
// 2.65 to 2.67 ms instead of 2.69 (H200, the same machine, runs interleaved).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t rows, int threads, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

template <typename T>
bool forward_typed(const at::Tensor& x, bool has_scale, float scale, const at::Tensor& y32, const at::Tensor& low) {
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  if (rows == 0) return true;
  bool vec = aligned16(x.const_data_ptr()) && (!low.defined() || aligned16(low.const_data_ptr())) &&
             (!y32.defined() || aligned16(y32.const_data_ptr()));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  return dispatch_shape<T>(n, vec, [&](auto v, auto c, int threads) {
    constexpr bool fixed = decltype(v)::value > 1;
    with_flag<fixed>(has_scale, [&](auto s) {
      with_flag<fixed>(y32.defined(), [&](auto y) {
        with_flag<fixed>(low.defined(), [&](auto l) {
          launch(forward_kernel<T, decltype(v)::value, decltype(c)::value, decltype(s)::value, decltype(y)::value,
                                decltype(l)::value>,
                 rows, threads, stream, ptr<T>(x), n, has_scale, scale, mut_ptr<float>(y32), mut_ptr<T>(low));
        });
      });
    });
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
  const bool saved = y32.defined();
  return dispatch_shape<T>(n, vec, [&](auto v, auto c, int threads) {
    constexpr bool fixed = decltype(v)::value > 1;
    auto run = [&](auto sv, auto xs, auto s, auto l) {
      launch(backward_kernel<T, decltype(v)::value, decltype(c)::value, decltype(sv)::value, decltype(xs)::value,
                             decltype(s)::value, decltype(l)::value>,
             rows, threads, stream, ptr<T>(grad), ptr<float>(y32), ptr<T>(x), n, has_x_scale, x_scale, has_scale,
             scale, mut_ptr<T>(out), mut_ptr<T>(low));
    };
    using Fixed0 = std::integral_constant<int, fixed ? 0 : kRuntime>;
    with_flag<fixed>(has_scale, [&](auto s) {
      if (fixed && saved) {  // x, x_scale and low unused
        run(std::integral_constant<int, fixed ? 1 : kRuntime>{}, Fixed0{}, s, Fixed0{});
        return;
      }
      with_flag<fixed>(has_x_scale, [&](auto xs) {
        with_flag<fixed>(low.defined(), [&](auto l) { run(Fixed0{}, xs, s, l); });
      });
    });
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

#include "codegen/cuda/ColumnSum.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace hb::cuda {
namespace {

constexpr int kWarps = 8;  // a block's warps, each over every 8th row of the block's part

// VEC elements of T loaded as one access (16 bytes when VEC > 1).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Block (x, part): columns [x * 32 VEC, (x + 1) * 32 VEC) over rows [part * m, (part + 1) * m). Lane l of
// each warp reads VEC consecutive columns of a row (a warp 32 VEC columns: whole 16-byte sectors), warp w
// the rows w, w + 8, ...; the eight warps' sums are added in warp order, so every run adds in the same
// order.
template <typename T, int VEC>
__global__ void __launch_bounds__(kWarps * 32) column_partials(const T* __restrict__ x, float* __restrict__ part,
                                                              int64_t cols, int64_t m) {
  __shared__ float red[kWarps][32 * VEC];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + lane) * VEC;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * m;
  float acc[VEC] = {};
  if (c0 < cols) {
    const T* p = x + (r0 + warp) * cols + c0;
    const int64_t step = kWarps * cols;
#pragma unroll 4
    for (int64_t r = warp; r < m; r += kWarps, p += step) {
      const Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] += static_cast<float>(v.v[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) red[warp][lane * VEC + e] = acc[e];
  __syncthreads();
  for (int j = threadIdx.x; j < 32 * VEC; j += kWarps * 32) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * VEC + j;
    if (c >= cols) continue;
    float s = red[0][j];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += red[w][j];
    part[static_cast<int64_t>(blockIdx.y) * cols + c] = s;
  }
}

// out[c] = the parts' sums of column c, added in part order, rounded once.
template <typename TOut>
__global__ void column_total(const float* __restrict__ part, TOut* __restrict__ out, int64_t cols, int64_t parts) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int64_t p = 0; p < parts; ++p) s += part[p * cols + c];
  out[c] = static_cast<TOut>(s);
}

template <typename T>
bool launch(const at::Tensor& x, int64_t parts, const at::Tensor& out) {
  const int64_t rows = x.size(0), cols = x.size(1), m = rows / parts;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = cols % kVec == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  const int per_block = 32 * (vec ? kVec : 1);
  const int64_t xblocks = (cols + per_block - 1) / per_block;
  if (parts > 65535 || xblocks > INT32_MAX) return false;
  const at::Tensor part = at::empty({parts, cols}, x.options().dtype(at::kFloat));
  auto stream = at::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(xblocks), static_cast<unsigned>(parts));
  const T* xp = static_cast<const T*>(x.data_ptr());
  if (vec)
    column_partials<T, kVec><<<grid, kWarps * 32, 0, stream>>>(xp, part.data_ptr<float>(), cols, m);
  else
    column_partials<T, 1><<<grid, kWarps * 32, 0, stream>>>(xp, part.data_ptr<float>(), cols, m);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const unsigned tblocks = static_cast<unsigned>((cols + 255) / 256);
  auto total = [&](auto* y) {
    using TOut = std::remove_pointer_t<decltype(y)>;
    column_total<TOut><<<tblocks, 256, 0, stream>>>(part.data_ptr<float>(), y, cols, parts);
  };
  switch (out.scalar_type()) {
    case at::kFloat: total(out.data_ptr<float>()); break;
    case at::kBFloat16: total(out.data_ptr<c10::BFloat16>()); break;
    default: total(out.data_ptr<c10::Half>()); break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

bool kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

bool column_sum(const at::Tensor& x, int64_t parts, const at::Tensor& out) {
  if (!x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || !kernel_dtype(x.scalar_type()) || parts < 1 ||
      x.size(0) % parts != 0 || !out.is_cuda() || out.device() != x.device() || !out.is_contiguous() ||
      out.numel() != x.size(1) || !kernel_dtype(out.scalar_type()))
    return false;
  if (x.size(1) == 0) return true;
  const c10::cuda::CUDAGuard guard(x.device());
  switch (x.scalar_type()) {
    case at::kFloat: return launch<float>(x, parts, out);
    case at::kBFloat16: return launch<c10::BFloat16>(x, parts, out);
    default: return launch<c10::Half>(x, parts, out);
  }
}

}  // namespace hb::cuda

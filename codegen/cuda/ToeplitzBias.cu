#include "codegen/cuda/ToeplitzBias.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "backend/ir/Error.h"

namespace hb::cuda {
namespace {

constexpr int kTile = 64;  // the backward's square tile; 2 * kTile - 1 diagonals

__device__ __forceinline__ int64_t lo(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t hi(int64_t a, int64_t b) { return a < b ? b : a; }

// The table column head h reads (ToeplitzIndex::h_map).
__device__ __forceinline__ int64_t column(const ToeplitzIndex& ix, int64_t h) {
  if (!ix.h_map) return h;
  int64_t c = ix.h_map_int64 ? static_cast<const int64_t*>(ix.h_map)[h * ix.h_map_stride]
                             : static_cast<const int32_t*>(ix.h_map)[h * ix.h_map_stride];
  CUDA_KERNEL_ASSERT_MSG(c >= -ix.h_bound && c < ix.h_bound,
                         "flex_attention: the score_mod's head index is out of range of the bias table");
  if (c < 0) c += ix.h_bound;
  return c;
}

// The gather: each block writes kGatherRows x kGatherCols of one head's bias. Those elements read one
// run of consecutive diagonals (kGatherRows + kGatherCols - 1 table entries): the block stages them in
// shared memory once (the table's column is strided in memory, so per-element reads were 32 sectors a
// warp), then consecutive threads write consecutive columns (coalesced) from it, conflict-free.
constexpr int kGatherRows = 16, kGatherCols = 1024;

template <typename T, typename O>
__global__ void gather_kernel(const T* __restrict__ buf, ToeplitzIndex ix, O* __restrict__ out, int64_t Sq,
                              int64_t Skv) {
  __shared__ float diag[kGatherRows + kGatherCols - 1];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kGatherCols, i0 = static_cast<int64_t>(blockIdx.y) * kGatherRows;
  const int64_t h = blockIdx.z, col = column(ix, h) * ix.stride_h;
  const int64_t iend = lo(i0 + kGatherRows, Sq), jend = lo(j0 + kGatherCols, Skv);
  // diag[v] holds d = i - j = dmax - v; only the d an in-range (i, j) reaches are read (the caller
  // checked those rows exist).
  const int64_t dmax = i0 + kGatherRows - 1 - j0, dlo = i0 - (jend - 1), dhi = iend - 1 - j0;
  for (int v = threadIdx.x; v < kGatherRows + kGatherCols - 1; v += blockDim.x) {
    const int64_t d = dmax - v;
    diag[v] = (d >= dlo && d <= dhi) ? static_cast<float>(buf[(ix.sign * d + ix.offset) * ix.stride_d + col]) : 0.f;
  }
  __syncthreads();
  for (int64_t i = i0; i < iend; ++i) {
    O* o = out + (h * Sq + i) * Skv;
    const int base = static_cast<int>(i0 + kGatherRows - 1 - i);  // v = base + (j - j0)
    for (int64_t j = j0 + threadIdx.x; j < jend; j += blockDim.x) o[j] = static_cast<O>(diag[base + (j - j0)]);
  }
}

// The reduction: a block sums kReduceTiles square tiles along one diagonal stripe (tiles (ti, tj) with
// ti - tj fixed share their 2 * kTile - 1 diagonals): each tile is staged in shared memory (16-byte
// loads where the rows allow), one thread per diagonal adds its elements into a register, and the
// block ends with one atomic add per diagonal: kReduceTiles times fewer atomics than one per tile, and
// none in shared memory.
constexpr int kReduceTiles = 8;

template <typename T>
__global__ void reduce_kernel(const T* __restrict__ dbias, ToeplitzIndex ix, float* __restrict__ grad, int64_t Sq,
                              int64_t Skv, int64_t tiles_i, int64_t tiles_j) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t stripe = static_cast<int64_t>(blockIdx.x) - (tiles_j - 1);  // ti - tj
  const int64_t h = blockIdx.z, col = column(ix, h);
  const T* base = dbias + h * Sq * Skv;
  const int t = threadIdx.x;  // diagonal t: ii - jj = t - (kTile - 1)
  const int q = t - (kTile - 1);
  float acc = 0.f;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = Skv % kVec == 0 && reinterpret_cast<uintptr_t>(dbias) % 16 == 0;
  // The stripe's tiles: ti from max(0, stripe), tj = ti - stripe; this block takes kReduceTiles of them.
  const int64_t first = stripe > 0 ? stripe : 0;
  for (int k = 0; k < kReduceTiles; ++k) {
    const int64_t ti = first + static_cast<int64_t>(blockIdx.y) * kReduceTiles + k, tj = ti - stripe;
    if (ti >= tiles_i || tj >= tiles_j) break;
    const int64_t i0 = ti * kTile, j0 = tj * kTile;
    __syncthreads();  // the last tile's reads are done
    if (vec && i0 + kTile <= Sq && j0 + kTile <= Skv) {
      for (int e = t; e < kTile * kTile / kVec; e += blockDim.x) {
        const int ii = e / (kTile / kVec), jj = (e % (kTile / kVec)) * kVec;
        const uint4 raw = *reinterpret_cast<const uint4*>(base + (i0 + ii) * Skv + j0 + jj);
        const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int u = 0; u < kVec; ++u) tile[ii][jj + u] = static_cast<float>(x[u]);
      }
    } else {
      for (int e = t; e < kTile * kTile; e += blockDim.x) {
        const int ii = e / kTile, jj = e % kTile;
        const int64_t i = i0 + ii, j = j0 + jj;
        tile[ii][jj] = (i < Sq && j < Skv) ? static_cast<float>(base[i * Skv + j]) : 0.f;
      }
    }
    __syncthreads();
    if (t < 2 * kTile - 1)
      for (int ii = q > 0 ? q : 0; ii < kTile && ii - q < kTile; ++ii) acc += tile[ii][ii - q];
  }
  if (t >= 2 * kTile - 1) return;
  // Diagonal d = i - j of the grid; it has an in-range element in some tile of this block's run (else
  // it is off the grid: no table row to touch).
  const int64_t d = stripe * kTile + q;
  if (d <= -Skv || d >= Sq) return;
  atomicAdd(&grad[(ix.sign * d + ix.offset) * ix.stride_d + col * ix.stride_h], acc);
}

// deterministic=True, pass 1: each 64 x 64 tile's 127 diagonal sums, each summed by one thread in row
// order from the tile in shared memory (no atomics), into partials[h][tile row][tile column][127].
template <typename T>
__global__ void diagonal_partials_kernel(const T* __restrict__ dbias, float* __restrict__ partials, int64_t Sq,
                                         int64_t Skv) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t ti = blockIdx.y, tj = blockIdx.x, h = blockIdx.z;
  const int64_t i0 = ti * kTile, j0 = tj * kTile;
  const T* base = dbias + h * Sq * Skv;
  for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
    const int ii = e / kTile, jj = e % kTile;
    const int64_t i = i0 + ii, j = j0 + jj;
    tile[ii][jj] = (i < Sq && j < Skv) ? static_cast<float>(base[i * Skv + j]) : 0.f;
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= 2 * kTile - 1) return;
  const int q = t - (kTile - 1);  // ii - jj on this diagonal
  float s = 0.f;
  for (int ii = q > 0 ? q : 0; ii < kTile && ii - q < kTile; ++ii) s += tile[ii][ii - q];
  partials[((h * gridDim.y + ti) * gridDim.x + tj) * (2 * kTile - 1) + t] = s;
}

// deterministic=True, pass 2: one thread per diagonal d = i - j of the grid sums the partials of the
// tiles it crosses in a fixed order (tile rows ascending), per head; a table with no head dim
// (stride_h == 0), or heads mapped to one column (h_map), get the heads' sums added in head order. One
// thread per table row: no two write one element.
__global__ void diagonal_sum_kernel(const float* __restrict__ partials, ToeplitzIndex ix, float* __restrict__ grad,
                                    int64_t Sq, int64_t Skv, int64_t H, int64_t tiles_i, int64_t tiles_j) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= Sq + Skv - 1) return;
  const int64_t d = n - (Skv - 1);
  // Tiles (ti, tj) whose diagonal t = d - 64 (ti - tj) + 63 is in [0, 126]: ti - tj = k for k in
  // [ceil((d - 63) / 64), floor((d + 63) / 64)], at most two values.
  auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  const int64_t k_lo = -floor_div(-(d - (kTile - 1)), kTile), k_hi = floor_div(d + kTile - 1, kTile);
  float* out = grad + (ix.sign * d + ix.offset) * ix.stride_d;
  float all_heads = 0.f;
  for (int64_t h = 0; h < H; ++h) {
    float s = 0.f;
    for (int64_t ti = 0; ti < tiles_i; ++ti)
      for (int64_t k = k_lo; k <= k_hi; ++k) {
        const int64_t tj = ti - k;
        if (tj < 0 || tj >= tiles_j) continue;
        const int64_t t = d - k * kTile + kTile - 1;
        s += partials[((h * tiles_i + ti) * tiles_j + tj) * (2 * kTile - 1) + t];
      }
    if (ix.stride_h == 0) all_heads += s;
    else out[column(ix, h) * ix.stride_h] += s;  // grad is zeroed by the caller
  }
  if (ix.stride_h == 0) *out = all_heads;
}

int64_t lo_host(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace

void toeplitz_bias(const at::Tensor& buf, const ToeplitzIndex& ix, const at::Tensor& out) {
  HB_INTERNAL_CHECK(out.is_cuda() && out.dim() == 4 && out.is_contiguous() &&
                    (out.scalar_type() == at::kFloat || out.scalar_type() == buf.scalar_type()))
      << "toeplitz_bias: out must be a contiguous [1, H, Sq, Skv] CUDA tensor, float32 or the table's dtype";
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t Sq = out.size(2), Skv = out.size(3), n = out.numel();
  if (n == 0) return;
  HB_INTERNAL_CHECK(out.size(1) <= 65535 && (Sq + kGatherRows - 1) / kGatherRows <= 65535)
      << "toeplitz_bias: more than 65535 heads or row tiles";
  const dim3 blocks(static_cast<unsigned>((Skv + kGatherCols - 1) / kGatherCols),
                    static_cast<unsigned>((Sq + kGatherRows - 1) / kGatherRows), static_cast<unsigned>(out.size(1)));
  const int threads = 256;
  auto stream = at::cuda::getCurrentCUDAStream();
  // The table's values in float32, or in its own dtype (exact: a bf16 table's bias is bf16).
  auto launch = [&](auto* table) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(table)>>;
    if (out.scalar_type() == at::kFloat)
      gather_kernel<<<blocks, threads, 0, stream>>>(table, ix, out.data_ptr<float>(), Sq, Skv);
    else
      gather_kernel<<<blocks, threads, 0, stream>>>(table, ix, static_cast<T*>(out.data_ptr()), Sq, Skv);
  };
  switch (buf.scalar_type()) {
    case at::kFloat: launch(buf.data_ptr<float>()); break;
    case at::kBFloat16: launch(buf.data_ptr<c10::BFloat16>()); break;
    case at::kHalf: launch(buf.data_ptr<c10::Half>()); break;
    default:
      HB_INTERNAL_CHECK(false) << "toeplitz_bias: table dtype " << buf.scalar_type();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void toeplitz_bias_backward(const at::Tensor& dbias, const ToeplitzIndex& ix, const at::Tensor& grad,
                            bool deterministic) {
  HB_INTERNAL_CHECK(dbias.is_cuda() && dbias.dim() == 4 && dbias.size(0) == 1 && dbias.is_contiguous())
      << "toeplitz_bias_backward: dbias must be a contiguous [1, H, Sq, Skv] CUDA tensor";
  HB_INTERNAL_CHECK(grad.scalar_type() == at::kFloat) << "toeplitz_bias_backward: grad must be float32";
  HB_INTERNAL_CHECK(dbias.size(1) <= 65535) << "toeplitz_bias_backward: more than 65535 heads";
  const c10::cuda::CUDAGuard guard(dbias.device());
  const int64_t Sq = dbias.size(2), Skv = dbias.size(3);
  if (dbias.numel() == 0) return;
  const dim3 blocks((Skv + kTile - 1) / kTile, (Sq + kTile - 1) / kTile, dbias.size(1));
  auto stream = at::cuda::getCurrentCUDAStream();
  if (deterministic) {
    const int64_t H = dbias.size(1), tiles_i = blocks.y, tiles_j = blocks.x;
    at::Tensor partials = at::empty({H * tiles_i * tiles_j * (2 * kTile - 1)}, dbias.options().dtype(at::kFloat));
    switch (dbias.scalar_type()) {
      case at::kFloat:
        diagonal_partials_kernel<<<blocks, 128, 0, stream>>>(dbias.data_ptr<float>(), partials.data_ptr<float>(), Sq, Skv);
        break;
      case at::kBFloat16:
        diagonal_partials_kernel<<<blocks, 128, 0, stream>>>(dbias.data_ptr<c10::BFloat16>(), partials.data_ptr<float>(), Sq, Skv);
        break;
      case at::kHalf:
        diagonal_partials_kernel<<<blocks, 128, 0, stream>>>(dbias.data_ptr<c10::Half>(), partials.data_ptr<float>(), Sq, Skv);
        break;
      default:
        HB_INTERNAL_CHECK(false) << "toeplitz_bias_backward: dbias dtype " << dbias.scalar_type();
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t diagonals = Sq + Skv - 1;
    diagonal_sum_kernel<<<static_cast<unsigned>((diagonals + 127) / 128), 128, 0, stream>>>(
        partials.data_ptr<float>(), ix, grad.data_ptr<float>(), Sq, Skv, H, tiles_i, tiles_j);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // One block per run of kReduceTiles tiles of a diagonal stripe (blocks.x stripes, the longest has
  // min(tiles_i, tiles_j) tiles), per head.
  const int64_t tiles_i = blocks.y, tiles_j = blocks.x;
  const dim3 runs(static_cast<unsigned>(tiles_i + tiles_j - 1),
                  static_cast<unsigned>((lo_host(tiles_i, tiles_j) + kReduceTiles - 1) / kReduceTiles), blocks.z);
  switch (dbias.scalar_type()) {
    case at::kFloat:
      reduce_kernel<<<runs, 128, 0, stream>>>(dbias.data_ptr<float>(), ix, grad.data_ptr<float>(), Sq, Skv, tiles_i, tiles_j);
      break;
    case at::kBFloat16:
      reduce_kernel<<<runs, 128, 0, stream>>>(dbias.data_ptr<c10::BFloat16>(), ix, grad.data_ptr<float>(), Sq, Skv, tiles_i, tiles_j);
      break;
    case at::kHalf:
      reduce_kernel<<<runs, 128, 0, stream>>>(dbias.data_ptr<c10::Half>(), ix, grad.data_ptr<float>(), Sq, Skv, tiles_i, tiles_j);
      break;
    default:
      HB_INTERNAL_CHECK(false) << "toeplitz_bias_backward: dbias dtype " << dbias.scalar_type();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace hb::cuda

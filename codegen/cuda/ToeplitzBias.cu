#include "codegen/cuda/ToeplitzBias.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "backend/ir/Error.h"

namespace hb::cuda {
namespace {

constexpr int kTile = 64;  // the backward's square tile; 2 * kTile - 1 diagonals

__device__ __forceinline__ int64_t lo(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t hi(int64_t a, int64_t b) { return a < b ? b : a; }

// One block per row (h, i) of the output: one division per block, consecutive threads write
// consecutive columns (coalesced) and read the table backwards along the diagonal (cached: the table
// is small).
template <typename T>
__global__ void gather_kernel(const T* __restrict__ buf, ToeplitzIndex ix, float* __restrict__ out, int64_t Sq,
                              int64_t Skv) {
  const int64_t row = blockIdx.x;
  const int64_t h = row / Sq, i = row % Sq;
  const T* base = buf + (ix.sign * i + ix.offset) * ix.stride_d + h * ix.stride_h;
  const int64_t step = -ix.sign * ix.stride_d;  // one column right = one table row the other way
  float* o = out + row * Skv;
  for (int64_t j = threadIdx.x; j < Skv; j += blockDim.x) o[j] = static_cast<float>(base[j * step]);
}

template <typename T>
__global__ void reduce_kernel(const T* __restrict__ dbias, ToeplitzIndex ix, float* __restrict__ grad, int64_t Sq,
                              int64_t Skv) {
  __shared__ float diag[2 * kTile - 1];
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile, j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t h = blockIdx.z;
  for (int t = threadIdx.x; t < 2 * kTile - 1; t += blockDim.x) diag[t] = 0.f;
  __syncthreads();
  const T* base = dbias + h * Sq * Skv;
  // A warp reads 32 consecutive columns of one row: coalesced, and 32 distinct diagonals.
  for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
    const int ii = e / kTile, jj = e % kTile;
    const int64_t i = i0 + ii, j = j0 + jj;
    if (i < Sq && j < Skv) atomicAdd(&diag[ii - jj + kTile - 1], static_cast<float>(base[i * Skv + j]));
  }
  __syncthreads();
  for (int t = threadIdx.x; t < 2 * kTile - 1; t += blockDim.x) {
    const int64_t d = i0 - j0 + t - (kTile - 1);  // i - j on this diagonal
    // Does the diagonal cross the tile's in-range part? (Else it has no element: leave the table.)
    const int64_t ilo = hi(i0, j0 + d), ihi = lo(lo(i0 + kTile, Sq), lo(j0 + kTile, Skv) + d);
    if (ilo < ihi) atomicAdd(&grad[(ix.sign * d + ix.offset) * ix.stride_d + h * ix.stride_h], diag[t]);
  }
}


}  // namespace

void toeplitz_bias(const at::Tensor& buf, const ToeplitzIndex& ix, const at::Tensor& out) {
  HB_INTERNAL_CHECK(out.is_cuda() && out.scalar_type() == at::kFloat && out.dim() == 4 && out.is_contiguous())
      << "toeplitz_bias: out must be a contiguous float32 [1, H, Sq, Skv] CUDA tensor";
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t Sq = out.size(2), Skv = out.size(3), n = out.numel();
  if (n == 0) return;
  const int threads = 256;
  const int64_t rows = out.size(1) * Sq;
  HB_INTERNAL_CHECK(rows < (1LL << 31)) << "toeplitz_bias: too many rows";
  auto stream = at::cuda::getCurrentCUDAStream();
  switch (buf.scalar_type()) {
    case at::kFloat:
      gather_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(buf.data_ptr<float>(), ix, out.data_ptr<float>(), Sq, Skv);
      break;
    case at::kBFloat16:
      gather_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(buf.data_ptr<c10::BFloat16>(), ix, out.data_ptr<float>(), Sq, Skv);
      break;
    case at::kHalf:
      gather_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(buf.data_ptr<c10::Half>(), ix, out.data_ptr<float>(), Sq, Skv);
      break;
    default:
      HB_INTERNAL_CHECK(false) << "toeplitz_bias: table dtype " << buf.scalar_type();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void toeplitz_bias_backward(const at::Tensor& dbias, const ToeplitzIndex& ix, const at::Tensor& grad) {
  HB_INTERNAL_CHECK(dbias.is_cuda() && dbias.dim() == 4 && dbias.size(0) == 1 && dbias.is_contiguous())
      << "toeplitz_bias_backward: dbias must be a contiguous [1, H, Sq, Skv] CUDA tensor";
  HB_INTERNAL_CHECK(grad.scalar_type() == at::kFloat) << "toeplitz_bias_backward: grad must be float32";
  HB_INTERNAL_CHECK(dbias.size(1) <= 65535) << "toeplitz_bias_backward: more than 65535 heads";
  const c10::cuda::CUDAGuard guard(dbias.device());
  const int64_t Sq = dbias.size(2), Skv = dbias.size(3);
  if (dbias.numel() == 0) return;
  const dim3 blocks((Skv + kTile - 1) / kTile, (Sq + kTile - 1) / kTile, dbias.size(1));
  auto stream = at::cuda::getCurrentCUDAStream();
  switch (dbias.scalar_type()) {
    case at::kFloat:
      reduce_kernel<<<blocks, 256, 0, stream>>>(dbias.data_ptr<float>(), ix, grad.data_ptr<float>(), Sq, Skv);
      break;
    case at::kBFloat16:
      reduce_kernel<<<blocks, 256, 0, stream>>>(dbias.data_ptr<c10::BFloat16>(), ix, grad.data_ptr<float>(), Sq, Skv);
      break;
    case at::kHalf:
      reduce_kernel<<<blocks, 256, 0, stream>>>(dbias.data_ptr<c10::Half>(), ix, grad.data_ptr<float>(), Sq, Skv);
      break;
    default:
      HB_INTERNAL_CHECK(false) << "toeplitz_bias_backward: dbias dtype " << dbias.scalar_type();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace hb::cuda

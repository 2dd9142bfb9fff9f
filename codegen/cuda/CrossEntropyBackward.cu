#include "codegen/cuda/CrossEntropyBackward.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "backend/ir/Error.h"

namespace hb::cuda {
namespace {

// One thread per element, grid-strided: a memory-bound pass (read log_probs, write out).
// With row_max (the logits form), log_probs are logits, made log-probabilities as ATen rounds them:
// (x - row_max[i]) + log_probs_max[i].
template <typename TIn, typename TOut>
__global__ void cross_entropy_backward_kernel(const TIn* log_probs,  // out may be log_probs
                                              const float* __restrict__ row_max,        // [rows] or null
                                              const float* __restrict__ log_probs_max,  // [rows] or null
                                              const int64_t* __restrict__ target,
                                              const float* __restrict__ row_scale, TOut* out, int64_t rows,
                                              int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, j = e - i * cols;
    const float s = row_scale[i];
    const float x = static_cast<float>(log_probs[e]);
    const float p = expf(row_max ? (x - row_max[i]) + log_probs_max[i] : x);
    out[e] = static_cast<TOut>(s * (j == target[i] ? p - 1.f : p));
  }
}

}  // namespace

void cross_entropy_backward(const at::Tensor& log_probs, const at::Tensor& row_max, const at::Tensor& log_probs_max,
                            const at::Tensor& target, const at::Tensor& row_scale, const at::Tensor& out) {
  const bool shifted = row_max.defined();
  auto row_floats = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == log_probs.size(0) &&
           t.is_contiguous();
  };
  HB_INTERNAL_CHECK(log_probs.is_cuda() && log_probs.dim() == 2 && log_probs.is_contiguous() && out.is_contiguous() &&
                    out.sizes().equals(log_probs.sizes()) &&
                    (shifted ? (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16 ||
                                out.scalar_type() == at::kHalf) &&
                                   row_floats(row_max) && row_floats(log_probs_max)
                             : out.scalar_type() == log_probs.scalar_type()) &&
                    target.scalar_type() == at::kLong && target.is_contiguous() &&
                    row_scale.scalar_type() == at::kFloat && row_scale.is_contiguous())
      << "cross_entropy_backward: operands break the kernel's preconditions";
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1), n = rows * cols;
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(log_probs.device());
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads,
                                           int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} * 32);
  auto stream = at::cuda::getCurrentCUDAStream();
  const float* max_ptr = shifted ? row_max.data_ptr<float>() : nullptr;
  const float* lsm_max_ptr = shifted ? log_probs_max.data_ptr<float>() : nullptr;
  auto launch = [&](auto* x) {
    using T = std::remove_pointer_t<decltype(x)>;
    auto go = [&](auto* y) {
      using TOut = std::remove_pointer_t<decltype(y)>;
      cross_entropy_backward_kernel<T, TOut><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
          x, max_ptr, lsm_max_ptr, target.data_ptr<int64_t>(), row_scale.data_ptr<float>(), y, rows, cols);
    };
    if (!shifted)
      go(static_cast<T*>(out.data_ptr()));
    else if (out.scalar_type() == at::kFloat)
      go(out.data_ptr<float>());
    else if (out.scalar_type() == at::kBFloat16)
      go(out.data_ptr<c10::BFloat16>());
    else
      go(out.data_ptr<c10::Half>());
  };
  switch (log_probs.scalar_type()) {
    case at::kFloat: launch(log_probs.data_ptr<float>()); break;
    case at::kBFloat16: launch(log_probs.data_ptr<c10::BFloat16>()); break;
    case at::kHalf: launch(log_probs.data_ptr<c10::Half>()); break;
    default: HB_INTERNAL_CHECK(false) << "cross_entropy_backward: dtype " << log_probs.scalar_type();
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace hb::cuda

// The CUDA kernel of hintbackend::cross_entropy_backward (backend/runtime/CrossEntropyBackward.h has its
// semantics): out[i, j] = s_i * (exp(log_probs[i, j]) - [j == target_i]) in one pass, computed in float32 and
// rounded once to out's dtype, so float16 and bfloat16 losses fold too (ATen's pair computes the
// log-softmax gradient in float32 and rounds once as well). Part of hb_runtime, built only where nvcc and a
// CUDA torch exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hb::cuda {

// Preconditions (the caller's): log_probs and out [N, C] contiguous, of one dtype (float16, bfloat16 or
// float32), on one CUDA device; row_scale [N] float32 (s_i, 0 on ignored rows);
// target [N] int64, a column in [0, C) on rows whose scale is not 0 (any value on the others). `out` may be
// `log_probs` (each element is read before it is written, by the same thread).
// With `row_max` defined (the .logits form): log_probs are logits (float16, bfloat16 or float32), row_max and
// log_probs_max [N] float32, out float32, bfloat16 or float16 (computed in float32, rounded once), and
// out[i, j] = s_i (exp((logits[i, j] - row_max[i]) + log_probs_max[i]) - [j == target_i]).
void cross_entropy_backward(const at::Tensor& log_probs, const at::Tensor& row_max, const at::Tensor& log_probs_max,
                            const at::Tensor& target, const at::Tensor& row_scale, const at::Tensor& out);

}  // namespace hb::cuda

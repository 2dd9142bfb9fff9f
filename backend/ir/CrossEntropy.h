// The cross-entropy ops of hintbackend's own that the fold passes write into the IR and the runtime
// registers with the dispatcher (backend/runtime/CrossEntropy*.cpp): their names, and the forward's
// chunking rule, which the pass applies (it writes the rows per chunk into the node) and the target's
// workspace model reads back. Plain data, shared by both sides.
#pragma once
#include <algorithm>
#include <cstdint>

namespace hb {

// passes/FoldCrossEntropyBackward.h
constexpr const char* kCrossEntropyBackwardTarget = "hintbackend::cross_entropy_backward.default";
constexpr const char* kCrossEntropyBackwardLogitsTarget = "hintbackend::cross_entropy_backward.logits";
// passes/FoldCrossEntropyForward.h
constexpr const char* kCrossEntropyForwardTarget = "hintbackend::cross_entropy_forward.default";

// nll_loss's reduction argument, for notes: 0 none, 1 mean, 2 sum.
inline const char* nll_reduction_name(int64_t r) { return r == 0 ? "none" : r == 1 ? "mean" : "sum"; }

// The forward takes the log-softmax of at most this many bytes of [rows, C] at a time (twice: the rows
// upcast, then their log-probabilities), instead of the whole [N, C] (twice: 1.5 GiB for GPT-2's
// vocabulary at B4 S1024 in float32). 64 MiB keeps a language model's loss to a dozen chunks or fewer.
constexpr int64_t kCrossEntropyChunkBytes = int64_t{64} << 20;

// Rows per chunk for N rows of C classes of `elem` bytes: at least one, at most N.
inline int64_t cross_entropy_chunk_rows(int64_t n, int64_t c, int64_t elem) {
  return std::clamp<int64_t>(kCrossEntropyChunkBytes / std::max<int64_t>(1, c * elem), 1, std::max<int64_t>(n, 1));
}

}  // namespace hb

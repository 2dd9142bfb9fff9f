#include "backend/runtime/CrossEntropyForward.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/nll_loss_forward.h>
#include <ATen/ops/where.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

namespace hb::rt {
namespace {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t reduction,
                                                         int64_t ignore_index, at::ScalarType dtype,
                                                         int64_t chunk_rows) {
  TORCH_CHECK(logits.dim() >= 1 && at::isFloatingType(logits.scalar_type()) && at::isFloatingType(dtype),
              "hintbackend::cross_entropy_forward: logits must be floating [..., C] and dtype floating, got ",
              logits.sizes(), " ", logits.scalar_type(), " and ", dtype);
  const int64_t c = logits.size(-1);
  const Tensor x = logits.reshape({-1, c});
  const int64_t n = x.size(0);
  TORCH_CHECK(target.dim() == 1 && target.size(0) == n && target.scalar_type() == at::kLong,
              "hintbackend::cross_entropy_forward: target must be [", n, "] int64, got ", target.sizes(), " ",
              target.scalar_type());
  TORCH_CHECK(reduction >= 0 && reduction <= 2, "hintbackend::cross_entropy_forward: reduction ", reduction,
              " is not 0 (none), 1 (mean) or 2 (sum)");
  TORCH_CHECK(chunk_rows >= 1, "hintbackend::cross_entropy_forward: chunk_rows must be at least 1, got ", chunk_rows);
  const auto opts = x.options().dtype(dtype);
  Tensor log_probs_max = at::empty({n, 1}, opts);
  Tensor picked = at::empty({n, 1}, opts);  // each row's target log-probability (column 0's when ignored)
  const Tensor valid = target.ne(ignore_index);
  if (!x.is_cuda()) {  // eager's error (IndexError, its message); on CUDA both assert on the device
    const Tensor bad = valid.logical_and(target.lt(0).logical_or(target.ge(c)));
    if (bad.any().item<bool>())
      TORCH_CHECK_INDEX(false, "Target ", target.masked_select(bad)[0].item<int64_t>(), " is out of bounds.");
  }
  const Tensor col = at::where(valid, target, 0).unsqueeze(1);
  for (int64_t r = 0; r < n; r += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - r);
    const Tensor lp = at::_log_softmax(x.narrow(0, r, rows).to(dtype), 1, false);
    Tensor maxima = log_probs_max.narrow(0, r, rows);
    at::amax_out(maxima, lp, {1}, true);
    picked.narrow(0, r, rows).copy_(lp.gather(1, col.narrow(0, r, rows)));
  }
  // The loss over the picked values: column 0 for kept rows, -1 (ignored) for the others.
  const Tensor column0 = at::where(valid, 0, -1);
  auto [loss, total_weight] = at::nll_loss_forward(picked, column0, {}, reduction, -1);
  return {loss, total_weight, log_probs_max};
}

}  // namespace

void link_cross_entropy_forward_ops() {}

}  // namespace hb::rt

// The schema: the name passes/FoldCrossEntropyForward.cpp writes into the IR. CPU and CUDA (the executor
// calls it below autograd; ATen ops only, so any device ATen runs them on would do).
TORCH_LIBRARY_FRAGMENT(hintbackend, m) {
  m.def(
      "cross_entropy_forward(Tensor logits, Tensor target, int reduction, int ignore_index, ScalarType dtype, "
      "int chunk_rows) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) { m.impl("cross_entropy_forward", &hb::rt::cross_entropy_forward); }
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) { m.impl("cross_entropy_forward", &hb::rt::cross_entropy_forward); }
#endif

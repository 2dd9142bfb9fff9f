#include "backend/runtime/CrossEntropyBackward.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/where.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "backend/ir/CrossEntropy.h"

#ifdef HB_WITH_CUDA
#include "codegen/cuda/CrossEntropyBackward.h"
#endif

namespace hb::rt {
namespace {

using at::Tensor;

// What both forms check: target [N] int64 for x's N rows, a known reduction, and grad's shape for it.
void check_common(const Tensor& grad, const Tensor& x, const Tensor& target, int64_t reduction) {
  TORCH_CHECK(target.dim() == 1 && target.size(0) == x.size(0) && target.scalar_type() == at::kLong,
              "hintbackend::cross_entropy_backward: target must be [", x.size(0), "] int64, got ", target.sizes(), " ",
              target.scalar_type());
  TORCH_CHECK(reduction >= 0 && reduction <= 2, "hintbackend::cross_entropy_backward: reduction ", reduction,
              " is not 0 (none), 1 (mean) or 2 (sum)");
  TORCH_CHECK(reduction == 0 ? grad.dim() == 1 && grad.size(0) == x.size(0) : grad.dim() == 0,
              "hintbackend::cross_entropy_backward: grad has shape ", grad.sizes(), " for reduction ", reduction);
}

// Each row's scale s_i as [N] contiguous in `dtype`: grad / total_weight (mean), grad (sum), grad[i] (none),
// and 0 on rows whose target is ignore_index (chosen by where: with every row ignored, mean's s is inf or
// nan, and multiplying by 0 would give nan).
Tensor row_scales(const Tensor& grad, const Tensor& target, int64_t reduction, int64_t ignore_index,
                  const Tensor& total_weight, at::ScalarType dtype) {
  const Tensor s = reduction == 1 ? grad.div(total_weight) : grad;
  return at::where(target.ne(ignore_index), s.to(dtype), 0).expand({target.size(0)}).contiguous();
}

// Fills out ([N, C]) with the gradient s_i (p[i, j] - [j == target_i]): probs_into(dst, r, rows) writes the
// probabilities p of rows [r, r + rows) into dst in `wide`; then each row's scale (`scales`, row_scales in
// wide) and the target column are applied (an ignored row's scale is 0, so any valid column does). Straight
// into out when it has that dtype (probs_into may then read its input from out itself), else a chunk of rows
// at a time into a `wide` temporary, each rounded once into out (backend/ir/CrossEntropy.h's chunk, so the
// temporary stays small).
void write_rows(const Tensor& out, at::ScalarType wide, const Tensor& scales, const Tensor& target, int64_t ignore_index,
                const std::function<void(Tensor, int64_t, int64_t)>& probs_into) {
  const Tensor row = scales.unsqueeze(1), col = at::where(target.ne(ignore_index), target, 0).unsqueeze(1);
  auto rows_into = [&](Tensor dst, int64_t r, int64_t rows) {
    probs_into(dst, r, rows);
    const Tensor rr = row.narrow(0, r, rows), cr = col.narrow(0, r, rows);
    dst.mul_(rr);
    dst.scatter_(1, cr, dst.gather(1, cr).sub_(rr));
  };
  const int64_t n = out.size(0), c = out.size(1);
  if (out.scalar_type() == wide) {
    rows_into(out, 0, n);
    return;
  }
  const int64_t chunk = cross_entropy_chunk_rows(n, c, at::elementSize(wide));
  for (int64_t r = 0; r < n; r += chunk) {
    const int64_t rows = std::min(chunk, n - r);
    Tensor tmp = at::empty({rows, c}, out.options().dtype(wide));
    rows_into(tmp, r, rows);
    out.narrow(0, r, rows).copy_(tmp);
  }
}

Tensor& cross_entropy_backward_out(const Tensor& grad, const Tensor& log_probs, const Tensor& target, int64_t reduction,
                                   int64_t ignore_index, const Tensor& total_weight, Tensor& out) {
  TORCH_CHECK(log_probs.dim() == 2, "hintbackend::cross_entropy_backward: log_probs must be [N, C], got ",
              log_probs.sizes());
  check_common(grad, log_probs, target, reduction);
  TORCH_CHECK(out.sizes().equals(log_probs.sizes()) && out.scalar_type() == log_probs.scalar_type(),
              "hintbackend::cross_entropy_backward.out: out must be ", log_probs.scalar_type(), " of shape ",
              log_probs.sizes(), ", got ", out.scalar_type(), " ", out.sizes());
  // float16/bfloat16 compute in float32 and round once, as ATen's log-softmax gradient does.
  const at::ScalarType dt = log_probs.scalar_type();
  const at::ScalarType wide = dt == at::kHalf || dt == at::kBFloat16 ? at::kFloat : dt;
  const Tensor scales = row_scales(grad, target, reduction, ignore_index, total_weight, wide);
#ifdef HB_WITH_CUDA
  if (log_probs.is_cuda() && dt != at::kDouble && log_probs.is_contiguous() && out.is_contiguous()) {
    // One pass in float32, rounded once (half-precision losses fold too).
    cuda::cross_entropy_backward(log_probs, at::Tensor(), at::Tensor(), target.contiguous(), scales, out);
    return out;
  }
#endif
  // The probabilities exp(log_probs) (dst may be log_probs itself).
  write_rows(out, wide, scales, target, ignore_index, [&](Tensor dst, int64_t r, int64_t rows) {
    if (wide == dt) {
      at::exp_out(dst, log_probs.narrow(0, r, rows));
    } else {  // upcast first: exp_out from a bf16 input would round exp to bf16 before widening it
      dst.copy_(log_probs.narrow(0, r, rows));
      dst.exp_();
    }
  });
  return out;
}

Tensor& cross_entropy_backward_logits_out(const Tensor& grad, const Tensor& logits, const Tensor& row_max,
                                          const Tensor& log_probs_max, const Tensor& target, int64_t reduction,
                                          int64_t ignore_index, const Tensor& total_weight,
                                          std::optional<at::ScalarType> dtype, at::OptionalIntArrayRef shape,
                                          Tensor& out) {
  const int64_t n = logits.dim() == 2 ? logits.size(0) : -1, c = logits.dim() == 2 ? logits.size(1) : -1;
  const at::ScalarType wide = row_max.scalar_type(), want = dtype.value_or(wide);
  auto row_column = [&](const Tensor& t) {
    return t.dim() == 2 && t.size(0) == n && t.size(1) == 1 && t.scalar_type() == wide;
  };
  TORCH_CHECK(n >= 0 && at::isFloatingType(logits.scalar_type()) && at::isFloatingType(wide) && row_column(row_max) &&
                  row_column(log_probs_max) && at::isFloatingType(want),
              "hintbackend::cross_entropy_backward.logits: logits must be [N, C] and row_max, log_probs_max [N, 1] of "
              "one floating dtype, got ",
              logits.sizes(), " ", logits.scalar_type(), ", ", row_max.sizes(), " ", wide, " and ",
              log_probs_max.sizes(), " ", log_probs_max.scalar_type());
  TORCH_CHECK(out.scalar_type() == want && out.numel() == n * c && out.is_contiguous() &&
                  (!shape || out.sizes().equals(*shape)),
              "hintbackend::cross_entropy_backward.logits_out: out must be contiguous ", want, " of ", n * c,
              " elements", shape ? " and the given shape" : "", ", got ", out.scalar_type(), " ", out.sizes());
  check_common(grad, logits, target, reduction);
  const Tensor scales = row_scales(grad, target, reduction, ignore_index, total_weight, wide);
  Tensor out2d = out.view({n, c});
#ifdef HB_WITH_CUDA
  if (logits.is_cuda() && wide == at::kFloat && logits.scalar_type() != at::kDouble && want != at::kDouble &&
      logits.is_contiguous()) {
    cuda::cross_entropy_backward(logits, row_max.reshape({n}).contiguous(), log_probs_max.reshape({n}).contiguous(),
                                 target.contiguous(), scales, out2d);
    return out;
  }
#endif
  // The probabilities from the log-probabilities as ATen's log-softmax rounds them, (logits - max) +
  // log_probs_max (dst may be those logits themselves).
  write_rows(out2d, wide, scales, target, ignore_index, [&](Tensor dst, int64_t r, int64_t rows) {
    if (logits.scalar_type() == wide) {
      at::sub_out(dst, logits.narrow(0, r, rows), row_max.narrow(0, r, rows));
    } else {  // upcast first (exact): a mixed-dtype sub takes ATen's slow casting path on the CPU
      dst.copy_(logits.narrow(0, r, rows));
      dst.sub_(row_max.narrow(0, r, rows));
    }
    dst.add_(log_probs_max.narrow(0, r, rows));
    dst.exp_();
  });
  return out;
}

Tensor cross_entropy_backward_logits(const Tensor& grad, const Tensor& logits, const Tensor& row_max,
                                     const Tensor& log_probs_max, const Tensor& target, int64_t reduction,
                                     int64_t ignore_index, const Tensor& total_weight,
                                     std::optional<at::ScalarType> dtype, at::OptionalIntArrayRef shape) {
  Tensor out = at::empty(shape ? *shape : logits.sizes(), logits.options().dtype(dtype.value_or(row_max.scalar_type())));
  return cross_entropy_backward_logits_out(grad, logits, row_max, log_probs_max, target, reduction, ignore_index,
                                           total_weight, dtype, shape, out);
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& target, int64_t reduction,
                              int64_t ignore_index, const Tensor& total_weight) {
  Tensor out = at::empty(log_probs.sizes(), log_probs.options());
  return cross_entropy_backward_out(grad, log_probs, target, reduction, ignore_index, total_weight, out);
}

}  // namespace

void link_cross_entropy_backward_ops() {}

}  // namespace hb::rt

// The schema: the name passes/FoldCrossEntropyBackward.cpp writes into the IR. CPU and CUDA only (the
// executor calls it below autograd).
TORCH_LIBRARY_FRAGMENT(hintbackend, m) {
  m.def(
      "cross_entropy_backward(Tensor grad, Tensor log_probs, Tensor target, int reduction, int ignore_index, "
      "Tensor total_weight) -> Tensor");
  m.def(
      "cross_entropy_backward.out(Tensor grad, Tensor log_probs, Tensor target, int reduction, int ignore_index, "
      "Tensor total_weight, *, Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "cross_entropy_backward.logits(Tensor grad, Tensor logits, Tensor row_max, Tensor log_probs_max, Tensor target, "
      "int reduction, int ignore_index, Tensor total_weight, ScalarType? dtype=None, int[]? shape=None) -> Tensor");
  m.def(
      "cross_entropy_backward.logits_out(Tensor grad, Tensor logits, Tensor row_max, Tensor log_probs_max, "
      "Tensor target, int reduction, int ignore_index, Tensor total_weight, ScalarType? dtype=None, "
      "int[]? shape=None, *, Tensor(a!) out) -> Tensor(a!)");
}

namespace {
template <typename Lib>
void impl_all(Lib& m) {
  m.impl("cross_entropy_backward", &hb::rt::cross_entropy_backward);
  m.impl("cross_entropy_backward.out", &hb::rt::cross_entropy_backward_out);
  m.impl("cross_entropy_backward.logits", &hb::rt::cross_entropy_backward_logits);
  m.impl("cross_entropy_backward.logits_out", &hb::rt::cross_entropy_backward_logits_out);
}
}  // namespace

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) { impl_all(m); }
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) { impl_all(m); }
#endif

#include "backend/runtime/BatchNormInPlace.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/native_batch_norm.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace hb::rt {

namespace {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> batch_norm_in_place(const Tensor& input,
                                                                       const std::optional<Tensor>& weight,
                                                                       const std::optional<Tensor>& bias,
                                                                       Tensor& running_mean, Tensor& running_var,
                                                                       double momentum, double eps) {
  auto [out, mean, invstd] =
      at::native_batch_norm(input, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps);
  return {out, mean, invstd, Tensor(running_mean.variable_data()), Tensor(running_var.variable_data())};
}

// The Autograd kernel: the op has no derivative (the executor runs it without grad, in a forward whose
// backward AOTAutograd traced), and returns aliases of two inputs, which torch's fallback for custom ops
// without an Autograd kernel refuses (a warning in torch 2.11, an error from 2.12).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> batch_norm_in_place_autograd(
    const Tensor& input, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, Tensor& running_mean,
    Tensor& running_var, double momentum, double eps) {
  TORCH_CHECK(!at::GradMode::is_enabled() || !(input.requires_grad() || (weight && weight->requires_grad()) ||
                                               (bias && bias->requires_grad())),
              "hintbackend::batch_norm_in_place has no derivative: call it without grad (torch.no_grad()); "
              "a model's BatchNorm gets its gradient from aten::native_batch_norm_backward");
  at::AutoDispatchBelowADInplaceOrView below;
  return batch_norm_in_place(input, weight, bias, running_mean, running_var, momentum, eps);
}

}  // namespace

void link_batch_norm_in_place_ops() {}

}  // namespace hb::rt

// The schema: the name passes/WriteInputsInPlace.cpp writes into the IR (backend/ir/Aliasing.h says
// which elements alias which arguments). The executor calls it below autograd.
TORCH_LIBRARY_FRAGMENT(hintbackend, m) {
  m.def(
      "batch_norm_in_place(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!) running_mean, "
      "Tensor(b!) running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor(a!), Tensor(b!))");
}

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) { m.impl("batch_norm_in_place", &hb::rt::batch_norm_in_place); }

TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) { m.impl("batch_norm_in_place", &hb::rt::batch_norm_in_place); }

TORCH_LIBRARY_IMPL(hintbackend, Autograd, m) {
  m.impl("batch_norm_in_place", &hb::rt::batch_norm_in_place_autograd);
}

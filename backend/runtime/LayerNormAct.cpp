#include "backend/runtime/LayerNormAct.h"

#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

#include "backend/ir/KernelPlan.h"

namespace hb::rt {

namespace {

using at::Tensor;

RowActivation activation(c10::string_view name) {
  const std::optional<RowActivation> a = parse_row_activation(std::string(name));
  TORCH_CHECK(a && *a != RowActivation::None, "hintbackend::layer_norm_act: unknown activation '", name,
              "' (gelu, gelu_tanh or silu)");
  return *a;
}

// gelu's `approximate` for a GELU activation
const char* approximate(RowActivation a) { return a == RowActivation::GeluTanh ? "tanh" : "none"; }

Tensor apply(RowActivation a, const Tensor& h) {
  return a == RowActivation::Silu ? at::silu(h) : at::gelu(h, approximate(a));
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act(const Tensor& h, at::IntArrayRef normalized_shape,
                                                   const std::optional<Tensor>& weight,
                                                   const std::optional<Tensor>& bias, double eps,
                                                   c10::string_view act) {
  return at::native_layer_norm(apply(activation(act), h), normalized_shape, weight, bias, eps);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act_backward(const Tensor& grad_out, const Tensor& h,
                                                            at::IntArrayRef normalized_shape, const Tensor& mean,
                                                            const Tensor& rstd, const std::optional<Tensor>& weight,
                                                            const std::optional<Tensor>& bias,
                                                            std::array<bool, 3> output_mask, c10::string_view act) {
  const RowActivation a = activation(act);
  auto [dx, dw, db] =
      at::native_layer_norm_backward(grad_out, apply(a, h), normalized_shape, mean, rstd, weight, bias, output_mask);
  if (dx.defined())
    dx = a == RowActivation::Silu ? at::silu_backward(dx, h) : at::gelu_backward(dx, h, approximate(a));
  return {dx, dw, db};
}

}  // namespace

void link_layer_norm_act_ops() {}

}  // namespace hb::rt

// The schemas: the names passes/FoldLayerNormActivation.cpp writes into the IR. CPU and CUDA (the
// executor calls them below autograd).
TORCH_LIBRARY_FRAGMENT(hintbackend, m) {
  m.def(
      "layer_norm_act(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str act) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_act_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, "
      "Tensor? weight, Tensor? bias, bool[3] output_mask, str act) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) {
  m.impl("layer_norm_act", &hb::rt::layer_norm_act);
  m.impl("layer_norm_act_backward", &hb::rt::layer_norm_act_backward);
}
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) {
  m.impl("layer_norm_act", &hb::rt::layer_norm_act);
  m.impl("layer_norm_act_backward", &hb::rt::layer_norm_act_backward);
}
#endif

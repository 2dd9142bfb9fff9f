#include "backend/runtime/RowSoftmax.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

#ifdef HB_WITH_CUDA
#include "codegen/cuda/RowSoftmax.h"
#endif

namespace hb::rt {
namespace {

using at::Tensor;

// ---- the chains as ATen ops: eager's exact result, for whatever the kernels do not take -------------
Tensor chain_forward(const Tensor& x, std::optional<double> scale, at::ScalarType dtype) {
  Tensor v = scale ? x.mul(*scale) : x;
  return at::_softmax(v.to(at::kFloat), -1, false).to(dtype);
}

Tensor chain_backward(const Tensor& grad, const Tensor& y, std::optional<double> scale, at::ScalarType dtype) {
  Tensor r = at::_softmax_backward_data(grad.to(at::kFloat), y, -1, at::kFloat).to(dtype);
  return scale ? r.mul(*scale) : r;
}

#ifdef HB_WITH_CUDA
bool kernel_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat; }

bool rows_ok(const Tensor& t) { return t.defined() && t.dim() >= 1 && t.is_contiguous(); }

// The CUDA kernels' preconditions: contiguous rows on one device, one dtype T for `same_t` (x, grad,
// T-typed results), float32 for `f32` (the saved softmax, or the float32 result); undefined ones pass.
// Pointers, not copies: this runs on every call.
bool kernels_take(std::initializer_list<const Tensor*> same_t, const Tensor& f32) {
  const Tensor& first = **same_t.begin();
  if (!kernel_dtype(first.scalar_type())) return false;
  auto fits = [&](const Tensor& t, at::ScalarType dtype) {
    return !t.defined() || (rows_ok(t) && t.scalar_type() == dtype && t.device() == first.device() &&
                            t.sizes().equals(first.sizes()));
  };
  for (const Tensor* t : same_t)
    if (!fits(*t, first.scalar_type())) return false;
  return fits(f32, at::kFloat);
}

#endif

// Runs the CUDA forward into y32 / low (either may be undefined); false when the kernel does not take it.
bool run_forward(const Tensor& x, std::optional<double> scale, const Tensor& y32, const Tensor& low) {
#ifdef HB_WITH_CUDA
  if (x.is_cuda() && kernels_take({&x, &low}, y32))
    return hb::cuda::row_softmax_forward(x, scale.has_value(), scale ? static_cast<float>(*scale) : 1.f, y32, low);
#endif
  return false;
}

bool run_backward(const Tensor& grad, const Tensor& y32, const Tensor& x, std::optional<double> x_scale,
                  std::optional<double> scale, const Tensor& out, const Tensor& low = Tensor()) {
#ifdef HB_WITH_CUDA
  if (grad.is_cuda() && kernels_take({&grad, &x, &out, &low}, y32))
    return hb::cuda::row_softmax_backward(grad, y32, x, x_scale.has_value(), x_scale ? static_cast<float>(*x_scale) : 1.f,
                                          scale.has_value(), scale ? static_cast<float>(*scale) : 1.f, out, low);
#endif
  return false;
}

// `out` given (an out= call): the result goes there, through a temporary when it is not one the
// kernels write (wrong layout); its shape must already be right (the arena's views are).
Tensor& deliver(const Tensor& r, Tensor& out) {
  TORCH_CHECK(out.sizes().equals(r.sizes()), "hintbackend row softmax: out has shape ", out.sizes(), ", expected ",
              r.sizes());
  out.copy_(r);
  return out;
}

// ---- the ops ---------------------------------------------------------------------------------------
Tensor& row_softmax_out(const Tensor& x, std::optional<double> scale, at::ScalarType dtype, Tensor& out) {
  TORCH_CHECK(out.scalar_type() == dtype && out.sizes().equals(x.sizes()),
              "hintbackend::row_softmax.out: out must be ", dtype, " of shape ", x.sizes());
  const bool f32 = dtype == at::kFloat;
  if (dtype == x.scalar_type() || f32)
    if (run_forward(x, scale, f32 ? out : Tensor(), f32 ? Tensor() : out)) return out;
  return deliver(chain_forward(x, scale, dtype), out);
}

Tensor row_softmax(const Tensor& x, std::optional<double> scale, at::ScalarType dtype) {
  Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  return row_softmax_out(x, scale, dtype, out);
}

std::tuple<Tensor, Tensor> row_softmax2(const Tensor& x, std::optional<double> scale) {
  Tensor y32 = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  Tensor low = at::empty(x.sizes(), x.options());
  if (run_forward(x, scale, y32, low)) return {y32, low};
  y32 = chain_forward(x, scale, at::kFloat);
  return {y32, y32.to(x.scalar_type())};
}

Tensor& backward_out(const Tensor& grad, const Tensor& y, const Tensor& x, std::optional<double> x_scale,
                     std::optional<double> scale, at::ScalarType dtype, Tensor& out) {
  TORCH_CHECK(out.scalar_type() == dtype && out.sizes().equals(grad.sizes()),
              "hintbackend::row_softmax_backward.out: out must be ", dtype, " of shape ", grad.sizes());
  if (dtype == grad.scalar_type() && run_backward(grad, y, x, x_scale, scale, out)) return out;
  const Tensor yy = y.defined() ? y : chain_forward(x, x_scale, at::kFloat);
  return deliver(chain_backward(grad, yy, scale, dtype), out);
}

Tensor& row_softmax_backward_out(const Tensor& grad, const Tensor& y, std::optional<double> scale,
                                 at::ScalarType dtype, Tensor& out) {
  TORCH_CHECK(y.scalar_type() == at::kFloat, "hintbackend::row_softmax_backward: y must be float32, got ",
              y.scalar_type());
  return backward_out(grad, y, Tensor(), std::nullopt, scale, dtype, out);
}

Tensor row_softmax_backward(const Tensor& grad, const Tensor& y, std::optional<double> scale,
                            at::ScalarType dtype) {
  Tensor out = at::empty(grad.sizes(), grad.options().dtype(dtype));
  return row_softmax_backward_out(grad, y, scale, dtype, out);
}

Tensor& row_softmax_recompute_backward_out(const Tensor& grad, const Tensor& x, std::optional<double> x_scale,
                                           std::optional<double> scale, at::ScalarType dtype, Tensor& out) {
  return backward_out(grad, Tensor(), x, x_scale, scale, dtype, out);
}

// Overwrites grad with the gradient (in grad's dtype) and x with the recomputed probabilities (in x's):
// the kernel reads each row whole before it writes it, so in place is safe.
Tensor& row_softmax_recompute_backward_(Tensor& grad, Tensor& x, std::optional<double> x_scale,
                                        std::optional<double> scale) {
  TORCH_CHECK(grad.sizes().equals(x.sizes()), "hintbackend::row_softmax_recompute_backward_: grad has shape ",
              grad.sizes(), ", x ", x.sizes());
  if (run_backward(grad, Tensor(), x, x_scale, scale, grad, x)) return grad;
  const Tensor y = chain_forward(x, x_scale, at::kFloat);
  grad.copy_(chain_backward(grad, y, scale, grad.scalar_type()));
  x.copy_(y);
  return grad;
}

Tensor row_softmax_recompute_backward(const Tensor& grad, const Tensor& x, std::optional<double> x_scale,
                                      std::optional<double> scale, at::ScalarType dtype) {
  Tensor out = at::empty(grad.sizes(), grad.options().dtype(dtype));
  return row_softmax_recompute_backward_out(grad, x, x_scale, scale, dtype, out);
}

}  // namespace

void link_row_softmax_ops() {}

}  // namespace hb::rt

// Schemas: the names passes/RowSoftmaxFusion.cpp writes into the IR. Implementations for CPU and CUDA
// (the executor calls them below autograd, so no other dispatch key is needed).
TORCH_LIBRARY(hintbackend, m) {
  m.def("row_softmax(Tensor x, float? scale, ScalarType dtype) -> Tensor");
  m.def("row_softmax.out(Tensor x, float? scale, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("row_softmax2(Tensor x, float? scale) -> (Tensor, Tensor)");
  m.def("row_softmax_backward(Tensor grad, Tensor y, float? scale, ScalarType dtype) -> Tensor");
  m.def(
      "row_softmax_backward.out(Tensor grad, Tensor y, float? scale, ScalarType dtype, *, Tensor(a!) out) -> "
      "Tensor(a!)");
  m.def("row_softmax_recompute_backward(Tensor grad, Tensor x, float? x_scale, float? scale, ScalarType dtype) -> Tensor");
  m.def(
      "row_softmax_recompute_backward.out(Tensor grad, Tensor x, float? x_scale, float? scale, ScalarType dtype, *, "
      "Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "row_softmax_recompute_backward_(Tensor(a!) grad, Tensor(b!) x, float? x_scale, float? scale) -> Tensor(a!)");
}

namespace {
template <typename Lib>
void impl_all(Lib& m) {
  using namespace hb::rt;
  m.impl("row_softmax", &row_softmax);
  m.impl("row_softmax.out", &row_softmax_out);
  m.impl("row_softmax2", &row_softmax2);
  m.impl("row_softmax_backward", &row_softmax_backward);
  m.impl("row_softmax_backward.out", &row_softmax_backward_out);
  m.impl("row_softmax_recompute_backward", &row_softmax_recompute_backward);
  m.impl("row_softmax_recompute_backward.out", &row_softmax_recompute_backward_out);
  m.impl("row_softmax_recompute_backward_", &row_softmax_recompute_backward_);
}
}  // namespace

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) { impl_all(m); }
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) { impl_all(m); }
#endif

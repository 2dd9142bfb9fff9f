#include "backend/runtime/RowSoftmax.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
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

// ---- CPU kernels: one pass over each row, in float32 ---------------------------------------------
template <typename T>
void softmax_row(const T* x, int64_t n, bool has_scale, float scale, float* r) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(x[i]);
    if (has_scale) v = static_cast<float>(static_cast<T>(v * scale));  // x * scale rounds to T
    r[i] = v;
    m = std::fmax(m, v);
  }
  double s = 0.0;  // a float32 running sum loses n * eps; the CUDA kernel sums in a tree instead
  for (int64_t i = 0; i < n; ++i) s += (r[i] = std::exp(r[i] - m));
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t i = 0; i < n; ++i) r[i] *= inv;
}

template <typename T>
void cpu_forward(const Tensor& x, bool has_scale, float scale, const Tensor& y32, const Tensor& low) {
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  const T* xp = x.const_data_ptr<T>();
  float* yp = y32.defined() ? y32.mutable_data_ptr<float>() : nullptr;
  T* lp = low.defined() ? low.mutable_data_ptr<T>() : nullptr;
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> r(n);
    for (int64_t row = r0; row < r1; ++row) {
      softmax_row(xp + row * n, n, has_scale, scale, r.data());
      if (yp) std::copy(r.begin(), r.end(), yp + row * n);
      if (lp)
        for (int64_t i = 0; i < n; ++i) lp[row * n + i] = static_cast<T>(r[i]);
    }
  });
}

template <typename T>
void cpu_backward(const Tensor& grad, const Tensor& y32, const Tensor& x, bool has_x_scale, float x_scale,
                  bool has_scale, float scale, const Tensor& out) {
  const int64_t n = grad.size(-1), rows = n ? grad.numel() / n : 0;
  const T* gp = grad.const_data_ptr<T>();
  const float* yp = y32.defined() ? y32.const_data_ptr<float>() : nullptr;
  const T* xp = x.defined() ? x.const_data_ptr<T>() : nullptr;
  T* op = out.mutable_data_ptr<T>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> recomputed(yp ? 0 : n);
    for (int64_t row = r0; row < r1; ++row) {
      const float* y = yp ? yp + row * n : recomputed.data();
      if (!yp) softmax_row(xp + row * n, n, has_x_scale, x_scale, recomputed.data());
      const T* g = gp + row * n;
      double acc = 0.0;
      for (int64_t i = 0; i < n; ++i) acc += static_cast<float>(g[i]) * y[i];
      const float dot = static_cast<float>(acc);
      for (int64_t i = 0; i < n; ++i) {
        T v = static_cast<T>(y[i] * (static_cast<float>(g[i]) - dot));
        if (has_scale) v = static_cast<T>(static_cast<float>(v) * scale);
        op[row * n + i] = v;
      }
    }
  });
}

template <typename F>
void dispatch_low(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: f(float{}); break;
  }
}

bool kernel_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat; }

bool rows_ok(const Tensor& t) { return t.defined() && t.dim() >= 1 && t.is_contiguous(); }

// The kernels' shared preconditions: contiguous rows on the CPU or one CUDA device, one dtype T for
// `same_t` (x, grad, T-typed results), float32 for `f32` (the saved softmax, float32 results).
bool kernels_take(const std::vector<Tensor>& same_t, const std::vector<Tensor>& f32) {
  const Tensor& first = same_t.front();
  if (!kernel_dtype(first.scalar_type())) return false;
  if (!first.device().is_cpu()) {
#ifdef HB_WITH_CUDA
    if (!first.device().is_cuda()) return false;
#else
    return false;
#endif
  }
  for (const Tensor& t : same_t)
    if (t.defined() && (!rows_ok(t) || t.scalar_type() != first.scalar_type() || t.device() != first.device() ||
                        !t.sizes().equals(first.sizes())))
      return false;
  for (const Tensor& t : f32)
    if (t.defined() && (!rows_ok(t) || t.scalar_type() != at::kFloat || t.device() != first.device() ||
                        !t.sizes().equals(first.sizes())))
      return false;
  return true;
}

// Runs the fused forward into y32 / low (either may be undefined); false when the kernels do not take it.
bool run_forward(const Tensor& x, std::optional<double> scale, const Tensor& y32, const Tensor& low) {
  if (!kernels_take({x, low}, {y32})) return false;
  const float s = scale ? static_cast<float>(*scale) : 1.f;
#ifdef HB_WITH_CUDA
  if (x.is_cuda()) return hb::cuda::row_softmax_forward(x, scale.has_value(), s, y32, low);
#endif
  dispatch_low(x.scalar_type(), [&](auto t) { cpu_forward<decltype(t)>(x, scale.has_value(), s, y32, low); });
  return true;
}

bool run_backward(const Tensor& grad, const Tensor& y32, const Tensor& x, std::optional<double> x_scale,
                  std::optional<double> scale, const Tensor& out) {
  if (!kernels_take({grad, x, out}, {y32})) return false;
  const float xs = x_scale ? static_cast<float>(*x_scale) : 1.f, s = scale ? static_cast<float>(*scale) : 1.f;
#ifdef HB_WITH_CUDA
  if (grad.is_cuda())
    return hb::cuda::row_softmax_backward(grad, y32, x, x_scale.has_value(), xs, scale.has_value(), s, out);
#endif
  dispatch_low(grad.scalar_type(), [&](auto t) {
    cpu_backward<decltype(t)>(grad, y32, x, x_scale.has_value(), xs, scale.has_value(), s, out);
  });
  return true;
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

Tensor row_softmax_recompute_backward(const Tensor& grad, const Tensor& x, std::optional<double> x_scale,
                                      std::optional<double> scale, at::ScalarType dtype) {
  Tensor out = at::empty(grad.sizes(), grad.options().dtype(dtype));
  return row_softmax_recompute_backward_out(grad, x, x_scale, scale, dtype, out);
}

}  // namespace

void link_row_softmax_ops() {}

}  // namespace hb::rt

// Schemas: the names passes/RowSoftmaxFusion.cpp writes into the IR. Implementations for CPU and
// CUDA; the kernels run on both, so no other dispatch key (Meta, autograd) is needed at run time.
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
}
}  // namespace

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) { impl_all(m); }
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) { impl_all(m); }
#endif

#include "backend/runtime/ColumnSum.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include <vector>

#ifdef HB_WITH_CUDA
#include "codegen/cuda/ColumnSum.h"
#endif

namespace hb::rt {
namespace {

using at::Tensor;

// The result's sizes: x's without its `dims` leading dims (keepdim: those as ones).
std::vector<int64_t> result_sizes(const Tensor& x, int64_t dims, bool keepdim) {
  std::vector<int64_t> s;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d >= dims) s.push_back(x.size(d));
    else if (keepdim) s.push_back(1);
  return s;
}

void check_args(const Tensor& x, int64_t dims, int64_t parts) {
  TORCH_CHECK(dims >= 1 && dims < x.dim(), "hintbackend::column_sum: dims must be in [1, ", x.dim(), "), got ",
              dims);
  TORCH_CHECK(parts >= 1, "hintbackend::column_sum: parts must be >= 1, got ", parts);
}

Tensor& column_sum_out(const Tensor& x, int64_t dims, bool keepdim, int64_t parts, at::ScalarType dtype, Tensor& out) {
  check_args(x, dims, parts);
  const std::vector<int64_t> sizes = result_sizes(x, dims, keepdim);
  TORCH_CHECK(out.scalar_type() == dtype && out.sizes().equals(sizes), "hintbackend::column_sum.out: out must be ",
              dtype, " of shape ", at::IntArrayRef(sizes), ", got ", out.scalar_type(), " ", out.sizes());
  const int64_t cols = c10::multiply_integers(sizes.begin(), sizes.end());
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
#ifdef HB_WITH_CUDA
  if (x.is_cuda() && x.is_contiguous() && hb::cuda::column_sum(x.view({rows, cols}), parts, out)) return out;
#endif
  // The same sums as ATen ops: parts float32 sums of N / parts rows, their float32 sum, then the cast.
  const Tensor m = x.reshape({rows, cols});
  const Tensor part = rows % parts == 0 ? m.view({parts, rows / parts, cols}).sum({1}, false, at::kFloat)
                                        : m.sum({0}, true, at::kFloat);
  out.copy_(part.sum({0}, false, at::kFloat).view(sizes));
  return out;
}

Tensor column_sum(const Tensor& x, int64_t dims, bool keepdim, int64_t parts, at::ScalarType dtype) {
  check_args(x, dims, parts);
  Tensor out = at::empty(result_sizes(x, dims, keepdim), x.options().dtype(dtype));
  return column_sum_out(x, dims, keepdim, parts, dtype, out);
}

}  // namespace

void link_column_sum_ops() {}

}  // namespace hb::rt

// The schema: the name passes/SplitColumnSum.cpp writes into the IR. CPU and CUDA (the executor calls it
// below autograd).
TORCH_LIBRARY_FRAGMENT(hintbackend, m) {
  m.def("column_sum(Tensor x, int dims, bool keepdim, int parts, ScalarType dtype) -> Tensor");
  m.def(
      "column_sum.out(Tensor x, int dims, bool keepdim, int parts, ScalarType dtype, *, Tensor(a!) out) -> "
      "Tensor(a!)");
}

TORCH_LIBRARY_IMPL(hintbackend, CPU, m) {
  m.impl("column_sum", &hb::rt::column_sum);
  m.impl("column_sum.out", &hb::rt::column_sum_out);
}
#ifdef HB_WITH_CUDA
TORCH_LIBRARY_IMPL(hintbackend, CUDA, m) {
  m.impl("column_sum", &hb::rt::column_sum);
  m.impl("column_sum.out", &hb::rt::column_sum_out);
}
#endif

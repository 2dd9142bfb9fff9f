// CUDA kernels for hintbackend::column_sum (backend/runtime/ColumnSum.h has its semantics): a column sum
// of an [N, C] matrix as `parts` float32 partial sums of N / parts rows each, then their float32 sum in
// part order, rounded once into the result's dtype. Two launches of one op and a float workspace of parts x
// C, where the view, the two ATen sums and the cast split-column-sum wrote before took three launches and
// four ops' host time. Part of hb_runtime, built only where nvcc and a CUDA torch exist (HB_WITH_CUDA).
#pragma once
#include <ATen/core/Tensor.h>

namespace hb::cuda {

// Returns false, launching nothing, when the kernels do not take these tensors; the caller then runs
// ATen ops. Preconditions (the caller's): x a contiguous [N, C] CUDA matrix of float32, bfloat16 or
// float16 with N a multiple of `parts`; out contiguous with C elements of one of those dtypes, on x's
// device.
bool column_sum(const at::Tensor& x, int64_t parts, const at::Tensor& out);

}  // namespace hb::cuda

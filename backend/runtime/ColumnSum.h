// hintbackend::column_sum, the op passes/SplitColumnSum.h rewrites a long column sum into, registered with
// the dispatcher (namespace `hintbackend`) so the executor runs it like any ATen op, arena placement
// through its out= overload included.
//
//   column_sum(x, dims, keepdim, parts, dtype)
//       the sum of x over its `dims` leading dims (N rows of C = the other dims' product), as `parts`
//       float32 sums of N / parts rows each, then the float32 sum of those in part order, rounded once to
//       `dtype`; shaped as aten::sum.dim_IntList(x, [0 .. dims - 1], keepdim) shapes it.
// On CUDA, contiguous x of float32, bfloat16 or float16 and N a multiple of parts run two kernels
// (codegen/cuda/ColumnSum.cu): nothing is staged beyond the parts x C floats. Anything else runs the same
// two sums and cast as ATen ops (the CPU: the pass never writes the op there, but the op takes it).
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the op is linked in (see RowSoftmax.h).
void link_column_sum_ops();

}  // namespace hb::rt

// split-column-sum: on CUDA, a sum over the leading dims of a contiguous tensor (a Linear's bias
// gradient, `grad.sum(0)` of an [N, C] matrix) becomes hintbackend::column_sum, so ATen never stages it
// through a global buffer.
//
// ATen's CUDA reduction splits a long reduction over rows across CTAs and keeps every CTA's partial sums
// in a global buffer the caching allocator hands out for the call: for an [N, C] column sum it measured
// 8 MiB at [2048, 512], 32 MiB at [2048, 2048], 128 MiB at [16384, 1024] and 132 MiB at [8192, 4096]
// (bf16 or float32, the H100, torch 2.11; benchmarks/column_sum.py), more than the tensor itself. In a
// training step's backward that buffer is often the peak's largest block. r float32 partial sums of N / r
// rows each, then their sum, stage only r x C floats:
//   %s = aten::sum.dim_IntList(%x, [0, .., k-1], keepdim)                  N rows of C, N = r * m
// becomes, in place (the node keeps its name and type)
//   %s = hintbackend::column_sum.default(%x, k, keepdim, r, <result dtype>)
// (backend/runtime/ColumnSum.h: two kernels on CUDA, codegen/cuda/ColumnSum.cu). Both stages accumulate
// in float32 and round once, as the one-pass sum does; only the order of the additions differs, and it
// is the same in every run. Until the sixteenth session the pass wrote the same sums as a view, two ATen
// sums and a cast (three launches and four ops' host time a sum). r is the smallest of 32, 64, 128, 256
// that divides N with m = N / r <= 1024 rows per partial; the pass leaves a sum alone off CUDA, with
// fewer than 512 rows or 128 outputs (little or nothing staged), with no such r, or with a symbolic shape
// or a non-contiguous input.
//
// The note lists what it split:
//   split-column-sum graph backward_1: %sum_2 over 2048 rows of 2048 as 32 partial sums of 64 rows
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool split_column_sum(Graph& g, PassContext& ctx);

}  // namespace hb

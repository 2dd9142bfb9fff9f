// fold-transpose-pairs: a transpose of a transpose of x (`aten::t` twice, or `aten::transpose.int` twice
// over the same two dims) reads as x itself.
//
// AOTAutograd's backward of a linear layer writes two such pairs: the input's gradient as
// mm(grad, t(t(w))) (w.t() from the forward, transposed back) and the weight's as t(t(mm(...))). Each
// outer view has x's sizes, strides and offset, so its readers read x; the views go when nothing else
// reads them. Four dispatches fewer per linear layer and backward: host time, where the step is
// host-bound (issue 12's SDPA block).
//
// Left alone: a pair whose outer view is a graph output while x is a placeholder or an output too (the
// output would be the input itself, or two outputs one tensor: AccumulateGrad may take one gradient
// tensor as a .grad and later add into it in place); and a pair whose types disagree with x's.
//
// The note counts what it folded:
//   fold-transpose-pairs graph backward_1: 8 pairs (%t_4 reads %primals_12, %t_7 reads %mm_1, ...)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_transpose_pairs(Graph& g, PassContext& ctx);

}  // namespace hb

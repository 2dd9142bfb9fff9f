// fold-select-backward: a sum of select_backward gradients that covers every index of one dimension
// becomes one stack.
//
// `q, k, v = qkv.unbind(0)` (or `x[0], x[1], x[2]` on a packed projection) traces to three selects; their
// gradient, as AOTAutograd writes it, is
//   %sb_i = aten::select_backward(%g_i, sizes, dim, i)    for each i: a zero tensor of `sizes`, g_i copied in
//   %sum  = aten::add(aten::add(%sb_2, %sb_1), %sb_0)
// which is stack([g_0, ..., g_{n-1}], dim): the adds only put each slice where the others have zeros.
// The traced form allocates n full-size zero tensors (alive together before the adds), fills and copies
// each, and reads them all again to add; the stack writes the result once. When the adds' leaves are
// select_backward nodes of one gradient shape and dimension whose indices are 0 .. n-1 exactly once
// (n = sizes[dim]), each read by this sum alone, with the result's dtype and a static row-major result
// (the stack's layout), the sum's last add becomes
// `aten::stack.default([%g_0, ..., %g_{n-1}], dim)` and the other nodes go. Partial sums (indices
// missing or repeated), `alpha` adds and dtype changes are left alone.
//
// The note lists what it folded:
//   fold-select-backward graph backward_1: %add_4 = stack of 3 select_backward gradients (dim 0), 4 nodes removed
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_select_backward(Graph& g, PassContext& ctx);

}  // namespace hb

// fold-softmax-upcast: `_softmax(x.to(float32), dim, false)` with x in float16 on CUDA becomes
// `_softmax(x, dim, true)` (half_to_float), and the same for `_log_softmax`. Not bfloat16: ATen's CUDA
// half_to_float softmax takes Half only (torch 2.11).
//
// Attention written as plain ops upcasts its scores before the softmax (`s.float().softmax(-1)`): the
// upcast writes a float32 copy of the B x H x S x S scores that only the softmax reads. ATen's CUDA
// softmax with half_to_float reads the half-precision input and accumulates in float32, as it does
// for a float32 input, so the result is the same up to its reduction order (it may differ in the
// last bit) and the copy (6 bytes per score: 2 read, 4 written) is gone. CPU has no half_to_float
// kernel, so CPU graphs are left alone. The upcast node goes when nothing else reads it.
//
// The note lists what it folded:
//   fold-softmax-upcast graph forward_0: %_softmax reads %mul (float16) directly, %_to_copy removed
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_softmax_upcast(Graph& g, PassContext& ctx);

// When `n` is a plain dtype cast (`_to_copy` naming only the dtype, and at most the same device and
// the strided layout; or `prims::convert_element_type`) that keeps its input's shape: the input's
// node index; else -1. Shared with row-softmax-fusion, which folds casts around softmaxes too.
int plain_cast_source(const Graph& g, const Node& n);

}  // namespace hb

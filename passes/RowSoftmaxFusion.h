// row-softmax-fusion: a softmax over the last dim, with the scalar scale and dtype casts attention
// written as plain ops puts around it, becomes one row kernel call (backend/runtime/RowSoftmax.h has
// the ops' exact semantics); its gradient likewise.
//
//   forward   x * c -> .to(float32) -> _softmax(-1) -> .to(T)
//     %_to_copy_1: bf16[..] = hintbackend::row_softmax(%view_2, 0.25, dtype.bfloat16)
//     (row_softmax2 returns the float32 softmax too when something else reads it: a BFS forward saves
//     it for the backward; getitems named after the softmax and the downcast read the pair)
//   backward  g.to(float32) -> _softmax_backward_data(g, y, -1) -> .to(T) -> * c
//     %mul_1: bf16[..] = hintbackend::row_softmax_backward(%view_8, %detach_1, 0.25, dtype.bfloat16)
//   backward whose y is a softmax of the same graph (a DFS region's backward recomputes the forward):
//     %mul_1: bf16[..] = hintbackend::row_softmax_recompute_backward(%view_8, %view_2, 0.25, 0.25, dtype.bfloat16)
//     which recomputes y from the scores in the kernel: the float32 softmax is never written. When
//     the same graph also reads the recomputed probabilities in T (a DFS backward's dv = P^T @ dO)
//     and nothing else reads the scores or the gradient, one kernel reads both once and overwrites
//     them, the gradient with ds and the scores with P (a slice then holds two S x S buffers, not
//     four); P becomes an alias of the scores, and its readers move after the kernel:
//     %mul_1: bf16[..] = hintbackend::row_softmax_recompute_backward_(%view_8, %view_2, 0.25, 0.25) !mutates
//     %_to_copy_1: bf16[..] = aten::alias.default(%view_2) !view
//
// Each part of a chain is optional (no scale; a float32 softmax input needs no casts; a float16 one
// with half_to_float after fold-softmax-upcast), but a cast or mul joins only when the chain is its
// sole reader. Plain-op attention moves about 24 bytes per score through its four forward ops and
// 28 through its four backward ones; the row kernels read and write each row once (BFS: 8 and 8;
// DFS's recomputing backward, 8 for the gradient and the probabilities together). Tables: docs/fusion.md,
// "Row kernels"; why it matters for slicing: docs/scheduling.md, "Measured".
// Runs after slice-schedule (whose legality rules read the plain ATen ops) inside slice_loop bodies
// too, and before pointwise-fusion, which would otherwise take the scalar mul.
//
// The note lists each fused chain:
//   row-softmax-fusion graph slice_body_0: %_to_copy_1 = row_softmax(%view_2) from %mul %_to_copy %_softmax %_to_copy_1
#pragma once
#include "passes/Pipeline.h"

namespace hb {

constexpr const char* kRowSoftmaxTarget = "hintbackend::row_softmax.default";
constexpr const char* kRowSoftmax2Target = "hintbackend::row_softmax2.default";
constexpr const char* kRowSoftmaxBackwardTarget = "hintbackend::row_softmax_backward.default";
constexpr const char* kRowSoftmaxRecomputeBackwardTarget = "hintbackend::row_softmax_recompute_backward.default";
constexpr const char* kRowSoftmaxRecomputeBackwardInPlaceTarget = "hintbackend::row_softmax_recompute_backward_.default";

bool row_softmax_fusion(Graph& g, PassContext& ctx);

}  // namespace hb

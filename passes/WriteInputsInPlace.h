// write-inputs-in-place: an input the caller writes a graph output back into (PassContext::input_writes)
// is written by the node that computes the new value instead, so that the caller's copy has nothing
// to do and the node's functional form copies nothing.
//
// What it is for: AOTAutograd functionalizes a module's in-place updates of its buffers. Each comes out of
// the graph as a new value among its first outputs, which the caller (the lean runtime, or AOTAutograd's
// runtime) then copies into the buffer. Three shapes of it:
//   - training BatchNorm's `running_mean`, `running_var` and `num_batches_tracked`:
//       %add = aten::add.Tensor(%primals_4, 1)                             num_batches_tracked + 1
//       %bn = aten::_native_batch_norm_legit_functional.default(%x, %w, %b, %primals_5, %primals_6, true, m, eps)
//       return (%add, %getitem_3, %getitem_4, ...)  the new values of primals_4, 5, 6, then the rest
//     The functional BatchNorm clones both statistics before its kernel updates the clones, and the caller
//     copies three tensors back: five dispatches a BatchNorm a step that eager's module does not make.
//     After this pass:
//       %add = aten::add_.Tensor(%primals_4, 1) !mutates
//       %bn = hintbackend::batch_norm_in_place.default(%x, %w, %b, %primals_5, %primals_6, m, eps) !mutates
//     The op (backend/runtime/BatchNormInPlace.h) runs ATen's native_batch_norm, which updates the
//     statistics in place as eager's module does, and returns them as elements 3 and 4 (their storage:
//     backend/ir/Aliasing.h, aliased_argument). A module in bf16 or f16 on CUDA has statistics of that
//     dtype while the functional form's new values are float: AOTAutograd converts each back
//     (`aten::_to_copy.default(%getitem_3, dtype=...)`); the in-place op updates them in their own dtype
//     (what the functional form's kernel does to its clones), so the conversion reads as the element
//     itself, which takes the input's type, and goes;
//   - an op with an in-place overload computing the same value into its first argument (in_place_overloads
//     in the .cpp: add, sub, mul, div, lerp, copy, fill, zero, masked_fill, index_put, index_copy), as a
//     step counter, a moving average (`ema.lerp_(x, w)`) or a cache written at tensor positions
//     (`cache.index_copy_(2, pos, k)`, Hugging Face's static cache) trace: `index_copy` becomes
//     `index_copy_`, and so on; and a chain of them, each reading the one before and read by nothing else
//     (`ema.mul_(d).add_(x, alpha=1 - d)`, traced as mul, then add of the mul: both become in-place, each
//     writing the buffer; `count.add_(1).mul_(2)` likewise);
//   - a buffer written through a view, `cache[:, :, pos] = k` (select) or `cache[:, :, a:b] = k` (slice):
//       %v = aten::select.int(%cache, 2, %pos)       %c = aten::copy.default(%v, %k)
//       %s = aten::select_scatter.default(%cache, %c, 2, %pos)
//     %c becomes `aten::copy_.default(%v, %k) !mutates`, writing the cache through the view; %s goes and
//     its readers read %cache (after %c in the order, where memory-schedule keeps them: they read storage
//     %c writes). Without this, each call copied the whole cache twice (the scatter, the write-back).
// The caller sees an output that already is its input's data and copies nothing (LeanAutograd.cpp skips
// it; ATen's copy_ returns at once there too).
//
// Rewritten only where it cannot change a value anyone reads:
//   - the placeholder is written back from exactly that node's value (the output at its position is the
//     node, element 3 / 4 of the BatchNorm, or a conversion of it to the input's dtype that is its only
//     reader), and nothing else reads the placeholder (no node, no other output: a reader after the node
//     would see the new value), but the view a scatter's copy writes through;
//   - the new value has the placeholder's own type (no broadcast, no type promotion), and it is returned
//     at its write-back position only (a value also saved for the backward or returned to the user would
//     become the input itself there);
//   - a scatter's view is the one it scatters into (the same arguments, symbolic positions the same node);
//   - the BatchNorm trains (its running statistics are its arguments 3 and 4, both rewritten or neither).
// Top-level nodes only: runs after slice-schedule, whose legality rules read the functional ops (slice
// loop bodies keep them). Not under CUDA graphs (PassContext::keep_across_calls false): a replay costs the
// copies no host time, and a recorded write into an input is what the replays' input copies must not
// miss.
//
// The note says what it rewrote:
//   write-inputs-in-place graph forward_0: %primals_4 by %add (add_), %primals_5 and %primals_6 by
//   %_native_batch_norm_legit_functional (batch_norm_in_place)
//   write-inputs-in-place graph inference_0: %arg0_1 by %copy (copy_ into a view), %arg2_1 by %add (add_)
//   write-inputs-in-place graph forward_0: %buffers_ema by %mul, %add (mul_, add_)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool write_inputs_in_place(Graph& g, PassContext& ctx);

}  // namespace hb

// write-inputs-in-place: an input the caller writes a graph output back into (PassContext::input_writes)
// is written by the node that computes the new value instead, so that the caller's copy has nothing
// to do and the node's functional form allocates nothing.
//
// What it is for: AOTAutograd functionalizes a module's in-place updates of its buffers. Training
// BatchNorm's `running_mean`, `running_var` and `num_batches_tracked` come out of the forward as new
// values, which the caller then copies into the buffers (the lean runtime's write-back; AOTAutograd's
// runtime does the same):
//   %add = aten::add.Tensor(%primals_4, 1)                                 num_batches_tracked + 1
//   %bn = aten::_native_batch_norm_legit_functional.default(%x, %w, %b, %primals_5, %primals_6, true, m, eps)
//   return (%add, %getitem_3, %getitem_4, ...)     the first outputs: the new values of primals_4, 5, 6
// The functional BatchNorm clones both statistics before its kernel updates the clones, and the caller
// copies three tensors back: five dispatches a BatchNorm a step that eager's in-place module does not
// make. After this pass:
//   %add = aten::add_.Tensor(%primals_4, 1) !mutates
//   %bn = hintbackend::batch_norm_in_place.default(%x, %w, %b, %primals_5, %primals_6, m, eps) !mutates
// The BatchNorm op (backend/runtime/BatchNormInPlace.h) runs ATen's native_batch_norm, which updates the
// statistics in place as eager's module does, and returns them as elements 3 and 4 (their storage:
// backend/ir/Aliasing.h, aliased_argument). The caller sees an output that already is its input's data
// and copies nothing (backend/bindings/LeanAutograd.cpp; ATen's copy_ returns at once there too).
//
// A module in bf16 or f16 on CUDA has statistics of that dtype, while the functional form's new values
// are float: AOTAutograd converts each back (`%_to_copy = aten::_to_copy.default(%getitem_3, dtype=...)`)
// before it is written back and saved. The in-place op updates the statistics in their own dtype (what
// the functional form's kernel does to its clones, and eager's module to the buffers), so the conversion
// reads as the element itself, which takes the input's type, and goes.
//
// Rewritten only where it cannot change a value anyone reads:
//   - the placeholder is written back from exactly that node's value (the output at its position is the
//     add, or element 3 / 4 of the BatchNorm, or a conversion of it to the input's dtype that is its only
//     reader), and nothing else reads the placeholder (no node, no other output: a reader after the node
//     would see the new value);
//   - the add's result has the placeholder's own type (no broadcast, no type promotion) and no alpha;
//   - the BatchNorm trains (its running statistics are its arguments 3 and 4, both rewritten or neither).
// Top-level nodes only: runs after slice-schedule, whose legality rules read the functional ops (slice
// loop bodies keep them). Not under CUDA graphs (PassContext::keep_across_calls false): a replay costs the
// copies no host time, and a recorded write into an input is what the replays' input copies must not
// miss.
//
// The note says what it rewrote:
//   write-inputs-in-place graph forward_0: %primals_4 by %add (add_), %primals_5 and %primals_6 by
//   %_native_batch_norm_legit_functional (batch_norm_in_place)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool write_inputs_in_place(Graph& g, PassContext& ctx);

}  // namespace hb

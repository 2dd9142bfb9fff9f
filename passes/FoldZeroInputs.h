// fold-zero-inputs: placeholders the caller will pass as zeros (PassContext::zero_inputs, by name) stop
// being read where a read is an add: add(x, z) and add(z, x) read as x.
//
// What it is for: a training step that ignores one of the forward's outputs (HF models return the logits
// beside the loss) gets that output's gradient as a tensor of zeros, which torch's autograd materializes
// before the backward runs and the backward adds to the gradient it computes (AOTAutograd traces
// `add(tangents_k, grad)`). The lean runtime (python/hintbackend/lean_runtime.py) turns materialization
// off; where a gradient arrives undefined it runs this graph compiled again with that tangent named here,
// and passes nothing where the compiled graph no longer reads it: no [N, vocabulary] block of zeros at
// the backward's peak, no memset and no add.
//
// Folded only where the add's type is x's own (shape, strides, dtype, device: no broadcast, no type
// promotion) and it has no alpha; and not where the add is a graph output while x is a placeholder or an
// output too (as fold-transpose-pairs: the output would be an input itself, or two outputs one tensor).
// Any other read keeps the placeholder read (the runtime then passes zeros, as before).
//
// The note says what it folded and what still reads a zero input:
//   fold-zero-inputs graph backward_3: %tangents_2 is zero: 1 add folded (%add_7 reads %view_12)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_zero_inputs(Graph& g, PassContext& ctx);

}  // namespace hb

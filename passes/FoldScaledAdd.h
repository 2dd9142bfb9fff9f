// fold-scaled-add: an add (or sub) of a tensor times a constant, read by nothing else, reads the tensor
// with the constant as the op's alpha: add(a, mul(b, s)) -> add(a, b, alpha=s), sub likewise.
//
// AOTAutograd decomposes `add(a, b, alpha=s)` into a mul and an add (functionalization of
// `buf.add_(x, alpha=s)`, as an exponential moving average `ema.mul_(d).add_(x, alpha=1 - d)` or an
// optimizer-style update writes it). The mul's result is a full-size temporary and a kernel more than eager
// runs; folded back, the graph runs eager's own op again (and write-inputs-in-place, after it, writes the
// buffer with it).
//
// Only where it changes no value's type: the mul is a floating tensor times a constant number with the
// tensor's own type (no promotion), read by the add alone and not returned; the add has no alpha of its own. Numerics: one rounding (a + s * b) where
// the decomposition rounded twice; that is eager's `add(a, b, alpha=s)`, and within an ulp of `a + b * s`.
//
// The note counts what it folded:
//   fold-scaled-add graph inference_0: 1 mul folded (%add reads %arg1_1 with alpha 0.25)
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool fold_scaled_add(Graph& g, PassContext& ctx);

}  // namespace hb

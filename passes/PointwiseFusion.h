// pointwise-fusion: groups chains of elementwise ops into one hintbackend::fused_pointwise node whose
// body is a subgraph of the original ops, so the runtime makes one kernel call (and one output
// allocation) where eager makes one per op.
//
//   %sigmoid: f32[8, 16] = hintbackend::fused_pointwise(@fused_sigmoid, [%mm, %select_1])
//
// args[0]  Arg::Kind::Graph: the body, in g.subgraphs. Its placeholders are, in order, one per input;
//          it returns the single fused value (not a tuple).
// args[1]  Arg::Kind::List of Ref: the inputs (tensors of the group's dtype and device).
// The node keeps the name, type, hints and source of the group's last op (the root), so users read
// the same value under the same name.
//
// Grouping: walking backwards, each fusable op not yet grouped is a root; a fusable producer joins
// the group when every user of it is already in the group (so only the root's value leaves it: no
// value is computed twice and no cycle can form) and it is in the same hinted_context region. Groups
// of one op stay as they are. What fuses is codegen/PointwiseProgram.h's table
// (is_fusable_pointwise); slice_loop bodies are fused too. The runtime evaluates the body with the
// CPU pointwise kernel, or runs it op by op where no kernel applies.
#pragma once
#include "passes/Pipeline.h"

namespace hb {

// At most this many ops per group (the program's registers live on the stack).
constexpr int kMaxFusedOps = 48;

bool pointwise_fusion(Graph& g, PassContext& ctx);

}  // namespace hb

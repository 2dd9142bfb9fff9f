// hint-propagation: checks the hints hinted_context regions put on nodes (backend/ir/Hints.h,
// docs/hints.md) against the graph, and fills them in where FX left a node of a region without them.
//
// One owner per hint rule: the value rules of a hint and of hints merged across nested regions (types,
// ranges, enums, not both slices and slice_size, memory_budget only with "auto") are hoo/hints.py's,
// checked at the hinted_context call; the importer reads the document (JSON types, spellings);
// this pass owns what needs the graph.
// Checks (each failure is an hb::UserError naming the region and a node, with a fix):
//   - a region's path ends in its id, and every node of a region carries the same hints;
//   - slice_dims exist on, and have equal sizes across, the tensors that enter and leave the region
//     (an input of lower rank than the region's results is shared by all slices and not checked;
//     size 1 on an input broadcasts).
// Fills: a getitem of a hinted multi-output node (flex_attention's (out, lse, max)) inherits its
// hints, so a region's results are all marked.
//
// Passes that create or replace nodes keep them in their region with inherit_hints /
// insert_node_like (backend/ir/GraphEdit.h).
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool hint_propagation(Graph& g, PassContext& ctx);

}  // namespace hb

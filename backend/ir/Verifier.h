// Structural checks on an IR graph (and its subgraphs). Throws hb::UserError naming the node and
// the problem. Run after import and, with HINTBACKEND_VERIFY_EACH_PASS=1, after every pass.
#pragma once
#include "backend/ir/Graph.h"

namespace hb {

void verify(const Graph& g);

}  // namespace hb

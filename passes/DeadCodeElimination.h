#pragma once
#include "passes/Pipeline.h"

namespace hb {

// dead-code-elimination: removes call_function and get_attr nodes whose values no node uses and
// that have no effect beyond their value (no mutation, no random draw). Placeholders stay: they are
// the graph's calling convention.
bool dead_code_elimination(Graph& g, PassContext& ctx);

}  // namespace hb

// The heap simulator (XLA's is the model): replays the allocations and frees of a graph's values over
// its fixed order and returns the most bytes live at once. The slice chooser (slice-schedule),
// memory-schedule and the memory planner's arena check compare candidates with it.
#pragma once
#include <cstdint>

#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"

namespace hb {

// Heap simulator: the most bytes live at once over the graph's order, counting everything (inputs for
// the whole call, or until their last use when g.inputs_owned; outputs to the end, views as their base,
// symbolic shapes as 0) plus, while a node runs, its workspace (opt.target), and while a slice_loop runs, its
// body's peak (inputs not counted) with the body's planned arena (placed by opt.target) held throughout, as
// the runtime holds it for every slice.
// The slice chooser and memory-schedule compare candidates with it.
int64_t simulate_peak(const Graph& g, const MemoryPlanOptions& opt, bool count_inputs = true);

// The same simulation when the values `plan` places live in arenas: each busy period's arena bytes
// from its first placed value's definition to its last one's last use, every other value as it lives.
// The runtime keeps the arenas only when this is not above simulate_peak(g): an arena must not cost
// more than allocating per op.
int64_t simulate_peak_with_arena(const Graph& g, const MemoryPlan& plan, const MemoryPlanOptions& opt);

}  // namespace hb

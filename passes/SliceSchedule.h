// slice-schedule: BFS or DFS for each hinted region (docs/scheduling.md).
//
//   bfs   op-major over whole tensors: the region is left as it is.
//   dfs   slice-major: the region's sliceable subgraph (slice-legality) becomes ONE loop node that runs
//         the subgraph once per slice on views of slice i; intermediates are per-slice sized and reused
//         by every slice; results are written into full outputs (no concatenation).
//   auto  the chooser simulates the graph's peak memory for every valid slice count (heap simulator
//         over the rewritten order, memory_plan.h) and keeps the fewest slices whose peak fits
//         memory_budget; no count fits -> hb::UserError naming the budget and the smallest peak.
//
// Slice count: `slices` hint, else extent / `slice_size`, else (dfs with memory_budget, or auto) the
// chooser, else (plain dfs) the extent itself: one batch x head slice at a time. 1 slice = BFS.
// Every decision goes into ctx.notes ("slice-schedule region 0: auto chose slices=8 ...").
//
// The loop node it writes, and its contract with the runtime: backend/ir/SliceLoop.h.
#pragma once
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ir/MemoryPlan.h"
#include "backend/ir/SliceLoop.h"
#include "passes/Pipeline.h"
#include "passes/SliceLegality.h"

namespace hb {

// Runs `pass` on the body of every slice_loop node of g (passes that rewrite the per-slice work, as
// the fusion passes do); true when it changed any.
bool for_each_slice_body(Graph& g, const std::function<bool(Graph& body)>& pass);

// Rewrites region R's sliceable subgraph into one slice_loop node with `slices` slices (a valid count,
// R computed on this graph). Returns the loop node's index.
int make_slice_loop(Graph& g, const SliceRegion& R, int64_t slices);

// The chooser's view of one candidate: slice count and the simulated peak of the whole graph.
struct SliceCandidate {
  int64_t slices = 1;
  int64_t peak_bytes = 0;
};
// Simulates every valid slice count of R (ascending), with the heap simulator under `opt` (its target).
std::vector<SliceCandidate> simulate_slice_counts(const Graph& g, const SliceRegion& R, const MemoryPlanOptions& opt);
// The fewest slices whose peak fits `budget`; throws hb::UserError naming the budget and the
// smallest peak when none does. `region` describes the region in the message.
SliceCandidate choose_slice_count(const std::vector<SliceCandidate>& candidates, int64_t budget,
                                  const std::string& region);

bool slice_schedule(Graph& g, PassContext& ctx);

}  // namespace hb

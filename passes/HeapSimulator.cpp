#include "passes/HeapSimulator.h"

#include <algorithm>
#include <set>
#include <vector>

#include "backend/ir/SliceLoop.h"
#include "passes/Lifetimes.h"
#include "passes/MemoryPlan.h"

namespace hb {

namespace {
int64_t sweep_peak(const Graph& g, const MemoryPlanOptions& opt, bool count_inputs, const std::set<ValueRef>* arena,
                   const std::vector<ArenaSegment>& windows);

// A slice_loop body's peak while the loop runs, its inputs (views of the loop's) aside: its values as
// they live, except that those its plan places sit in an arena of the plan's size for the whole loop
// (the runtime allocates the body's arena once and reuses it for every slice; the arena's bytes can
// exceed the live peak, which is all a plain sweep would count).
int64_t slice_body_peak(const Graph& body, const MemoryPlanOptions& opt) {
  const MemoryPlan plan = memory_plan(body, opt);  // what the runtime will place: the rest lives as it lives
  std::set<ValueRef> placed;
  for (const PlannedBuffer& b : plan.buffers) placed.insert(b.values.begin(), b.values.end());
  const int n = static_cast<int>(body.nodes.size());
  if (placed.empty() || n == 0) return sweep_peak(body, opt, false, nullptr, {});
  return sweep_peak(body, opt, false, &placed, {ArenaSegment{0, n - 1, plan.arena_bytes}});
}

// The heap simulator's sweep. Values in `arena` (may be null) are not counted as they live: instead
// each window's bytes (the arenas' busy periods) are live over its nodes.
int64_t sweep_peak(const Graph& g, const MemoryPlanOptions& opt, bool count_inputs, const std::set<ValueRef>* arena,
                   const std::vector<ArenaSegment>& windows) {
  const Lifetimes V = lifetimes(g);
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int64_t> delta(n + 1, 0);
  for (int v = 0; v < static_cast<int>(V.vals.size()); ++v) {
    if (V.root[v] != v || V.bytes[v] <= 0) continue;
    if (arena && arena->count(V.vals[v])) continue;
    const Node& node = g.nodes[V.vals[v].node];
    const bool input = node.op == OpKind::Placeholder || node.op == OpKind::GetAttr;
    if (input && !count_inputs) continue;
    // An input the caller keeps lives for the whole call; one it hands over dies at its last use.
    const bool kept = input && g.caller_keeps(node);
    const int start = input ? 0 : V.vals[v].node;
    const int end = (kept || V.last[v] == Lifetimes::kForever) ? n - 1 : V.last[v];
    // Rounded like the arena's buffers (allocators round too), so the two simulations compare alike.
    const int64_t bytes = (V.bytes[v] + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    delta[start] += bytes;
    delta[end + 1] -= bytes;
  }
  for (const ArenaSegment& w : windows) {
    delta[w.start] += w.bytes;
    delta[w.end + 1] -= w.bytes;
  }
  int64_t live = 0, peak = 0;
  for (int i = 0; i < n; ++i) {
    live += delta[i];
    const Node& node = g.nodes[i];
    int64_t extra = opt.target.workspace_bytes(g, node);
    if (const Graph* body = slice_loop_body(g, node)) extra += slice_body_peak(*body, opt);
    peak = std::max(peak, live + extra);
  }
  return peak;
}
}  // namespace

int64_t simulate_peak(const Graph& g, const MemoryPlanOptions& opt, bool count_inputs) {
  return sweep_peak(g, opt, count_inputs, nullptr, {});
}

int64_t simulate_peak_with_arena(const Graph& g, const MemoryPlan& plan, const MemoryPlanOptions& opt) {
  std::set<ValueRef> placed;
  for (const PlannedBuffer& b : plan.buffers) placed.insert(b.values.begin(), b.values.end());
  if (placed.empty()) return simulate_peak(g, opt);
  return sweep_peak(g, opt, true, &placed, plan.segments);
}

}  // namespace hb

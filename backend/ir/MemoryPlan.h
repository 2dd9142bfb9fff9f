// The memory plan as data: where each intermediate of a graph lives in the arena of its busy period,
// why the others are not placed, and which results go straight into a caller's destination. The
// planner (passes/MemoryPlan.h) computes it once, as the last step of compiling; the runtime
// (backend/runtime/) executes it as given and never re-derives it; the dumps print it (to_string).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/Target.h"

namespace hb {

constexpr int64_t kArenaAlignment = 64;  // bytes; every offset and planned size is a multiple

// A tensor value: node's result (elem -1) or element `elem` of its tuple result.
struct ValueRef {
  int node = -1;
  int elem = -1;
  bool operator==(const ValueRef& o) const { return node == o.node && elem == o.elem; }
  bool operator<(const ValueRef& o) const { return node != o.node ? node < o.node : elem < o.elem; }
};

// One allocation: live over nodes [start, end] of the order (inclusive). values[0] defines it; any
// further values reuse it in place, each written by the node that last read the one before.
struct PlannedBuffer {
  std::vector<ValueRef> values;
  int64_t offset = 0;  // within its period's arena
  int64_t size = 0;    // aligned
  int start = 0;
  int end = 0;
  int segment = 0;     // its busy period (MemoryPlan::segments)
};

// A busy period: nodes [start, end] of the order, during which some planned buffer is live; outside
// all periods no planned value is.
struct ArenaSegment {
  int start = 0;
  int end = 0;
  int64_t bytes = 0;  // this period's arena
};

struct UnplannedValue {
  ValueRef value;
  std::string why;  // "input", "constant", "output", "view of %x", "symbolic shape"
};

// An output the graph returns (directly, or through reshaping views nothing else reads): when the
// caller passes a destination for it (a slice loop passes slice i of its full result), node writes
// there through its out= overload or fused kernel, and the caller copies nothing.
struct OutputWrite {
  int output = -1;  // index among the graph's outputs
  int node = -1;    // the node that writes it
};

struct MemoryPlan {
  std::string graph;
  std::string target;              // the Target whose placement rule planned it
  std::string strategy;            // the allocator that placed it
  std::string device;              // the arenas' device ("" when nothing is placed)
  std::vector<PlannedBuffer> buffers;
  std::vector<UnplannedValue> unplanned;
  std::vector<ArenaSegment> segments;  // in order, disjoint
  int64_t arena_bytes = 0;         // planned peak: the largest period's arena
  int64_t no_reuse_bytes = 0;      // every planned buffer in its own memory (no reuse at all)
  int64_t live_peak_bytes = 0;     // most planned bytes live at once: no allocator can do better
  // Whether calls of this graph use the arena: only when the simulated call peak with it is not above
  // allocating per op (`note` gives both). A slice loop running the graph as its body uses it regardless.
  bool arena_for_calls = true;
  std::string note;
  std::vector<OutputWrite> output_writes;
  std::map<std::string, std::shared_ptr<const MemoryPlan>> bodies;  // slice_loop bodies, by subgraph name

  // The buffer holding a planned value (views are not resolved: they are views of their base), or null.
  const PlannedBuffer* buffer_of(int node, int elem = -1) const;
  // Its offset, -1 if unplanned.
  int64_t offset_of(int node, int elem = -1) const;
};

// The planner's settings: read once at the edge (python/hintbackend/options.py, hb-opt's flags) and
// passed down as values.
struct MemoryPlanOptions {
  std::string strategy;  // "greedy-by-size", "best-fit", or "" = run both and keep the smaller arena
  bool in_place = true;  // an elementwise result may take over a dying input's buffer
  bool arena = true;     // false: nothing is placed, every op allocates its own result
  Target target;         // what the runtime can place, and the nodes' workspaces
};

// "1.25 GiB" style.
std::string format_bytes(int64_t bytes);

// For the dump:
//   memory-plan graph forward: arena 8448 bytes (8.25 KiB) by best-fit on cuda:0, no reuse 16640, live peak 8448, 5 buffers
//     %mm: offset 0 size 4096 live [3, 5]
//     %exp: offset 4096 size 4096 live [4, 6] then %relu in place
//     unplanned: %x (input), %view (view of %mm), %out (output)
std::string to_string(const MemoryPlan& p, const Graph& g);

}  // namespace hb

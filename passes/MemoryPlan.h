// memory-plan (analysis): offsets for the graph's intermediates in ONE arena per graph call.
//
//   1. lifetimes   over the final order; a view (and getitem, an in-place op's result, and
//                  aten::_unsafe_view, a view its schema does not declare) is not a buffer: it extends
//                  its base's life. Each tuple element is its own buffer.
//   2. unplanned   graph inputs, constants, anything the graph returns or that a returned value aliases,
//                  symbolic shapes, non-tensors, and what MemoryPlanOptions::unplaceable rejects.
//   3. in-place    an elementwise op may write into an input's buffer when that input dies at this op,
//                  has the same shape and dtype, and the op reads no other view of it.
//   4. periods     busy periods: maximal spans of the order during which some buffer is live. Each is
//                  placed on its own from offset 0, since periods never overlap in time.
//   5. placement   an ArenaAllocator strategy (greedy-by-size as TFLite's arena planner, best-fit
//                  over alloc/free events as XLA's heap simulator); the plan keeps the strategy whose
//                  largest period is smallest. arena_bytes is that largest period.
//
// The runtime allocates one arena per busy period of a call (most graphs have one), at the period's
// first placed value, and drops it after the period's last use, so memory no value needs is never
// held while unplaced ops (and their hidden workspaces) run between periods. A slice_loop body runs
// every period of every slice in one arena of arena_bytes. Each planned value is a view at its offset
// (plan.offset_of(node, elem)); unplanned values are allocated as usual. The plan is a pure function
// of the final graph and the options: the pass prints memory_plan(g) (every value placeable); the
// runtime computes memory_plan(g, {unplaceable = what it cannot place}) and dumps that one as
// "memory-plan-runtime". slice_loop bodies get their own plans (bodies), reused by every slice.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "passes/Pipeline.h"

namespace hb {

constexpr int64_t kArenaAlignment = 64;  // bytes; every offset and planned size is a multiple

// A tensor value: node's result (elem -1) or element `elem` of its tuple result.
struct ValueRef {
  int node = -1;
  int elem = -1;
  bool operator==(const ValueRef& o) const { return node == o.node && elem == o.elem; }
  bool operator<(const ValueRef& o) const { return node != o.node ? node < o.node : elem < o.elem; }
};

// Lifetimes over the graph's order (memory-plan's step 1, the heap simulator's input): every tensor
// value (each tuple element separately), the alias root whose storage it lives in (a view, a getitem,
// a mutating op's result and aten::_unsafe_view are not storage of their own), its bytes, the values
// each node reads, and per root the last node reading it or any alias. Roots, bytes and reads do not
// depend on the order (memory-schedule costs its candidate orders with them); `last` does.
struct Lifetimes {
  static constexpr int kForever = std::numeric_limits<int>::max();  // last: the graph returns it
  std::vector<ValueRef> vals;
  std::map<ValueRef, int> id;           // value -> index into vals
  std::vector<int> root;                // per value: index of its alias root
  std::vector<int64_t> bytes;           // per value, unaligned; -1: symbolic shape
  std::vector<int> last;                // per root: last node reading it or any alias; kForever when returned
  std::vector<const TensorType*> type;  // per value, into the graph
  std::vector<std::vector<int>> reads;  // per node: the values it reads (a getitem: only its element)

  int find(int node, int elem) const;  // index of a value, -1 if none
};
Lifetimes lifetimes(const Graph& g);

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

struct MemoryPlan {
  std::string graph;
  std::string strategy;            // the allocator that placed it
  std::vector<PlannedBuffer> buffers;
  std::vector<UnplannedValue> unplanned;
  std::vector<ArenaSegment> segments;  // in order, disjoint
  int64_t arena_bytes = 0;         // planned peak: the largest period's arena
  int64_t no_reuse_bytes = 0;      // every planned buffer in its own memory (no reuse at all)
  int64_t live_peak_bytes = 0;     // most planned bytes live at once: no allocator can do better
  std::map<std::string, std::shared_ptr<MemoryPlan>> bodies;  // slice_loop bodies, by subgraph name

  // Offset of a planned value (views are not resolved: they are views of their base), -1 if unplanned.
  int64_t offset_of(int node, int elem = -1) const;
};

// ---- allocation strategies --------------------------------------------------------------------
struct BufferRequest {
  int64_t size = 0;  // aligned
  int start = 0, end = 0;
};
class ArenaAllocator {
 public:
  virtual ~ArenaAllocator() = default;
  virtual const char* name() const = 0;
  // An offset per request such that requests live at the same time never overlap.
  virtual std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const = 0;
};
// Largest first, each into the smallest gap among the time-overlapping buffers placed so far.
class GreedyBySizeAllocator : public ArenaAllocator {
 public:
  const char* name() const override { return "greedy-by-size"; }
  std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const override;
};
// In execution order: frees return their chunk (coalesced), allocations take the smallest free chunk
// that fits, else grow the top.
class BestFitAllocator : public ArenaAllocator {
 public:
  const char* name() const override { return "best-fit"; }
  std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const override;
};

struct MemoryPlanOptions {
  // "greedy-by-size", "best-fit", or "" = run both and keep the smaller arena (ties: greedy-by-size).
  // The environment variable HINTBACKEND_MEMORY_PLAN_STRATEGY, when set, overrides it.
  std::string strategy;
  bool in_place = true;  // HINTBACKEND_MEMORY_PLAN_IN_PLACE=0 turns in-place reuse off
  // Which values the runtime can write into the arena: called per node that would get a buffer,
  // returns "" when it can, else why not (then the value is unplanned with that reason). Null: every
  // value can. The runtime (backend/runtime/Executor.cpp) passes "an ATen op it can call through an
  // out= overload", so the plan it computes has exactly the buffers it places.
  std::function<std::string(const Graph& g, int node)> unplaceable;
  // Also plan slice_loop bodies (into MemoryPlan::bodies, with these same options). The runtime turns
  // it off: each body's executor computes its own plan.
  bool bodies = true;
};

MemoryPlan memory_plan(const Graph& g, const MemoryPlanOptions& opt = {});

// The placement model of the runtime that will run the graphs: why it cannot put node's result in its
// arena ("" = it can; the signature of MemoryPlanOptions::unplaceable). The runtime registers its own
// when it is loaded (backend/runtime/Executor.cpp: ATen ops with an out= kernel of their own for the
// device, fused groups); without one (hb-opt, the core tests) every value counts as placeable. The
// simulator plans slice-loop bodies with it, so the chooser sees the arena the body will really have.
void set_runtime_placement(std::function<std::string(const Graph& g, int node)> unplaceable);
const std::function<std::string(const Graph& g, int node)>& runtime_placement();

// The ops whose result may take over a dying input's buffer (step 3): elementwise ops and the row
// softmax ops. The runtime checks its in-place placements against it.
bool may_write_over_input(const Node& n);
// Ops whose result aliases their first argument although their schema does not say so
// (aten::_unsafe_view): lifetimes treat them as views.
bool aliases_without_annotation(const Node& n);
// Per node, the node whose storage its value lives in: a getitem, a view, a mutating op's result and
// _unsafe_view alias their first argument. Per node rather than per tuple element: coarser than
// lifetimes(), which is what a safety rule wants (memory-schedule's mutation order, row-softmax-fusion's
// in-place merge).
std::vector<int> storage_nodes(const Graph& g);

// The memory a node allocates and frees while it runs, beyond its results: hintbackend's FlexAttention
// reference (backend/runtime/FlexAttention.h) materializes float32 [B, H, Sq, Skv] scores and their
// derivatives. Per score, as measured on the H200 (benchmarks/slicing.py --region flex, B4 H16 S4096:
// BFS forward 13312 MB, forward+backward 28868 MB, for 2^30 scores): kFlexForwardWorkspace and
// kFlexBackwardWorkspace bytes. 0 for every other node (library workspaces, cuDNN's, are not modelled).
constexpr int64_t kFlexForwardWorkspace = 13;
constexpr int64_t kFlexBackwardWorkspace = 28;
int64_t hidden_workspace_bytes(const Graph& g, const Node& n);

// Heap simulator: the most bytes live at once over the graph's order, counting everything (inputs for
// the whole call, or until their last use when g.inputs_owned; outputs to the end, views as their base,
// symbolic shapes as 0) plus, while a node runs, its hidden workspace, and while a slice_loop runs, its
// body's peak (inputs not counted) with the body's planned arena held throughout, as the runtime holds
// it for every slice.
// The slice chooser and memory-schedule compare candidates with it.
int64_t simulate_peak(const Graph& g, bool count_inputs = true);

// The same simulation when the values `plan` places live in arenas: each busy period's arena bytes
// from its first placed value's definition to its last one's last use, every other value as it lives.
// The runtime keeps the arenas only when this is not above simulate_peak(g): an arena must not cost
// more than allocating per op.
int64_t simulate_peak_with_arena(const Graph& g, const MemoryPlan& plan);

// "1.25 GiB" style.
std::string format_bytes(int64_t bytes);

// For the dump:
//   memory-plan graph forward: arena 8448 bytes (8.25 KiB) by best-fit, no reuse 16640, live peak 8448, 5 buffers
//     %mm: offset 0 size 4096 live [3, 5]
//     %exp: offset 4096 size 4096 live [4, 6] reuses %sub in place
//     unplanned: %x (input), %view (view of %mm), %out (output)
std::string to_string(const MemoryPlan& p, const Graph& g);

// Pass entry: records the plan (and the bodies') in ctx.notes; never changes the graph.
bool memory_plan_pass(Graph& g, PassContext& ctx);

}  // namespace hb

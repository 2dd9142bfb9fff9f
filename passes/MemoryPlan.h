// memory-plan (analysis): offsets for the graph's intermediates in ONE arena per graph call.
//
//   1. lifetimes   over the final order; a view (and getitem, an in-place op's result, and
//                  aten::_unsafe_view, a view its schema does not declare) is not a buffer: it extends
//                  its base's life. Each tuple element is its own buffer.
//   2. unplanned   graph inputs, constants, anything the graph returns or that a returned value aliases,
//                  symbolic shapes, non-tensors, and what the target cannot place (opt.target); the
//                  arena lives on one device, the one with the most placeable bytes.
//   3. in-place    an elementwise op may write into an input's buffer when that input dies at this op,
//                  has the same shape and dtype (or is read through a view with the same elements in
//                  the same row-major order as the buffer and the result: a reshape), and the op reads
//                  no other view of it.
//   4. periods     busy periods: maximal spans of the order during which some buffer is live. Each is
//                  placed on its own from offset 0, since periods never overlap in time.
//   5. placement   an ArenaAllocator strategy (greedy-by-size as TFLite's arena planner, best-fit
//                  over alloc/free events as XLA's heap simulator); the plan keeps the strategy whose
//                  largest period is smallest. arena_bytes is that largest period.
//   6. calls       whether calls use the arena: only when the simulated call peak with it is not above
//                  allocating per op (passes/HeapSimulator.h).
//   7. outputs     which returned values can be written straight into a caller's destination.
//
// The runtime (backend/runtime/Executor.h) allocates one arena per busy period of a call (most graphs
// have one), at the period's first placed value, and drops it after the period's last use, so memory
// no value needs is never held while unplaced ops (and their workspaces) run between periods. A
// slice_loop body runs every period of every slice in one arena of arena_bytes. The plan is a pure
// function of the final graph and the options (target included), computed once when the graph is
// compiled (the pipeline's last step) and run as given; slice_loop bodies get their own plans
// (MemoryPlan::bodies), reused by every slice. The data types are the IR's (backend/ir/MemoryPlan.h).
#pragma once
#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"
#include "passes/Pipeline.h"

namespace hb {

MemoryPlan memory_plan(const Graph& g, const MemoryPlanOptions& opt);

// Pass entry: plans g with ctx.memory (the compiled program's plan: ctx.memory_plan) and records it in
// ctx.notes; never changes the graph.
bool memory_plan_pass(Graph& g, PassContext& ctx);

}  // namespace hb

// memory-schedule: reorders the graph's top-level nodes to lower its simulated peak memory. XLA's
// hlo-memory-scheduler is the model: several strategies, one simulator, keep the best.
//
//   original  the order the graph came in (FX's)
//   list      a list scheduler: among the nodes whose inputs have run, zero-byte ones (views, getitem,
//             sym ops) first, else the one with the most (bytes it frees) - (bytes it allocates);
//             ties by original position
//   dfs       a post-order from the output: a node's inputs, heaviest subtree first, then the node
//
// The heap simulator (simulate_peak, passes/HeapSimulator.h; it honours Graph::inputs_owned) replays each
// order and the lowest peak wins; the original wins ties and any gain under 1/64 of its peak, so the
// pass changes nothing unless it clearly helps (a new order also moves what the simulator cannot see:
// which kernels run back to back, when hidden workspaces are taken).
// Every order keeps:
//   - data dependencies (args, kwargs, nested lists);
//   - placeholders first in their original order, then get_attr constants, the output node last;
//   - effectful nodes (mutation, random draws, and ops whose effects no schema describes: python::
//     targets, higher-order ops other than FlexAttention) in their original relative order;
//   - a node that reads storage a mutating op writes (through any view or alias) on the side of that op
//     it was on: the mutated storage is, conservatively, that of every argument of the op.
// Getitems stay right after their tuple's producer (the executor holds a tuple until its last getitem).
// Subgraph bodies (slice_loop, fused_pointwise) are not reordered. The note gives each strategy's peak:
//
//   memory-schedule graph backward_1: list order, simulated peak 86.1 MiB -> 80.1 MiB (original, list, dfs:
//   90267648, 83976192, 83976192 bytes)
#pragma once
#include <vector>

#include "passes/Pipeline.h"

namespace hb {

// What every order must respect, per node: the nodes that must run before it (data, effect chain,
// mutation order; not the placeholder/output placement, which the strategies handle).
std::vector<std::vector<int>> schedule_dependencies(const Graph& g);

// The strategies' orders: order[k] is the old index of the node at position k (for reorder_nodes).
std::vector<int> list_schedule(const Graph& g);
std::vector<int> dfs_schedule(const Graph& g);

bool memory_schedule(Graph& g, PassContext& ctx);

}  // namespace hb

// What the IR knows about ops that alias or overwrite memory beyond what their schema's effects say:
// shared by the planner (passes/MemoryPlan.h), the passes that must respect storage
// (memory-schedule, row-softmax-fusion) and the runtime's checks of in-place placements.
#pragma once
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

// The ops whose result may take over a dying input's buffer (the planner's in-place step): elementwise
// ops and the row softmax ops. The runtime checks its in-place placements against it.
bool may_write_over_input(const Node& n);
// Ops whose result aliases their first argument although their schema does not say so
// (aten::_unsafe_view): lifetimes treat them as views.
bool aliases_without_annotation(const Node& n);
// Per node, the node whose storage its value lives in: a getitem, a view, a mutating op's result and
// _unsafe_view alias their first argument. Per node rather than per tuple element: coarser than
// lifetimes(), which is what a safety rule wants (memory-schedule's mutation order, row-softmax-fusion's
// in-place merge).
std::vector<int> storage_nodes(const Graph& g);

}  // namespace hb

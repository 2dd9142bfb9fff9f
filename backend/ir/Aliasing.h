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

// hintbackend::batch_norm_in_place (write-inputs-in-place; backend/runtime/BatchNormInPlace.h): training
// BatchNorm that updates the running statistics, its arguments 3 and 4, in place, and returns them as
// tuple elements 3 and 4 (output, mean, invstd, running_mean, running_var), as
// aten::_native_batch_norm_legit_functional returns their new values.
inline constexpr const char* kBatchNormInPlaceTarget = "hintbackend::batch_norm_in_place.default";
// For a node that aliases an argument (a view, a mutating op, _unsafe_view; not getitem): the argument
// whose storage element `elem` of its result (-1: the result itself) lives in, or -1 where that element
// is fresh memory. Its first argument, but for batch_norm_in_place (elements 3 and 4: arguments 3 and 4;
// elements 0 to 2 are fresh).
int aliased_argument(const Node& n, int elem);
// Per node, the node whose storage its value lives in: a getitem, a view, a mutating op's result and
// _unsafe_view alias their first argument. Per node rather than per tuple element: coarser than
// lifetimes(), which is what a safety rule wants (memory-schedule's mutation order, row-softmax-fusion's
// in-place merge). (batch_norm_in_place's result counts as its first argument's: coarse, and safe for
// those rules.)
std::vector<int> storage_nodes(const Graph& g);

}  // namespace hb

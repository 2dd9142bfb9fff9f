// Small editing helpers shared by passes: they keep Arg::ref indices consistent.
#pragma once
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

// Drops every node i with keep[i] == false and renumbers references. The caller guarantees no kept
// node uses a dropped one (checked: an internal error otherwise). Returns the number removed.
int remove_nodes(Graph& g, const std::vector<bool>& keep);

// Inserts `n` before position `pos` and renumbers references; returns the new node's index.
int insert_node(Graph& g, int pos, Node n);

}  // namespace hb

// Small editing helpers shared by passes: they keep Arg::ref indices consistent.
#pragma once
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

// Drops every node i with keep[i] == false and renumbers references. The caller guarantees no kept
// node uses a dropped one (checked: an internal error otherwise). Returns the number removed.
int remove_nodes(Graph& g, const std::vector<bool>& keep);

// Points every reference to node i at node becomes[i] instead (a node a pass folded into another), the
// references' names too. becomes[i] == i leaves them.
void redirect_uses(Graph& g, const std::vector<int>& becomes);

// `base`, or `base_1`, `base_2` ...: a name no node and no subgraph of g has yet.
std::string unique_name(const Graph& g, const std::string& base);

// Appends the output node returning `value` (a ref, or a tuple of refs), named "output" unless a node
// has that name already (then "output_", ...). For passes that build subgraphs.
void add_output(Graph& g, Arg value);

// Inserts `n` before position `pos` and renumbers references; returns the new node's index.
int insert_node(Graph& g, int pos, Node n);

// Puts the nodes in a new order: order[k] is the old index of the node that goes to position k (a
// permutation of 0..n-1). Renumbers references; every one must still point to an earlier node
// (checked: an internal error otherwise, naming the node).
void reorder_nodes(Graph& g, const std::vector<int>& order);

}  // namespace hb

namespace hb {

// Keeps a node that a pass creates or substitutes in the hinted_context region of the node it
// comes from: copies hints and the custom metadata when `n` has none of its own, and the source
// location when `n` has none. Passes that rewrite nodes call this so hints survive them.
void inherit_hints(Node& n, const Node& from);

// insert_node(g, pos, n) after inherit_hints(n, g.nodes[like]): for a node that stands in for, or
// is derived from, node `like` (an index before the insertion).
int insert_node_like(Graph& g, int pos, Node n, int like);

}  // namespace hb

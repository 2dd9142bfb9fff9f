#include "backend/ir/GraphEdit.h"

#include "backend/ir/Error.h"

namespace hb {

namespace {
void renumber(Graph& g, const std::vector<int>& new_index) {
  for (Node& n : g.nodes) {
    auto fix = [&](Arg& a) {
      HB_INTERNAL_CHECK(new_index[a.ref] >= 0) << "node %" << n.name << " uses removed node %" << a.s;
      a.ref = new_index[a.ref];
    };
    for (Arg& a : n.args) a.for_each_ref_mut(fix);
    for (auto& kv : n.kwargs) kv.second.for_each_ref_mut(fix);
  }
}
}  // namespace

void redirect_uses(Graph& g, const std::vector<int>& becomes) {
  for (Node& m : g.nodes) {
    auto rewire = [&](Arg& a) {
      if (becomes[a.ref] == a.ref) return;
      a.ref = becomes[a.ref];
      a.s = g.nodes[a.ref].name;
    };
    for (Arg& a : m.args) a.for_each_ref_mut(rewire);
    for (auto& kv : m.kwargs) kv.second.for_each_ref_mut(rewire);
  }
}

int remove_nodes(Graph& g, const std::vector<bool>& keep) {
  HB_INTERNAL_CHECK(keep.size() == g.nodes.size()) << "remove_nodes: mask size mismatch";
  std::vector<int> new_index(g.nodes.size(), -1);
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!keep[i]) continue;
    new_index[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(g.nodes[i]));
  }
  const int removed = static_cast<int>(g.nodes.size() - kept.size());
  g.nodes = std::move(kept);
  renumber(g, new_index);
  return removed;
}

void add_output(Graph& g, Arg value) {
  Node ret;
  ret.op = OpKind::Output;
  ret.name = "output";
  while (g.find(ret.name) >= 0) ret.name += "_";
  ret.args.push_back(std::move(value));
  g.nodes.push_back(std::move(ret));
}

int insert_node(Graph& g, int pos, Node n) {
  HB_INTERNAL_CHECK(pos >= 0 && pos <= static_cast<int>(g.nodes.size())) << "insert_node: bad position";
  std::vector<int> new_index(g.nodes.size());
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) new_index[i] = i < pos ? i : i + 1;
  renumber(g, new_index);
  g.nodes.insert(g.nodes.begin() + pos, std::move(n));
  return pos;
}

void reorder_nodes(Graph& g, const std::vector<int>& order) {
  const int n = static_cast<int>(g.nodes.size());
  HB_INTERNAL_CHECK(static_cast<int>(order.size()) == n) << "reorder_nodes: order has " << order.size()
                                                         << " entries for " << n << " nodes";
  std::vector<int> new_index(n, -1);
  for (int k = 0; k < n; ++k) {
    HB_INTERNAL_CHECK(order[k] >= 0 && order[k] < n && new_index[order[k]] < 0)
        << "reorder_nodes: order is not a permutation (entry " << k << ": " << order[k] << ")";
    new_index[order[k]] = k;
  }
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (int old : order) nodes.push_back(std::move(g.nodes[old]));
  g.nodes = std::move(nodes);
  renumber(g, new_index);
  for (int k = 0; k < n; ++k)
    g.nodes[k].for_each_input([&](const Arg& a) {
      HB_INTERNAL_CHECK(a.ref < k) << "reorder_nodes: %" << g.nodes[k].name << " now runs before its input %" << a.s;
    });
}

}  // namespace hb

namespace hb {

void inherit_hints(Node& n, const Node& from) {
  if (n.hints.empty()) {
    n.hints = from.hints;
    if (n.custom_json.empty()) n.custom_json = from.custom_json;
  }
  if (n.source.empty()) n.source = from.source;
}

int insert_node_like(Graph& g, int pos, Node n, int like) {
  HB_INTERNAL_CHECK(like >= 0 && like < static_cast<int>(g.nodes.size())) << "insert_node_like: bad node " << like;
  inherit_hints(n, g.nodes[like]);
  return insert_node(g, pos, std::move(n));
}

std::string unique_name(const Graph& g, const std::string& base) {
  std::string name = base;
  for (int k = 1; g.find(name) >= 0 || g.subgraphs.count(name); ++k) name = base + "_" + std::to_string(k);
  return name;
}

}  // namespace hb

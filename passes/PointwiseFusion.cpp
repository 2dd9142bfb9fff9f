#include "passes/PointwiseFusion.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/ir/GraphEdit.h"
#include "codegen/PointwiseProgram.h"
#include "passes/SliceSchedule.h"

namespace hb {
namespace {

// Members of each group (ascending node indices; the last is the root).
std::vector<std::vector<int>> find_groups(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<bool> fusable(n);
  for (int i = 0; i < n; ++i) fusable[i] = is_fusable_pointwise(g, i);
  const std::vector<std::vector<int>> users = g.users();
  std::vector<bool> grouped(n, false);
  std::vector<std::vector<int>> groups;
  for (int root = n - 1; root >= 0; --root) {
    if (!fusable[root] || grouped[root]) continue;
    std::set<int> members = {root};
    // Producers are decided from the latest down: all their users come later, so by the time a
    // producer is considered every user that could join already has.
    std::set<int, std::greater<int>> candidates;
    auto add_producers = [&](int m) {
      g.nodes[m].for_each_input([&](const Arg& a) { candidates.insert(a.ref); });
    };
    add_producers(root);
    while (!candidates.empty() && static_cast<int>(members.size()) < kMaxFusedOps) {
      const int p = *candidates.begin();
      candidates.erase(candidates.begin());
      if (!fusable[p] || grouped[p] || members.count(p)) continue;
      if (g.nodes[p].hints.region != g.nodes[root].hints.region) continue;
      if (g.nodes[p].type.tensor.dtype != g.nodes[root].type.tensor.dtype) continue;
      bool all_inside = true;
      for (int u : users[p]) all_inside &= members.count(u) > 0;
      if (!all_inside) continue;
      members.insert(p);
      add_producers(p);
    }
    if (members.size() < 2) continue;
    for (int m : members) grouped[m] = true;
    groups.emplace_back(members.begin(), members.end());
  }
  return groups;
}

// The fused node standing in for group `members` (its root is members.back()); adds the body to g.
Node make_fused(Graph& g, const std::vector<int>& members) {
  const int root = members.back();
  const std::set<int> inside(members.begin(), members.end());
  auto body = std::make_shared<Graph>();
  body->name = unique_name(g, "fused_" + g.nodes[root].name);
  std::map<int, int> body_index;
  Arg inputs;
  inputs.kind = Arg::Kind::List;
  for (int m : members) {
    g.nodes[m].for_each_input([&](const Arg& a) {
      if (inside.count(a.ref) || body_index.count(a.ref)) return;
      Node p;
      p.op = OpKind::Placeholder;
      p.name = g.nodes[a.ref].name;
      p.type = g.nodes[a.ref].type;
      body_index[a.ref] = static_cast<int>(body->nodes.size());
      body->nodes.push_back(std::move(p));
      inputs.items.push_back(Arg::of_ref(a.ref, g.nodes[a.ref].name));
    });
  }
  for (int m : members) {
    Node b = g.nodes[m];
    auto remap = [&](Arg& a) { a.ref = body_index.at(a.ref); };
    for (Arg& a : b.args) a.for_each_ref_mut(remap);
    for (auto& kv : b.kwargs) kv.second.for_each_ref_mut(remap);
    body_index[m] = static_cast<int>(body->nodes.size());
    body->nodes.push_back(std::move(b));
  }
  add_output(*body, Arg::of_ref(body_index.at(root), g.nodes[root].name));
  g.subgraphs[body->name] = body;

  Node fused;
  fused.name = g.nodes[root].name;
  fused.op = OpKind::CallFunction;
  fused.target = kFusedPointwiseTarget;
  fused.type = g.nodes[root].type;
  Arg graph_arg;
  graph_arg.kind = Arg::Kind::Graph;
  graph_arg.s = body->name;
  fused.args = {graph_arg, inputs};
  inherit_hints(fused, g.nodes[root]);
  return fused;
}

bool fuse_graph(Graph& g, PassContext& ctx) {
  // slice_loop bodies first: their ops are the per-slice work.
  bool changed = for_each_slice_body(g, [&](Graph& body) { return fuse_graph(body, ctx); });
  const std::vector<std::vector<int>> groups = find_groups(g);
  if (groups.empty()) return changed;
  std::vector<bool> keep(g.nodes.size(), true);
  for (const std::vector<int>& members : groups) {
    std::ostringstream note;
    note << "pointwise-fusion: graph " << g.name << ": %" << g.nodes[members.back()].name << " fuses "
         << members.size() << " ops:";
    for (int m : members) note << " %" << g.nodes[m].name;
    ctx.notes.push_back(note.str());
    Node fused = make_fused(g, members);
    for (int m : members) keep[m] = false;
    keep[members.back()] = true;
    g.nodes[members.back()] = std::move(fused);
  }
  remove_nodes(g, keep);
  return true;
}

}  // namespace

bool pointwise_fusion(Graph& g, PassContext& ctx) { return fuse_graph(g, ctx); }

}  // namespace hb

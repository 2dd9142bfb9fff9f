#include "passes/HintPropagation.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/ir/GraphEdit.h"
#include "backend/ir/Printer.h"

namespace hb {

namespace {

std::string region_name(const Hints& h) {
  std::ostringstream os;
  os << "region " << h.region << " (path ";
  for (size_t i = 0; i < h.path.size(); ++i) os << (i ? "/" : "") << h.path[i];
  os << ")";
  return os.str();
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << "]";
  return os.str();
}

std::string dim_str(const Dim& d) { return d.is_static() ? std::to_string(d.value) : d.symbol; }
bool same_dim(const Dim& a, const Dim& b) { return a.is_static() == b.is_static() && a.value == b.value && a.symbol == b.symbol; }
bool is_one(const Dim& d) { return d.is_static() && d.value == 1; }

// Fill: a getitem of a hinted tuple-producing node takes its producer's hints.
bool fill_getitems(Graph& g) {
  bool changed = false;
  for (Node& n : g.nodes) {
    if (n.op != OpKind::CallFunction || n.target != "operator::getitem" || !n.hints.empty()) continue;
    if (n.args.empty() || n.args[0].kind != Arg::Kind::Ref) continue;
    const Node& producer = g.nodes[n.args[0].ref];
    if (producer.hints.empty()) continue;
    inherit_hints(n, producer);
    changed = true;
  }
  return changed;
}

// The region's path ends in its id and its hints agree on every node of the region.
void check_consistency(const Graph& g, const std::map<int, std::vector<int>>& regions) {
  for (const auto& [region, members] : regions) {
    const int first = members.front();
    const Hints& h = g.nodes[first].hints;
    HB_USER_CHECK(!h.path.empty() && h.path.back() == region)
        << region_name(h) << " on " << describe(g, first) << ": the path must end in the region's own id "
        << region << ". The hints were not written by hinted_context; check the graph document.";
    for (int i : members) {
      HB_USER_CHECK(g.nodes[i].hints == h)
          << "conflicting hints for region " << region << ": " << describe(g, first) << " has {"
          << to_string(h) << "} but " << describe(g, i) << " has {" << to_string(g.nodes[i].hints)
          << "}. Every node of a region carries the same merged hints; a pass that rewrote one of them "
             "should copy the hints with inherit_hints (backend/ir/GraphEdit.h).";
    }
  }
}

// slice_dims exist on, and agree across, the tensors entering and leaving the region.
void check_slice_dims(const Graph& g, const std::map<int, std::vector<int>>& regions,
                      const std::vector<std::vector<int>>& users) {
  for (const auto& entry : regions) {
    const int region = entry.first;  // a plain variable: lambdas below capture it (clang 14 cannot capture a binding)
    const std::vector<int>& members = entry.second;
    const Hints& h = g.nodes[members.front()].hints;
    if (h.slice_dims.empty()) continue;
    int64_t max_dim = 0;
    for (int64_t d : h.slice_dims) max_dim = std::max(max_dim, d);
    // Results: tensors made in the region that a node outside it (or the output) uses.
    std::vector<int> results;
    for (int i : members) {
      if (g.nodes[i].type.kind != ValueType::Kind::Tensor) continue;
      for (int u : users[i])
        if (g.nodes[u].hints.region != region) {
          results.push_back(i);
          break;
        }
    }
    if (results.empty()) continue;
    // Inputs: tensors made outside the region that a node of the region uses.
    std::vector<int> inputs;
    std::vector<bool> seen(g.nodes.size(), false);
    for (int i : members)
      g.nodes[i].for_each_input([&](const Arg& a) {
        const Node& src = g.nodes[a.ref];
        if (seen[a.ref] || src.hints.region == region || src.type.kind != ValueType::Kind::Tensor) return;
        seen[a.ref] = true;
        inputs.push_back(a.ref);
      });
    // The sliced values are the highest-rank results. A lower-rank result is one shared by all slices:
    // in a backward graph, the gradient of a weight or of a captured buffer (FlexAttention's learned
    // bias), summed over the slices; a lower-rank input is a weight or a bias. Neither is checked:
    // slice-legality decides what such a value means for the slicing.
    size_t max_rank = 0;
    for (int r : results) max_rank = std::max(max_rank, g.nodes[r].type.tensor.shape.size());
    int ref = -1;
    for (int r : results)
      if (g.nodes[r].type.tensor.shape.size() == max_rank) { ref = r; break; }
    const auto& ref_shape = g.nodes[ref].type.tensor.shape;
    auto check = [&](int i, bool is_input) {
      const TensorType& t = g.nodes[i].type.tensor;
      if (t.shape.size() < max_rank) return;  // shared by all slices
      HB_USER_CHECK(static_cast<int64_t>(t.shape.size()) > max_dim)
          << region_name(h) << ": slice_dims=" << dims_str(h.slice_dims) << " but " << describe(g, i)
          << ", a tensor " << (is_input ? "entering" : "leaving") << " the region, is " << to_string(t)
          << " and has no dim " << max_dim
          << ". Slice dims are leading dims every tensor entering or leaving the region has; use fewer "
             "slice_dims or narrow the region.";
      for (int64_t d : h.slice_dims) {
        if (i == ref || same_dim(t.shape[d], ref_shape[d]) || (is_input && is_one(t.shape[d]))) continue;
        HB_USER_FAIL() << region_name(h) << ": slice dim " << d << " has size " << dim_str(ref_shape[d])
                       << " on " << describe(g, ref) << " but " << dim_str(t.shape[d]) << " on "
                       << describe(g, i) << " (" << to_string(t)
                       << "). Every tensor entering or leaving a sliced region must agree on the slice dims "
                          "(size 1 broadcasts on inputs); change slice_dims or narrow the region.";
      }
    };
    for (int r : results) check(r, false);
    for (int i : inputs) check(i, true);
  }
}

}  // namespace

bool hint_propagation(Graph& g, PassContext& ctx) {
  const bool changed = fill_getitems(g);
  std::map<int, std::vector<int>> regions;  // region id -> its nodes, in graph order
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    if (!g.nodes[i].hints.empty()) regions[g.nodes[i].hints.region].push_back(i);
  if (regions.empty()) return changed;
  check_consistency(g, regions);
  check_slice_dims(g, regions, g.users());
  ctx.notes.push_back("hint-propagation: " + std::to_string(regions.size()) + " region(s) in graph '" + g.name + "'");
  return changed;
}

}  // namespace hb

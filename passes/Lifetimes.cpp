#include "passes/Lifetimes.h"

#include <algorithm>

#include "backend/ir/Aliasing.h"

namespace hb {

int Lifetimes::find(int node, int elem) const {
  auto it = id.find({node, elem});
  return it == id.end() ? -1 : it->second;
}

Lifetimes lifetimes(const Graph& g) {
  Lifetimes V;
  const int n = static_cast<int>(g.nodes.size());
  auto add = [&](int node, int elem, const TensorType& t) {
    const int k = static_cast<int>(V.vals.size());
    V.vals.push_back({node, elem});
    V.id[{node, elem}] = k;
    V.root.push_back(k);
    auto numel = t.numel();
    V.bytes.push_back(numel ? *numel * dtype_bytes(t.dtype) : -1);
    V.last.push_back(node);
    V.type.push_back(&t);
  };
  // Values and their roots, in order (a view's base is always defined before it).
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    const ValueType& t = node.type;
    const size_t first = V.vals.size();
    if (t.kind == ValueType::Kind::Tensor) add(i, -1, t.tensor);
    if (t.kind == ValueType::Kind::Tuple)
      for (size_t e = 0; e < t.elems.size(); ++e)
        if (t.elems[e].kind == ValueType::Kind::Tensor) add(i, static_cast<int>(e), t.elems[e].tensor);
    if (first == V.vals.size() || node.op != OpKind::CallFunction) continue;
    int base = -1;
    if (node.target == "operator::getitem" && !node.args.empty() && node.args[0].kind == Arg::Kind::Ref) {
      const int k = node.args.size() > 1 ? static_cast<int>(node.args[1].i) : 0;
      base = V.find(node.args[0].ref, k);
      if (base < 0) base = V.find(node.args[0].ref, -1);
    } else if (node.effects.is_view || node.effects.mutates || aliases_without_annotation(node)) {
      // (per element: batch_norm_in_place returns fresh tensors beside its running statistics)
      for (size_t v = first; v < V.vals.size(); ++v) {
        const int arg = aliased_argument(node, V.vals[v].elem);
        if (arg < 0 || arg >= static_cast<int>(node.args.size()) || node.args[arg].kind != Arg::Kind::Ref) continue;
        const int b = V.find(node.args[arg].ref, -1);
        if (b >= 0) V.root[v] = V.root[b];
      }
      continue;
    }
    if (base >= 0)
      for (size_t v = first; v < V.vals.size(); ++v) V.root[v] = V.root[base];
  }
  // Reads: each use extends the root's life; the output node makes it live forever.
  const int out = g.output_node();
  V.reads.assign(n, {});
  auto read = [&](int v, int j) {
    int& l = V.last[V.root[v]];
    l = (j == out) ? Lifetimes::kForever : std::max(l, j);
    if (std::find(V.reads[j].begin(), V.reads[j].end(), v) == V.reads[j].end()) V.reads[j].push_back(v);
  };
  for (int j = 0; j < n; ++j) {
    const Node& node = g.nodes[j];
    if (node.target == "operator::getitem" && j != out && node.args.size() > 1) {  // reads its element only
      const int v = V.find(node.args[0].ref, static_cast<int>(node.args[1].i));
      if (v >= 0) {
        read(v, j);
        continue;
      }
    }
    node.for_each_input([&](const Arg& a) {
      auto it = V.id.lower_bound({a.ref, std::numeric_limits<int>::min()});
      for (; it != V.id.end() && it->first.node == a.ref; ++it) read(it->second, j);
    });
  }
  return V;
}

}  // namespace hb

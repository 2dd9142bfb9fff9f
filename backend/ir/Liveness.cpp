#include "backend/ir/Liveness.h"

#include <algorithm>

namespace hb {

Liveness liveness(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  Liveness L;
  L.last_use.assign(n, 0);
  for (int i = 0; i < n; ++i) L.last_use[i] = i;
  const int out = g.output_node();
  for (int i = 0; i < n; ++i) {
    g.nodes[i].for_each_input([&](const Arg& a) {
      L.last_use[a.ref] = (i == out) ? Liveness::kForever : std::max(L.last_use[a.ref], i);
    });
  }
  // Views extend their inputs' lives to their own: walk backwards so a chain of views carries the last
  // use all the way to the base. A getitem does not: the element it takes out holds its own
  // reference, and the tuple (with the elements nobody took, e.g. max_pool's indices) can go as soon
  // as the last getitem ran, as torch's own generated code drops it.
  for (int i = n - 1; i >= 0; --i) {
    const Node& node = g.nodes[i];
    if (!node.effects.is_view) continue;
    node.for_each_input([&](const Arg& a) { L.last_use[a.ref] = std::max(L.last_use[a.ref], L.last_use[i]); });
  }
  L.release_after.assign(n, {});
  for (int i = 0; i < n; ++i)
    if (L.last_use[i] != Liveness::kForever) L.release_after[L.last_use[i]].push_back(i);
  return L;
}

}  // namespace hb

#include "passes/DeadCodeElimination.h"

#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {
bool removable(const Node& n) {
  if (n.op != OpKind::CallFunction && n.op != OpKind::GetAttr) return false;
  if (n.effects.mutates || n.effects.nondeterministic_seeded) return false;
  // Higher-order ops and Python callables are kept: their effects are not described by a schema.
  return n.target.rfind("higher_order::", 0) != 0;
}
}  // namespace

bool dead_code_elimination(Graph& g, PassContext& ctx) {
  // Walk backwards so a chain of dead nodes goes in one sweep.
  std::vector<int> uses(g.nodes.size(), 0);
  std::vector<bool> keep(g.nodes.size(), true);
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
    const Node& n = g.nodes[i];
    if (uses[i] == 0 && removable(n)) {
      keep[i] = false;
      continue;
    }
    n.for_each_input([&](const Arg& a) { ++uses[a.ref]; });
  }
  return remove_nodes(g, keep) > 0;
}

}  // namespace hb

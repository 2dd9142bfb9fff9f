#include "passes/FoldSelectBackward.h"

#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {

constexpr const char* kSelectBackward = "aten::select_backward.default";
constexpr const char* kAdd = "aten::add.Tensor";
constexpr const char* kStack = "aten::stack.default";

// A plain `a + b` of two node values (no alpha, or alpha 1).
bool plain_add(const Node& n) {
  if (n.target != kAdd || n.args.size() != 2 || n.args[0].kind != Arg::Kind::Ref || n.args[1].kind != Arg::Kind::Ref)
    return false;
  for (const auto& [key, a] : n.kwargs)
    if (key != "alpha" || !((a.kind == Arg::Kind::Int && a.i == 1) || (a.kind == Arg::Kind::Float && a.f == 1.0)))
      return false;
  return true;
}

// The static sizes of a select_backward's `input_sizes` argument, or empty.
std::vector<int64_t> static_sizes(const Arg& a) {
  std::vector<int64_t> s;
  if (a.kind != Arg::Kind::List) return {};
  for (const Arg& x : a.items) {
    if (x.kind != Arg::Kind::Int) return {};
    s.push_back(x.i);
  }
  return s;
}

struct Sum {
  std::vector<int> adds;    // the tree's add nodes, root last
  std::vector<int> leaves;  // its select_backward nodes
};

// Collects the add tree under `i` (adds read only inside the tree); false when a leaf is not a
// select_backward read once.
bool collect(const Graph& g, int i, const std::vector<int>& uses, bool root, Sum* s) {
  const Node& n = g.nodes[i];
  if (!root && uses[i] != 1) return false;
  if (plain_add(n)) {
    for (const Arg& a : n.args)
      if (!collect(g, a.ref, uses, false, s)) return false;
    s->adds.push_back(i);
    return true;
  }
  if (n.target != kSelectBackward || root) return false;
  s->leaves.push_back(i);
  return true;
}

}  // namespace

bool fold_select_backward(Graph& g, PassContext& ctx) {
  std::vector<int> uses(g.nodes.size(), 0);
  for (const Node& n : g.nodes) n.for_each_input([&](const Arg& a) { ++uses[a.ref]; });
  std::vector<bool> keep(g.nodes.size(), true);
  std::ostringstream note;
  int folded = 0;
  // Roots last in FX order: visit from the end so that a sum's inner adds are never taken as roots.
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
    Node& root = g.nodes[i];
    if (!keep[i] || !plain_add(root) || root.type.kind != ValueType::Kind::Tensor) continue;
    Sum s;
    if (!collect(g, i, uses, true, &s) || s.leaves.size() < 2) continue;
    const TensorType& out = root.type.tensor;
    if (!out.contiguous_static()) continue;  // the stack writes the plain row-major layout
    const Node& first = g.nodes[s.leaves[0]];
    if (first.args.size() != 4 || first.args[2].kind != Arg::Kind::Int) continue;
    const std::vector<int64_t> sizes = static_sizes(first.args[1]);
    const int64_t rank = static_cast<int64_t>(sizes.size());
    int64_t dim = first.args[2].i;
    if (rank == 0 || dim < -rank || dim >= rank) continue;
    if (dim < 0) dim += rank;
    const int64_t n = sizes[dim];
    if (n != static_cast<int64_t>(s.leaves.size())) continue;
    std::vector<int> by_index(n, -1);
    bool ok = true;
    for (int leaf : s.leaves) {
      const Node& sb = g.nodes[leaf];
      ok = ok && sb.args.size() == 4 && sb.args[0].kind == Arg::Kind::Ref && sb.args[2].kind == Arg::Kind::Int &&
           sb.args[3].kind == Arg::Kind::Int && static_sizes(sb.args[1]) == sizes &&
           (sb.args[2].i < 0 ? sb.args[2].i + rank : sb.args[2].i) == dim &&
           sb.type.kind == ValueType::Kind::Tensor && sb.type.tensor.dtype == out.dtype;
      if (!ok) break;
      const Node& grad = g.nodes[sb.args[0].ref];
      ok = grad.type.kind == ValueType::Kind::Tensor && grad.type.tensor.dtype == out.dtype;
      const int64_t index = sb.args[3].i < 0 ? sb.args[3].i + n : sb.args[3].i;
      ok = ok && index >= 0 && index < n && by_index[index] < 0;
      if (!ok) break;
      by_index[index] = leaf;
    }
    if (!ok) continue;
    Arg list;
    list.kind = Arg::Kind::List;
    for (int leaf : by_index) list.items.push_back(g.nodes[leaf].args[0]);
    root.target = kStack;
    root.args = {list, Arg::of_int(dim)};
    root.kwargs.clear();
    root.effects = OpEffects{};
    for (int j : s.adds)
      if (j != i) keep[j] = false;
    for (int leaf : s.leaves) keep[leaf] = false;
    note << (folded++ ? "; " : ": ") << "%" << root.name << " = stack of " << n << " select_backward gradients (dim "
         << dim << "), " << s.adds.size() - 1 + s.leaves.size() << " nodes removed";
  }
  if (!folded) return false;
  ctx.notes.push_back("fold-select-backward graph " + g.name + note.str());
  remove_nodes(g, keep);
  return true;
}

}  // namespace hb

#include "passes/FoldTransposePairs.h"

#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {

// The two dims `n` swaps, normalized (lower first), when it is a transpose of a ref; else {-1, -1}.
std::pair<int64_t, int64_t> swapped_dims(const Graph& g, const Node& n) {
  const std::pair<int64_t, int64_t> none{-1, -1};
  if (n.op != OpKind::CallFunction || n.args.empty() || n.args[0].kind != Arg::Kind::Ref || !n.kwargs.empty() ||
      n.type.kind != ValueType::Kind::Tensor)
    return none;
  const Node& src = g.nodes[n.args[0].ref];
  if (src.type.kind != ValueType::Kind::Tensor) return none;
  const int64_t rank = static_cast<int64_t>(src.type.tensor.shape.size());
  if (n.target == "aten::t.default" && n.args.size() == 1) return rank == 2 ? std::make_pair<int64_t, int64_t>(0, 1) : none;
  if (n.target != "aten::transpose.int" || n.args.size() != 3 || n.args[1].kind != Arg::Kind::Int ||
      n.args[2].kind != Arg::Kind::Int)
    return none;
  int64_t a = n.args[1].i, b = n.args[2].i;
  if (a < 0) a += rank;
  if (b < 0) b += rank;
  if (a < 0 || b < 0 || a >= rank || b >= rank || a == b) return none;
  return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
}

}  // namespace

bool fold_transpose_pairs(Graph& g, PassContext& ctx) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> uses(n, 0);
  std::vector<bool> output(n, false);
  for (const Node& m : g.nodes) {
    m.for_each_input([&](const Arg& a) { ++uses[a.ref]; });
    if (m.op == OpKind::Output) m.for_each_input([&](const Arg& a) { output[a.ref] = true; });
  }
  std::vector<int> becomes(n);
  for (int i = 0; i < n; ++i) becomes[i] = i;
  std::vector<bool> keep(n, true);
  std::ostringstream note;
  int folded = 0;
  for (int i = 0; i < n; ++i) {
    const Node& outer = g.nodes[i];
    const auto dims = swapped_dims(g, outer);
    if (dims.first < 0) continue;
    const int inner = outer.args[0].ref;
    // (not through a view this pass already folded or dropped: t(t(t(x))) folds once, into t(x))
    if (!keep[inner] || swapped_dims(g, g.nodes[inner]) != dims) continue;
    const int x = g.nodes[inner].args[0].ref;
    if (!keep[x]) continue;
    const Node& src = g.nodes[x];
    if (!outer.type.same_tensor(src.type)) continue;
    if (output[i] && (src.op == OpKind::Placeholder || output[x])) continue;
    becomes[i] = x;
    keep[i] = false;
    uses[x] += uses[i];
    if (output[i]) output[x] = true;
    if (--uses[inner] == 0) keep[inner] = false;
    if (folded < 4) note << (folded ? ", " : " (") << "%" << outer.name << " reads %" << src.name;
    ++folded;
  }
  if (!folded) return false;
  redirect_uses(g, becomes);
  ctx.notes.push_back("fold-transpose-pairs graph " + g.name + ": " + std::to_string(folded) + " pair" +
                      (folded == 1 ? "" : "s") + note.str() + (folded > 4 ? ", ...)" : ")"));
  remove_nodes(g, keep);
  return true;
}

}  // namespace hb

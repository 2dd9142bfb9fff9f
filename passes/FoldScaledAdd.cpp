#include "passes/FoldScaledAdd.h"

#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

bool fold_scaled_add(Graph& g, PassContext& ctx) {
  const int n = static_cast<int>(g.nodes.size());
  const std::vector<std::vector<int>> users = g.users();
  std::vector<bool> output(n, false);
  for (const Node& m : g.nodes)
    if (m.op == OpKind::Output) m.for_each_input([&](const Arg& a) { output[a.ref] = true; });
  // Whether node `m` is a tensor times a constant that only node `reader` reads, typed as that tensor.
  auto scaled = [&](int m, int reader) -> bool {
    const Node& mul = g.nodes[m];
    if (mul.op != OpKind::CallFunction || mul.target != "aten::mul.Tensor" || mul.args.size() != 2 ||
        !mul.kwargs.empty() || mul.args[0].kind != Arg::Kind::Ref || output[m])
      return false;
    const Arg& s = mul.args[1];
    const TensorType* b = g.tensor_type(mul.args[0]);
    if (!b || mul.type.kind != ValueType::Kind::Tensor || !mul.type.tensor.same_layout(*b)) return false;
    if (!is_floating(b->dtype) || !(s.kind == Arg::Kind::Int || s.kind == Arg::Kind::Float)) return false;
    for (int u : users[m])
      if (u != reader) return false;
    return true;
  };
  std::vector<bool> keep(n, true);
  std::ostringstream examples;
  int folded = 0;
  for (int i = 0; i < n; ++i) {
    Node& add = g.nodes[i];
    const bool is_add = add.target == "aten::add.Tensor", is_sub = add.target == "aten::sub.Tensor";
    if (add.op != OpKind::CallFunction || !(is_add || is_sub) || add.args.size() != 2 || !add.kwargs.empty() ||
        add.args[0].kind != Arg::Kind::Ref || add.args[1].kind != Arg::Kind::Ref)
      continue;
    int k = 1;  // the operand that is the scaled tensor
    if (!scaled(add.args[1].ref, i)) {
      if (!is_add || !scaled(add.args[0].ref, i)) continue;
      k = 0;  // add is commutative: the scaled operand goes second
    }
    const int m = add.args[k].ref;
    if (add.args[0].ref == add.args[1].ref) continue;  // add(mul, mul): the mul has another use
    const Node& mul = g.nodes[m];
    const Arg other = add.args[1 - k], source = mul.args[0], s = mul.args[1];
    add.args = {other, source};
    add.kwargs = {{"alpha", s}};
    keep[m] = false;
    if (folded < 3) {
      examples << (folded ? ", " : " (") << "%" << add.name << " reads %" << g.nodes[source.ref].name << " with alpha ";
      if (s.kind == Arg::Kind::Int) examples << s.i;
      else examples << s.f;
    }
    ++folded;
  }
  if (!folded) return false;
  remove_nodes(g, keep);
  ctx.notes.push_back("fold-scaled-add graph " + g.name + ": " + std::to_string(folded) + " mul" +
                      (folded == 1 ? "" : "s") + " folded" + examples.str() + (folded > 3 ? ", ...)" : ")"));
  return true;
}

}  // namespace hb

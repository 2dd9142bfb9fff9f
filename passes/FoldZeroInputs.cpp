#include "passes/FoldZeroInputs.h"

#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

bool fold_zero_inputs(Graph& g, PassContext& ctx) {
  if (ctx.zero_inputs.empty()) return false;
  const int n = static_cast<int>(g.nodes.size());
  std::vector<bool> zero(n, false), output(n, false);
  for (int i = 0; i < n; ++i)
    zero[i] = g.nodes[i].op == OpKind::Placeholder && ctx.zero_inputs.count(g.nodes[i].name);
  for (const Node& m : g.nodes)
    if (m.op == OpKind::Output) m.for_each_input([&](const Arg& a) { output[a.ref] = true; });
  std::vector<int> becomes(n);
  for (int i = 0; i < n; ++i) becomes[i] = i;
  std::vector<bool> keep(n, true);
  std::vector<int> folded(n, 0);  // per zero input: adds folded
  std::ostringstream examples;
  int total = 0;
  for (int i = 0; i < n; ++i) {
    const Node& add = g.nodes[i];
    if (add.op != OpKind::CallFunction || add.target != "aten::add.Tensor" || add.args.size() != 2 ||
        !add.kwargs.empty() || add.args[0].kind != Arg::Kind::Ref || add.args[1].kind != Arg::Kind::Ref)
      continue;
    const int a = add.args[0].ref, b = add.args[1].ref;
    if (zero[a] == zero[b]) continue;  // neither, or both (then x would be a zero input too)
    const int z = zero[a] ? a : b, x = zero[a] ? b : a;
    const Node& src = g.nodes[becomes[x]];
    if (!add.type.same_tensor(src.type)) continue;
    if (output[i] && (src.op == OpKind::Placeholder || output[becomes[x]])) continue;
    becomes[i] = becomes[x];
    keep[i] = false;
    if (output[i]) output[becomes[x]] = true;
    ++folded[z];
    if (total < 4) examples << (total ? ", " : " (") << "%" << add.name << " reads %" << src.name;
    ++total;
  }
  // What still reads each zero input, for the note (the runtime passes zeros there).
  std::vector<std::vector<std::string>> readers(n);
  for (int i = 0; i < n; ++i)
    if (keep[i]) g.nodes[i].for_each_input([&](const Arg& a) {
        if (zero[a.ref]) readers[a.ref].push_back(g.nodes[i].name);
      });
  std::ostringstream note;
  note << "fold-zero-inputs graph " << g.name << ":";
  const char* sep = " ";
  for (int z = 0; z < n; ++z) {
    if (!zero[z]) continue;
    note << sep << "%" << g.nodes[z].name << " is zero: " << folded[z] << " add" << (folded[z] == 1 ? "" : "s")
         << " folded";
    if (!readers[z].empty()) {
      note << ", still read by";
      for (size_t k = 0; k < readers[z].size() && k < 3; ++k) note << (k ? ", %" : " %") << readers[z][k];
      if (readers[z].size() > 3) note << ", ...";
    }
    sep = "; ";
  }
  if (total) note << examples.str() << (total > 4 ? ", ...)" : ")");
  ctx.notes.push_back(note.str());
  if (!total) return false;
  redirect_uses(g, becomes);
  remove_nodes(g, keep);
  return true;
}

}  // namespace hb

#include "passes/WriteInputsInPlace.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "backend/ir/Aliasing.h"
#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {

constexpr const char* kFunctionalBatchNorm = "aten::_native_batch_norm_legit_functional.default";

// Whether node `i` is element `elem` of node `of` (a getitem).
bool is_element(const Graph& g, int i, int of, int elem) {
  const Node& n = g.nodes[i];
  return n.target == "operator::getitem" && n.args.size() == 2 && n.args[0].kind == Arg::Kind::Ref &&
         n.args[0].ref == of && n.args[1].kind == Arg::Kind::Int && n.args[1].i == elem;
}

// A statistic of a BatchNorm, as written back: the getitem of element `elem` of node `bn`, or a
// conversion of it to the input's dtype (a bf16 module's statistics: the functional form's new values
// are float, and AOTAutograd converts them back) that nothing else reads.
struct Statistic {
  int getitem = -1;
  int conversion = -1;  // the _to_copy, or -1
};

std::optional<Statistic> statistic(const Graph& g, const std::vector<std::vector<int>>& users, const Arg& item,
                                   int bn, int elem, const ValueType& input) {
  if (item.kind != Arg::Kind::Ref) return std::nullopt;
  if (is_element(g, item.ref, bn, elem)) return Statistic{item.ref, -1};
  const Node& c = g.nodes[item.ref];
  if (c.target != "aten::_to_copy.default" || c.args.size() != 1 || c.args[0].kind != Arg::Kind::Ref ||
      !is_element(g, c.args[0].ref, bn, elem) || users[c.args[0].ref].size() != 1 || !c.type.same_tensor(input))
    return std::nullopt;
  for (const auto& [key, value] : c.kwargs)
    if (!(key == "dtype" && value.kind == Arg::Kind::DType && value.dtype == input.tensor.dtype) &&
        !(key == "layout" && value.kind == Arg::Kind::Layout && value.s == "strided"))
      return std::nullopt;
  return Statistic{c.args[0].ref, item.ref};
}

// Ops that have an in-place overload computing the same value into their first argument (ATen's
// `op_`): a buffer updated by one of them (`count.add_(1)`, `ema.lerp_(x, w)`, `buf.copy_(x)`,
// `cache.index_put_(...)`) is traced as the functional op and written back.
const std::map<std::string, std::string>& in_place_overloads() {
  static const std::map<std::string, std::string> k = {
      {"aten::add.Tensor", "aten::add_.Tensor"},           {"aten::add.Scalar", "aten::add_.Scalar"},
      {"aten::sub.Tensor", "aten::sub_.Tensor"},           {"aten::mul.Tensor", "aten::mul_.Tensor"},
      {"aten::mul.Scalar", "aten::mul_.Scalar"},           {"aten::div.Tensor", "aten::div_.Tensor"},
      {"aten::lerp.Scalar", "aten::lerp_.Scalar"},         {"aten::copy.default", "aten::copy_.default"},
      {"aten::fill.Scalar", "aten::fill_.Scalar"},         {"aten::zero.default", "aten::zero_.default"},
      {"aten::masked_fill.Scalar", "aten::masked_fill_.Scalar"},
      {"aten::index_put.default", "aten::index_put_.default"},
      {"aten::index_copy.default", "aten::index_copy_.default"}};
  return k;
}

// A scatter of a view's new values into a buffer, as `buf[:, i] = x` (select) or `buf[:, a:b] = x`
// (slice) is traced: %v = view(%buf, ...), %c = copy(%v, %x), %s = *_scatter(%buf, %c, ...), with the
// view's arguments those of the scatter. The view of the scatter's kind, its arguments after the source.
struct ScatterKind {
  const char* view;
  std::vector<Arg> defaults;  // the view's arguments after the tensor, as the schema defaults them
};
const std::map<std::string, ScatterKind>& scatters() {
  static const std::map<std::string, ScatterKind> k = {
      {"aten::select_scatter.default", {"aten::select.int", {}}},
      {"aten::slice_scatter.default",
       {"aten::slice.Tensor", {Arg::of_int(0), Arg::none(), Arg::none(), Arg::of_int(1)}}}};
  return k;
}

bool same_constant(const Arg& a, const Arg& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Arg::Kind::None: return true;
    case Arg::Kind::Int: return a.i == b.i;
    case Arg::Kind::Bool: return a.b == b.b;
    case Arg::Kind::Ref: return a.ref == b.ref;  // (the same symbolic index, a position the caller passes)
    default: return false;  // (a list, ...: not compared)
  }
}

// Whether the view's arguments after its tensor (from `from`) equal the scatter's (from `sfrom`),
// trailing defaults filled in.
bool same_view_args(const Node& view, size_t from, const Node& scatter, size_t sfrom, const std::vector<Arg>& defaults) {
  const size_t n = std::max({view.args.size() - from, scatter.args.size() - sfrom, defaults.size()});
  auto at = [&](const Node& x, size_t start, size_t k) -> const Arg* {
    if (start + k < x.args.size()) return &x.args[start + k];
    return k < defaults.size() ? &defaults[k] : nullptr;
  };
  for (size_t k = 0; k < n; ++k) {
    const Arg *a = at(view, from, k), *b = at(scatter, sfrom, k);
    if (!a || !b || !same_constant(*a, *b)) return false;
  }
  return view.kwargs.empty() && scatter.kwargs.empty();
}

}  // namespace

bool write_inputs_in_place(Graph& g, PassContext& ctx) {
  if (ctx.input_writes.empty() || !ctx.keep_across_calls) return false;
  const int out = g.output_node();
  if (out < 0 || g.nodes[out].args.empty()) return false;
  const std::vector<Arg>& outputs = g.nodes[out].args[0].items;
  const std::vector<std::vector<int>> users = g.users();
  // Per placeholder written back: the output position holding its new value.
  std::vector<int> written(g.nodes.size(), -1);
  for (size_t k = 0; k < ctx.input_writes.size() && k < outputs.size(); ++k) {
    const int p = g.find(ctx.input_writes[k]);
    if (p >= 0 && g.nodes[p].op == OpKind::Placeholder) written[p] = static_cast<int>(k);
  }
  // Whether `a` is a placeholder the caller writes back into that nothing but node `reader` reads (and
  // node `also`, when given: the view a scatter's copy writes through).
  auto only_written_by = [&](const Arg& a, int reader, int also = -1) {
    if (a.kind != Arg::Kind::Ref || written[a.ref] < 0) return false;
    for (int u : users[a.ref])
      if (u != reader && u != also) return false;
    return true;
  };
  std::vector<int> becomes(g.nodes.size());
  for (size_t k = 0; k < becomes.size(); ++k) becomes[k] = static_cast<int>(k);
  std::vector<bool> keep(g.nodes.size(), true);
  std::ostringstream note;
  int rewritten = 0;
  // "%buffer by %node (how)"; `by`: the nodes that write it, "%a, %b"
  auto say = [&](const std::string& what, const std::string& by, const std::string& as) {
    note << (rewritten++ ? ", " : ": ") << what << " by " << by << " (" << as << ")";
  };
  // How often each node is returned: a new value returned at its write-back position only (not also saved
  // for the backward or returned to the user) may become the input itself.
  std::vector<int> returned(g.nodes.size(), 0);
  for (const Arg& item : outputs)
    if (item.kind == Arg::Kind::Ref) ++returned[item.ref];
  // Whether node i's value is the new value of its first argument, a placeholder written back from it
  // alone, that nothing else reads (but `also`, when given).
  auto writes_first_argument = [&](const Node& n, int i, int also) {
    if (n.args.empty() || !only_written_by(n.args[0], i, also)) return false;
    const int p = n.args[0].ref;
    const Arg& at = outputs[written[p]];
    return at.kind == Arg::Kind::Ref && at.ref == i && returned[i] == 1 && n.type.same_tensor(g.nodes[p].type);
  };
  // A chain of ops with in-place overloads from a buffer to its new value (`ema.mul_(d).add_(x, alpha=1 - d)`
  // traced as mul, then add reading the mul): each op's first argument the one before it (the first op's
  // the buffer), read by nothing but that op, of the buffer's type, returned nowhere. All of them become
  // their in-place overloads, each writing the buffer.
  for (size_t k = 0; k < ctx.input_writes.size() && k < outputs.size(); ++k) {
    const int p = g.find(ctx.input_writes[k]);
    if (p < 0 || written[p] != static_cast<int>(k) || outputs[k].kind != Arg::Kind::Ref) continue;
    std::vector<int> chain;  // from the new value back to the op reading the buffer
    for (int c = outputs[k].ref;;) {
      const Node& cn = g.nodes[c];
      if (cn.op != OpKind::CallFunction || !in_place_overloads().count(cn.target) || cn.args.empty() ||
          cn.args[0].kind != Arg::Kind::Ref || !cn.type.same_tensor(g.nodes[p].type) ||
          returned[c] != (chain.empty() ? 1 : 0))
        break;
      chain.push_back(c);
      const int a = cn.args[0].ref;
      if (a == p) {
        if (!only_written_by(cn.args[0], c)) chain.clear();
        break;
      }
      if (!std::all_of(users[a].begin(), users[a].end(), [&](int u) { return u == c; })) {
        chain.clear();
        break;
      }
      c = a;
    }
    if (chain.empty() || g.nodes[g.nodes[chain.back()].args[0].ref].op != OpKind::Placeholder) continue;
    std::string names, ops;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Node& cn = g.nodes[*it];
      const std::string& to = in_place_overloads().at(cn.target);
      names += (names.empty() ? "%" : ", %") + cn.name;
      ops += (ops.empty() ? "" : ", ") + to.substr(6, to.find('.') - 6);  // "add_"
      cn.target = to;
      cn.effects.mutates = true;
    }
    say("%" + g.nodes[p].name, names, ops);
  }
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    Node& n = g.nodes[i];
    if (n.op != OpKind::CallFunction) continue;
    const auto scatter = scatters().find(n.target);
    if (scatter != scatters().end() && n.args.size() >= 2 && n.args[1].kind == Arg::Kind::Ref) {
      // %v = view(%buf, ...); %c = copy(%v, %x); %n = scatter(%buf, %c, ...): %c becomes copy_(%v, %x),
      // writing the buffer through the view, and %n's readers read the buffer.
      const int c = n.args[1].ref;
      const Node& cn = g.nodes[c];
      if (cn.target != "aten::copy.default" || cn.args.size() != 2 || !cn.kwargs.empty() ||
          cn.args[0].kind != Arg::Kind::Ref || users[c].size() != 1)
        continue;
      const int v = cn.args[0].ref;
      const Node& vn = g.nodes[v];
      if (vn.target != scatter->second.view || vn.args.empty() || vn.args[0].kind != Arg::Kind::Ref ||
          vn.args[0].ref != n.args[0].ref || users[v].size() != 1 || !cn.type.same_tensor(vn.type) ||
          !same_view_args(vn, 1, n, 2, scatter->second.defaults) || !writes_first_argument(n, i, v))
        continue;
      const std::string buffer = "%" + g.nodes[n.args[0].ref].name;
      say(buffer, "%" + g.nodes[c].name, "copy_ into a view");
      g.nodes[c].target = "aten::copy_.default";
      g.nodes[c].effects.mutates = true;
      becomes[i] = n.args[0].ref;
      keep[i] = false;
    } else if (n.target == kFunctionalBatchNorm && n.args.size() == 8 && n.kwargs.empty() &&
               n.args[5].kind == Arg::Kind::Bool && n.args[5].b && only_written_by(n.args[3], i) &&
               only_written_by(n.args[4], i)) {
      const int mean = n.args[3].ref, var = n.args[4].ref;
      const std::optional<Statistic> m = statistic(g, users, outputs[written[mean]], i, 3, g.nodes[mean].type);
      const std::optional<Statistic> v = statistic(g, users, outputs[written[var]], i, 4, g.nodes[var].type);
      if (!m || !v || n.type.kind != ValueType::Kind::Tuple || n.type.elems.size() != 5) continue;
      say("%" + g.nodes[mean].name + " and %" + g.nodes[var].name, "%" + n.name, "batch_norm_in_place");
      n.target = kBatchNormInPlaceTarget;
      n.args.erase(n.args.begin() + 5);  // (training: always, for this op)
      n.effects.mutates = true;
      // The statistics are the inputs' own data now, in their dtype: a conversion back reads as them.
      for (const auto& [s, elem, input] : {std::tuple{*m, 3, mean}, std::tuple{*v, 4, var}}) {
        n.type.elems[elem] = g.nodes[input].type;
        g.nodes[s.getitem].type = g.nodes[input].type;
        if (s.conversion < 0) continue;
        becomes[s.conversion] = s.getitem;
        keep[s.conversion] = false;
      }
    }
  }
  if (!rewritten) return false;
  redirect_uses(g, becomes);
  remove_nodes(g, keep);
  ctx.notes.push_back("write-inputs-in-place graph " + g.name + note.str());
  return true;
}

}  // namespace hb

#include "passes/WriteInputsInPlace.h"

#include <optional>
#include <sstream>
#include <tuple>

#include "backend/ir/Aliasing.h"
#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {

constexpr const char* kFunctionalBatchNorm = "aten::_native_batch_norm_legit_functional.default";

bool same_type(const ValueType& a, const ValueType& b) {
  return a.kind == ValueType::Kind::Tensor && b.kind == ValueType::Kind::Tensor && a.tensor.shape == b.tensor.shape &&
         a.tensor.stride == b.tensor.stride && a.tensor.dtype == b.tensor.dtype && a.tensor.device == b.tensor.device;
}

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
      !is_element(g, c.args[0].ref, bn, elem) || users[c.args[0].ref].size() != 1 || !same_type(c.type, input))
    return std::nullopt;
  for (const auto& [key, value] : c.kwargs)
    if (!(key == "dtype" && value.kind == Arg::Kind::DType && value.dtype == input.tensor.dtype) &&
        !(key == "layout" && value.kind == Arg::Kind::Layout && value.s == "strided"))
      return std::nullopt;
  return Statistic{c.args[0].ref, item.ref};
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
  // Whether placeholder `p` is written back from `value` and nothing but node `reader` reads it.
  auto only_written_by = [&](const Arg& a, int reader) {
    if (a.kind != Arg::Kind::Ref || written[a.ref] < 0) return false;
    return users[a.ref].size() == 1 && users[a.ref][0] == reader;
  };
  std::vector<int> becomes(g.nodes.size());
  for (size_t k = 0; k < becomes.size(); ++k) becomes[k] = static_cast<int>(k);
  std::vector<bool> keep(g.nodes.size(), true);
  std::ostringstream note;
  int rewritten = 0;
  auto say = [&](const std::string& what, const Node& n, const char* as) {
    note << (rewritten++ ? ", " : ": ") << what << " by %" << n.name << " (" << as << ")";
  };
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    Node& n = g.nodes[i];
    if (n.op != OpKind::CallFunction) continue;
    if ((n.target == "aten::add.Tensor" || n.target == "aten::add.Scalar") && n.args.size() == 2 && n.kwargs.empty() &&
        only_written_by(n.args[0], i)) {
      const Node& p = g.nodes[n.args[0].ref];
      const Arg& at = outputs[written[n.args[0].ref]];
      if (at.kind != Arg::Kind::Ref || at.ref != i || !same_type(n.type, p.type)) continue;
      say("%" + p.name, n, "add_");
      n.target = n.target == "aten::add.Tensor" ? "aten::add_.Tensor" : "aten::add_.Scalar";
      n.effects.mutates = true;
    } else if (n.target == kFunctionalBatchNorm && n.args.size() == 8 && n.kwargs.empty() &&
               n.args[5].kind == Arg::Kind::Bool && n.args[5].b && only_written_by(n.args[3], i) &&
               only_written_by(n.args[4], i)) {
      const int mean = n.args[3].ref, var = n.args[4].ref;
      const std::optional<Statistic> m = statistic(g, users, outputs[written[mean]], i, 3, g.nodes[mean].type);
      const std::optional<Statistic> v = statistic(g, users, outputs[written[var]], i, 4, g.nodes[var].type);
      if (!m || !v || n.type.kind != ValueType::Kind::Tuple || n.type.elems.size() != 5) continue;
      say("%" + g.nodes[mean].name + " and %" + g.nodes[var].name, n, "batch_norm_in_place");
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

#include "passes/FoldLayerNormActivation.h"

#include <optional>
#include <sstream>
#include <string>

#include "backend/ir/GraphEdit.h"
#include "codegen/KernelSelect.h"

namespace hb {

namespace {

constexpr const char* kGelu = "aten::gelu.default";
constexpr const char* kGeluBackward = "aten::gelu_backward.default";
constexpr const char* kSilu = "aten::silu.default";
constexpr const char* kSiluBackward = "aten::silu_backward.default";

// gelu's `approximate` ("none" when not given), as argument `pos` or as the keyword; nullopt for any
// other argument or keyword, or a value that is not a string.
std::optional<std::string> approximate(const Node& n, size_t pos) {
  const Arg* a = nullptr;
  if (n.args.size() == pos + 1) a = &n.args[pos];
  else if (n.args.size() != pos) return std::nullopt;
  for (const auto& [key, v] : n.kwargs) {
    if (key != "approximate" || a) return std::nullopt;
    a = &v;
  }
  if (!a) return "none";
  if (a->kind != Arg::Kind::Str) return std::nullopt;
  return a->s;
}

// The activation node n computes of its one tensor argument; nullopt for anything else.
std::optional<RowActivation> activation_of(const Node& n) {
  if (n.op != OpKind::CallFunction || n.args.empty() || n.args[0].kind != Arg::Kind::Ref) return std::nullopt;
  if (n.target == kSilu) {
    if (n.args.size() != 1 || !n.kwargs.empty()) return std::nullopt;
    return RowActivation::Silu;
  }
  if (n.target != kGelu) return std::nullopt;
  const std::optional<std::string> approx = approximate(n, 1);
  if (approx == "none") return RowActivation::Gelu;
  if (approx == "tanh") return RowActivation::GeluTanh;
  return std::nullopt;
}

// Whether n is act's backward of (grad, h): gelu_backward with act's approximation, or silu_backward.
bool is_backward_of(const Node& n, RowActivation act, int grad, int h) {
  if (n.op != OpKind::CallFunction || n.args.size() < 2 || n.args[0].kind != Arg::Kind::Ref ||
      n.args[1].kind != Arg::Kind::Ref || n.args[0].ref != grad || n.args[1].ref != h)
    return false;
  if (act == RowActivation::Silu) return n.target == kSiluBackward && n.args.size() == 2 && n.kwargs.empty();
  if (n.target != kGeluBackward) return false;
  const std::optional<std::string> approx = approximate(n, 2);
  return approx == (act == RowActivation::GeluTanh ? "tanh" : "none");
}

}  // namespace

bool fold_layer_norm_activation(Graph& g, PassContext& ctx) {
  if (!ctx.memory.target.cuda_kernels) return false;
  const int count = static_cast<int>(g.nodes.size());
  const std::vector<std::vector<int>> users = g.users();
  std::vector<bool> keep(count, true);
  std::vector<int> becomes(count);
  for (int i = 0; i < count; ++i) becomes[i] = i;
  std::ostringstream note;
  int folded = 0;
  for (int i = 0; i < count; ++i) {
    const Node& ln = g.nodes[i];
    const bool backward = ln.target == kLayerNormBackwardTarget;
    if (!backward && ln.target != kLayerNormTarget) continue;
    const std::optional<LayerNormShape> shape = layer_norm_shape(ln);
    if (!shape || ln.args[shape->input_arg].kind != Arg::Kind::Ref) continue;
    const int a = ln.args[shape->input_arg].ref;
    const Node& an = g.nodes[a];
    const std::optional<RowActivation> act = activation_of(an);
    if (!act || !keep[a] || users[a].size() != 1 || an.hints.region != ln.hints.region) continue;
    const int h = an.args[0].ref;
    // The backward: h's gradient is the activation's backward of the layer norm's input gradient, the
    // only reader of that gradient.
    int dx = -1, dh = -1;
    if (backward) {
      const Arg& mask = ln.args[7];
      if (mask.kind != Arg::Kind::List || mask.items.size() != 3 || mask.items[0].kind != Arg::Kind::Bool ||
          !mask.items[0].b)
        continue;
      for (int u : users[i]) {
        const Node& un = g.nodes[u];
        if (un.target == "operator::getitem" && un.args.size() == 2 && un.args[1].kind == Arg::Kind::Int &&
            un.args[1].i == 0)
          dx = dx < 0 ? u : -2;  // (two getitems of the same result: leave it)
      }
      if (dx < 0 || users[dx].size() != 1) continue;
      dh = users[dx][0];
      // (%dh's readers will read %dx: the same tensor type, or leave it)
      const ValueType &tx = g.nodes[dx].type, &th = g.nodes[dh].type;
      if (!is_backward_of(g.nodes[dh], *act, dx, h) || g.nodes[dh].hints.region != ln.hints.region ||
          !tx.same_tensor(th))
        continue;
    }
    Node fused = ln;
    fused.target = backward ? kLayerNormActBackwardTarget : kLayerNormActTarget;
    fused.args[shape->input_arg] = Arg::of_ref(h, g.nodes[h].name);
    fused.args.push_back(Arg::of_str(row_activation_name(*act)));
    if (!layer_norm_rows_why_not(g, fused).empty()) continue;  // (h not contiguous, another dtype ...)
    g.nodes[i] = std::move(fused);
    keep[a] = false;
    if (backward) {
      keep[dh] = false;
      becomes[dh] = dx;
    }
    if (folded < 4)
      note << (folded ? ", " : ": ") << "%" << an.name << " into %" << g.nodes[i].name << " ("
           << row_activation_name(*act) << (backward ? ", and %" + g.nodes[dh].name : std::string()) << ")";
    ++folded;
  }
  if (!folded) return false;
  redirect_uses(g, becomes);
  ctx.notes.push_back("fold-layer-norm-activation graph " + g.name + note.str() + (folded > 4 ? ", ..." : ""));
  remove_nodes(g, keep);
  return true;
}

}  // namespace hb

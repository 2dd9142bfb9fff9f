#include "passes/RowSoftmaxFusion.h"

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>

#include "backend/ir/GraphEdit.h"
#include "backend/ir/Aliasing.h"
#include "passes/SliceSchedule.h"
#include "passes/SoftmaxUpcast.h"

namespace hb {
namespace {

bool is_tensor(const Node& n, DType d) { return n.type.kind == ValueType::Kind::Tensor && n.type.tensor.dtype == d; }
bool is_low(DType d) { return d == DType::BFloat16 || d == DType::Float16; }
// A cast source the kernels read directly: a half-precision one, or float32 (a cast to itself).
bool low_or_f32(DType d) { return is_low(d) || d == DType::Float32; }

bool same_shape(const Node& a, const Node& b) {
  if (a.type.kind != ValueType::Kind::Tensor || b.type.kind != ValueType::Kind::Tensor) return false;
  return a.type.tensor.device == b.type.tensor.device && a.type.tensor.shape == b.type.tensor.shape;
}

bool is_last_dim(const Node& n, const Arg& dim) {
  const int64_t rank = static_cast<int64_t>(n.type.tensor.shape.size());
  return rank >= 1 && dim.kind == Arg::Kind::Int && (dim.i == -1 || dim.i == rank - 1);
}

// `v * c` with a Python number c, in v's dtype: (v, c).
std::optional<std::pair<int, double>> scalar_mul(const Graph& g, const Node& n) {
  if (n.target != "aten::mul.Tensor" || n.args.size() != 2 || !n.kwargs.empty() || n.args[0].kind != Arg::Kind::Ref)
    return std::nullopt;
  const Arg& c = n.args[1];
  if (c.kind != Arg::Kind::Float && c.kind != Arg::Kind::Int) return std::nullopt;
  const Node& v = g.nodes[n.args[0].ref];
  if (!same_shape(v, n) || v.type.tensor.dtype != n.type.tensor.dtype) return std::nullopt;
  return std::make_pair(n.args[0].ref, c.kind == Arg::Kind::Float ? c.f : static_cast<double>(c.i));
}

Arg scale_arg(const std::optional<double>& s) { return s ? Arg::of_float(*s) : Arg::none(); }

// x [* scale] [-> float32] -> _softmax(-1) over float32, every step in the softmax's region and read
// only by the next one.
struct ForwardChain {
  int softmax = -1;
  int x = -1;
  std::optional<double> scale;
  DType t = DType::Float32;   // x's dtype
  std::vector<int> absorbed;  // the mul and the upcast: removed with the softmax
};

std::optional<ForwardChain> match_forward(const Graph& g, int s, const std::vector<int>& uses) {
  const Node& n = g.nodes[s];
  if (n.target != "aten::_softmax.default" || n.args.size() != 3 || n.args[0].kind != Arg::Kind::Ref ||
      n.args[2].kind != Arg::Kind::Bool || !is_tensor(n, DType::Float32) || !is_last_dim(n, n.args[1]))
    return std::nullopt;
  ForwardChain c;
  c.softmax = s;
  int b = n.args[0].ref;
  auto joins = [&](int m) { return uses[m] == 1 && g.nodes[m].hints.region == n.hints.region; };
  if (n.args[2].b) {  // half_to_float (fold-softmax-upcast): the input is float16
    if (!is_tensor(g.nodes[b], DType::Float16)) return std::nullopt;
  } else {
    if (!is_tensor(g.nodes[b], DType::Float32)) return std::nullopt;
    const int src = plain_cast_source(g, g.nodes[b]);
    if (src >= 0 && joins(b) && low_or_f32(g.nodes[src].type.tensor.dtype)) {
      c.absorbed.push_back(b);
      b = src;
    }
  }
  if (auto m = scalar_mul(g, g.nodes[b]); m && joins(b)) {
    c.absorbed.push_back(b);
    c.scale = m->second;
    b = m->first;
  }
  if (!same_shape(g.nodes[b], n)) return std::nullopt;
  c.x = b;
  c.t = g.nodes[b].type.tensor.dtype;
  return c;
}

// [grad -> float32] -> _softmax_backward_data(g, y, -1, float32) [-> T] [* scale]: with T the grad's
// dtype, so a low-precision grad needs the downcast (else the kernel's one dtype does not hold).
struct BackwardChain {
  int grad = -1, y = -1, last = -1;  // `last`: the node whose value the fused op computes
  std::optional<double> scale;
  std::vector<int> absorbed;         // every chain node but `last`
  std::optional<ForwardChain> recompute;  // y is this graph's softmax of that chain
};

std::optional<BackwardChain> match_backward(const Graph& g, int i, const std::vector<int>& uses,
                                            const std::vector<std::vector<int>>& users) {
  const Node& n = g.nodes[i];
  if (n.target != "aten::_softmax_backward_data.default" || n.args.size() != 4 || n.args[0].kind != Arg::Kind::Ref ||
      n.args[1].kind != Arg::Kind::Ref || n.args[3].kind != Arg::Kind::DType || n.args[3].dtype != DType::Float32 ||
      !is_tensor(n, DType::Float32) || !is_last_dim(n, n.args[2]))
    return std::nullopt;
  const int gr = n.args[0].ref;
  if (!is_tensor(g.nodes[gr], DType::Float32) || !is_tensor(g.nodes[n.args[1].ref], DType::Float32) ||
      !same_shape(g.nodes[gr], n) || !same_shape(g.nodes[n.args[1].ref], n))
    return std::nullopt;
  auto joins = [&](int m) { return g.nodes[m].hints.region == n.hints.region; };
  BackwardChain c;
  c.grad = gr;
  c.y = n.args[1].ref;
  c.last = i;
  DType t = DType::Float32;
  if (const int src = plain_cast_source(g, g.nodes[gr]);
      src >= 0 && uses[gr] == 1 && joins(gr) && low_or_f32(g.nodes[src].type.tensor.dtype)) {
    c.absorbed.push_back(gr);
    c.grad = src;
    t = g.nodes[src].type.tensor.dtype;
  }
  // The cast back to T: needed for a low-precision T (else the kernel's one dtype does not hold);
  // a float32-to-float32 one is absorbed too.
  const int d = users[i].size() == 1 ? users[i][0] : -1;
  if (d >= 0 && plain_cast_source(g, g.nodes[d]) == i && is_tensor(g.nodes[d], t) && joins(d)) {
    c.absorbed.push_back(i);
    c.last = d;
  } else if (t != DType::Float32) {
    return std::nullopt;
  }
  if (users[c.last].size() == 1) {
    const int m = users[c.last][0];
    if (auto mul = scalar_mul(g, g.nodes[m]); mul && mul->first == c.last && joins(m)) {
      c.absorbed.push_back(c.last);
      c.scale = mul->second;
      c.last = m;
    }
  }
  // y through detach/alias to a softmax this graph computes: recompute it from that chain's input.
  int r = c.y;
  while ((g.nodes[r].target == "aten::detach.default" || g.nodes[r].target == "aten::alias.default") &&
         g.nodes[r].args.size() == 1 && g.nodes[r].args[0].kind == Arg::Kind::Ref)
    r = g.nodes[r].args[0].ref;
  if (auto f = match_forward(g, r, uses); f && f->t == t) c.recompute = f;
  return c;
}

// Drops the nodes in `candidates` that nothing kept reads, cascading through the detach/alias nodes
// they read (those between a recomputed softmax and its backward).
void drop_dead(const Graph& g, std::set<int> candidates, std::vector<bool>& keep) {
  std::vector<int> uses(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (keep[i]) g.nodes[i].for_each_input([&](const Arg& a) { ++uses[a.ref]; });
  while (!candidates.empty()) {
    const int i = *candidates.rbegin();  // latest first: its inputs come before it
    candidates.erase(i);
    if (!keep[i] || uses[i] > 0) continue;
    keep[i] = false;
    g.nodes[i].for_each_input([&](const Arg& a) {
      --uses[a.ref];
      const std::string& t = g.nodes[a.ref].target;
      if (t == "aten::detach.default" || t == "aten::alias.default") candidates.insert(a.ref);
    });
  }
}

std::string chain_names(const Graph& g, std::vector<int> nodes) {
  std::sort(nodes.begin(), nodes.end());
  std::string s;
  for (int m : nodes) s += " %" + g.nodes[m].name;
  return s;
}

Node call_node(const Node& like, const char* target, std::vector<Arg> args) {
  Node n;
  n.name = like.name;
  n.op = OpKind::CallFunction;
  n.target = target;
  n.args = std::move(args);
  n.type = like.type;
  inherit_hints(n, like);
  return n;
}

std::vector<int> use_counts(const Graph& g) {
  std::vector<int> uses(g.nodes.size(), 0);
  for (const Node& n : g.nodes) n.for_each_input([&](const Arg& a) { ++uses[a.ref]; });
  return uses;
}

// Fuses the first backward chain of g; false when there is none. Backward chains go first: a
// recomputing one stops reading the softmax, which the forward round then fuses without its float32
// result.
bool fuse_one_backward(Graph& g, std::vector<std::string>& notes) {
  const std::vector<int> uses = use_counts(g);
  const std::vector<std::vector<int>> users = g.users();
  std::optional<BackwardChain> c;
  for (int i = 0; i < static_cast<int>(g.nodes.size()) && !c; ++i) c = match_backward(g, i, uses, users);
  if (!c) return false;
  const Node& last = g.nodes[c->last];
  const Arg grad = Arg::of_ref(c->grad, g.nodes[c->grad].name);
  std::vector<int> chain = c->absorbed;
  chain.push_back(c->last);
  std::string what;
  Node fused;
  if (c->recompute) {
    const int x = c->recompute->x;
    fused = call_node(last, kRowSoftmaxRecomputeBackwardTarget,
                      {grad, Arg::of_ref(x, g.nodes[x].name), scale_arg(c->recompute->scale), scale_arg(c->scale),
                       Arg::of_dtype(last.type.tensor.dtype)});
    what = "row_softmax_recompute_backward(%" + g.nodes[c->grad].name + ", %" + g.nodes[x].name + ")";
  } else {
    fused = call_node(last, kRowSoftmaxBackwardTarget,
                      {grad, Arg::of_ref(c->y, g.nodes[c->y].name), scale_arg(c->scale),
                       Arg::of_dtype(last.type.tensor.dtype)});
    what = "row_softmax_backward(%" + g.nodes[c->grad].name + ", %" + g.nodes[c->y].name + ")";
  }
  notes.push_back("row-softmax-fusion graph " + g.name + ": %" + last.name + " = " + what + " from" +
                  chain_names(g, chain));
  std::vector<bool> keep(g.nodes.size(), true);
  for (int m : c->absorbed) keep[m] = false;
  g.nodes[c->last] = std::move(fused);
  if (c->recompute) drop_dead(g, {c->y}, keep);
  remove_nodes(g, keep);
  return true;
}

// Fuses the first forward chain of g; false when there is none.
bool fuse_one_forward(Graph& g, std::vector<std::string>& notes) {
  const std::vector<int> uses = use_counts(g);
  std::optional<ForwardChain> found;
  for (int i = 0; i < static_cast<int>(g.nodes.size()) && !found; ++i) found = match_forward(g, i, uses);
  if (!found) return false;
  const ForwardChain& c = *found;
  const std::vector<std::vector<int>> users = g.users();
  const Node s = g.nodes[c.softmax];
  int down = -1, others = 0;
  for (int u : users[c.softmax]) {
    if (down < 0 && is_low(c.t) && plain_cast_source(g, g.nodes[u]) == c.softmax && is_tensor(g.nodes[u], c.t) &&
        g.nodes[u].hints.region == s.hints.region)
      down = u;
    else
      ++others;
  }
  const Arg x = Arg::of_ref(c.x, g.nodes[c.x].name);
  std::vector<int> chain = c.absorbed;
  chain.push_back(c.softmax);
  if (down >= 0) chain.push_back(down);
  const std::string from = " from" + chain_names(g, chain);
  const std::string prefix = "row-softmax-fusion graph " + g.name + ": %";
  if (down >= 0 && others > 0) {  // both: one call, the pair read by getitems under the old names
    Node call = call_node(s, kRowSoftmax2Target, {x, scale_arg(c.scale)});
    call.name = unique_name(g, s.name + "_rows");
    call.type = ValueType{};
    call.type.kind = ValueType::Kind::Tuple;
    call.type.elems = {s.type, g.nodes[down].type};
    notes.push_back(prefix + call.name + " = row_softmax2(%" + g.nodes[c.x].name + ")" + from);
    const std::string call_name = call.name;
    // Inserted before the softmax (its input and the absorbed nodes come earlier and keep their
    // indices); the softmax and the downcast move up by one and become the getitems.
    const int at = insert_node(g, c.softmax, std::move(call));
    for (const auto& [node, k] : {std::pair<int, int>{c.softmax + 1, 0}, {down + 1, 1}}) {
      Node& v = g.nodes[node];
      v.target = "operator::getitem";
      v.args = {Arg::of_ref(at, call_name), Arg::of_int(k)};
      v.kwargs.clear();
    }
    std::vector<bool> keep(g.nodes.size(), true);
    for (int m : c.absorbed) keep[m] = false;
    remove_nodes(g, keep);
    return true;
  }
  std::vector<bool> keep(g.nodes.size(), true);
  for (int m : c.absorbed) keep[m] = false;
  if (down >= 0) {  // only the downcast is read: one T result
    Node& d = g.nodes[down];
    notes.push_back(prefix + d.name + " = row_softmax(%" + g.nodes[c.x].name + ")" + from);
    d = call_node(d, kRowSoftmaxTarget, {x, scale_arg(c.scale), Arg::of_dtype(c.t)});
    keep[c.softmax] = false;
  } else {  // the float32 softmax only
    notes.push_back(prefix + s.name + " = row_softmax(%" + g.nodes[c.x].name + ")" + from);
    g.nodes[c.softmax] = call_node(s, kRowSoftmaxTarget, {x, scale_arg(c.scale), Arg::of_dtype(DType::Float32)});
  }
  remove_nodes(g, keep);
  return true;
}

// Whether storage `root` (storage_nodes) is a fresh intermediate of g that only the nodes in `allowed`
// read, apart from its own aliases: so an op may overwrite it once those have read it. The output node
// reading it (through any alias) rules it out like any other reader.
bool private_storage(const Graph& g, const std::vector<int>& base, int root, const std::set<int>& allowed) {
  const Node& r = g.nodes[root];
  if (r.op != OpKind::CallFunction || r.type.kind != ValueType::Kind::Tensor) return false;
  for (int j = 0; j < static_cast<int>(g.nodes.size()); ++j) {
    if (allowed.count(j) || (base[j] == root && j != root && g.nodes[j].op == OpKind::CallFunction)) continue;
    bool reads = false;
    g.nodes[j].for_each_input([&](const Arg& a) { reads |= base[a.ref] == root; });
    if (reads) return false;
  }
  return true;
}

// A recomputing gradient kernel and a row_softmax of the same scores (the probabilities a DFS backward
// recomputes for dv = P^T @ dO): when nothing else reads the scores or the gradient, one kernel reads
// both once and overwrites them, the gradient with ds and the scores with P (no new S x S buffer:
// a slice keeps two). The probabilities become an alias of the scores, read after the kernel; their
// readers that came before it move right after it. None of them may feed it (checked).
bool merge_one_recompute(Graph& g, std::vector<std::string>& notes) {
  const int n = static_cast<int>(g.nodes.size());
  const std::vector<int> base = storage_nodes(g);
  for (int r = 0; r < n; ++r) {
    const Node& rb = g.nodes[r];
    if (rb.target != kRowSoftmaxRecomputeBackwardTarget || rb.args.size() != 5) continue;
    const int grad = rb.args[0].ref, x = rb.args[1].ref;
    if (rb.args[4].dtype != g.nodes[grad].type.tensor.dtype || base[grad] == base[x]) continue;
    for (int p = 0; p < r; ++p) {
      const Node& sm = g.nodes[p];
      if (sm.target != kRowSoftmaxTarget || sm.args.size() != 3 || sm.args[0].ref != x ||
          sm.args[2].dtype != g.nodes[x].type.tensor.dtype || sm.args[1].kind != rb.args[2].kind ||
          (sm.args[1].kind == Arg::Kind::Float && sm.args[1].f != rb.args[2].f) || sm.hints.region != rb.hints.region)
        continue;
      if (!private_storage(g, base, base[x], {p, r}) || !private_storage(g, base, base[grad], {r}))
        continue;
      // Everything that reads the probabilities, directly or not; none may be something r reads.
      std::vector<bool> from_p(n, false);
      from_p[p] = true;
      for (int i = p + 1; i < n; ++i) g.nodes[i].for_each_input([&](const Arg& a) { from_p[i] = from_p[i] || from_p[a.ref]; });
      if (from_p[r]) continue;
      notes.push_back("row-softmax-fusion graph " + g.name + ": %" + rb.name + " = row_softmax_recompute_backward_(%" +
                      g.nodes[grad].name + ", %" + g.nodes[x].name + ") overwrites them with ds and %" + sm.name +
                      " (P, now an alias of %" + g.nodes[x].name + ")");
      Node& k = g.nodes[r];
      k.target = kRowSoftmaxRecomputeBackwardInPlaceTarget;
      k.args.pop_back();  // the dtype: grad's
      k.effects.mutates = true;
      Node& pv = g.nodes[p];
      pv.target = "aten::alias.default";
      pv.args = {Arg::of_ref(x, g.nodes[x].name)};
      pv.kwargs.clear();
      pv.effects.is_view = true;
      // New order: the kernel where r was, then P's readers that ran before it (P first).
      std::vector<int> order;
      for (int i = 0; i < n; ++i) {
        if (i < r && from_p[i]) continue;
        order.push_back(i);
        if (i == r)
          for (int j = 0; j < r; ++j)
            if (from_p[j]) order.push_back(j);
      }
      reorder_nodes(g, order);
      return true;
    }
  }
  return false;
}

bool fuse_graph(Graph& g, PassContext& ctx) {
  bool changed = for_each_slice_body(g, [&](Graph& body) { return fuse_graph(body, ctx); });
  std::vector<std::string> notes;
  while (fuse_one_backward(g, notes)) changed = true;
  while (fuse_one_forward(g, notes)) changed = true;
  while (merge_one_recompute(g, notes)) changed = true;
  for (std::string& s : notes) ctx.notes.push_back(std::move(s));
  return changed;
}

}  // namespace

bool row_softmax_fusion(Graph& g, PassContext& ctx) { return fuse_graph(g, ctx); }

}  // namespace hb

#include "passes/FoldCrossEntropyForward.h"

#include <algorithm>
#include <optional>

#include "backend/ir/GraphEdit.h"
#include "passes/SliceSchedule.h"
#include "passes/SoftmaxUpcast.h"

namespace hb {
namespace {

bool is_ref(const Arg& a) { return a.kind == Arg::Kind::Ref; }

// amax(%lsm, [1] or [-1], true): the row maxima save-logsumexp adds.
bool is_row_max_of(const Node& n, int lsm) {
  if (n.target != "aten::amax.default" || n.op != OpKind::CallFunction || n.args.size() != 3 || !n.kwargs.empty() ||
      !is_ref(n.args[0]) || n.args[0].ref != lsm || n.args[2].kind != Arg::Kind::Bool || !n.args[2].b)
    return false;
  const Arg& dims = n.args[1];
  return dims.kind == Arg::Kind::List && dims.items.size() == 1 && dims.items[0].kind == Arg::Kind::Int &&
         (dims.items[0].i == 1 || dims.items[0].i == -1);
}

struct Fold {
  int nll = -1;
  int lsm = -1;
  int operand = -1;                // what the op reads: the logits before their upcast, or x
  std::vector<int> chain;          // the upcast and views between operand and lsm: removed
  std::vector<int> row_maxima;     // amax nodes: become getitem(nll, 2)
  int64_t rows = 0;
};

std::optional<Fold> match(const Graph& g, int i, const std::vector<std::vector<int>>& readers) {
  const Node& nll = g.nodes[i];
  // self, target, weight, reduction, ignore_index
  if (nll.target != "aten::nll_loss_forward.default" || nll.op != OpKind::CallFunction || nll.args.size() != 5 ||
      !nll.kwargs.empty() || !is_ref(nll.args[0]) || !is_ref(nll.args[1]) || nll.args[2].kind != Arg::Kind::None ||
      nll.args[3].kind != Arg::Kind::Int || nll.args[3].i < 0 || nll.args[3].i > 2 ||
      nll.args[4].kind != Arg::Kind::Int || nll.type.kind != ValueType::Kind::Tuple || nll.type.elems.size() != 2)
    return std::nullopt;
  Fold f;
  f.nll = i;
  f.lsm = nll.args[0].ref;
  const Node& lsm = g.nodes[f.lsm];
  if (lsm.target != "aten::_log_softmax.default" || lsm.op != OpKind::CallFunction || lsm.args.size() != 3 ||
      !lsm.kwargs.empty() || !is_ref(lsm.args[0]) || lsm.args[1].kind != Arg::Kind::Int ||
      (lsm.args[1].i != 1 && lsm.args[1].i != -1) || lsm.args[2].kind != Arg::Kind::Bool ||
      lsm.type.kind != ValueType::Kind::Tensor)
    return std::nullopt;
  // half_to_float (fold-softmax-upcast's, on CUDA): the op upcasts its fp16 input the same way.
  const bool half_to_float = lsm.args[2].b;
  const TensorType& lt = lsm.type.tensor;
  const TensorType* target = g.tensor_type(nll.args[1]);
  if (lt.shape.size() != 2 || !lt.contiguous_static() || !is_floating(lt.dtype) || !target || target->dtype != DType::Int64 ||
      target->shape.size() != 1 || target->shape[0] != lt.shape[0])
    return std::nullopt;
  // lsm: read by the loss once and by row maxima whose readers all come after the loss.
  int loss_reads = 0;
  for (int r : readers[f.lsm]) {
    if (r == i) {
      ++loss_reads;
    } else if (is_row_max_of(g.nodes[r], f.lsm)) {
      for (int rr : readers[r])
        if (rr <= i) return std::nullopt;
      if (std::find(f.row_maxima.begin(), f.row_maxima.end(), r) == f.row_maxima.end()) f.row_maxima.push_back(r);
    } else {
      return std::nullopt;
    }
  }
  if (loss_reads != 1) return std::nullopt;
  // The upcast: views, then one dtype conversion, each read by nothing but the next step.
  int x = lsm.args[0].ref;
  f.operand = x;
  std::vector<int> chain;
  for (int n = x; !half_to_float && readers[n].size() == 1;) {
    const Node& v = g.nodes[n];
    if (v.op != OpKind::CallFunction) break;
    chain.push_back(n);
    if ((v.target == "aten::view.default" || v.target == "aten::_unsafe_view.default") && !v.args.empty() &&
        is_ref(v.args[0])) {
      n = v.args[0].ref;
      continue;
    }
    // The op reshapes its input to [N, C]: the logits must be contiguous with C last.
    const int src = plain_cast_source(g, v);
    if (src >= 0) {
      const TensorType& st = g.nodes[src].type.tensor;
      if (v.type.tensor.dtype == lt.dtype && is_floating(st.dtype) && st.contiguous_static() && !st.shape.empty() &&
          st.shape.back() == lt.shape[1]) {
        f.operand = src;
        f.chain = chain;
      }
    }
    break;
  }
  const TensorType* xt = g.tensor_type(Arg::of_ref(f.operand, ""));
  if (!xt || !xt->contiguous_static() || !is_floating(xt->dtype)) return std::nullopt;
  f.rows = cross_entropy_chunk_rows(lt.shape[0].value, lt.shape[1].value, dtype_bytes(lt.dtype));
  return f;
}

bool fold_graph(Graph& g, PassContext& ctx) {
  bool changed = for_each_slice_body(g, [&](Graph& body) { return fold_graph(body, ctx); });
  std::vector<std::vector<int>> readers(g.nodes.size());
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    g.nodes[i].for_each_input([&](const Arg& a) { readers[a.ref].push_back(i); });
  std::vector<bool> keep(g.nodes.size(), true);
  std::vector<bool> moved(g.nodes.size(), false);
  std::vector<std::vector<int>> behind(g.nodes.size());  // per loss: its row maxima, which move behind it
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const std::optional<Fold> f = match(g, i, readers);
    if (!f) continue;
    Node& nll = g.nodes[i];
    const TensorType& lt = g.nodes[f->lsm].type.tensor;
    auto name = [&](int n) { return "%" + g.nodes[n].name; };
    std::string note = "fold-cross-entropy-forward graph " + g.name + ": %" + nll.name + " = cross_entropy_forward(" +
                       name(f->operand) + ", " + name(nll.args[1].ref) + "), " + nll_reduction_name(nll.args[3].i) + ", " +
                       std::to_string(f->rows) + " rows a chunk";
    // The op in place of the loss: its name, hints and first two results stay; the row maxima are its third.
    TensorType row_max = lt;
    row_max.shape = {lt.shape[0], Dim{1, ""}};
    row_max.stride = {Dim{1, ""}, Dim{1, ""}};
    ValueType third;
    third.kind = ValueType::Kind::Tensor;
    third.tensor = row_max;
    nll.type.elems.push_back(third);
    nll.target = kCrossEntropyForwardTarget;
    nll.args = {Arg::of_ref(f->operand, g.nodes[f->operand].name), nll.args[1], nll.args[3], nll.args[4],
                Arg::of_dtype(lt.dtype), Arg::of_int(f->rows)};
    for (int r : f->row_maxima) {
      Node& m = g.nodes[r];
      note += (r == f->row_maxima.front() ? "; " : ", ") + name(r);
      m.target = "operator::getitem";
      m.args = {Arg::of_ref(i, nll.name), Arg::of_int(2)};
      m.kwargs.clear();
      moved[r] = true;
      behind[i].push_back(r);
    }
    if (!f->row_maxima.empty()) note += " = its row maxima";
    std::vector<int> removed = f->chain;
    removed.push_back(f->lsm);
    std::sort(removed.begin(), removed.end());
    for (size_t k = 0; k < removed.size(); ++k) {
      keep[removed[k]] = false;
      note += (k == 0 ? "; " : k + 1 == removed.size() ? " and " : ", ") + name(removed[k]);
    }
    ctx.notes.push_back(note + " removed");
    changed = true;
  }
  // Row maxima that came before their loss move right behind it (their readers all come later).
  if (!changed) return false;
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    if (moved[i]) continue;
    order.push_back(i);
    order.insert(order.end(), behind[i].begin(), behind[i].end());
  }
  reorder_nodes(g, order);
  std::vector<bool> kept(g.nodes.size());
  for (size_t k = 0; k < order.size(); ++k) kept[k] = keep[order[k]];
  remove_nodes(g, kept);
  return changed;
}

}  // namespace

bool fold_cross_entropy_forward(Graph& g, PassContext& ctx) { return fold_graph(g, ctx); }

}  // namespace hb

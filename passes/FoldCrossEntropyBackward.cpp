#include "passes/FoldCrossEntropyBackward.h"

#include <optional>

#include "backend/ir/GraphEdit.h"
#include "passes/SliceSchedule.h"
#include "passes/SoftmaxUpcast.h"

namespace hb {
namespace {

bool is_ref(const Arg& a) { return a.kind == Arg::Kind::Ref; }
// float32 and float64; float16 and bfloat16 too: the op computes those in float32 and rounds once (one
// kernel on CUDA, chunks of rows elsewhere), as ATen's log-softmax gradient does.
bool foldable(const TensorType& t) {
  return t.dtype == DType::Float32 || t.dtype == DType::Float64 || t.dtype == DType::Float16 ||
         t.dtype == DType::BFloat16;
}

// A row-major [N, C] tensor type (symbolic sizes compare by their expression).
bool rows_contiguous(const TensorType& t) {
  if (t.shape.size() != 2 || t.stride.size() != 2) return false;
  const Dim one{1, ""};
  return (t.stride[1] == one || t.shape[1] == one) && (t.stride[0] == t.shape[1] || t.shape[0] == one);
}

struct Fold {
  int grad = -1;  // the log-softmax gradient: becomes the folded op
  int nll = -1;   // nll_loss_backward: removed
  int add = -1;   // the logits form: lsm = add(sub(logits, m), a), removed with its sub (the op reads the operands)
};

// [N, 1] in `dtype` on `device`, one element per row (stride 1 between rows).
bool row_column(const TensorType* t, const TensorType& out) {
  const Dim one{1, ""};
  return t && t->dtype == out.dtype && t->device == out.device && t->shape.size() == 2 && t->shape[0] == out.shape[0] &&
         t->shape[1] == one && t->stride.size() == 2 && (t->stride[0] == one || t->shape[0] == one);
}

// The logits form: `lsm` is aten::add.Tensor(aten::sub.Tensor(logits, m), a), read by nothing but the
// gradient pair (2 uses; the sub by nothing but the add), with logits [N, C] row-major of any float dtype
// (the partition's rewrite subtracts the float32 row maximum from the bf16 logits themselves) and m, a
// [N, 1] of the gradient's dtype. Returns the add's index or -1.
int logits_form(const Graph& g, int lsm, const TensorType& out, const std::vector<int>& uses) {
  auto binary = [&](int i, const char* target) {
    const Node& n = g.nodes[i];
    return n.target == target && n.op == OpKind::CallFunction && n.args.size() == 2 && n.kwargs.empty() &&
           is_ref(n.args[0]) && is_ref(n.args[1]);
  };
  if (!binary(lsm, "aten::add.Tensor") || uses[lsm] != 2) return -1;
  const int sub = g.nodes[lsm].args[0].ref;
  if (!binary(sub, "aten::sub.Tensor") || uses[sub] != 1) return -1;
  const TensorType* x = g.tensor_type(g.nodes[sub].args[0]);
  if (!x || x->shape != out.shape || !rows_contiguous(*x) || !is_floating(x->dtype) || x->device != out.device ||
      !row_column(g.tensor_type(g.nodes[sub].args[1]), out) || !row_column(g.tensor_type(g.nodes[lsm].args[1]), out))
    return -1;
  return lsm;
}

// `i` is a log-softmax gradient over dim 1 whose grad_output is an nll_loss_backward we can fold.
std::optional<Fold> match(const Graph& g, int i, const std::vector<int>& uses) {
  const Node& n = g.nodes[i];
  if (n.target != "aten::_log_softmax_backward_data.default" || n.args.size() != 4 || !n.kwargs.empty() ||
      !is_ref(n.args[0]) || !is_ref(n.args[1]) || n.args[2].kind != Arg::Kind::Int ||
      n.args[3].kind != Arg::Kind::DType || n.type.kind != ValueType::Kind::Tensor)
    return std::nullopt;
  const TensorType& out = n.type.tensor;
  if (!rows_contiguous(out) || !foldable(out) || n.args[3].dtype != out.dtype ||
      (n.args[2].i != 1 && n.args[2].i != -1))
    return std::nullopt;
  const int nll = n.args[0].ref;
  const Node& l = g.nodes[nll];
  // grad_output, self, target, weight, reduction, ignore_index, total_weight
  if (l.target != "aten::nll_loss_backward.default" || l.args.size() != 7 || !l.kwargs.empty() || uses[nll] != 1 ||
      l.op != OpKind::CallFunction)
    return std::nullopt;
  const Arg &t = l.args[0], &target = l.args[2], &weight = l.args[3], &reduction = l.args[4], &ignore = l.args[5],
            &total = l.args[6];
  if (!is_ref(t) || !is_ref(target) || weight.kind != Arg::Kind::None || reduction.kind != Arg::Kind::Int ||
      reduction.i < 0 || reduction.i > 2 || ignore.kind != Arg::Kind::Int || !is_ref(total))
    return std::nullopt;
  const TensorType *tt = g.tensor_type(t), *yt = g.tensor_type(target), *wt = g.tensor_type(total),
                   *lt = g.tensor_type(n.args[1]);
  if (!tt || !yt || !wt || !lt || l.type.kind != ValueType::Kind::Tensor) return std::nullopt;
  const TensorType& nt = l.type.tensor;
  // One [N, C] shape and float dtype for nll, lsm2 and the result; targets [N] int64; total_weight a scalar.
  if (nt.shape != out.shape || lt->shape != out.shape || nt.dtype != out.dtype || lt->dtype != out.dtype ||
      nt.device != out.device || lt->device != out.device)
    return std::nullopt;
  if (yt->dtype != DType::Int64 || yt->shape.size() != 1 || yt->shape[0] != out.shape[0] || !wt->shape.empty() ||
      wt->dtype != out.dtype || tt->dtype != out.dtype)
    return std::nullopt;
  // The tangent: a scalar for mean and sum, one per row for none.
  if (reduction.i == 0 ? (tt->shape.size() != 1 || tt->shape[0] != out.shape[0]) : !tt->shape.empty())
    return std::nullopt;
  Fold f{i, nll};
  if (l.args[1].kind == Arg::Kind::Ref && l.args[1].ref == n.args[1].ref) f.add = logits_form(g, n.args[1].ref, out, uses);
  return f;
}

// The logits form's gradient, read only through views and then one conversion to another float dtype (a
// bf16 model's gradient going back to its logits' dtype): that conversion's index, with the views
// between in `chain`; else -1. Its type must be contiguous (the op writes it whole).
int gradient_conversion(const Graph& g, int grad, const std::vector<std::vector<int>>& readers, std::vector<int>& chain) {
  for (int n = grad; readers[n].size() == 1;) {
    const int r = readers[n][0];
    const Node& v = g.nodes[r];
    if (v.op != OpKind::CallFunction || v.args.empty() || !is_ref(v.args[0]) || v.args[0].ref != n ||
        v.type.kind != ValueType::Kind::Tensor)
      return -1;
    if (v.target == "aten::view.default" || v.target == "aten::_unsafe_view.default") {
      chain.push_back(r);
      n = r;
      continue;
    }
    const TensorType& t = v.type.tensor;
    if (plain_cast_source(g, v) != n || !t.contiguous_static() || !is_floating(t.dtype)) return -1;
    return r;
  }
  return -1;
}

bool fold_graph(Graph& g, PassContext& ctx) {
  bool changed = for_each_slice_body(g, [&](Graph& body) { return fold_graph(body, ctx); });
  std::vector<int> uses(g.nodes.size(), 0);
  std::vector<std::vector<int>> readers(g.nodes.size());
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    g.nodes[i].for_each_input([&](const Arg& a) {
      ++uses[a.ref];
      readers[a.ref].push_back(i);
    });
  std::vector<bool> keep(g.nodes.size(), true);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const std::optional<Fold> f = match(g, i, uses);
    if (!f) continue;
    const Node l = g.nodes[f->nll];
    Node& n = g.nodes[f->grad];
    const Arg lsm = n.args[1];
    auto name = [&](const Arg& a) { return "%" + g.nodes[a.ref].name; };
    const int sub = f->add >= 0 ? g.nodes[f->add].args[0].ref : -1;
    const std::string removed =
        "%" + l.name + (sub >= 0 ? ", %" + g.nodes[sub].name + " and %" + g.nodes[f->add].name : "") + " removed";
    // In place of the gradient node (every input comes before nll, which comes before it): its name,
    // type and hints stay.
    if (sub >= 0) {
      const Arg logits = g.nodes[sub].args[0], row_max = g.nodes[sub].args[1], lsm_max = g.nodes[f->add].args[1];
      ctx.notes.push_back("fold-cross-entropy-backward graph " + g.name + ": %" + n.name +
                          " = cross_entropy_backward.logits(" + name(l.args[0]) + ", " + name(logits) + ", " +
                          name(row_max) + ", " + name(lsm_max) + ", " + name(l.args[2]) + "), " +
                          nll_reduction_name(l.args[4].i) + ", " + removed);
      n.target = kCrossEntropyBackwardLogitsTarget;
      n.args = {l.args[0], logits, row_max, lsm_max, l.args[2], l.args[4], l.args[5], l.args[6]};
      keep[f->add] = keep[sub] = false;
      // The gradient's conversion back to the logits' dtype: the op writes that result (its dtype and
      // shape) and the views and conversion go; their readers read the op.
      std::vector<int> chain;
      const int conv = gradient_conversion(g, f->grad, readers, chain);
      if (conv >= 0) {
        const ValueType type = g.nodes[conv].type;
        Arg shape;
        shape.kind = Arg::Kind::List;
        for (const Dim& d : type.tensor.shape) shape.items.push_back(Arg::of_int(d.value));
        n.args.push_back(Arg::of_dtype(type.tensor.dtype));
        n.args.push_back(shape);
        n.type = type;
        chain.push_back(conv);
        for (int k : chain) keep[k] = false;
        for (int r : readers[conv]) {
          auto rewire = [&](Arg& a) {
            if (a.ref == conv) {
              a.ref = f->grad;
              a.s = n.name;
            }
          };
          for (Arg& a : g.nodes[r].args) a.for_each_ref_mut(rewire);
          for (auto& kv : g.nodes[r].kwargs) kv.second.for_each_ref_mut(rewire);
        }
        std::string note = "; it writes %" + g.nodes[conv].name + "'s " + dtype_name(type.tensor.dtype) + " value: ";
        for (size_t k = 0; k < chain.size(); ++k)
          note += (k == 0 ? "%" : k + 1 == chain.size() ? " and %" : ", %") + g.nodes[chain[k]].name;
        ctx.notes.back() += note + " removed";
      }
    } else {
      ctx.notes.push_back("fold-cross-entropy-backward graph " + g.name + ": %" + n.name + " = cross_entropy_backward(" +
                          name(l.args[0]) + ", " + name(lsm) + ", " + name(l.args[2]) + "), " +
                          nll_reduction_name(l.args[4].i) + ", " + removed);
      n.target = kCrossEntropyBackwardTarget;
      n.args = {l.args[0], lsm, l.args[2], l.args[4], l.args[5], l.args[6]};
    }
    keep[f->nll] = false;
    changed = true;
  }
  remove_nodes(g, keep);
  return changed;
}

}  // namespace

bool fold_cross_entropy_backward(Graph& g, PassContext& ctx) { return fold_graph(g, ctx); }

}  // namespace hb

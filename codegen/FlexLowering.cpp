#include "codegen/FlexLowering.h"

#include <algorithm>
#include <map>
#include <vector>

namespace hb {

std::string to_string(const FlexBand& b) {
  const int64_t inf = FlexBand::kNoBound;
  if (b.unbounded()) return "no mask";
  if (b.lo == 0 && b.hi == inf) return "causal";
  if (b.lo == 0) return "causal window " + std::to_string(b.hi + 1);
  return "band [" + (b.lo == -inf ? std::string("-inf") : std::to_string(b.lo)) + ", " +
         (b.hi == inf ? std::string("inf") : std::to_string(b.hi)) + "]";
}

namespace {

constexpr int64_t kInf = FlexBand::kNoBound;

// An abstract value of the mask graph: an integer affine in q_idx and kv_idx (a*q + c*kv + k), or a
// boolean that holds exactly on a band of d = q - kv, or unknown (with why).
struct Val {
  enum class K { Unknown, Affine, Bool } k = K::Unknown;
  int64_t a = 0, c = 0, k0 = 0;  // Affine
  FlexBand band;                 // Bool
  std::string why;               // Unknown
};

Val unknown(std::string why) { return Val{Val::K::Unknown, 0, 0, 0, {}, std::move(why)}; }
Val affine(int64_t a, int64_t c, int64_t k) { return Val{Val::K::Affine, a, c, k, {}, ""}; }
Val boolean(FlexBand b) { return Val{Val::K::Bool, 0, 0, 0, b, ""}; }

std::string op_of(const std::string& target) {  // "aten::ge.Tensor" -> "ge"
  const size_t ns = target.find("::");
  const size_t start = ns == std::string::npos ? 0 : ns + 2;
  const size_t dot = target.find('.', start);
  return target.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
}

// {lo, hi} intersections, with a fully empty band kept as lo > hi.
FlexBand intersect(const FlexBand& x, const FlexBand& y) {
  FlexBand b;
  b.lo = std::max(x.lo, y.lo);
  b.hi = std::min(x.hi, y.hi);
  return b;
}

// x (cmp) y, both affine: a band when x - y = s * (q - kv) + k with s = +-1.
Val compare(const std::string& op, const Val& x, const Val& y) {
  if (x.k == Val::K::Unknown) return x;
  if (y.k == Val::K::Unknown) return y;
  if (x.k != Val::K::Affine || y.k != Val::K::Affine) return unknown("compares booleans");
  int64_t a = x.a - y.a, c = x.c - y.c, k = x.k0 - y.k0;
  if (a == 0 && c == 0) return unknown("compares constants");
  if (a != -c || (a != 1 && a != -1)) return unknown("compares q_idx and kv_idx other than through q_idx - kv_idx");
  // s*d + k (op) 0, s = a. Normalize to d + k' (op') 0 with s = +1.
  std::string o = op;
  if (a == -1) {
    k = -k;
    if (o == "ge") o = "le";
    else if (o == "gt") o = "lt";
    else if (o == "le") o = "ge";
    else if (o == "lt") o = "gt";
  }
  FlexBand b;
  if (o == "ge") b.lo = -k;                // d >= -k
  else if (o == "gt") b.lo = -k + 1;
  else if (o == "le") b.hi = -k;
  else if (o == "lt") b.hi = -k - 1;
  else if (o == "eq") b.lo = b.hi = -k;
  else return unknown("compares with '" + op + "'");
  return boolean(b);
}

bool constant_int(const Arg& a, int64_t* v) {
  if (a.kind == Arg::Kind::Int) *v = a.i;
  else if (a.kind == Arg::Kind::Bool) *v = a.b;
  else return false;
  return true;
}

}  // namespace

bool mask_band(const Graph& m, FlexBand* band, std::string* why) {
  std::vector<Val> val(m.nodes.size());
  int placeholder = 0;
  auto arg = [&](const Arg& a) -> Val {
    int64_t v = 0;
    if (a.kind == Arg::Kind::Ref) return val[a.ref];
    if (constant_int(a, &v)) return affine(0, 0, v);
    return unknown("a non-integer constant");
  };
  for (int i = 0; i < static_cast<int>(m.nodes.size()); ++i) {
    const Node& n = m.nodes[i];
    if (n.op == OpKind::Placeholder) {
      const int p = placeholder++;
      val[i] = p == 2 ? affine(1, 0, 0) : p == 3 ? affine(0, 1, 0)
               : unknown(p == 0 ? "reads the batch index" : p == 1 ? "reads the head index" : "reads a captured buffer");
      continue;
    }
    if (n.op == OpKind::Output) {
      const Arg& out = n.args.empty() ? Arg{} : (n.args[0].items.empty() ? n.args[0] : n.args[0].items[0]);
      const Val r = out.kind == Arg::Kind::Ref ? val[out.ref] : unknown("returns no value");
      if (r.k != Val::K::Bool) {
        *why = r.k == Val::K::Unknown ? r.why : "returns index arithmetic, not a comparison";
        return false;
      }
      if (r.band.lo > r.band.hi) {
        *why = "masks every score";
        return false;
      }
      *band = r.band;
      return true;
    }
    if (n.op != OpKind::CallFunction) {
      val[i] = unknown("reads a constant tensor");
      continue;
    }
    const std::string op = op_of(n.target);
    std::vector<Val> in;
    for (const Arg& a : n.args) in.push_back(arg(a));
    auto first_unknown = [&]() -> const Val* {
      for (const Val& v : in)
        if (v.k == Val::K::Unknown) return &v;
      return nullptr;
    };
    if (op == "new_ones" || op == "ones" || op == "ones_like") {
      val[i] = boolean(FlexBand{});
    } else if ((op == "full" || op == "new_full" || op == "scalar_tensor") && !n.args.empty()) {
      const Arg& fill = n.args.size() > 1 && op != "scalar_tensor" ? n.args[1] : n.args[0];
      int64_t v = 0;
      val[i] = constant_int(fill, &v) && v == 1 ? boolean(FlexBand{}) : unknown("a constant that is not true");
    } else if (op == "_to_copy" || op == "to" || op == "convert_element_type" || op == "clone" || op == "alias") {
      val[i] = in.empty() ? unknown("a conversion of nothing") : in[0];
    } else if (op == "ge" || op == "gt" || op == "le" || op == "lt" || op == "eq") {
      val[i] = in.size() == 2 ? compare(op, in[0], in[1]) : unknown("a comparison of " + std::to_string(in.size()));
    } else if (op == "bitwise_and" || op == "logical_and" || op == "__and__" || op == "and_" || op == "mul") {
      if (in.size() == 2 && in[0].k == Val::K::Bool && in[1].k == Val::K::Bool) val[i] = boolean(intersect(in[0].band, in[1].band));
      else if (op == "mul" && in.size() == 2 && in[0].k == Val::K::Affine && in[1].k == Val::K::Affine &&
               ((in[0].a == 0 && in[0].c == 0) || (in[1].a == 0 && in[1].c == 0))) {
        const Val& s = in[0].a == 0 && in[0].c == 0 ? in[0] : in[1];
        const Val& x = &s == &in[0] ? in[1] : in[0];
        val[i] = affine(x.a * s.k0, x.c * s.k0, x.k0 * s.k0);
      } else {
        const Val* u = first_unknown();
        val[i] = u ? *u : unknown("'" + op + "' of a boolean and an integer");
      }
    } else if (op == "add" || op == "sub") {
      int64_t alpha = 1;
      if (const Arg* al = n.kwarg("alpha")) constant_int(*al, &alpha);
      if (in.size() >= 2 && in[0].k == Val::K::Affine && in[1].k == Val::K::Affine) {
        const int64_t s = (op == "sub" ? -1 : 1) * alpha;
        val[i] = affine(in[0].a + s * in[1].a, in[0].c + s * in[1].c, in[0].k0 + s * in[1].k0);
      } else {
        const Val* u = first_unknown();
        val[i] = u ? *u : unknown("'" + op + "' of booleans");
      }
    } else if (op == "neg" && in.size() == 1 && in[0].k == Val::K::Affine) {
      val[i] = affine(-in[0].a, -in[0].c, -in[0].k0);
    } else {
      const Val* u = first_unknown();
      val[i] = u ? *u : unknown("computes '" + n.target + "'");
    }
  }
  *why = "has no output";
  return false;
}

FlexAnalysis analyze_flex(const Graph& g, int node) {
  FlexAnalysis r;
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  const size_t want = backward ? 14 : 9;
  if (n.args.size() != want) {
    r.mask_why = r.score_why = "malformed flex node";
    return r;
  }
  auto sub = [&](const Arg& a) -> const Graph* {
    if (a.kind != Arg::Kind::Graph) return nullptr;
    auto it = g.subgraphs.find(a.s);
    return it == g.subgraphs.end() ? nullptr : it->second.get();
  };
  const Arg& block_mask = n.args[backward ? 9 : 4];
  const Graph* mask = block_mask.items.empty() ? nullptr : sub(block_mask.items.back());
  if (!mask) r.mask_why = "no mask_mod graph";
  else r.band_ok = mask_band(*mask, &r.band, &r.mask_why);
  // score_mod: the forward's own graph (the backward's fw_graph is the same function).
  const Graph* score = sub(n.args[backward ? 7 : 3]);
  if (!score) {
    r.score_why = "no score_mod graph";
  } else {
    const int out = score->output_node();
    const std::vector<int> ph = score->placeholders();
    const Arg* ret = out >= 0 && !score->nodes[out].args.empty() ? &score->nodes[out].args[0] : nullptr;
    if (ret && !ret->items.empty()) ret = &ret->items[0];
    r.score_identity = ret && ret->kind == Arg::Kind::Ref && !ph.empty() && ret->ref == ph[0];
    if (!r.score_identity && ret && ret->kind == Arg::Kind::Ref && ph.size() >= 5) {
      // score + t, t reading neither the score nor kv_idx: a row shift.
      const Node& add = score->nodes[ret->ref];
      const Arg* alpha = add.kwarg("alpha");
      if (add.target == "aten::add.Tensor" && add.args.size() == 2 && (!alpha || (alpha->kind == Arg::Kind::Int && alpha->i == 1))) {
        for (int side = 0; side < 2 && !r.score_row_shift; ++side) {
          const Arg& s0 = add.args[side];
          const Arg& t = add.args[1 - side];
          if (s0.kind != Arg::Kind::Ref || s0.ref != ph[0]) continue;
          // t's inputs, transitively: none may be the score or kv_idx.
          std::vector<int> stack;
          if (t.kind == Arg::Kind::Ref) stack.push_back(t.ref);
          bool clean = true;
          std::vector<bool> seen(score->nodes.size(), false);
          while (!stack.empty() && clean) {
            const int i = stack.back();
            stack.pop_back();
            if (seen[i]) continue;
            seen[i] = true;
            if (i == ph[0] || i == ph[4]) clean = false;
            score->nodes[i].for_each_input([&](const Arg& a) { stack.push_back(a.ref); });
          }
          r.score_row_shift = clean;
        }
      }
    }
    if (!r.score_identity) {
      std::string ops;
      for (const Node& s : score->nodes)
        if (s.op == OpKind::CallFunction) ops += (ops.empty() ? "" : ", ") + s.target;
      r.score_why = "score_mod computes " + (ops.empty() ? std::string("a value other than the score") : ops);
    }
  }
  if (!backward) {
    const auto users = g.users();
    for (int u : users[node])
      if (g.nodes[u].target == "operator::getitem" && g.nodes[u].args.size() > 1 && g.nodes[u].args[1].i == 2)
        r.uses_max_scores = true;
  }
  return r;
}

std::string cudnn_why_not(const Graph& g, int node, const FlexAnalysis& a) {
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  if (n.args.size() != (backward ? 14u : 9u)) return "malformed flex node";
  auto tensor = [&](const Arg& arg) -> const TensorType* {
    if (arg.kind != Arg::Kind::Ref || g.nodes[arg.ref].type.kind != ValueType::Kind::Tensor) return nullptr;
    return &g.nodes[arg.ref].type.tensor;
  };
  const TensorType *q = tensor(n.args[0]), *k = tensor(n.args[1]), *v = tensor(n.args[2]);
  if (!q || !k || !v || q->shape.size() != 4 || k->shape.size() != 4 || v->shape.size() != 4)
    return "q, k, v are not [B, H, S, D] tensors";
  if (q->device.rfind("cuda", 0) != 0) return "on " + q->device + " (cuDNN runs on CUDA)";
  if (q->dtype != k->dtype || q->dtype != v->dtype || (q->dtype != DType::Float16 && q->dtype != DType::BFloat16))
    return std::string("q, k, v in ") + dtype_name(q->dtype) + " (cuDNN's SDPA takes float16 or bfloat16)";
  for (const TensorType* t : {q, k, v})
    for (const Dim& d : t->shape)
      if (!d.is_static()) return "a symbolic shape";
  const int64_t D = q->shape[3].value, Dv = v->shape[3].value, Hq = q->shape[1].value, Hkv = k->shape[1].value;
  if (D != Dv || D % 8 != 0 || D > 256) return "head dim " + std::to_string(D) + " (cuDNN: D = Dv, a multiple of 8 up to 256)";
  if (Hkv == 0 || Hq % Hkv != 0 || v->shape[1].value != Hkv) return "the heads of q are not a multiple of k's";
  for (const TensorType* t : {q, k, v})
    if (t->stride.size() == 4 && t->stride[3].value != 1) return "the head dim of q, k or v is not contiguous";
  if (!a.band_ok) return "mask_mod " + a.mask_why;
  if (!a.band.unbounded() && a.band.lo != 0) return "mask_mod is the band " + to_string(a.band) + ", not causal";
  if (!a.score_identity && !a.score_row_shift) return a.score_why;
  const Arg& score_bufs = n.args[backward ? 12 : 7];
  const Arg& mask_bufs = n.args[backward ? 13 : 8];
  if ((a.score_identity && !score_bufs.items.empty()) || !mask_bufs.items.empty()) return "captured buffers";
  if (a.uses_max_scores) return "max_scores is read (cuDNN does not return it)";
  if (backward && n.args[6].kind != Arg::Kind::None) return "the backward takes a logsumexp gradient";
  return "";
}

}  // namespace hb

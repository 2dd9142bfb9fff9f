#include "codegen/FlexLowering.h"

#include "codegen/FlexKernelAbi.h"

#include <algorithm>
#include <cmath>
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

// An abstract value of the mask graph: an integer affine in q_idx and kv_idx (a*q + c*kv + k), or a
// boolean that holds exactly on a band of d = q - kv, or unknown (with why).
// Also, for padding masks: the batch index, a captured buffer, and a buffer read at [b] (a per-batch
// length); a boolean may carry "and kv_idx < buffer pad[b]".
struct Val {
  enum class K { Unknown, Affine, Bool, Batch, Buffer, BufferOfB } k = K::Unknown;
  int64_t a = 0, c = 0, k0 = 0;  // Affine
  FlexBand band;                 // Bool
  std::string why;               // Unknown
  int buf = -1;                  // Buffer, BufferOfB: which captured buffer; Bool: the kv padding's (-1: none)
};

Val unknown(std::string why) { return Val{Val::K::Unknown, 0, 0, 0, {}, std::move(why)}; }
Val affine(int64_t a, int64_t c, int64_t k) { return Val{Val::K::Affine, a, c, k, {}, ""}; }
Val boolean(FlexBand b, int pad = -1) { return Val{Val::K::Bool, 0, 0, 0, b, "", pad}; }
Val special(Val::K k, int buf = -1) { return Val{k, 0, 0, 0, {}, "", buf}; }

// What an operand that is not index arithmetic or a boolean means to any op but the padding forms.
Val plain(const Val& v) {
  switch (v.k) {
    case Val::K::Batch: return unknown("reads the batch index");
    case Val::K::Buffer:
    case Val::K::BufferOfB: return unknown("reads a captured buffer");
    default: return v;
  }
}

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

// x (cmp) y, both affine: a band when x - y = s * (q - kv) + k with s = +-1. kv_idx < buf[b] (or
// buf[b] > kv_idx): no band, a kv padding by buf.
Val compare(const std::string& op, const Val& xv, const Val& yv) {
  const bool x_len = xv.k == Val::K::BufferOfB, y_len = yv.k == Val::K::BufferOfB;
  if (x_len != y_len) {
    const Val& idx = x_len ? yv : xv;
    const bool kv = idx.k == Val::K::Affine && idx.a == 0 && idx.c == 1 && idx.k0 == 0;
    if (kv && ((!x_len && op == "lt") || (x_len && op == "gt"))) return boolean(FlexBand{}, x_len ? xv.buf : yv.buf);
    return unknown("reads a captured buffer (other than as kv_idx < buf[b], a padding)");
  }
  const Val x = plain(xv), y = plain(yv);
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

namespace {

// Why a kv padding is not a band (its mask_why): the generated kernels and the reference take it as a
// mask_mod; cuDNN's path takes it as its padding mask.
constexpr const char* kPaddingIsNoBand = "reads a captured buffer (kv_idx < buf[b]: a padding, which only cuDNN's path takes)";

// mask_band's evaluation; *pad (when given) takes a kv padding, else a padding is not a band.
bool mask_eval(const Graph& m, FlexBand* band, int* pad, std::string* why) {
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
      val[i] = p == 2 ? affine(1, 0, 0) : p == 3 ? affine(0, 1, 0) : p == 0 ? special(Val::K::Batch)
               : p == 1 ? unknown("reads the head index") : special(Val::K::Buffer, p - 4);
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
      if (r.buf >= 0 && !pad) {
        *why = kPaddingIsNoBand;
        return false;
      }
      *band = r.band;
      if (pad) *pad = r.buf;
      return true;
    }
    if (n.op != OpKind::CallFunction) {
      val[i] = unknown("reads a constant tensor");
      continue;
    }
    const std::string op = op_of(n.target);
    std::vector<Val> in;
    for (const Arg& a : n.args) in.push_back(arg(a));
    // buf[b]: a per-batch value (a length); any other read of a buffer, or use of b, is unknown.
    if (op == "index" && n.args.size() == 2 && in[0].k == Val::K::Buffer && n.args[1].items.size() == 1 &&
        n.args[1].items[0].kind == Arg::Kind::Ref && val[n.args[1].items[0].ref].k == Val::K::Batch) {
      val[i] = special(Val::K::BufferOfB, in[0].buf);
      continue;
    }
    const bool comparison = op == "ge" || op == "gt" || op == "le" || op == "lt" || op == "eq";
    const bool conversion = op == "_to_copy" || op == "to" || op == "convert_element_type" || op == "clone" || op == "alias";
    if (!comparison && !(conversion && !in.empty() && in[0].k == Val::K::BufferOfB))
      for (Val& v : in) v = plain(v);
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
      if (in.size() == 2 && in[0].k == Val::K::Bool && in[1].k == Val::K::Bool) {
        const int p0 = in[0].buf, p1 = in[1].buf;
        val[i] = p0 >= 0 && p1 >= 0 && p0 != p1 ? unknown("pads kv_idx by two buffers")
                                                 : boolean(intersect(in[0].band, in[1].band), p0 >= 0 ? p0 : p1);
      }
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

}  // namespace

bool mask_band(const Graph& m, FlexBand* band, std::string* why) { return mask_eval(m, band, nullptr, why); }

bool mask_band_with_padding(const Graph& m, FlexBand* band, int* pad, std::string* why) {
  return mask_eval(m, band, pad, why);
}

std::string to_string(const FlexBiasLayout& l) {
  const std::string buf = "buf" + std::to_string(l.buffer);
  switch (l.kind) {
    case FlexBiasLayout::Kind::Grid: return "evaluated on the index grid";
    case FlexBiasLayout::Kind::Dense:
      return "dense " + buf + (l.has_batch ? "[b, h, q_idx, kv_idx]" : l.unit_batch ? "[0, h, q_idx, kv_idx]" : "[h, q_idx, kv_idx]");
    case FlexBiasLayout::Kind::Toeplitz: {
      std::string d = std::string(l.sign > 0 ? "q_idx - kv_idx" : "kv_idx - q_idx") +
                      (l.offset >= 0 ? " + " : " - ") + std::to_string(l.offset >= 0 ? l.offset : -l.offset);
      std::vector<std::string> idx(l.h_dim < 0 ? 1 : 2);
      idx[l.d_dim] = d;
      if (l.h_dim >= 0)
        idx[l.h_dim] = l.h_map < 0 ? std::string("h") : "buf" + std::to_string(l.h_map) + (l.h_map_reads_b ? "[b, h]" : "[h]");
      return "toeplitz " + buf + "[" + idx[0] + (idx.size() > 1 ? ", " + idx[1] : "") + "]";
    }
  }
  return "";
}

namespace {

// The node an Arg refers to through value-preserving casts (t.to(float32), a clone).
int through_casts(const Graph& g, int i) {
  while (i >= 0) {
    const Node& n = g.nodes[i];
    const std::string op = n.op == OpKind::CallFunction ? op_of(n.target) : "";
    if ((op == "_to_copy" || op == "to" || op == "clone" || op == "alias" || op == "lift_fresh_copy" || op == "detach") &&
        !n.args.empty() && n.args[0].kind == Arg::Kind::Ref)
      i = n.args[0].ref;
    else
      break;
  }
  return i;
}

// x as a * q_idx + c * kv_idx + k over the integer ops index arithmetic uses, or false.
bool affine_index(const Graph& g, const std::vector<int>& ph, const Arg& x, int64_t* a, int64_t* c, int64_t* k) {
  if (constant_int(x, k)) {
    *a = *c = 0;
    return true;
  }
  if (x.kind != Arg::Kind::Ref) return false;
  const int i = through_casts(g, x.ref);
  if (i == ph[3]) { *a = 1; *c = 0; *k = 0; return true; }
  if (i == ph[4]) { *a = 0; *c = 1; *k = 0; return true; }
  const Node& n = g.nodes[i];
  if (n.op != OpKind::CallFunction) return false;
  const std::string op = op_of(n.target);
  int64_t a0, c0, k0, a1, c1, k1;
  if ((op == "add" || op == "sub") && n.args.size() == 2 && affine_index(g, ph, n.args[0], &a0, &c0, &k0) &&
      affine_index(g, ph, n.args[1], &a1, &c1, &k1)) {
    int64_t alpha = 1;
    if (const Arg* al = n.kwarg("alpha"); al && !constant_int(*al, &alpha)) return false;
    const int64_t s = (op == "sub" ? -1 : 1) * alpha;
    *a = a0 + s * a1; *c = c0 + s * c1; *k = k0 + s * k1;
    return true;
  }
  if (op == "neg" && n.args.size() == 1 && affine_index(g, ph, n.args[0], &a0, &c0, &k0)) {
    *a = -a0; *c = -c0; *k = -k0;
    return true;
  }
  if (op == "mul" && n.args.size() == 2 && affine_index(g, ph, n.args[0], &a0, &c0, &k0) &&
      affine_index(g, ph, n.args[1], &a1, &c1, &k1)) {
    if (a0 == 0 && c0 == 0) { *a = a1 * k0; *c = c1 * k0; *k = k1 * k0; return true; }
    if (a1 == 0 && c1 == 0) { *a = a0 * k1; *c = c0 * k1; *k = k0 * k1; return true; }
  }
  return false;
}

// Whether a is placeholder p of g (ph: g's placeholders), through value-preserving casts.
bool reads_placeholder_arg(const Graph& g, const std::vector<int>& ph, const Arg& a, int p) {
  return a.kind == Arg::Kind::Ref && through_casts(g, a.ref) == ph[p];
}

// Whether x reads the head through a captured integer buffer, map[h] or map[b, h] (the DFS slice's
// global head, slice-schedule's index table): the buffer's number among the captured ones, else -1.
int head_map(const Graph& g, const std::vector<int>& ph, const Arg& x, bool* reads_b) {
  if (x.kind != Arg::Kind::Ref || ph.size() < 5) return -1;
  const Node& n = g.nodes[through_casts(g, x.ref)];
  if (n.op != OpKind::CallFunction || n.target != "aten::index.Tensor" || n.args.size() != 2 ||
      n.args[0].kind != Arg::Kind::Ref || n.args[1].kind != Arg::Kind::List)
    return -1;
  const std::vector<Arg>& idx = n.args[1].items;
  auto is_ph = [&](const Arg& a, int p) { return reads_placeholder_arg(g, ph, a, p); };
  const bool h_only = idx.size() == 1 && is_ph(idx[0], 2), bh = idx.size() == 2 && is_ph(idx[0], 1) && is_ph(idx[1], 2);
  if (!h_only && !bh) return -1;
  const auto at = std::find(ph.begin() + 5, ph.end(), n.args[0].ref);
  if (at == ph.end()) return -1;
  const ValueType& t = g.nodes[*at].type;
  if (t.kind != ValueType::Kind::Tensor || t.tensor.shape.size() != idx.size() ||
      (t.tensor.dtype != DType::Int64 && t.tensor.dtype != DType::Int32))
    return -1;
  *reads_b = bh;
  return static_cast<int>(at - ph.begin()) - 5;
}

// The layout of t (the score_mod's additive term, node `t`), as FlexBiasLayout describes.
FlexBiasLayout bias_layout(const Graph& g, int t) {
  FlexBiasLayout l;
  const std::vector<int> ph = g.placeholders();
  const int i = through_casts(g, t);
  const Node& n = g.nodes[i];
  if (n.op != OpKind::CallFunction || n.target != "aten::index.Tensor" || n.args.size() != 2 ||
      n.args[0].kind != Arg::Kind::Ref)
    return l;
  int buf = through_casts(g, n.args[0].ref);
  // bias[0, h, q_idx, kv_idx] of a [1, H, Sq, Skv] bias traces as select(bias, 0, 0) indexed by the rest.
  bool selected = false;
  if (const Node& sel = g.nodes[buf]; sel.op == OpKind::CallFunction && sel.target == "aten::select.int" &&
                                      sel.args.size() == 3 && sel.args[0].kind == Arg::Kind::Ref &&
                                      sel.args[1].kind == Arg::Kind::Int && sel.args[1].i == 0 &&
                                      sel.args[2].kind == Arg::Kind::Int && sel.args[2].i == 0) {
    const int base = through_casts(g, sel.args[0].ref);
    const ValueType& bty = g.nodes[base].type;
    if (bty.kind == ValueType::Kind::Tensor && !bty.tensor.shape.empty() && bty.tensor.shape[0].is_static() &&
        bty.tensor.shape[0].value == 1) {
      buf = base;
      selected = true;
    }
  }
  if (ph.size() < 5) return l;
  const auto at = std::find(ph.begin() + 5, ph.end(), buf);
  if (at == ph.end()) return l;
  const std::vector<Arg>& idx = n.args[1].items;
  const TensorType* bt = g.nodes[buf].type.kind == ValueType::Kind::Tensor ? &g.nodes[buf].type.tensor : nullptr;
  // every dim indexed: t is one element per grid point
  if (!bt || bt->shape.size() != idx.size() + (selected ? 1 : 0)) return l;
  if (selected && idx.size() != 3) return l;
  auto is_ph = [&](const Arg& a, int p) { return reads_placeholder_arg(g, ph, a, p); };
  const int buffer = static_cast<int>(at - ph.begin()) - 5;
  // bias[0, h, q_idx, kv_idx] may also trace as an index by a constant tensor: of a dim of size 1, the
  // only element it can read.
  const bool unit_dim0 = !bt->shape.empty() && bt->shape[0].is_static() && bt->shape[0].value == 1;
  if (!selected && unit_dim0 && idx.size() == 4 && idx[0].kind == Arg::Kind::Ref &&
      g.nodes[through_casts(g, idx[0].ref)].op == OpKind::GetAttr && is_ph(idx[1], 2) && is_ph(idx[2], 3) &&
      is_ph(idx[3], 4)) {
    l.kind = FlexBiasLayout::Kind::Dense;
    l.buffer = buffer;
    l.unit_batch = true;
    return l;
  }
  if ((idx.size() == 4 && is_ph(idx[0], 1) && is_ph(idx[1], 2) && is_ph(idx[2], 3) && is_ph(idx[3], 4)) ||
      (idx.size() == 3 && is_ph(idx[0], 2) && is_ph(idx[1], 3) && is_ph(idx[2], 4))) {
    l.kind = FlexBiasLayout::Kind::Dense;
    l.buffer = buffer;
    l.has_batch = idx.size() == 4;
    l.unit_batch = selected;
    return l;
  }
  if (idx.size() > 2) return l;
  for (int d = 0; d < static_cast<int>(idx.size()); ++d) {
    int64_t a = 0, c = 0, k = 0;
    bool map_reads_b = false;
    if (is_ph(idx[d], 2)) {
      if (l.h_dim >= 0) return FlexBiasLayout{};
      l.h_dim = d;
    } else if (const int m = head_map(g, ph, idx[d], &map_reads_b); m >= 0) {
      if (l.h_dim >= 0) return FlexBiasLayout{};
      l.h_dim = d;
      l.h_map = m;
      l.h_map_reads_b = map_reads_b;
    } else if (affine_index(g, ph, idx[d], &a, &c, &k) && a == -c && (a == 1 || a == -1) && l.d_dim < 0) {
      l.d_dim = d;
      l.sign = static_cast<int>(a);
      l.offset = k;
    } else {
      return FlexBiasLayout{};
    }
  }
  if (l.d_dim < 0) return FlexBiasLayout{};
  l.kind = FlexBiasLayout::Kind::Toeplitz;
  l.buffer = buffer;
  return l;
}

}  // namespace

bool score_pw_op(const std::string& target, ScorePw* op) {
  static const std::map<std::string, ScorePw> kOps = {
      {"aten::add.Tensor", ScorePw::Add},       {"aten::add.Scalar", ScorePw::Add},
      {"aten::sub.Tensor", ScorePw::Sub},       {"aten::sub.Scalar", ScorePw::Sub},
      {"aten::rsub.Scalar", ScorePw::Sub},      // handled as b - a by the runtime
      {"aten::mul.Tensor", ScorePw::Mul},       {"aten::mul.Scalar", ScorePw::Mul},
      {"aten::div.Tensor", ScorePw::Div},       {"aten::div.Scalar", ScorePw::Div},
      {"aten::neg.default", ScorePw::Neg},      {"aten::abs.default", ScorePw::Abs},
      {"aten::exp.default", ScorePw::Exp},      {"aten::log.default", ScorePw::Log},
      {"aten::tanh.default", ScorePw::Tanh},
      {"aten::sigmoid.default", ScorePw::Sigmoid},
      {"aten::maximum.default", ScorePw::Max},  {"aten::minimum.default", ScorePw::Min},
      {"aten::ge.Tensor", ScorePw::Ge},         {"aten::ge.Scalar", ScorePw::Ge},
      {"aten::gt.Tensor", ScorePw::Gt},         {"aten::gt.Scalar", ScorePw::Gt},
      {"aten::le.Tensor", ScorePw::Le},         {"aten::le.Scalar", ScorePw::Le},
      {"aten::lt.Tensor", ScorePw::Lt},         {"aten::lt.Scalar", ScorePw::Lt},
      {"aten::eq.Tensor", ScorePw::Eq},         {"aten::eq.Scalar", ScorePw::Eq},
      {"aten::ne.Tensor", ScorePw::Ne},         {"aten::ne.Scalar", ScorePw::Ne},
      {"aten::bitwise_and.Tensor", ScorePw::And}, {"aten::logical_and.default", ScorePw::And},
      {"aten::bitwise_or.Tensor", ScorePw::Or}, {"aten::logical_or.default", ScorePw::Or},
      {"aten::where.self", ScorePw::Where},
      {"aten::_to_copy.default", ScorePw::Cast}, {"prims::convert_element_type.default", ScorePw::Cast},
      {"aten::clone.default", ScorePw::Cast},   {"aten::alias.default", ScorePw::Cast},
      {"aten::lift_fresh_copy.default", ScorePw::Cast}, {"aten::detach.default", ScorePw::Cast},
      {"aten::index.Tensor", ScorePw::Index},
  };
  auto it = kOps.find(target);
  if (it == kOps.end()) return false;
  *op = it->second;
  return true;
}

namespace {

// score_pointwise's check of score_mod(score, b, h, q_idx, kv_idx, *buffers).
bool pointwise_score_mod(const Graph& g, std::string* why) {
  constexpr int bufs_from = 5;  // the first buffer's placeholder position
  const std::string what = "score_mod";
  const std::vector<int> ph = g.placeholders();
  if (static_cast<int>(ph.size()) < bufs_from) {
    *why = what + " has too few inputs";
    return false;
  }
  const auto users = g.users();
  auto ph_pos = [&](int node) {
    const auto it = std::find(ph.begin(), ph.end(), node);
    return it == ph.end() ? -1 : static_cast<int>(it - ph.begin());
  };
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == OpKind::Placeholder) {
      const int p = ph_pos(i);
      // b, h and the buffers may only be read through an index (a broadcast input cuDNN can take).
      if (p == 1 || p == 2 || p >= bufs_from) {
        for (int u : users[i]) {
          const Node& un = g.nodes[u];
          const bool index_arg = un.target == "aten::index.Tensor" && un.args.size() == 2 &&
                                 un.args[1].items.size() == 1 && un.args[1].items[0].kind == Arg::Kind::Ref &&
                                 un.args[1].items[0].ref == i;
          const bool indexed = un.target == "aten::index.Tensor" && un.args.size() == 2 &&
                               un.args[0].kind == Arg::Kind::Ref && un.args[0].ref == i;
          if (p >= bufs_from ? !indexed : !index_arg) {
            *why = what + (p == 1 ? " reads the batch index" : p == 2 ? " reads the head index"
                                                                             : " reads a captured buffer") +
                   " other than as buf[index] (" + un.target + ")";
            return false;
          }
        }
      }
      continue;
    }
    if (n.op == OpKind::Output) continue;
    if (n.op == OpKind::GetAttr) {
      *why = what + " reads a constant tensor";
      return false;
    }
    ScorePw op;
    if (!score_pw_op(n.target, &op)) {
      *why = what + " computes " + n.target + ", which has no cuDNN pointwise node here";
      return false;
    }
    if (op == ScorePw::Index) {
      // buf[one index placeholder], a 1-d buffer
      const Arg& b = n.args.size() == 2 ? n.args[0] : Arg{};
      const std::vector<Arg>& idx = n.args.size() == 2 ? n.args[1].items : std::vector<Arg>{};
      const int bp = b.kind == Arg::Kind::Ref ? ph_pos(b.ref) : -1;
      const int ip = idx.size() == 1 && idx[0].kind == Arg::Kind::Ref ? ph_pos(idx[0].ref) : -1;
      const ValueType& bt = bp >= 0 ? g.nodes[b.ref].type : ValueType{};
      if (bp < bufs_from || ip < 2 || ip > 4 || bt.kind != ValueType::Kind::Tensor || bt.tensor.shape.size() != 1) {
        // buf[b]: cuDNN 9.19 computed a [B, 1, 1, 1] input in its score-modifier subgraph wrongly (an
        // output error of 0.87 on an H100, 2026-11-27): per-batch reads stay off cuDNN.
        *why = what + (ip == 1 ? " reads a buffer by the batch index, which cuDNN's score modifier gets wrong"
                               : " indexes other than a 1-d buffer by h, q_idx or kv_idx");
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool score_pointwise(const Graph& score_mod, const Graph* joint, std::string* why) {
  if (!pointwise_score_mod(score_mod, why)) return false;
  if (!joint) return true;
  // joint(score, b, h, q_idx, kv_idx, grad, *buffers) -> (grad_score, None x4, *buffer grads): the
  // buffers must want no gradient (cuDNN's pointwise nodes cannot reduce into them).
  const int out = joint->output_node();
  if (out < 0 || joint->nodes[out].args.empty() || joint->nodes[out].args[0].items.empty()) {
    *why = "the joint graph returns nothing";
    return false;
  }
  const std::vector<Arg>& items = joint->nodes[out].args[0].items;
  if (items[0].kind != Arg::Kind::Ref) {
    *why = "the joint graph returns no score gradient";
    return false;
  }
  // cuDNN 9.19's backward builds and computes correctly with a score_mod whose score gradient is the
  // incoming gradient itself (score + t: ALiBi, relative position), measured on the H200; our generic
  // bprop for a derivative of its own (softcap, a temperature) found no engine or gave wrong dV. Those
  // backwards stay on the reference until that is solved (a soft cap goes through cuDNN's own Softcap
  // modifier instead: analyze_flex); their forwards run here.
  const std::vector<int> jph = joint->placeholders();
  if (jph.size() < 6 || through_casts(*joint, items[0].ref) != jph[5]) {
    *why = "its gradient is not the incoming one (d score_mod / d score != 1), which cuDNN's score_mod "
           "backward does not compute correctly here";
    return false;
  }
  for (size_t k = 5; k < items.size(); ++k)
    if (items[k].kind == Arg::Kind::Ref) {
      *why = "a captured buffer wants a gradient";
      return false;
    }
  // cuDNN's backward then needs no bprop of ours: the identity is its default.
  return true;
}

namespace {

// c when `score` is c * tanh(score / c) (div by c or mul by 1/c; c * t or t * c), else 0.
double softcap_of(const Graph& score) {
  const std::vector<int> ph = score.placeholders();
  const int out = score.output_node();
  if (ph.empty() || out < 0 || score.nodes[out].args.empty()) return 0;
  const Arg& r = score.nodes[out].args[0].items.empty() ? score.nodes[out].args[0] : score.nodes[out].args[0].items[0];
  auto number = [](const Arg& a, double* v) {
    if (a.kind == Arg::Kind::Float) *v = a.f;
    else if (a.kind == Arg::Kind::Int) *v = static_cast<double>(a.i);
    else return false;
    return true;
  };
  if (r.kind != Arg::Kind::Ref) return 0;
  const Node& mul = score.nodes[r.ref];
  if (mul.target != "aten::mul.Tensor" || mul.args.size() != 2) return 0;
  double c = 0;
  int t = -1;
  for (int side = 0; side < 2; ++side)
    if (number(mul.args[side], &c) && mul.args[1 - side].kind == Arg::Kind::Ref) t = mul.args[1 - side].ref;
  if (t < 0 || c <= 0 || score.nodes[t].target != "aten::tanh.default" || score.nodes[t].args.size() != 1 ||
      score.nodes[t].args[0].kind != Arg::Kind::Ref)
    return 0;
  const Node& d = score.nodes[score.nodes[t].args[0].ref];
  double k = 0;
  if (d.args.size() != 2 || d.args[0].kind != Arg::Kind::Ref || d.args[0].ref != ph[0] || !number(d.args[1], &k)) return 0;
  const bool ok = (d.target == "aten::div.Tensor" && k == c) ||
                  (d.target == "aten::mul.Tensor" && std::abs(k * c - 1.0) < 1e-12);
  return ok ? c : 0;
}

// The nodes `a` reads, transitively, itself included (none for a constant): seen[i] for node i of g.
std::vector<bool> inputs_of(const Graph& g, const Arg& a) {
  std::vector<bool> seen(g.nodes.size(), false);
  std::vector<int> stack;
  if (a.kind == Arg::Kind::Ref) stack.push_back(a.ref);
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    if (seen[i]) continue;
    seen[i] = true;
    g.nodes[i].for_each_input([&](const Arg& r) { stack.push_back(r.ref); });
  }
  return seen;
}

// Whether the bias `t` (node t of a score_mod graph with placeholders ph: score, b, h, q_idx, kv_idx,
// buffers) is c * (kv_idx - q_idx) or c * (q_idx - kv_idx), the difference alone, or a product of it and c
// (either order), with c reading neither the score nor q_idx nor kv_idx (a constant, or a buffer read by b
// or h: ALiBi's slope[h]): a ramp along each row, whose slope score_mod(0, b, h, 0, 1) gives. The bias
// must be computed in float32 or float64 (or integers): a half-precision product rounds the bias, which a
// ramp evaluated in float would not.
bool kv_ramp_of(const Graph& score, int t, const std::vector<int>& ph) {
  auto ok_type = [&](int i) {
    const ValueType& v = score.nodes[i].type;
    if (v.kind != ValueType::Kind::Tensor) return v.kind == ValueType::Kind::Int || v.kind == ValueType::Kind::Float;
    return v.tensor.dtype != DType::Float16 && v.tensor.dtype != DType::BFloat16 && v.tensor.dtype != DType::Bool;
  };
  auto difference = [&](const Arg& a) {
    if (a.kind != Arg::Kind::Ref) return false;
    const Node& d = score.nodes[a.ref];
    const Arg* alpha = d.kwarg("alpha");
    if (d.target != "aten::sub.Tensor" || d.args.size() != 2 || (alpha && !(alpha->kind == Arg::Kind::Int && alpha->i == 1)))
      return false;
    const Arg &x = d.args[0], &y = d.args[1];
    if (x.kind != Arg::Kind::Ref || y.kind != Arg::Kind::Ref) return false;
    return (x.ref == ph[4] && y.ref == ph[3]) || (x.ref == ph[3] && y.ref == ph[4]);
  };
  auto constant_in_row = [&](const Arg& a) {  // reads none of score, q_idx, kv_idx
    if (a.kind == Arg::Kind::Float || a.kind == Arg::Kind::Int) return true;
    if (a.kind != Arg::Kind::Ref) return false;
    const std::vector<bool> seen = inputs_of(score, a);
    return !seen[ph[0]] && !seen[ph[3]] && !seen[ph[4]];
  };
  if (t < 0 || !ok_type(t)) return false;
  const Arg self = Arg::of_ref(t, score.nodes[t].name);
  if (difference(self)) return true;
  const Node& m = score.nodes[t];
  if (m.target != "aten::mul.Tensor" || m.args.size() != 2) return false;
  for (int side = 0; side < 2; ++side)
    if (difference(m.args[side]) && constant_in_row(m.args[1 - side])) return true;
  return false;
}

}  // namespace

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
  else if (mask_band_with_padding(*mask, &r.band, &r.pad_kv, &r.mask_why)) r.band_ok = r.pad_kv < 0;
  if (r.pad_kv >= 0) r.mask_why = kPaddingIsNoBand;
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
      // score + t with t not reading the score: a row shift when t does not read kv_idx either, else
      // an additive bias.
      const Node& add = score->nodes[ret->ref];
      const Arg* alpha = add.kwarg("alpha");
      if (add.target == "aten::add.Tensor" && add.args.size() == 2 && (!alpha || (alpha->kind == Arg::Kind::Int && alpha->i == 1))) {
        for (int side = 0; side < 2 && !r.score_row_shift && !r.score_bias; ++side) {
          const Arg& s0 = add.args[side];
          const Arg& t = add.args[1 - side];
          if (s0.kind != Arg::Kind::Ref || s0.ref != ph[0]) continue;
          const std::vector<bool> seen = inputs_of(*score, t);  // t's inputs, transitively
          if (seen[ph[0]]) continue;
          r.bias_reads_b = seen[ph[1]];
          r.bias_reads_h = seen[ph[2]];
          r.bias_reads_q = seen[ph[3]];
          if (seen[ph[4]]) {
            r.score_bias = true;
            if (t.kind == Arg::Kind::Ref) r.bias_layout = bias_layout(*score, t.ref);
            r.score_kv_ramp = t.kind == Arg::Kind::Ref && kv_ramp_of(*score, t.ref, ph);
          } else {
            r.score_row_shift = true;
          }
        }
      }
    }
    if (!r.score_identity) {
      const Graph* joint = backward ? sub(n.args[8]) : nullptr;
      r.score_pointwise = score_pointwise(*score, joint, &r.pointwise_why);
      r.softcap = softcap_of(*score);
      if (r.softcap > 0 && score->placeholders().size() == 5) r.score_pointwise = true;  // no buffers: cuDNN's Softcap
      else r.softcap = 0;
    }
    if (!r.score_identity) {
      std::string ops;
      for (const Node& s : score->nodes)
        if (s.op == OpKind::CallFunction) ops += (ops.empty() ? "" : ", ") + s.target;
      r.score_why = "score_mod computes " + (ops.empty() ? std::string("a value other than the score") : ops);
    }
  }
  if (backward) {
    if (const Graph* joint = sub(n.args[8]); joint && joint->output_node() >= 0 && !joint->nodes[joint->output_node()].args.empty()) {
      const Arg& items = joint->nodes[joint->output_node()].args[0];
      const Arg& buffers = n.args[12];
      for (size_t k = 5; k < items.items.size(); ++k) {
        if (items.items[k].kind != Arg::Kind::Ref) continue;
        ++r.buffer_grads;
        const size_t b = k - 5;
        const TensorType* t = b < buffers.items.size() ? g.tensor_type(buffers.items[b]) : nullptr;
        if (r.float_grad_buffer < 0 && t && (t->dtype == DType::Float32 || t->dtype == DType::Float64))
          r.float_grad_buffer = static_cast<int>(b);
      }
    }
  } else {
    // The forward's buffers the backward computes a gradient for (python/hintbackend/partition.py marks
    // them requires_grad in the forward graph).
    const Arg& buffers = n.args[7];
    for (size_t b = 0; b < buffers.items.size(); ++b) {
      const TensorType* t = g.tensor_type(buffers.items[b]);
      if (t && t->requires_grad) {
        ++r.buffer_grads;
        if (r.float_grad_buffer < 0 && (t->dtype == DType::Float32 || t->dtype == DType::Float64))
          r.float_grad_buffer = static_cast<int>(b);
      }
    }
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
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]), *v = g.tensor_type(n.args[2]);
  if (!q || !k || !v || q->shape.size() != 4 || k->shape.size() != 4 || v->shape.size() != 4)
    return "q, k, v are not [B, H, S, D] tensors";
  if (q->device.rfind("cuda", 0) != 0) return "on " + q->device + " (cuDNN runs on CUDA)";
  const Arg& scale = n.args[backward ? 10 : 5];
  if (scale.kind != Arg::Kind::Float && scale.kind != Arg::Kind::Int)
    return "the scale is computed at run time (1 / sqrt of a symbolic head dim); cuDNN's graph takes a constant";
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
  if (!a.band_ok && a.pad_kv < 0) return "mask_mod " + a.mask_why;
  if (!a.band.unbounded() && a.band.lo != 0) return "mask_mod is the band " + to_string(a.band) + ", not causal";
  if (!a.score_identity && !a.score_row_shift && !a.score_bias && !a.score_pointwise)
    return a.score_why + " (" + a.pointwise_why + ")";
  const Arg& score_bufs = n.args[backward ? 12 : 7];
  const Arg& mask_bufs = n.args[backward ? 13 : 8];
  if (a.pad_kv >= 0) {
    // cuDNN's padding mask: per-batch key lengths, int32 [B, 1, 1, 1]. Taken with the identity or a row
    // shift (outputs of an empty batch are then set as flex defines them); a no-mask or causal band only.
    if (!a.score_identity && !a.score_row_shift)
      return "a kv padding mask (kv_idx < buf[b]) with a score_mod that is neither the identity nor a row shift";
    if (a.band.hi != FlexBand::kNoBound) return "a kv padding mask with the band " + to_string(a.band);
    const TensorType* len = mask_bufs.items.size() == 1 ? g.tensor_type(mask_bufs.items[0]) : nullptr;
    if (!len || len->shape.size() != 1 || !len->shape[0].is_static() || len->shape[0].value < q->shape[0].value ||
        (len->dtype != DType::Int32 && len->dtype != DType::Int64) || len->device != q->device)
      return "a kv padding mask whose lengths are not one int32/int64 [B] tensor on q's device";
  } else if (!mask_bufs.items.empty()) {
    return "captured buffers";
  }
  if (a.score_identity && !score_bufs.items.empty()) return "captured buffers";
  if (a.uses_max_scores) return "max_scores is read (cuDNN does not return it)";
  if (backward && n.args[6].kind != Arg::Kind::None) return "the backward takes a logsumexp gradient";
  return "";
}


std::optional<int64_t> materialized_bias_bytes(const Graph& g, int node, const FlexAnalysis& a) {
  if (!a.score_bias || a.score_pointwise || a.softcap > 0 || a.bias_layout.kind == FlexBiasLayout::Kind::Dense)
    return std::nullopt;
  const Node& n = g.nodes[node];
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]);
  if (!q || !k || q->shape.size() != 4 || k->shape.size() != 4) return std::nullopt;
  // A Toeplitz gather builds [1, H, Sq, Skv] (its head map, read at b = 0, is the same for every b), in
  // the table's dtype when that is q's (exact), else in float32, as the grid evaluation does.
  const bool per_batch = a.bias_reads_b && a.bias_layout.kind != FlexBiasLayout::Kind::Toeplitz;
  int64_t bytes = 4;
  if (a.bias_layout.kind == FlexBiasLayout::Kind::Toeplitz) {
    const Arg& bufs = n.args[n.target == "higher_order::flex_attention_backward" ? 12 : 7];
    const size_t t = static_cast<size_t>(a.bias_layout.buffer);
    const TensorType* table = t < bufs.items.size() ? g.tensor_type(bufs.items[t]) : nullptr;
    if (table && table->dtype == q->dtype) bytes = dtype_bytes(table->dtype);
  }
  for (const Dim& d : {per_batch ? q->shape[0] : Dim{1, ""}, q->shape[1], q->shape[2], k->shape[2]}) {
    if (!d.is_static()) return std::nullopt;
    bytes *= d.value;
  }
  return bytes;
}

namespace {

// The bias cuDNN's path makes for flex node `node` and its gradient: cudnn_flex_workspace_bytes without
// cuDNN's own workspace.
int64_t cudnn_bias_bytes(const Graph& g, int node, const FlexAnalysis& a) {
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  if (!a.score_bias || a.score_pointwise || a.softcap > 0) return 0;
  if (a.bias_layout.kind == FlexBiasLayout::Kind::Dense) {
    const Arg& bufs = n.args[backward ? 12 : 7];
    const size_t k = static_cast<size_t>(a.bias_layout.buffer);
    const TensorType* b = k < bufs.items.size() ? g.tensor_type(bufs.items[k]) : nullptr;
    if (!b) return 0;
    int64_t elems = 1;
    for (const Dim& d : b->shape) {
      if (!d.is_static()) return 0;
      elems *= d.value;
    }
    // A float32 copy of a dtype neither float32 nor q's; the backward's dBias, float32 at the widest.
    const TensorType* q = g.tensor_type(n.args[0]);
    const bool as_is = b->dtype == DType::Float32 || (q && b->dtype == q->dtype);
    return (as_is ? 0 : 4 * elems) + (backward ? 4 * elems : 0);
  }
  const std::optional<int64_t> bytes = materialized_bias_bytes(g, node, a);
  if (!bytes) return 0;
  // The grid evaluation holds t before its contiguous broadcast copy (a score_mod's last op at least).
  const int64_t bias = a.bias_layout.kind == FlexBiasLayout::Kind::Grid ? 2 * *bytes : *bytes;
  return bias + (backward ? *bytes : 0);
}

}  // namespace

int64_t cudnn_flex_workspace_bytes(const Graph& g, int node, const FlexAnalysis& a) {
  return cudnn_bias_bytes(g, node, a) + cudnn_sdpa_workspace_bytes(g, node, a);
}

CudnnBackwardGroup cudnn_backward_group(int64_t B, int64_t Hkv, int64_t Skv) {
  CudnnBackwardGroup r{B, Hkv, 1};
  if (B < 1 || Hkv < 1) return r;
  const int64_t per = flex_dq_pairs(B * Hkv, Skv);
  if (per >= B * Hkv) return r;
  auto divisor_at_most = [](int64_t n, int64_t most) {
    for (int64_t d = std::max<int64_t>(1, std::min(n, most)); d > 1; --d)
      if (n % d == 0) return d;
    return int64_t{1};
  };
  if (per >= Hkv) {
    r.batches = divisor_at_most(B, per / Hkv);
    r.calls = B / r.batches;
  } else {
    r.batches = 1;
    r.kv_heads = divisor_at_most(Hkv, per);
    r.calls = B * (Hkv / r.kv_heads);
  }
  return r;
}

bool cudnn_backward_grouped(const FlexAnalysis& a) {
  // CudnnFlexCall's Bias mode: an additive bias that is not run as pointwise nodes.
  const bool pointwise = !a.score_identity && !a.score_row_shift && a.score_pointwise;
  return pointwise || !a.score_bias;
}

CudnnBackwardGroup cudnn_backward_group(const Graph& g, int node, const FlexAnalysis& a) {
  const Node& n = g.nodes[node];
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]);
  if (!q || !k || q->shape.size() != 4 || k->shape.size() != 4 || !q->shape[0].is_static() ||
      !k->shape[1].is_static() || !k->shape[2].is_static())
    return {};  // symbolic: nothing to group by (the runtime groups by the sizes it gets)
  const CudnnBackwardGroup whole{q->shape[0].value, k->shape[1].value, 1};
  if (n.target != "higher_order::flex_attention_backward" || !cudnn_backward_grouped(a)) return whole;
  return cudnn_backward_group(whole.batches, whole.kv_heads, k->shape[2].value);
}

std::optional<FlexDqLaunches> flex_cuda_dq_launches(const Graph& g, int node) {
  const Node& n = g.nodes[node];
  if (n.args.size() < 3) return std::nullopt;
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]), *v = g.tensor_type(n.args[2]);
  if (!q || !k || !v || q->device.rfind("cuda", 0) != 0 || q->shape.size() != 4 || k->shape.size() != 4 ||
      v->shape.size() != 4)
    return std::nullopt;
  for (const Dim& d : {q->shape[0], q->shape[1], q->shape[2], q->shape[3], k->shape[1], k->shape[2], v->shape[3]})
    if (!d.is_static()) return std::nullopt;
  const int64_t hq = q->shape[1].value, hkv = k->shape[1].value;
  if (hkv <= 0 || hq % hkv != 0) return std::nullopt;
  FlexDqLaunches r;
  r.pairs = q->shape[0].value * hkv;
  const int64_t per = flex_dq_pairs(r.pairs, k->shape[2].value);
  r.streams = flex_dq_streams(r.pairs, per, n.hints.deterministic.value_or(false) ? 1 : 0);
  r.per_launch = per / r.streams;
  r.launches = (r.pairs + r.per_launch - 1) / r.per_launch;
  const int64_t d = flex_cuda_head_dim(q->shape[3].value, v->shape[3].value);
  r.workspace_bytes = per * (hq / hkv) * q->shape[2].value * (d > 0 ? d : q->shape[3].value) * 4;
  return r;
}

int64_t cudnn_sdpa_workspace_bytes(const Graph& g, int node, const FlexAnalysis& a) {
  // Fitted to what cuDNN 9.19 reports on an H200 (benchmarks/cudnn_workspace.py: exact to its 256-byte
  // constant on every case run, docs/flex-attention.md) and to cudnn-frontend's sdpa_backward node.
  constexpr int64_t kEngine = 1024;  // the engine's own few bytes: 256 on every case measured
  const Node& n = g.nodes[node];
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]);
  if (!q || !k || q->shape.size() != 4 || k->shape.size() != 4) return kEngine;
  for (const Dim& d : {q->shape[0], q->shape[1], q->shape[2], q->shape[3], k->shape[1], k->shape[2]})
    if (!d.is_static()) return kEngine;  // symbolic: the rest counted as 0, like symbolic values
  // A kv padding: cudnn-frontend's per-batch sequence-length copies, 8 bytes a batch (not measured).
  if (n.target != "higher_order::flex_attention_backward") return kEngine + (a.pad_kv >= 0 ? q->shape[0].value * 8 : 0);
  // One call's: a group of whole batches, or of kv heads with their query heads (cudnn_backward_group).
  const CudnnBackwardGroup grp = cudnn_backward_group(g, node, a);
  const int64_t Hq = q->shape[1].value, Hkv = grp.kv_heads, B = grp.batches, H = Hq / k->shape[1].value * Hkv,
                S = q->shape[2].value, D = q->shape[3].value, Skv = k->shape[2].value;
  const int64_t padding = a.pad_kv >= 0 ? B * 8 : 0;
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const bool dbias = a.score_bias && !a.score_pointwise && a.softcap <= 0 && a.buffer_grads > 0;
  const bool deterministic = n.hints.deterministic.value_or(false);
  // The row sums of dO * O, float32 [B, H, S]; then either dP (the score gradient, q's dtype, [B, H, S,
  // Skv] padded to 128-row tiles), which dBias reads and the deterministic algorithm reduces dQ from, or
  // the default's float32 dQ accumulator [B, H, S, D]; GQA adds the per-q-head float32 dK/dV partials
  // [B, H, Skv, D] it reduces over each group.
  int64_t bytes = kEngine + padding + B * H * S * 4;
  bytes += dbias || deterministic ? B * H * up(S, 128) * up(Skv, 128) * 2 : B * H * S * D * 4;
  if (Hkv != H) bytes += B * H * Skv * D * 4;
  return grp.calls > 1 ? 2 * bytes : bytes;  // calls in groups: two in flight (CudnnFlexCall)
}

}  // namespace hb

#include "passes/SliceLegality.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "backend/ir/Printer.h"

namespace hb {

std::string to_string(const SliceMap& m) {
  if (!m.sliced()) return "whole";
  return "dims[" + std::to_string(m.dim) + ":" + std::to_string(m.dim + m.ndims) + "]";
}

std::vector<int64_t> SliceRegion::slice_counts() const {
  std::vector<int64_t> out;
  if (extent <= 0) return out;
  for (int64_t n = 1; n <= extent; ++n) {
    if (extent % n) continue;
    bool ok = true;
    for (const auto& grp : groups) ok = ok && slice_box(grp, n, 0).has_value();
    if (ok) out.push_back(n);
  }
  return out;
}

namespace {

// ---- helpers over targets and types ------------------------------------------------------------

std::string op_name(const std::string& target) {  // "aten::add.Tensor" -> "add"
  auto p = target.find("::");
  std::string s = p == std::string::npos ? target : target.substr(p + 2);
  auto d = s.find('.');
  return d == std::string::npos ? s : s.substr(0, d);
}
std::string op_namespace(const std::string& target) {
  auto p = target.find("::");
  return p == std::string::npos ? "" : target.substr(0, p);
}

bool is_static(const TensorType& t) {
  for (const Dim& d : t.shape)
    if (!d.is_static()) return false;
  return true;
}
// Why a node cannot be sliced: thrown by the rules, caught by the walk, which ends the region there.
struct Fail {
  std::string why;
};

int rank(const TensorType& t) { return static_cast<int>(t.shape.size()); }
// A dim the walk reads; a tensor of too small a rank (types that contradict each other, from a
// malformed document) has no rule.
int64_t dim_size(const TensorType& t, int d) {
  if (d < 0 || d >= rank(t)) throw Fail{"has a tensor of rank " + std::to_string(rank(t)) + " where dim " +
                                         std::to_string(d) + " is sliced"};
  return t.shape[d].value;
}
int64_t group_extent(const TensorType& t, SliceMap m) {
  int64_t e = 1;
  for (int d = m.dim; d < m.dim + m.ndims; ++d) e *= dim_size(t, d);
  return e;
}
std::vector<int64_t> group_sizes(const TensorType& t, SliceMap m) {
  std::vector<int64_t> s;
  for (int d = m.dim; d < m.dim + m.ndims; ++d) s.push_back(dim_size(t, d));
  return s;
}
// A dim argument in [-r, r) as a dim in [0, r); out of range (a malformed document) has no rule.
int norm_dim(int64_t d, int r) {
  if (d < -static_cast<int64_t>(r) || d >= r)
    throw Fail{"has dim " + std::to_string(d) + ", out of range for rank " + std::to_string(r)};
  return static_cast<int>(d < 0 ? d + r : d);
}
bool in_group(SliceMap m, int d) { return m.sliced() && d >= m.dim && d < m.dim + m.ndims; }

// Elementwise (with broadcasting) ops, forward and backward: slices of the inputs give the slice of
// the output.
const std::set<std::string>& pointwise_ops() {
  static const std::set<std::string> k = {
      "add", "sub", "rsub", "mul", "div", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "tanh",
      "sigmoid", "relu", "gelu", "silu", "mish", "softplus", "elu", "leaky_relu", "hardtanh", "where",
      "clamp", "clamp_min", "clamp_max", "pow", "rsqrt", "sqrt", "square", "reciprocal", "abs", "sign",
      "sin", "cos", "erf", "floor", "ceil", "round", "trunc", "isnan", "isinf", "nan_to_num", "floor_divide",
      "remainder", "fmod",
      "maximum", "minimum", "eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or",
      "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "masked_fill", "_to_copy", "clone",
      "alias", "detach", "lift_fresh_copy", "convert_element_type", "copy", "fill", "zeros_like",
      "ones_like", "empty_like", "full_like", "threshold_backward", "gelu_backward", "sigmoid_backward",
      "tanh_backward", "silu_backward", "mish_backward", "softplus_backward", "elu_backward",
      "leaky_relu_backward", "hardtanh_backward"};
  return k;
}

// softmax-like ops: pointwise except along one dim (index of the dim argument).
int softmax_dim_arg(const std::string& op) {
  if (op == "_softmax" || op == "softmax" || op == "_log_softmax" || op == "log_softmax") return 1;
  if (op == "_softmax_backward_data" || op == "_log_softmax_backward_data") return 2;
  return -1;
}

bool is_reduction(const std::string& op) {
  static const std::set<std::string> k = {"sum", "mean", "amax", "amin", "logsumexp", "prod", "any", "all"};
  return k.count(op) > 0;
}

bool is_sdpa(const std::string& op) {
  static const std::set<std::string> k = {
      "scaled_dot_product_attention",
      "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
      "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"};
  return k.count(op) > 0;
}
// Position of dropout_p in each SDPA overload (-1: none).
int sdpa_dropout_arg(const std::string& op) {
  if (op == "scaled_dot_product_attention") return 4;
  if (op == "_scaled_dot_product_flash_attention" || op == "_scaled_dot_product_flash_attention_for_cpu") return 3;
  if (op == "_scaled_dot_product_efficient_attention" || op == "_scaled_dot_product_cudnn_attention") return 5;
  if (op == "_scaled_dot_product_flash_attention_backward") return 10;
  if (op == "_scaled_dot_product_efficient_attention_backward") return 9;
  if (op == "_scaled_dot_product_flash_attention_for_cpu_backward") return 6;
  return -1;
}

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// ---- the walk ---------------------------------------------------------------------------------

// One region's state while walking it in order; rules read it and propose maps.
struct Walk {
  Walk(const Graph& graph, const std::vector<int64_t>& dims) : g(graph), slice_dims(dims) {}
  const Graph& g;
  const std::vector<int64_t>& slice_dims;
  int64_t E = 0;
  std::map<int, std::vector<SliceMap>> maps;  // sliceable nodes
  std::map<int, SliceMap> ext;               // inputs from outside, as assigned so far
  std::vector<int> ext_order;
  std::vector<std::vector<int64_t>> groups;
  std::set<std::pair<int, int>> replicated;  // (node, tuple element or -1): see SliceRegion::replicated
  std::set<std::pair<int, int>> summed;      // (node, tuple element or -1): see SliceRegion::summed
  std::map<int, std::vector<int>> global_index;  // see SliceRegion::global_index
  std::vector<int64_t> global_group;             // the group sizes their index tables have

  // Per node, proposals that commit only when the node's rule succeeds.
  std::map<int, SliceMap> pending_ext;
  int64_t pending_E = 0;

  int64_t extent() const { return E ? E : pending_E; }
  const Node& node(int i) const { return g.nodes[i]; }
  const TensorType* tensor(int ref) const {
    const ValueType& t = g.nodes[ref].type;
    return t.kind == ValueType::Kind::Tensor ? &t.tensor : nullptr;
  }
  bool inside(int ref) const { return maps.count(ref) > 0; }
  std::string name(int ref) const { return "%" + g.nodes[ref].name; }

  // The map a value has, if known: sliceable nodes have theirs; inputs once assigned.
  std::optional<SliceMap> known(int ref) const {
    if (auto it = maps.find(ref); it != maps.end()) return it->second.empty() ? SliceMap{} : it->second[0];
    if (auto it = pending_ext.find(ref); it != pending_ext.end()) return it->second;
    if (auto it = ext.find(ref); it != ext.end()) return it->second;
    return std::nullopt;
  }

  // The hinted slice dims (default: batch and heads for rank >= 4, the merged batch*heads dim for
  // rank 3) of a tensor type, when their sizes multiply to the region's extent (or set it).
  std::optional<SliceMap> seed_type(const TensorType& t) {
    std::vector<int64_t> dims = slice_dims;
    if (dims.empty()) {
      if (rank(t) >= 4) dims = {0, 1};
      else if (rank(t) == 3) dims = {0};
      else return std::nullopt;
    }
    for (size_t i = 1; i < dims.size(); ++i)
      if (dims[i] != dims[i - 1] + 1) throw Fail{"slice_dims " + dims_str(slice_dims) + " are not consecutive"};
    if (dims.front() < 0 || dims.back() >= rank(t)) return std::nullopt;
    SliceMap m{static_cast<int>(dims.front()), static_cast<int>(dims.size())};
    const int64_t e = group_extent(t, m);
    if (e <= 1) return std::nullopt;
    if (extent() == 0) pending_E = e;
    else if (e != extent()) return std::nullopt;
    return m;
  }
  // An outside value's map by the hinted dims, if it has none yet.
  std::optional<SliceMap> seed(int ref) {
    if (auto k = known(ref)) return k;
    const TensorType* t = tensor(ref);
    if (!t) return SliceMap{};
    auto m = seed_type(*t);
    if (m) pending_ext[ref] = *m;
    return m;
  }
  // Requires value `ref` to have map `m` for this use: checks a sliceable node's map, assigns an
  // outside value's.
  void require(int ref, SliceMap m, int user) {
    if (auto k = known(ref)) {
      if (*k == m) return;
      if (!inside(ref) && !ext.count(ref) && pending_ext.count(ref)) {  // seeded tentatively by this node
        pending_ext[ref] = m;
        return;
      }
      throw Fail{"needs " + name(ref) + " as " + to_string(m) + " but it is sliced as " + to_string(*k)};
    }
    pending_ext[ref] = m;
  }

  // Where a tensor `x` broadcast against output `o` (right-aligned, as in torch) carries o's group:
  // the same dims at full size (sliced), absent or size 1 (whole), anything else is an error.
  SliceMap align(const TensorType& x, const TensorType& o, SliceMap M, const std::string& who) const {
    if (!M.sliced()) return {};
    const int shift = rank(o) - rank(x);
    int full = 0, bcast = 0;
    for (int od = M.dim; od < M.dim + M.ndims; ++od) {
      const int64_t os = dim_size(o, od);
      const int xd = od - shift;
      if (os == 1) continue;
      if (xd >= 0 && dim_size(x, xd) == os) ++full;
      else if (xd < 0 || dim_size(x, xd) == 1) ++bcast;
      else throw Fail{who + " has size " + std::to_string(dim_size(x, xd)) + " in sliced dim " + std::to_string(od)};
    }
    if (full && bcast) throw Fail{who + " is broadcast along some but not all of the sliced dims"};
    if (!full) return {};
    if (M.dim - shift < 0) throw Fail{who + " lacks leading sliced dims"};
    return {M.dim - shift, M.ndims};
  }
};

// Tensor-valued references of a node, each once, in argument order.
std::vector<int> tensor_inputs(const Walk& w, const Node& n) {
  std::vector<int> out;
  n.for_each_input([&](const Arg& a) {
    if (w.tensor(a.ref) && std::find(out.begin(), out.end(), a.ref) == out.end()) out.push_back(a.ref);
  });
  return out;
}
const Arg* arg_or_kwarg(const Node& n, size_t pos, const char* key) {
  if (pos < n.args.size()) return &n.args[pos];
  return n.kwarg(key);
}
std::vector<int64_t> int_list(const Arg* a) {
  std::vector<int64_t> v;
  if (!a) return v;
  if (a->kind == Arg::Kind::Int) v.push_back(a->i);
  for (const Arg& x : a->items)
    if (x.kind == Arg::Kind::Int) v.push_back(x.i);
  return v;
}

// The map of a single-input op's input: known, seeded by the hinted dims, or whole.
SliceMap input_map(Walk& w, int ref) {
  auto m = w.seed(ref);
  if (!m) {
    w.require(ref, SliceMap{}, -1);
    return {};
  }
  return *m;
}

const TensorType& out_tensor(const Walk& w, int i) {
  const ValueType& t = w.node(i).type;
  if (t.kind != ValueType::Kind::Tensor) throw Fail{"its result is not a tensor (" + to_string(t) + ")"};
  return t.tensor;
}

// ---- rules: each returns the output maps or throws Fail ----------------------------------------

// Pointwise with broadcasting; `reduce_dim` (softmax family) must stay outside the group.
std::vector<SliceMap> rule_pointwise(Walk& w, int i, int reduce_dim_arg) {
  const Node& n = w.node(i);
  const TensorType& O = out_tensor(w, i);
  const int R = rank(O);
  const std::vector<int> ins = tensor_inputs(w, n);
  SliceMap M;
  for (int t : ins) {
    auto k = w.known(t);
    if (k && k->sliced()) {
      M = {k->dim + R - rank(*w.tensor(t)), k->ndims};
      break;
    }
  }
  if (!M.sliced()) {  // no sliced input yet: seed the outside input of the highest rank
    int best = -1;
    for (int t : ins)
      if (!w.known(t) && (best < 0 || rank(*w.tensor(t)) > rank(*w.tensor(best)))) best = t;
    if (best >= 0)
      if (auto s = w.seed(best); s && s->sliced()) M = {s->dim + R - rank(*w.tensor(best)), s->ndims};
  }
  if (M.sliced() && group_extent(O, M) != w.extent())
    throw Fail{"its result's sliced dims have extent " + std::to_string(group_extent(O, M)) + ", not " +
               std::to_string(w.extent())};
  for (int t : ins) w.require(t, w.align(*w.tensor(t), O, M, w.name(t)), i);
  if (reduce_dim_arg >= 0 && M.sliced()) {
    const Arg* a = arg_or_kwarg(n, reduce_dim_arg, "dim");
    if (a && a->kind == Arg::Kind::Int && in_group(M, norm_dim(a->i, R)))
      throw Fail{"normalizes over dim " + std::to_string(norm_dim(a->i, R)) + ", a sliced dim"};
  }
  return {M};
}

std::vector<SliceMap> rule_reduction(Walk& w, int i) {
  const Node& n = w.node(i);
  const std::string op = op_name(n.target);
  const Arg* dims_arg = arg_or_kwarg(n, 1, "dim");
  if (!dims_arg || dims_arg->kind == Arg::Kind::None || int_list(dims_arg).empty())
    throw Fail{"reduces over every dim, the sliced ones included"};
  const int x = n.args[0].ref;
  const TensorType* X = x >= 0 ? w.tensor(x) : nullptr;
  if (!X) throw Fail{"reduces a non-tensor"};
  const SliceMap m = input_map(w, x);
  out_tensor(w, i);
  if (!m.sliced()) return {SliceMap{}};
  const Arg* kd = arg_or_kwarg(n, 2, "keepdim");
  const bool keepdim = kd && kd->kind == Arg::Kind::Bool && kd->b;
  int before = 0;
  for (int64_t d : int_list(dims_arg)) {
    const int nd = norm_dim(d, rank(*X));
    if (in_group(m, nd)) throw Fail{"reduces over dim " + std::to_string(nd) + ", a sliced dim"};
    if (nd < m.dim) ++before;
  }
  return {SliceMap{keepdim ? m.dim : m.dim - before, m.ndims}};
}

// view/reshape: the sliced dims must stay leading (only size-1 dims before them) in input and result.
std::vector<SliceMap> rule_view(Walk& w, int i) {
  const Node& n = w.node(i);
  const int x = n.args.empty() ? -1 : n.args[0].ref;
  if (x < 0 || !w.tensor(x)) throw Fail{"views a non-tensor"};
  const TensorType& X = *w.tensor(x);
  const TensorType& O = out_tensor(w, i);
  const SliceMap m = input_map(w, x);
  if (!m.sliced()) return {SliceMap{}};
  for (int d = 0; d < m.dim; ++d)
    if (dim_size(X, d) != 1) throw Fail{"its input's sliced dims are not leading (dim " + std::to_string(d) + " comes first)"};
  for (int d0 = 0; d0 < rank(O); ++d0) {
    int64_t p = 1;
    for (int k = 1; d0 + k <= rank(O); ++k) {
      p *= dim_size(O, d0 + k - 1);
      if (p == w.extent()) return {SliceMap{d0, k}};
      if (p > w.extent()) break;
    }
    if (dim_size(O, d0) != 1) break;
  }
  throw Fail{"reshapes the sliced dims (extent " + std::to_string(w.extent()) + ") together with other dims"};
}

std::vector<SliceMap> permuted(Walk& w, int i, const std::vector<int>& perm) {
  const SliceMap m = input_map(w, w.node(i).args[0].ref);
  out_tensor(w, i);
  if (!m.sliced()) return {SliceMap{}};
  for (int j = 0; j < static_cast<int>(perm.size()); ++j) {
    if (perm[j] != m.dim) continue;
    for (int t = 0; t < m.ndims; ++t)
      if (j + t >= static_cast<int>(perm.size()) || perm[j + t] != m.dim + t)
        throw Fail{"reorders the sliced dims among themselves or splits them apart"};
    return {SliceMap{j, m.ndims}};
  }
  throw Fail{"internal: permutation lost the sliced dims"};
}

std::vector<SliceMap> rule_permute(Walk& w, int i) {
  const Node& n = w.node(i);
  const int x = n.args[0].ref;
  if (x < 0 || !w.tensor(x)) throw Fail{"permutes a non-tensor"};
  const int r = rank(*w.tensor(x));
  std::vector<int> perm(r);
  for (int d = 0; d < r; ++d) perm[d] = d;
  const std::string op = op_name(n.target);
  if (op == "permute") {
    auto dims = int_list(arg_or_kwarg(n, 1, "dims"));
    if (static_cast<int>(dims.size()) != r) throw Fail{"malformed permute dims"};
    for (int d = 0; d < r; ++d) perm[d] = norm_dim(dims[d], r);
  } else if (op == "transpose") {
    auto a = int_list(arg_or_kwarg(n, 1, "dim0")), b = int_list(arg_or_kwarg(n, 2, "dim1"));
    if (a.empty() || b.empty()) throw Fail{"malformed transpose dims"};
    std::swap(perm[norm_dim(a[0], r)], perm[norm_dim(b[0], r)]);
  } else if (op == "t") {
    if (r == 2) std::swap(perm[0], perm[1]);
  }
  return permuted(w, i, perm);
}

std::vector<SliceMap> rule_expand(Walk& w, int i) {
  const Node& n = w.node(i);
  const int x = n.args[0].ref;
  if (x < 0 || !w.tensor(x)) throw Fail{"expands a non-tensor"};
  const TensorType& X = *w.tensor(x);
  const TensorType& O = out_tensor(w, i);
  auto m = w.known(x);
  if (!m) m = w.seed(x);
  SliceMap M;
  if (m && m->sliced()) M = {m->dim + rank(O) - rank(X), m->ndims};
  else if (auto s = w.seed_type(O)) M = *s;  // expanding a whole value to full batch x heads
  w.require(x, w.align(X, O, M, w.name(x)), i);
  return {M};
}

std::vector<SliceMap> rule_unsqueeze_like(Walk& w, int i) {
  const Node& n = w.node(i);
  const std::string op = op_name(n.target);
  const int x = n.args[0].ref;
  if (x < 0 || !w.tensor(x)) throw Fail{op + " of a non-tensor"};
  const int r = rank(*w.tensor(x));
  const SliceMap m = input_map(w, x);
  out_tensor(w, i);
  if (!m.sliced()) return {SliceMap{}};
  auto d0 = int_list(arg_or_kwarg(n, 1, "dim"));
  if (op == "unsqueeze") {
    if (d0.empty()) throw Fail{"malformed unsqueeze"};
    const int d = norm_dim(d0[0], r + 1);
    if (d > m.dim && d < m.dim + m.ndims) throw Fail{"inserts a dim between the sliced dims"};
    return {SliceMap{d <= m.dim ? m.dim + 1 : m.dim, m.ndims}};
  }
  if (op == "slice") {  // slice.Tensor(x, dim=0, start, end, step)
    const int d = d0.empty() ? 0 : norm_dim(d0[0], r);
    if (in_group(m, d)) throw Fail{"slices along dim " + std::to_string(d) + ", a sliced dim"};
    return {m};
  }
  // select.int(x, dim, index), squeeze.dim(x, dim), squeeze.dims(x, dims): drop dims.
  if (d0.empty()) throw Fail{op + " of every size-1 dim"};
  int before = 0;
  for (int64_t d : d0) {
    const int nd = norm_dim(d, r);
    if (in_group(m, nd)) throw Fail{op + " drops dim " + std::to_string(nd) + ", a sliced dim"};
    if (nd < m.dim) ++before;
  }
  return {SliceMap{m.dim - before, m.ndims}};
}

// mm: rows of the first operand; the second is whole.
std::vector<SliceMap> rule_mm(Walk& w, int i) {
  const Node& n = w.node(i);
  const int a = n.args[0].ref, b = n.args[1].ref;
  auto ma = w.known(a);
  if (!ma || !ma->sliced() || ma->dim != 0) throw Fail{"mm is sliced only along the rows of a sliced first operand"};
  out_tensor(w, i);
  w.require(b, SliceMap{}, i);
  return {SliceMap{0, 1}};
}

// bmm/baddbmm/matmul: along batch dims of the result; matrix dims stay whole.
std::vector<SliceMap> rule_batched_matmul(Walk& w, int i) {
  const Node& n = w.node(i);
  const std::string op = op_name(n.target);
  const TensorType& O = out_tensor(w, i);
  const int R = rank(O);
  std::vector<int> mats;  // the matrix operands
  if (op == "baddbmm") mats = {n.args[1].ref, n.args[2].ref};
  else mats = {n.args[0].ref, n.args[1].ref};
  for (int t : mats)
    if (t < 0 || !w.tensor(t)) throw Fail{op + " of a non-tensor"};
  SliceMap M;
  for (int t : mats)
    if (auto k = w.known(t); k && k->sliced()) { M = {k->dim + R - rank(*w.tensor(t)), k->ndims}; break; }
  if (!M.sliced()) {
    int best = rank(*w.tensor(mats[0])) >= rank(*w.tensor(mats[1])) ? mats[0] : mats[1];
    if (auto s = w.seed(best); s && s->sliced()) M = {s->dim + R - rank(*w.tensor(best)), s->ndims};
  }
  if (M.sliced() && M.dim + M.ndims > R - 2) throw Fail{"the sliced dims are matrix dims of " + op};
  for (int t : mats) {
    const TensorType& T = *w.tensor(t);
    SliceMap want = rank(T) <= 2 ? SliceMap{} : w.align(T, O, M, w.name(t));
    if (op != "matmul" && M.sliced() && !want.sliced()) throw Fail{op + " does not broadcast " + w.name(t)};
    w.require(t, want, i);
  }
  if (op == "baddbmm") w.require(n.args[0].ref, w.align(*w.tensor(n.args[0].ref), O, M, w.name(n.args[0].ref)), i);
  return {M};
}

// Does subgraph `name` read its placeholder number `k` (the batch or head index of a score/mask mod)?
bool reads_placeholder(const Graph& g, const std::string& name, int k) {
  auto it = g.subgraphs.find(name);
  if (it == g.subgraphs.end()) return false;
  const Graph& s = *it->second;
  auto ph = s.placeholders();
  if (k >= static_cast<int>(ph.size())) return false;
  // new_ones(b, size) and the like read only b's dtype and device (torch's noop_mask returns
  // b.new_ones(())), not its value.
  const std::vector<std::vector<int>> users = s.users();
  for (int u : users[ph[k]]) {
    const Node& n = s.nodes[u];
    const bool like_only = (n.target == "aten::new_ones.default" || n.target == "aten::new_zeros.default" ||
                            n.target == "aten::new_empty.default" || n.target == "aten::new_full.default") &&
                           !n.args.empty() && n.args[0].kind == Arg::Kind::Ref && n.args[0].ref == ph[k];
    int refs = 0;
    n.for_each_input([&](const Arg& a) { refs += a.ref == ph[k]; });
    if (!like_only || refs != 1) return true;
  }
  return false;
}

// Attention ops (SDPA forward/backward, flex_attention forward/backward): along batch and heads.
// Tensors of rank >= 3 (q, k, v, out, grads, logsumexp [B, H, S]) are sliced alike on dims < 2; the
// bias broadcasts; scalars (philox seeds) are whole.
std::vector<SliceMap> rule_attention(Walk& w, int i, bool flex) {
  const Node& n = w.node(i);
  const std::string op = op_name(n.target);
  if (n.effects.nondeterministic_seeded) throw Fail{"draws random numbers (dropout)"};
  if (!flex) {
    const int dp = sdpa_dropout_arg(op);
    const Arg* a = dp >= 0 ? arg_or_kwarg(n, dp, "dropout_p") : n.kwarg("dropout_p");
    if (a && a->kind == Arg::Kind::Float && a->f != 0.0) throw Fail{"uses dropout, whose random stream slicing would change"};
  }
  const int q = n.args[0].ref;
  if (q < 0 || !w.tensor(q) || rank(*w.tensor(q)) != 4) throw Fail{"its query is not a 4-d tensor"};
  const TensorType& Q = *w.tensor(q);
  auto mq = w.known(q);
  if (!mq) mq = w.seed(q);
  SliceMap M = mq ? *mq : SliceMap{};
  if (!M.sliced()) {  // the query may come whole while another operand is sliced
    for (int t : tensor_inputs(w, n))
      if (auto k = w.known(t); k && k->sliced() && rank(*w.tensor(t)) >= 3) { M = *k; break; }
  }
  if (!M.sliced()) return std::vector<SliceMap>(std::max<size_t>(1, n.type.elems.size()));
  if (M.dim + M.ndims > 2) throw Fail{"attention is sliced only along batch and heads, not " + to_string(M)};
  // A flex node's captured buffers (score_mod's and mask_mod's): every slice reads them whole, as the
  // subgraphs index them with global indices (b and h are made global where they are sliced), and a
  // backward's parts of their gradients then add up over the slices.
  std::set<int> captured;
  if (flex) {
    // score_mod/mask_mod see global batch/head indices; inside a slice they would see local ones, so
    // slice-schedule gives the body the global ones (global_index) where the group is q's leading dims.
    std::set<int> reads;
    auto check = [&](const Arg& a, int b_pos) {
      if (a.kind != Arg::Kind::Graph) return;
      for (int d : {0, 1}) {
        if (!in_group(M, d) || !reads_placeholder(w.g, a.s, b_pos + d)) continue;
        const Graph& sub = *w.g.subgraphs.at(a.s);  // reads_placeholder: it exists, with that placeholder
        const ValueType& t = sub.nodes[sub.placeholders()[b_pos + d]].type;
        if (t.kind != ValueType::Kind::Tensor || !t.tensor.shape.empty() ||
            (t.tensor.dtype != DType::Int32 && t.tensor.dtype != DType::Int64))
          throw Fail{"@" + a.s + " reads the " + (d == 0 ? "batch" : "head") + " index as " + to_string(t) +
                     ", not an integer scalar"};
        reads.insert(d);
      }
    };
    const bool bw = op == "flex_attention_backward";
    const size_t mask_pos = bw ? 9 : 4;
    for (size_t k = 0; k < n.args.size(); ++k) {
      if (n.args[k].kind == Arg::Kind::Graph) check(n.args[k], 1);
      if (k == mask_pos)
        for (const Arg& e : n.args[k].items)
          if (e.kind == Arg::Kind::Graph) check(e, 0);  // mask_mod(b, h, q_idx, kv_idx)
    }
    if (!reads.empty()) {
      // One set of index tables serves the region: every node reading them has q's group alike.
      const std::vector<int64_t> sizes = group_sizes(Q, M);
      if (!w.global_group.empty() && w.global_group != sizes)
        throw Fail{"reads the batch or head index over a group of sizes " + dims_str(sizes) + " where an earlier " +
                   "attention in the region reads it over " + dims_str(w.global_group)};
      w.global_group = sizes;
      w.global_index[i] = std::vector<int>(reads.begin(), reads.end());
    }
    // The gradients of captured buffers (result 3, one per score_mod buffer): every slice reads the
    // buffers whole and adds its part of their gradient, so the loop sums them (summed).
    bool buffer_grads = false;
    if (bw && n.type.kind == ValueType::Kind::Tuple && n.type.elems.size() >= 4)
      for (const ValueType& e : n.type.elems[3].elems) buffer_grads |= e.kind == ValueType::Kind::Tensor;
    if (buffer_grads) w.summed.insert({i, 3});
    for (size_t k : bw ? std::vector<size_t>{12, 13} : std::vector<size_t>{7, 8})
      for (const Arg& e : n.args[k].items)
        if (e.kind == Arg::Kind::Ref) captured.insert(e.ref);
    // Block-mask tensors [Bm, Hm, ...] are aligned on their leading dims with q (1 = broadcast).
    if (mask_pos < n.args.size()) {
      for (const Arg& e : n.args[mask_pos].items) {
        if (e.kind != Arg::Kind::Ref || !w.tensor(e.ref)) continue;
        const TensorType& T = *w.tensor(e.ref);
        int full = 0, bc = 0;
        for (int d = M.dim; d < M.dim + M.ndims; ++d) {
          if (dim_size(Q, d) == 1) continue;
          if (d < rank(T) && dim_size(T, d) == dim_size(Q, d)) ++full;
          else if (d < rank(T) && dim_size(T, d) == 1) ++bc;
          else throw Fail{"block mask " + w.name(e.ref) + " does not match the query's batch/heads"};
        }
        if (full && bc) throw Fail{"block mask " + w.name(e.ref) + " is broadcast along some sliced dims only"};
        w.require(e.ref, full ? M : SliceMap{}, i);
      }
    }
  }
  // The operands of rank >= 3: sliced like q on the same dims (GQA/MQA k, v with fewer heads fail here).
  for (int t : tensor_inputs(w, n)) {
    const TensorType& T = *w.tensor(t);
    bool is_mask = false;
    if (flex) {
      const size_t mask_pos = op == "flex_attention_backward" ? 9 : 4;
      if (mask_pos < n.args.size())
        for (const Arg& e : n.args[mask_pos].items) is_mask |= e.kind == Arg::Kind::Ref && e.ref == t;
    }
    if (is_mask) continue;
    if (captured.count(t)) {
      if (auto k = w.known(t); k && k->sliced())
        throw Fail{"reads captured buffer " + w.name(t) + " whole, which is sliced as " + to_string(*k) +
                   " (the subgraphs index it with global batch and head indices)"};
      w.require(t, SliceMap{}, i);
      continue;
    }
    if (rank(T) < 3) {
      if (auto k = w.known(t); k && k->sliced()) throw Fail{w.name(t) + " is sliced but attention reads it whole"};
      w.require(t, SliceMap{}, i);
      continue;
    }
    if (rank(T) == 4) {
      // Operands (q, k, v, out, grad_out) share the leading dims; a bias broadcasts like a pointwise input.
      bool operand = false;
      for (int d = M.dim; d < M.dim + M.ndims; ++d) operand |= dim_size(T, d) != 1;
      SliceMap want = M;
      if (!operand) want = SliceMap{};
      else
        for (int d = M.dim; d < M.dim + M.ndims; ++d)
          if (dim_size(T, d) != dim_size(Q, d))
            throw Fail{w.name(t) + " has " + std::to_string(dim_size(T, d)) + " in dim " + std::to_string(d) +
                       " where the query has " + std::to_string(dim_size(Q, d)) + " (grouped-query heads?)"};
      w.require(t, want, i);
    } else {  // logsumexp [B, H, S]
      for (int d = M.dim; d < M.dim + M.ndims; ++d)
        if (dim_size(T, d) != dim_size(Q, d)) throw Fail{w.name(t) + " does not share the query's batch/heads"};
      w.require(t, M, i);
    }
  }
  // Results: tensors of rank >= 3 share q's leading dims; smaller ones (seeds, sizes) are whole.
  auto result_map = [&](const ValueType& v) -> SliceMap {
    if (v.kind != ValueType::Kind::Tensor || rank(v.tensor) < 3) return {};
    for (int d = M.dim; d < M.dim + M.ndims; ++d)
      if (dim_size(v.tensor, d) != dim_size(Q, d))
        throw Fail{"a result (" + to_string(v.tensor) + ") would be summed over slices (gradient of a broadcast input)"};
    return M;
  };
  // The whole 0-dim results are the kernels' RNG seed and offset. Without dropout (checked above)
  // nothing reads them for their value (the backward takes them but draws nothing), so every slice's
  // serve: replicated.
  auto mark = [&](const ValueType& v, int elem) {
    if (v.kind == ValueType::Kind::Tensor && rank(v.tensor) == 0 && !flex) w.replicated.insert({i, elem});
  };
  if (n.type.kind == ValueType::Kind::Tuple) {
    std::vector<SliceMap> out;
    for (size_t e = 0; e < n.type.elems.size(); ++e) {
      out.push_back(result_map(n.type.elems[e]));
      mark(n.type.elems[e], static_cast<int>(e));
    }
    return out;
  }
  mark(n.type, -1);
  return {result_map(n.type)};
}

std::vector<SliceMap> rule_getitem(Walk& w, int i) {
  const Node& n = w.node(i);
  const int t = n.args[0].ref;
  const int64_t k = n.args.size() > 1 ? n.args[1].i : 0;
  auto it = w.maps.find(t);
  if (it == w.maps.end()) return {SliceMap{}};  // of an outside tuple: loop-invariant
  if (w.summed.count({t, -1}) || w.summed.count({t, static_cast<int>(k)})) {  // a part of a sum, or a tuple of them
    w.summed.insert({i, -1});
    return {SliceMap{}};
  }
  if (k < 0 || k >= static_cast<int64_t>(it->second.size())) throw Fail{"index out of range"};
  if (w.replicated.count({t, static_cast<int>(k)})) w.replicated.insert({i, -1});
  return {it->second[k]};
}

// The default slice dims (batch and heads) narrowed for the region's FlexAttention nodes: a score_mod or
// mask_mod that reads h would see slice-local heads when heads are sliced, so the region slices along
// batch only (and along heads only when one reads b), which keeps the subgraphs as they are. Reading
// both, or a batch (heads) of one, leaves the default: the body then reads global indices from index
// tables (slice-schedule). A slice_dims hint is kept as given.
void narrow_default_dims(const Graph& g, SliceRegion& R) {
  if (!R.slice_dims.empty()) return;
  std::string reads_b, reads_h;
  int64_t size_b = 0, size_h = 0;  // q's batch and heads (of the last flex node)
  for (int i : R.nodes) {
    const Node& n = g.nodes[i];
    const std::string op = op_name(n.target);
    if (op_namespace(n.target) != "higher_order" || (op != "flex_attention" && op != "flex_attention_backward")) continue;
    if (const TensorType* q = n.args.empty() ? nullptr : g.tensor_type(n.args[0]); q && q->shape.size() == 4) {
      size_b = q->shape[0].value;
      size_h = q->shape[1].value;
    }
    const size_t mask_pos = op == "flex_attention_backward" ? 9 : 4;
    auto look = [&](const Arg& a, int b_pos) {
      if (a.kind != Arg::Kind::Graph) return;
      if (reads_b.empty() && reads_placeholder(g, a.s, b_pos)) reads_b = "@" + a.s + " reads the batch index";
      if (reads_h.empty() && reads_placeholder(g, a.s, b_pos + 1)) reads_h = "@" + a.s + " reads the head index";
    };
    for (size_t k = 0; k < n.args.size(); ++k) {
      look(n.args[k], 1);  // score_mod(score, b, h, q_idx, kv_idx), the joint graph alike
      if (k == mask_pos)
        for (const Arg& e : n.args[k].items) look(e, 0);  // mask_mod(b, h, q_idx, kv_idx)
    }
  }
  // Only where the narrowed dim has more than one index (a batch of 1 would leave nothing to slice):
  // otherwise the default stays and the body reads global indices (slice-schedule).
  if (!reads_h.empty() && reads_b.empty() && size_b > 1) {
    R.slice_dims = {0};
    R.narrowed = "batch only: " + reads_h;
  } else if (!reads_b.empty() && reads_h.empty() && size_h > 1) {
    R.slice_dims = {1};
    R.narrowed = "heads only: " + reads_b;
  }
}

// Dispatches a node to its rule. Throws Fail with the reason when there is none or it does not apply.
std::vector<SliceMap> apply_rule(Walk& w, int i) {
  const Node& n = w.node(i);
  if (n.op != OpKind::CallFunction) throw Fail{std::string("is a ") + op_kind_name(n.op)};
  if (n.effects.mutates) throw Fail{"mutates one of its inputs"};
  if (n.effects.nondeterministic_seeded) throw Fail{"draws random numbers; slices would draw a different stream"};
  auto symbolic = [&](const ValueType& v) {
    if (v.kind == ValueType::Kind::Tensor && !is_static(v.tensor)) return true;
    for (const ValueType& e : v.elems)
      if (e.kind == ValueType::Kind::Tensor && !is_static(e.tensor)) return true;
    return false;
  };
  if (symbolic(n.type)) throw Fail{"has a symbolic shape (" + to_string(n.type) + "); slicing needs static sizes"};
  n.for_each_input([&](const Arg& a) {
    if (symbolic(w.node(a.ref).type))
      throw Fail{"reads " + w.name(a.ref) + " of symbolic shape " + to_string(w.node(a.ref).type)};
  });
  const std::string ns = op_namespace(n.target);
  const std::string op = op_name(n.target);
  // The rules read their first k positional arguments as tensors: a node that does not have them (a
  // malformed document; the runtime's schema check names it) has no rule.
  auto tensors = [&](size_t k) {
    if (n.args.size() < k) throw Fail{"has " + std::to_string(n.args.size()) + " arguments, fewer than its rule reads"};
    for (size_t j = 0; j < k; ++j)
      if (n.args[j].kind != Arg::Kind::Ref || !w.tensor(n.args[j].ref))
        throw Fail{"argument " + std::to_string(j) + " is not a tensor"};
  };
  if (n.target == "operator::getitem") {
    if (n.args.size() < 2 || n.args[0].kind != Arg::Kind::Ref || n.args[1].kind != Arg::Kind::Int)
      throw Fail{"is a malformed getitem"};
    return rule_getitem(w, i);
  }
  n.for_each_input([&](const Arg& a) {
    if (w.summed.count({a.ref, -1}))
      throw Fail{"reads " + w.name(a.ref) + ", a gradient summed over the slices, complete only after the loop"};
  });
  if (ns == "higher_order" && (op == "flex_attention" || op == "flex_attention_backward")) {
    if (n.args.size() != (op == "flex_attention" ? 9u : 14u)) throw Fail{"is a malformed " + op};
    tensors(3);
    return rule_attention(w, i, true);
  }
  if (ns != "aten" && ns != "prims") throw Fail{"has no slicing rule (" + ns + " op)"};
  if (pointwise_ops().count(op)) return rule_pointwise(w, i, -1);
  if (softmax_dim_arg(op) >= 0) return tensors(1), rule_pointwise(w, i, softmax_dim_arg(op));
  if (is_reduction(op)) return tensors(1), rule_reduction(w, i);
  if (op == "view" || op == "_unsafe_view" || op == "reshape" || op == "view_copy") return tensors(1), rule_view(w, i);
  if (op == "permute" || op == "transpose" || op == "t") return tensors(1), rule_permute(w, i);
  if (op == "expand") return tensors(1), rule_expand(w, i);
  if (op == "unsqueeze" || op == "squeeze" || op == "select" || op == "slice") return tensors(1), rule_unsqueeze_like(w, i);
  if (op == "mm") return tensors(2), rule_mm(w, i);
  if (op == "bmm" || op == "matmul") return tensors(2), rule_batched_matmul(w, i);
  if (op == "baddbmm") return tensors(3), rule_batched_matmul(w, i);
  if (is_sdpa(op)) return tensors(3), rule_attention(w, i, false);
  throw Fail{"has no slicing rule"};
}

// Walks one region in node order; stops at `stop` (with `stop_why`) if no earlier node ends it.
SliceRegion walk_region(const Graph& g, SliceRegion R, int stop, const std::string& stop_why) {
  Walk w(g, R.slice_dims);
  std::set<int> invariants;  // region nodes computed from constants only: outside the loop
  const int first = R.nodes.front(), last = R.nodes.back();
  for (int i = first; i <= last; ++i) {
    const Node& n = g.nodes[i];
    int uses = -1;
    n.for_each_input([&](const Arg& a) { if (uses < 0 && w.inside(a.ref)) uses = a.ref; });
    const bool in_region = n.hints.region == R.region && n.op != OpKind::Output;
    if (!in_region) {
      if (uses >= 0) {
        R.end_node = i;
        R.end_reason = "it is outside the region and reads " + w.name(uses) + " from the sliced part";
        break;
      }
      continue;
    }
    if (i == stop) {
      R.end_node = i;
      R.end_reason = stop_why;
      break;
    }
    // Built from nothing but constants (a factory op, or ops on such values), drawing no random
    // numbers and writing nothing: every slice would compute it alike, so it stays outside the loop,
    // run once and read whole, with or without a rule. flex_attention builds its default block mask
    // this way inside the region (ones, arange, index_put, sort ...).
    bool invariant = n.op == OpKind::CallFunction && !n.effects.nondeterministic_seeded && !n.effects.mutates &&
                     op_namespace(n.target) != "higher_order";
    n.for_each_input([&](const Arg& a) { invariant &= invariants.count(a.ref) > 0; });
    if (invariant) {
      invariants.insert(i);
      continue;
    }
    w.pending_ext.clear();
    w.pending_E = 0;
    std::vector<SliceMap> out;
    try {
      out = apply_rule(w, i);
      if (out.empty()) out.push_back(SliceMap{});
      // Each sliced result must have the group's dims, and their sizes, in its declared type (types
      // that contradict the rule come from a malformed document).
      auto fits = [&](const ValueType& v, const SliceMap& m) {
        if (!m.sliced() || v.kind != ValueType::Kind::Tensor) return;
        const std::vector<int64_t> got = group_sizes(v.tensor, m);  // throws Fail on a too-small rank
        if (w.E && group_extent(v.tensor, m) != w.E)
          throw Fail{"its type " + to_string(v) + " has " + std::to_string(group_extent(v.tensor, m)) +
                     " slices along " + to_string(m) + " where the region has " + std::to_string(w.E)};
      };
      if (n.type.kind == ValueType::Kind::Tuple)
        for (size_t e = 0; e < n.type.elems.size() && e < out.size(); ++e) fits(n.type.elems[e], out[e]);
      else fits(n.type, out[0]);
    } catch (const Fail& f) {
      R.end_node = i;
      R.end_reason = f.why;
      break;
    }
    bool any_sliced = false;
    for (const SliceMap& m : out) any_sliced |= m.sliced();
    if (uses < 0 && !any_sliced) continue;  // reads nothing sliced and is not sliced: stays outside
    // Commit: the node, its inputs' maps, the extent and the group shapes.
    if (!w.E) w.E = w.pending_E;
    for (const auto& kv : w.pending_ext) {
      if (w.inside(kv.first) || w.ext.count(kv.first)) continue;
      w.ext[kv.first] = kv.second;
      w.ext_order.push_back(kv.first);
    }
    n.for_each_input([&](const Arg& a) {  // non-tensor and unassigned inputs pass whole
      if (!w.inside(a.ref) && !w.ext.count(a.ref)) {
        w.ext[a.ref] = SliceMap{};
        w.ext_order.push_back(a.ref);
      }
    });
    w.maps[i] = out;
    R.sliceable.push_back(i);
  }
  R.extent = w.E;
  R.maps = w.maps;
  for (const auto& [node, elem] : w.replicated)
    if (elem < 0 && w.maps.count(node)) R.replicated.insert(node);
  for (const auto& [node, elem] : w.summed)
    if (elem < 0 && w.maps.count(node)) R.summed.insert(node);
  for (const auto& [node, dims] : w.global_index)
    if (w.maps.count(node)) R.global_index[node] = dims;
  for (int x : w.ext_order) R.inputs.push_back({x, w.ext[x]});
  auto add_group = [&](const ValueType& v, SliceMap m) {
    if (!m.sliced() || v.kind != ValueType::Kind::Tensor) return;
    auto s = group_sizes(v.tensor, m);
    if (std::find(R.groups.begin(), R.groups.end(), s) == R.groups.end()) R.groups.push_back(s);
  };
  for (const SliceInput& in : R.inputs) add_group(g.nodes[in.node].type, in.map);
  for (const auto& kv : R.maps) {
    const ValueType& v = g.nodes[kv.first].type;
    if (v.kind == ValueType::Kind::Tuple)
      for (size_t e = 0; e < v.elems.size() && e < kv.second.size(); ++e) add_group(v.elems[e], kv.second[e]);
    else add_group(v, kv.second[0]);
  }
  std::sort(R.groups.begin(), R.groups.end());
  // Outputs: sliceable values read by any node outside the sliceable subgraph.
  const auto users = g.users();
  for (int s : R.sliceable)
    for (int u : users[s])
      if (!R.maps.count(u)) {
        R.outputs.push_back(s);
        break;
      }
  return R;
}

}  // namespace

bool subgraph_reads_placeholder(const Graph& g, const std::string& sub, int k) { return reads_placeholder(g, sub, k); }

SliceLegality slice_legality(const Graph& g) {
  SliceLegality L;
  std::map<int, int> index;  // region id -> position in L.regions
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    if (n.hints.empty() || n.op == OpKind::Output || n.op == OpKind::Placeholder) continue;
    auto it = index.find(n.hints.region);
    if (it == index.end()) {
      it = index.emplace(n.hints.region, static_cast<int>(L.regions.size())).first;
      SliceRegion R;
      R.region = n.hints.region;
      R.hints = n.hints;
      R.slice_dims = n.hints.slice_dims;
      L.regions.push_back(R);
    }
    L.regions[it->second].nodes.push_back(i);
  }
  for (SliceRegion& R : L.regions) {
    narrow_default_dims(g, R);
    SliceRegion base = R;
    R = walk_region(g, base, -1, "");
    // A value leaving the loop must be a tensor split by slice (the loop writes slice i of it); when
    // one is not, end the subgraph at its producer and walk again.
    for (int guard = 0; guard < 64; ++guard) {
      int bad = -1;
      std::string why;
      for (int s : R.outputs) {
        const ValueType& v = g.nodes[s].type;
        if (v.kind != ValueType::Kind::Tensor) { bad = s; why = "its tuple result is used whole after the sliced part"; break; }
        if (!R.maps[s][0].sliced() && !R.replicated.count(s) && !R.summed.count(s)) {
          bad = s;
          why = "its result is used after the sliced part but is not split by slice";
          break;
        }
      }
      if (bad < 0) break;
      R = walk_region(g, base, bad, why);
    }
  }
  return L;
}

std::string to_string(const SliceLegality& L, const Graph& g) {
  std::ostringstream os;
  if (L.regions.empty()) os << "slice-legality: no hinted regions\n";
  for (const SliceRegion& R : L.regions) {
    os << "slice-legality region " << R.region << " (schedule="
       << (R.hints.schedule ? schedule_name(*R.hints.schedule) : "unset") << "): " << R.sliceable.size() << " of "
       << R.nodes.size() << " nodes sliceable along dims "
       << (R.slice_dims.empty() ? std::string("batch,heads") : dims_str(R.slice_dims)) << ", extent " << R.extent << "\n";
    if (!R.narrowed.empty()) os << "  no slice_dims hint: " << R.narrowed << "\n";
    for (const auto& [node, dims] : R.global_index) {
      os << "  " << describe(g, node) << " reads the";
      for (size_t k = 0; k < dims.size(); ++k) os << (k ? " and" : "") << (dims[k] == 0 ? " batch" : " head");
      os << " index: each slice reads the global one from an index table\n";
    }
    if (!R.inputs.empty()) {
      os << "  inputs:";
      for (size_t k = 0; k < R.inputs.size(); ++k)
        os << (k ? ", " : " ") << "%" << g.nodes[R.inputs[k].node].name << " " << to_string(R.inputs[k].map);
      os << "\n";
    }
    if (!R.outputs.empty()) {
      os << "  outputs:";
      for (size_t k = 0; k < R.outputs.size(); ++k)
        os << (k ? ", " : " ") << "%" << g.nodes[R.outputs[k]].name
           << (R.summed.count(R.outputs[k]) ? " (summed)" : R.replicated.count(R.outputs[k]) ? " (replicated)" : "");
      os << "\n";
    }
    if (R.end_node >= 0) os << "  ends at " << describe(g, R.end_node) << ": " << R.end_reason << "\n";
    else os << "  the whole region is sliceable\n";
    auto counts = R.slice_counts();
    if (!counts.empty()) os << "  slice counts: " << dims_str(counts).substr(1, dims_str(counts).size() - 2) << "\n";
  }
  std::string s = os.str();
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool slice_legality_pass(Graph& g, PassContext& ctx) {
  ctx.notes.push_back(to_string(slice_legality(g), g));
  return false;
}

}  // namespace hb

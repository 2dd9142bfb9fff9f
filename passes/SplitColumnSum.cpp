#include "passes/SplitColumnSum.h"

#include <optional>
#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

namespace {

constexpr const char* kSum = "aten::sum.dim_IntList";
constexpr int64_t kMinRows = 512, kMinOutputs = 128, kMaxRowsPerPartial = 1024;

bool on_cuda(const TensorType& t) { return t.device.rfind("cuda", 0) == 0; }

Arg int_list(const std::vector<int64_t>& v) {
  Arg a;
  a.kind = Arg::Kind::List;
  for (int64_t x : v) a.items.push_back(Arg::of_int(x));
  return a;
}

Arg of_bool(bool b) {
  Arg a;
  a.kind = Arg::Kind::Bool;
  a.b = b;
  return a;
}

TensorType contiguous(std::vector<int64_t> sizes, DType dtype, const std::string& device) {
  TensorType t;
  t.dtype = dtype;
  t.device = device;
  int64_t stride = 1;
  t.shape.resize(sizes.size());
  t.stride.resize(sizes.size());
  for (size_t k = sizes.size(); k-- > 0;) {
    t.shape[k].value = sizes[k];
    t.stride[k].value = stride;
    stride *= sizes[k];
  }
  return t;
}

struct Split {
  int k = 0;           // leading dims reduced
  int64_t rows = 0;    // N: their product
  int64_t r = 0;       // partial sums
  bool keepdim = false;
  std::vector<int64_t> kept;  // the kept dims' sizes
  int64_t outputs = 1;        // their product
};

// The split of sum node n, or nullopt when the pass leaves it alone.
std::optional<Split> plan(const Graph& g, const Node& n) {
  if (n.target != kSum || n.args.size() < 2 || n.args[0].kind != Arg::Kind::Ref || n.args[1].kind != Arg::Kind::List)
    return std::nullopt;
  for (const auto& [key, a] : n.kwargs)
    if (key != "dtype") return std::nullopt;
  const Node& x = g.nodes[n.args[0].ref];
  if (x.type.kind != ValueType::Kind::Tensor || n.type.kind != ValueType::Kind::Tensor) return std::nullopt;
  const TensorType& in = x.type.tensor;
  const TensorType& out = n.type.tensor;
  if (!on_cuda(in) || !in.contiguous_static() || !is_floating(in.dtype) || !is_floating(out.dtype) ||
      !out.contiguous_static())
    return std::nullopt;
  Split s;
  s.keepdim = n.args.size() > 2 && n.args[2].kind == Arg::Kind::Bool && n.args[2].b;
  if (n.args.size() > 2 && n.args[2].kind != Arg::Kind::Bool) return std::nullopt;
  const int rank = static_cast<int>(in.shape.size());
  std::vector<bool> reduced(rank, false);
  for (const Arg& d : n.args[1].items) {
    if (d.kind != Arg::Kind::Int || d.i < -rank || d.i >= rank) return std::nullopt;
    const int dim = static_cast<int>(d.i < 0 ? d.i + rank : d.i);
    if (reduced[dim]) return std::nullopt;
    reduced[dim] = true;
    ++s.k;
  }
  if (s.k == 0 || s.k >= rank) return std::nullopt;  // sum over nothing (all dims), or every dim
  for (int d = 0; d < rank; ++d)
    if (reduced[d] != (d < s.k)) return std::nullopt;  // only a prefix of the dims
  s.rows = 1;
  for (int d = 0; d < s.k; ++d) s.rows *= in.shape[d].value;
  for (int d = s.k; d < rank; ++d) s.kept.push_back(in.shape[d].value), s.outputs *= in.shape[d].value;
  if (s.rows < kMinRows || s.outputs < kMinOutputs) return std::nullopt;
  for (int64_t r : {32, 64, 128, 256})
    if (s.rows % r == 0 && s.rows / r <= kMaxRowsPerPartial) {
      s.r = r;
      break;
    }
  if (s.r == 0) return std::nullopt;
  return s;
}

}  // namespace

bool split_column_sum(Graph& g, PassContext& ctx) {
  std::ostringstream note;
  int split = 0;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const std::optional<Split> s = plan(g, g.nodes[i]);
    if (!s) continue;
    const std::string name = g.nodes[i].name;
    const TensorType out = g.nodes[i].type.tensor;
    const Arg x = g.nodes[i].args[0];
    const std::string& dev = out.device;
    // The rows as r x m, then (keepdim) k - 1 ones, then the kept dims.
    std::vector<int64_t> rows_shape = {s->r, s->rows / s->r};
    if (s->keepdim) rows_shape.insert(rows_shape.end(), s->k - 1, 1);
    rows_shape.insert(rows_shape.end(), s->kept.begin(), s->kept.end());
    std::vector<int64_t> part_shape(rows_shape);
    part_shape.erase(part_shape.begin() + 1);

    Node view;
    view.name = unique_name(g, name + "_rows");
    view.target = "aten::view.default";
    view.args = {x, int_list(rows_shape)};
    view.type.kind = ValueType::Kind::Tensor;
    view.type.tensor = contiguous(rows_shape, g.tensor_type(x)->dtype, dev);
    view.effects.is_view = true;
    int at = insert_node_like(g, i, view, i);
    ++i;

    Node part;
    part.name = unique_name(g, name + "_part");
    part.target = kSum;
    part.args = {Arg::of_ref(at, view.name), int_list({1}), of_bool(false)};
    part.kwargs = {{"dtype", Arg::of_dtype(DType::Float32)}};
    part.type.kind = ValueType::Kind::Tensor;
    part.type.tensor = contiguous(part_shape, DType::Float32, dev);
    at = insert_node_like(g, i, part, i);
    ++i;

    // The last node keeps the original's name and index (its users' references stay valid).
    std::vector<int64_t> out_sizes;
    for (const Dim& d : out.shape) out_sizes.push_back(d.value);
    int last = i;
    if (out.dtype != DType::Float32) {
      Node total;
      total.name = unique_name(g, name + "_f32");
      total.target = kSum;
      total.args = {Arg::of_ref(at, part.name), int_list({0}), of_bool(s->keepdim)};
      total.kwargs = {{"dtype", Arg::of_dtype(DType::Float32)}};
      total.type.kind = ValueType::Kind::Tensor;
      total.type.tensor = contiguous(out_sizes, DType::Float32, dev);
      at = insert_node_like(g, i, total, i);
      ++i;
      last = i;
      Node& cast = g.nodes[last];
      cast.target = "aten::_to_copy.default";
      cast.args = {Arg::of_ref(at, total.name)};
      cast.kwargs = {{"dtype", Arg::of_dtype(out.dtype)}};
    } else {
      Node& total = g.nodes[last];
      total.args = {Arg::of_ref(at, part.name), int_list({0}), of_bool(s->keepdim)};
      total.kwargs = {{"dtype", Arg::of_dtype(DType::Float32)}};
    }
    g.nodes[last].effects = OpEffects{};
    note << (split++ ? "; " : ": ") << "%" << name << " over " << s->rows << " rows of " << s->outputs
         << " as " << s->r << " partial sums of " << s->rows / s->r << " rows";
  }
  if (!split) return false;
  ctx.notes.push_back("split-column-sum graph " + g.name + note.str());
  return true;
}

}  // namespace hb

#include "passes/SplitColumnSum.h"

#include <optional>
#include <sstream>

namespace hb {

namespace {

constexpr const char* kSum = "aten::sum.dim_IntList";
constexpr const char* kColumnSum = "hintbackend::column_sum.default";
constexpr int64_t kMinRows = 512, kMinOutputs = 128, kMaxRowsPerPartial = 1024;

bool on_cuda(const TensorType& t) { return t.device.rfind("cuda", 0) == 0; }

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
    // In place: the node keeps its name, index and type (its users' references stay valid).
    Node& n = g.nodes[i];
    const Arg x = n.args[0];
    n.target = kColumnSum;
    n.args = {x, Arg::of_int(s->k), Arg::of_bool(s->keepdim), Arg::of_int(s->r), Arg::of_dtype(n.type.tensor.dtype)};
    n.kwargs.clear();
    n.effects = OpEffects{};
    note << (split++ ? "; " : ": ") << "%" << n.name << " over " << s->rows << " rows of " << s->outputs << " as "
         << s->r << " partial sums of " << s->rows / s->r << " rows";
  }
  if (!split) return false;
  ctx.notes.push_back("split-column-sum graph " + g.name + note.str());
  return true;
}

}  // namespace hb

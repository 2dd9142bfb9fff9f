#include "backend/ir/Graph.h"

#include <sstream>

namespace hb {

namespace {
struct DTypeInfo {
  DType d;
  const char* name;
  const char* short_name;
  int64_t bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::Bool, "bool", "b8", 1},           {DType::UInt8, "uint8", "u8", 1},
    {DType::Int8, "int8", "i8", 1},           {DType::Int16, "int16", "i16", 2},
    {DType::Int32, "int32", "i32", 4},        {DType::Int64, "int64", "i64", 8},
    {DType::Float16, "float16", "f16", 2},    {DType::BFloat16, "bfloat16", "bf16", 2},
    {DType::Float32, "float32", "f32", 4},    {DType::Float64, "float64", "f64", 8},
    {DType::Complex64, "complex64", "c64", 8}, {DType::Complex128, "complex128", "c128", 16},
    {DType::Float8_e4m3fn, "float8_e4m3fn", "f8e4m3", 1},
    {DType::Float8_e5m2, "float8_e5m2", "f8e5m2", 1},
};
const DTypeInfo& info(DType d) { return kDTypes[static_cast<int>(d)]; }
}  // namespace

std::optional<DType> parse_dtype(const std::string& name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.d;
  return std::nullopt;
}
const char* dtype_name(DType d) { return info(d).name; }
const char* dtype_short(DType d) { return info(d).short_name; }
int64_t dtype_bytes(DType d) { return info(d).bytes; }

bool is_floating(DType d) {
  return d == DType::Float16 || d == DType::BFloat16 || d == DType::Float32 || d == DType::Float64;
}

std::optional<int64_t> TensorType::numel() const {
  int64_t n = 1;
  for (const Dim& d : shape) {
    if (!d.is_static()) return std::nullopt;
    n *= d.value;
  }
  return n;
}

bool TensorType::contiguous_static() const {
  if (stride.size() != shape.size()) return false;
  int64_t expect = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (!shape[k].is_static() || !stride[k].is_static()) return false;
    if (shape[k].value != 1 && stride[k].value != expect) return false;
    expect *= shape[k].value;
  }
  return true;
}

bool TensorType::same_dense_elements(const TensorType& o) const {
  const std::optional<int64_t> n = numel();
  return dtype == o.dtype && contiguous_static() && o.contiguous_static() && n && n == o.numel();
}

bool TensorType::same_layout(const TensorType& o) const {
  return shape == o.shape && stride == o.stride && dtype == o.dtype && device == o.device;
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Placeholder: return "placeholder";
    case OpKind::CallFunction: return "call_function";
    case OpKind::GetAttr: return "get_attr";
    case OpKind::Output: return "output";
  }
  return "?";
}

std::vector<int> Graph::placeholders() const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
    if (nodes[i].op == OpKind::Placeholder) out.push_back(i);
  return out;
}

int Graph::output_node() const {
  for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i)
    if (nodes[i].op == OpKind::Output) return i;
  return -1;
}

const TensorType* Graph::tensor_type(const Arg& a) const {
  if (a.kind != Arg::Kind::Ref || a.ref < 0 || a.ref >= static_cast<int>(nodes.size()) ||
      nodes[a.ref].type.kind != ValueType::Kind::Tensor)
    return nullptr;
  return &nodes[a.ref].type.tensor;
}

int Graph::find(const std::string& n) const {
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
    if (nodes[i].name == n) return i;
  return -1;
}

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> u(nodes.size());
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    nodes[i].for_each_input([&](const Arg& a) {
      if (a.ref >= 0 && (u[a.ref].empty() || u[a.ref].back() != i)) u[a.ref].push_back(i);
    });
  }
  return u;
}

std::string describe(const Graph& g, int node) {
  std::ostringstream os;
  if (node < 0 || node >= static_cast<int>(g.nodes.size())) {
    os << "node #" << node << " of graph '" << g.name << "'";
    return os.str();
  }
  const Node& n = g.nodes[node];
  os << "%" << n.name << " (" << (n.target.empty() ? op_kind_name(n.op) : n.target) << ")";
  if (!n.source.empty()) os << " at " << n.source;
  if (!g.name.empty()) os << " in graph '" << g.name << "'";
  return os.str();
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::BFS: return "bfs";
    case Schedule::DFS: return "dfs";
    case Schedule::Auto: return "auto";
  }
  return "?";
}
const char* kernel_pref_name(KernelPref k) {
  switch (k) {
    case KernelPref::Auto: return "auto";
    case KernelPref::Cudnn: return "cudnn";
    case KernelPref::Fused: return "fused";
    case KernelPref::Aten: return "aten";
  }
  return "?";
}

bool Hints::operator==(const Hints& o) const {
  return region == o.region && path == o.path && schedule == o.schedule &&
         slice_dims == o.slice_dims && slices == o.slices && slice_size == o.slice_size &&
         memory_budget == o.memory_budget && kernel == o.kernel && deterministic == o.deterministic;
}

std::string to_string(const Hints& h) {
  if (h.empty()) return "";
  std::ostringstream os;
  os << "region=" << h.region << " path=";
  for (size_t i = 0; i < h.path.size(); ++i) os << (i ? "/" : "") << h.path[i];
  if (h.schedule) os << " schedule=" << schedule_name(*h.schedule);
  if (!h.slice_dims.empty()) {
    os << " slice_dims=[";
    for (size_t i = 0; i < h.slice_dims.size(); ++i) os << (i ? "," : "") << h.slice_dims[i];
    os << "]";
  }
  if (h.slices) os << " slices=" << *h.slices;
  if (h.slice_size) os << " slice_size=" << *h.slice_size;
  if (h.memory_budget) os << " memory_budget=" << *h.memory_budget;
  if (h.kernel) os << " kernel=" << kernel_pref_name(*h.kernel);
  if (h.deterministic) os << " deterministic=" << (*h.deterministic ? "true" : "false");
  return os.str();
}

}  // namespace hb

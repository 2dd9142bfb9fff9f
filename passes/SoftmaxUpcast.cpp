#include "passes/SoftmaxUpcast.h"

#include <sstream>

#include "backend/ir/GraphEdit.h"

namespace hb {

int plain_cast_source(const Graph& g, const Node& n) {
  if (n.args.empty() || n.args[0].kind != Arg::Kind::Ref) return -1;
  const Node& src = g.nodes[n.args[0].ref];
  if (n.type.kind != ValueType::Kind::Tensor || src.type.kind != ValueType::Kind::Tensor) return -1;
  const TensorType& out = n.type.tensor;
  const TensorType& in = src.type.tensor;
  if (in.device != out.device || in.shape != out.shape) return -1;
  if (n.target == "prims::convert_element_type.default") {
    if (n.args.size() != 2 || n.args[1].kind != Arg::Kind::DType || n.args[1].dtype != out.dtype) return -1;
    return n.args[0].ref;
  }
  if (n.target != "aten::_to_copy.default" || n.args.size() != 1) return -1;
  for (const auto& [key, a] : n.kwargs) {
    if (key == "dtype" && a.kind == Arg::Kind::DType && a.dtype == out.dtype) continue;
    if (key == "layout" && (a.kind == Arg::Kind::None || (a.kind == Arg::Kind::Layout && a.s == "strided"))) continue;
    if (key == "device" && (a.kind == Arg::Kind::None || (a.kind == Arg::Kind::Device && a.s == in.device))) continue;
    return -1;  // memory_format, non_blocking, pin_memory ...: not a plain cast
  }
  return n.kwarg("dtype") ? n.args[0].ref : -1;
}

namespace {

bool on_cuda(const TensorType& t) { return t.device.rfind("cuda", 0) == 0; }

// A pure float32 upcast of an fp16 tensor on CUDA: the input's index, or -1.
int upcast_input(const Graph& g, const Node& n) {
  const int src = plain_cast_source(g, n);
  if (src < 0) return -1;
  // Float16 only: ATen's CUDA half_to_float softmax refuses bfloat16 ("conversion is supported for Half
  // type only", torch 2.11, seen on the H200).
  const TensorType& in = g.nodes[src].type.tensor;
  return n.type.tensor.dtype == DType::Float32 && in.dtype == DType::Float16 && on_cuda(in) ? src : -1;
}

}  // namespace

bool fold_softmax_upcast(Graph& g, PassContext& ctx) {
  std::vector<int> uses(g.nodes.size(), 0);
  for (const Node& n : g.nodes) n.for_each_input([&](const Arg& a) { ++uses[a.ref]; });
  std::vector<bool> keep(g.nodes.size(), true);
  std::ostringstream note;
  int folded = 0;
  for (Node& n : g.nodes) {
    if (n.target != "aten::_softmax.default" && n.target != "aten::_log_softmax.default") continue;
    if (n.args.size() != 3 || n.args[0].kind != Arg::Kind::Ref || n.args[2].kind != Arg::Kind::Bool || n.args[2].b)
      continue;
    const int up = n.args[0].ref;
    const int src = upcast_input(g, g.nodes[up]);
    if (src < 0) continue;
    n.args[0] = Arg::of_ref(src, g.nodes[src].name);
    n.args[2].b = true;
    if (--uses[up] == 0 && g.nodes[up].op == OpKind::CallFunction) keep[up] = false;
    note << (folded++ ? "; " : ": ") << "%" << n.name << " reads %" << g.nodes[src].name << " ("
         << dtype_name(g.nodes[src].type.tensor.dtype) << ") directly"
         << (keep[up] ? "" : ", %" + g.nodes[up].name + " removed");
  }
  if (!folded) return false;
  ctx.notes.push_back("fold-softmax-upcast graph " + g.name + note.str());
  remove_nodes(g, keep);
  return true;
}

}  // namespace hb

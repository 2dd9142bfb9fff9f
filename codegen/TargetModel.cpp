#include "codegen/TargetModel.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "backend/ir/Aliasing.h"
#include "backend/ir/CrossEntropy.h"
#include "codegen/FlexKernelGen.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "codegen/PointwiseProgram.h"

namespace hb {

namespace {

bool on_cpu_or_cuda(const std::string& d) {
  return d == "cpu" || d.rfind("cpu:", 0) == 0 || d == "cuda" || d.rfind("cuda:", 0) == 0;
}

}  // namespace

std::string normalize_device(const std::string& device) { return device == "cuda" ? "cuda:0" : device; }

std::string structural_unplaceable(const Graph& g, int node, bool* ask_op) {
  *ask_op = false;
  const Node& n = g.nodes[node];
  if (n.target == kFusedPointwiseTarget)  // its kernels write into any preallocated result
    return n.type.kind == ValueType::Kind::Tensor && n.type.tensor.contiguous_static() ? "" : "not static contiguous";
  const KernelKind kind = op_kernel_kind(n);
  if (kind != KernelKind::Aten) return kernel_kind_name(kind);
  if (n.effects.is_view || n.effects.mutates || aliases_without_annotation(n)) return "alias";
  if (n.effects.nondeterministic_seeded) return "random";  // its out= overload may draw differently
  if (n.type.kind == ValueType::Kind::Tuple) return "multi-output op";
  if (n.type.kind != ValueType::Kind::Tensor) return "not a tensor";
  if (!n.type.tensor.contiguous_static()) return "not static contiguous";
  if (!on_cpu_or_cuda(n.type.tensor.device)) return "on " + n.type.tensor.device;
  *ask_op = true;
  return "";
}

Target make_target(std::string name, OutKernelQuery query) {
  Target t;
  t.name = std::move(name);
  t.unplaceable = [query = std::move(query)](const Graph& g, int node) -> std::string {
    bool ask = false;
    std::string why = structural_unplaceable(g, node, &ask);
    if (why.empty() && ask && query) why = query(g.nodes[node], normalize_device(g.nodes[node].type.tensor.device));
    return why;
  };
  t.workspace = [](const Graph& g, const Node& n) { return kernel_workspace_bytes(g, n); };
  return t;
}

Target structural_target() { return make_target("structural", nullptr); }

Target table_target(const std::string& table_text) {
  // "<target> <device>: <ok | why>" per line; '#' starts a comment.
  auto table = std::make_shared<std::map<std::pair<std::string, std::string>, std::string>>();
  std::istringstream in(table_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' '), colon = line.find(": ");
    if (sp == std::string::npos || colon == std::string::npos || colon < sp) continue;
    const std::string why = line.substr(colon + 2);
    (*table)[{line.substr(0, sp), line.substr(sp + 1, colon - sp - 1)}] = why == "ok" ? "" : why;
  }
  return make_target("table", [table](const Node& n, const std::string& device) -> std::string {
    auto it = table->find({n.target, device});
    return it == table->end() ? "not in the placement table" : it->second;
  });
}

std::string placement_table(const Graph& g, const Target& t) {
  std::set<std::string> lines;
  std::function<void(const Graph&)> walk = [&](const Graph& graph) {
    for (int i = 0; i < static_cast<int>(graph.nodes.size()); ++i) {
      bool ask = false;
      if (!structural_unplaceable(graph, i, &ask).empty() || !ask) continue;
      const std::string why = t.why_unplaceable(graph, i);
      lines.insert(graph.nodes[i].target + " " + normalize_device(graph.nodes[i].type.tensor.device) + ": " +
                   (why.empty() ? "ok" : why));
    }
    for (const auto& kv : graph.subgraphs) walk(*kv.second);
  };
  walk(g);
  std::string out = "# placement table of target '" + t.name + "' (hb-opt --placement=<this file> replays it)\n";
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

int64_t kernel_workspace_bytes(const Graph& g, const Node& n, bool cudnn_attention, bool fused_cpu, bool fused_cuda) {
  if (n.target == kCrossEntropyForwardTarget && n.args.size() == 6 && n.args[4].kind == Arg::Kind::DType &&
      n.args[5].kind == Arg::Kind::Int && n.type.kind == ValueType::Kind::Tuple && n.type.elems.size() == 3) {
    // Its chunk's upcast rows and their log-probabilities: 2 x rows x C of the result's dtype.
    const TensorType* x = g.tensor_type(n.args[0]);
    if (!x || x->shape.empty() || !x->shape.back().is_static()) return 0;
    return 2 * n.args[5].i * x->shape.back().value * dtype_bytes(n.args[4].dtype);
  }
  if ((n.target == kCrossEntropyBackwardTarget || n.target == kCrossEntropyBackwardLogitsTarget) && n.args.size() > 1 &&
      n.type.kind == ValueType::Kind::Tensor && n.type.tensor.device.rfind("cuda", 0) != 0 &&
      (n.type.tensor.dtype == DType::BFloat16 || n.type.tensor.dtype == DType::Float16)) {
    // Off CUDA a half-precision gradient is computed in float32 a chunk of rows at a time: one chunk.
    const TensorType* x = g.tensor_type(n.args[1]);
    if (!x || x->shape.size() != 2 || !x->shape[0].is_static() || !x->shape[1].is_static()) return 0;
    return cross_entropy_chunk_rows(x->shape[0].value, x->shape[1].value, 4) * x->shape[1].value * 4;
  }
  if (const std::optional<LayerNormShape> ln = layer_norm_shape(n);
      ln && ln->backward && n.args[7].kind == Arg::Kind::List && n.args[7].items.size() == 3 &&
      (n.args[7].items[1].b || n.args[7].items[2].b) && layer_norm_rows_why_not(g, n).empty()) {
    // LayerNormRows' per-block float sums of the weight and bias gradients (codegen/cuda/LayerNorm.cu).
    const std::optional<int64_t> numel = g.tensor_type(n.args[ln->input_arg])->numel();  // (the rule: a tensor)
    if (!numel || ln->columns <= 0) return 0;
    return std::min(*numel / ln->columns, kLayerNormRowsPartialBlocks) * 2 * ln->columns * 4;
  }
  const bool fw = n.target == "higher_order::flex_attention";
  if ((!fw && n.target != "higher_order::flex_attention_backward") || n.args.size() < 2) return 0;
  const int node = static_cast<int>(&n - g.nodes.data());
  const FlexAnalysis a = analyze_flex(g, node);
  if (cudnn_attention && cudnn_why_not(g, node, a).empty()) return cudnn_flex_workspace_bytes(g, node, a);
  const TensorType *qtt = g.tensor_type(n.args[0]), *ktt = g.tensor_type(n.args[1]);
  if (!qtt || !ktt || qtt->shape.size() != 4 || ktt->shape.size() != 4) return 0;
  const std::vector<Dim>*q = &qtt->shape, *k = &ktt->shape;
  for (const Dim& d : {(*q)[0], (*q)[1], (*q)[2], (*q)[3], (*k)[2]})
    if (!d.is_static()) return 0;  // symbolic: counted as 0, like symbolic values
  const TensorType& qt = *qtt;
  std::string why;
  if (fused_cuda && qt.device.rfind("cuda", 0) == 0 && generate_flex_kernel(g, node, &why, FlexKernelDevice::Cuda)) {
    if (fw) return 0;
    // The delta rows, and one launch's float dQ (flex_cuda_dq_launches; every row where it has none).
    const std::optional<FlexDqLaunches> l = flex_cuda_dq_launches(g, node);
    const int64_t rows = (*q)[0].value * (*q)[1].value * (*q)[2].value;
    return rows * 4 + (l ? l->workspace_bytes : rows * (*q)[3].value * 4);
  }
  if (fused_cpu && qt.device.rfind("cpu", 0) == 0 && generate_flex_kernel(g, node, &why)) {
    const int64_t elem = qt.dtype == DType::Float64 ? 8 : 4;
    const int64_t copy = (*q)[0].value * (*q)[1].value * std::max((*q)[2].value, (*k)[2].value) * (*q)[3].value;
    return copy * elem * (fw ? kFlexFusedForwardCopies : kFlexFusedBackwardCopies);
  }
  return (*q)[0].value * (*q)[1].value * (*q)[2].value * (*k)[2].value *
         (fw ? kFlexForwardWorkspace : kFlexBackwardWorkspace);
}

}  // namespace hb

#include "codegen/KernelSelect.h"

#include "backend/ir/Aliasing.h"
#include "backend/ir/Error.h"
#include "backend/ir/SliceLoop.h"
#include "backend/ir/SymOp.h"
#include "codegen/FlexKernelGen.h"
#include "codegen/FlexLowering.h"
#include "codegen/HostCompiler.h"
#include "codegen/PointwiseProgram.h"

#include <set>
#include <sstream>

namespace hb {

bool is_native_sym_op(const std::string& t) { return sym_op_code(t).has_value(); }

namespace {

std::string ns_of(const std::string& target) { return target.substr(0, target.find("::")); }

KernelChoice choose(const Node& n) {
  switch (n.op) {
    case OpKind::Placeholder: return {KernelKind::Input, ""};
    case OpKind::GetAttr: return {KernelKind::Constant, ""};
    case OpKind::Output: return {KernelKind::Output, ""};
    case OpKind::CallFunction: break;
  }
  const std::string& t = n.target;
  if (t == "operator::getitem") return {KernelKind::GetItem, ""};
  if (is_native_sym_op(t)) return {KernelKind::SymOp, ""};
  if (t == "higher_order::flex_attention") return {KernelKind::FlexForward, "C++ reference (dense scores)"};
  if (t == "higher_order::flex_attention_backward")
    return {KernelKind::FlexBackward, "C++ reference (dense scores, recomputed)"};
  if (t == "flex_lib::zeros_and_scatter.default") return {KernelKind::ZerosAndScatter, ""};
  if (t == kSliceLoopTarget) return {KernelKind::SliceLoop, "DFS: the body runs once per slice"};
  if (t == kFusedPointwiseTarget) return {KernelKind::FusedPointwise, ""};
  if (t == "hintbackend::cross_entropy_backward.default")  // fold-cross-entropy-backward's op
    return {KernelKind::Aten, "nll_loss_backward + log-softmax gradient folded: exp, row scale, target column "
                              "into one buffer (backend/runtime/CrossEntropyBackward.cpp)"};
  if (t == "hintbackend::cross_entropy_forward.default")  // fold-cross-entropy-forward's op
    return {KernelKind::Aten, "log-softmax + nll_loss_forward folded: the rows a chunk at a time (upcast, "
                              "log-softmax, row maxima, target column), then the loss "
                              "(backend/runtime/CrossEntropyForward.cpp)"};
  if (t == "hintbackend::cross_entropy_backward.logits")
    return {KernelKind::Aten, "nll_loss_backward + log-softmax gradient folded, from the logits, their row "
                              "maxima and the saved log-probability maxima: no [N, C] log-probabilities "
                              "(backend/runtime/CrossEntropyBackward.cpp)"};
  const std::string ns = ns_of(t);
  if (ns == "higher_order")
    return {KernelKind::Unsupported, "higher-order op with no hintbackend implementation"};
  if (ns == "operator" || ns == "python" || ns == "math" || ns == "torch" || ns == "builtins")
    return {KernelKind::Unsupported, "Python callable with no native implementation"};
  // Every other namespace::name.overload is an OpOverload the serializer saw registered in the
  // dispatcher; the runtime resolves its handle once when it builds the plan.
  return {KernelKind::Aten, ""};
}

// A fused node's choice: its program for the dump, or unsupported with why its body does not compile.
KernelChoice choose_fused(const Graph& g, const Node& n) {
  if (n.args.size() != 2 || n.args[0].kind != Arg::Kind::Graph || !g.subgraphs.count(n.args[0].s))
    return {KernelKind::Unsupported, "malformed fused_pointwise: args must be (@body, [inputs])"};
  try {
    return {KernelKind::FusedPointwise, "program: " + compile_pointwise(*g.subgraphs.at(n.args[0].s)).to_string()};
  } catch (const std::exception& e) {
    return {KernelKind::Unsupported, e.what()};
  }
}

}  // namespace

bool fused_row_shift(const Graph& g, int node, const FlexAnalysis& a) {
  const Node& n = g.nodes[node];
  return n.target == "higher_order::flex_attention_backward" && a.score_row_shift && n.args.size() > 6 &&
         n.args[6].kind == Arg::Kind::None;
}

namespace {

// Why the built CUDA unit cannot launch on this GPU ("" = it can): its kernels ask for more shared memory
// per block than the GPU gives (hb_flex_cuda_smem against CudaCompileSettings::smem_per_block), e.g. the
// mma.sync backward's 192 KiB at head dim 128 on an A100 (163 KiB) or an sm_86/sm_89 GPU (99 KiB).
std::string cuda_smem_why(const HostModule& m, bool backward, const CudaCompileSettings& cuda) {
  using SmemFn = long long (*)(int);
  const auto smem = reinterpret_cast<SmemFn>(m.symbol("hb_flex_cuda_smem"));
  if (cuda.smem_per_block <= 0 || !smem) return "";
  const long long need = smem(backward ? 1 : 0);
  if (need <= cuda.smem_per_block) return "";
  return std::string("the CUDA ") + (backward ? "backward" : "forward") + " needs " + std::to_string(need >> 10) +
         " KiB of shared memory per block; this GPU (sm_" + cuda.arch + ") gives " +
         std::to_string(cuda.smem_per_block >> 10) + " KiB";
}

// Why the tiled kernel with generated score/mask code cannot run this flex node ("" = it can); on
// success `src` holds the generated source and `build` the built library (the CPU kernel on CPU tensors,
// the CUDA kernels on CUDA tensors).
std::string fused_why_not(const Graph& g, int node, const Target& target, FlexKernelSource* src, HostBuild* build) {
  const Node& n = g.nodes[node];
  const TensorType* q = n.args.empty() ? nullptr : g.tensor_type(n.args[0]);
  if (!q) return "q has no tensor type";
  const TensorType& t = *q;
  const bool cuda = t.device.rfind("cuda", 0) == 0;
  if (!cuda && t.device.rfind("cpu", 0) != 0) return "on " + t.device;
  if (t.dtype != DType::Float16 && t.dtype != DType::BFloat16 && t.dtype != DType::Float32 && t.dtype != DType::Float64)
    return std::string("q is ") + dtype_name(t.dtype);
  std::string why;
  std::optional<FlexKernelSource> s =
      generate_flex_kernel(g, node, &why, cuda ? FlexKernelDevice::Cuda : FlexKernelDevice::Cpu);
  if (!s) return why;
  if (cuda && !target.cuda.enabled()) return "cannot build CUDA kernels: " + target.cuda.why_not();
  if (!cuda && !target.host.enabled()) return "no host C++ compiler is configured";
  *build = cuda ? build_cuda_module(s->source, target.cuda) : build_host_module(s->source, target.host);
  if (!build->module) return "building the generated kernel failed: " + build->error;
  if (cuda) {
    if (std::string why = cuda_smem_why(*build->module, n.target == "higher_order::flex_attention_backward",
                                        target.cuda);
        !why.empty())
      return why;
  }
  *src = std::move(*s);
  return "";
}

// Above this, a bias cuDNN would materialize is not built: the generated kernel reads the buffer in place
// (at B4 H16 S4096 a relative bias is 1 GiB and cuDNN's path is twice the generated kernel's speed; at
// S 32768 it is 64 GiB, and with its gradient it does not fit an H200).
constexpr int64_t kMaxMaterializedBias = int64_t{8} << 30;

// Why the memory a materialized bias takes rules cuDNN out for this node ("" = it does not): above
// kMaxMaterializedBias. (A dfs hint or a region's memory_budget could ask the same of smaller biases; the
// generated kernel runs inside slice loops, test_flex_cudnn.py's float-table test checks it on a GPU.)
std::string bias_memory_why(const Graph& g, int node, const FlexAnalysis& a) {
  const std::optional<int64_t> bytes = materialized_bias_bytes(g, node, a);
  if (!bytes || *bytes <= kMaxMaterializedBias) return "";
  return "it would materialize a " + std::to_string((*bytes + (1 << 20) - 1) >> 20) + " MiB bias (above 8 GiB)";
}

// Why cuDNN's dBias would round a buffer's gradient ("" = it would not): cuDNN builds dBias in q's dtype
// only (9.19; backend/runtime/CudnnFlexCall.cpp asks for float32 first), so the gradient of a float32 or
// float64 buffer, gathered from dBias, carries half-precision rounding: 1.9-2.1x eager flex's error against
// float64 for a relative bias (docs/flex-attention.md), past the 2x the project allows. The generated
// kernel adds it in float32.
//
// The forward goes with its backward (the pair on one kernel: no bias materialized for cuDNN's forward;
// on an H100 at B4 H16 S4096 the pair ran 4-5% faster than cuDNN's forward beside the generated
// backward, at a quarter (D64) to a half (D128) of the peak memory), where the backward's rule will
// apply: the buffer is marked as getting a gradient, and the generated backward can take the node
// (flex_cuda_backward_why_not: no deterministic=True, which would have the buffer gradient added in order,
// head dim up to 256, blocks of multiples of 128 x 64, or 64 x 64 on the SIMT backward).
std::string dbias_precision_why(const Graph& g, int node, const FlexAnalysis& a) {
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  if (a.float_grad_buffer < 0) return "";
  if (!a.score_bias || a.score_row_shift || a.score_pointwise || a.softcap > 0) return "";  // no dBias asked of cuDNN
  const TensorType* q = g.tensor_type(n.args[0]);
  if (!q || (q->dtype != DType::BFloat16 && q->dtype != DType::Float16)) return "";
  if (!backward && !flex_cuda_backward_why_not(g, node).empty()) return "";
  return std::string("its dBias is ") + dtype_name(q->dtype) + " only: buffer " + std::to_string(a.float_grad_buffer) +
         "'s float gradient would carry that rounding" + (backward ? "" : " (the backward runs on the generated kernel)");
}

// The CUDA backward's dQ launches (flex_cuda_dq_launches) where they are more than one: "; dQ summed in
// float 8 of 64 (b, kv head) pairs a launch, on two streams in turn (8 launches, 32 MiB)" (deterministic=True:
// "16 of 64 ... a launch (4 launches, 32 MiB)"). Nothing on the CPU or with symbolic sizes.
std::string dq_launches_note(const Graph& g, int node) {
  const std::optional<FlexDqLaunches> l = flex_cuda_dq_launches(g, node);
  if (!l || l->launches <= 1) return "";
  return "; dQ summed in float " + std::to_string(l->per_launch) + " of " + std::to_string(l->pairs) +
         " (b, kv head) pairs a launch" + (l->streams == 2 ? ", on two streams in turn" : "") + " (" +
         std::to_string(l->launches) + " launches, " + std::to_string((l->workspace_bytes + (1 << 20) - 1) >> 20) +
         " MiB)";
}

// cuDNN's backward calls (cudnn_backward_group) where they are more than one: "; 4 calls of 1 batch" or
// "; 8 calls of 2 kv heads".
std::string cudnn_calls_note(const Graph& g, int node, const FlexAnalysis& a) {
  const CudnnBackwardGroup grp = cudnn_backward_group(g, node, a);
  if (grp.calls <= 1) return "";
  const TensorType* k = g.tensor_type(g.nodes[node].args[1]);
  const bool whole = k && grp.kv_heads == k->shape[1].value;
  const int64_t n = whole ? grp.batches : grp.kv_heads;
  return "; " + std::to_string(grp.calls) + " calls of " + std::to_string(n) +
         (whole ? (n == 1 ? " batch" : " batches") : (n == 1 ? " kv head" : " kv heads")) + " (cuDNN's workspace one call's)";
}

// A flex node: cuDNN's SDPA when the target has it and it can run the node as flex defines it (and the
// region's kernel= hint allows it), else the generated tiled kernel where the target can build it, else
// the reference; the dump says which and why. A bias cuDNN would materialize past what memory allows
// (bias_memory_why), or a float buffer's gradient cuDNN would round (dbias_precision_why), goes to the
// generated kernel first, where it can run.
void choose_flex(const Graph& g, int node, const Target& target, KernelChoice& c) {
  const Node& n = g.nodes[node];
  const bool backward = c.kind == KernelKind::FlexBackward;
  const FlexAnalysis a = analyze_flex(g, node);
  const std::string what = "mask_mod: " + (a.band_ok ? to_string(a.band) : "not a band (" + a.mask_why + ")") +
                           "; score_mod: " +
                           (a.score_identity ? std::string("identity") : a.score_why.substr(a.score_why.find(' ') + 1));
  const std::optional<KernelPref> pref = n.hints.kernel;
  std::string why_not = cudnn_why_not(g, node, a);
  if (why_not.empty() && !target.cudnn_attention) why_not = "this build has no cuDNN (cudnn-frontend headers)";
  if (pref == KernelPref::Cudnn) {
    HB_USER_CHECK(why_not.empty()) << describe(g, node) << ": kernel=\"cudnn\" was asked for (hinted_context), but cuDNN "
                                   << "cannot run this FlexAttention: " << why_not
                                   << ". Drop kernel=\"cudnn\" to run it on the reference kernel.";
  }
  if (pref == KernelPref::Aten) {
    c.why += "; kernel=aten hint; " + what;
    return;
  }
  // Memory and precision before speed: the generated kernel, if it runs, where cuDNN's bias would not fit
  // or its dBias would round a float buffer's gradient.
  FlexKernelSource src;
  HostBuild build;
  std::string fused_not;
  bool fused_tried = false;
  std::string fused_first = why_not.empty() && !pref ? bias_memory_why(g, node, a) : "";
  if (fused_first.empty() && why_not.empty() && !pref) fused_first = dbias_precision_why(g, node, a);
  if (!fused_first.empty()) {
    fused_not = fused_why_not(g, node, target, &src, &build);
    fused_tried = true;
    if (fused_not.empty()) why_not = fused_first;
  }
  if (why_not.empty() && pref != KernelPref::Fused) {
    c.kind = backward ? KernelKind::FlexCudnnBackward : KernelKind::FlexCudnnForward;
    c.why = "cudnn: " + (a.band.unbounded() ? std::string("no mask") : to_string(a.band) + " band") +
            (a.pad_kv >= 0 ? ", kv padding (kv_idx < mask buffer " + std::to_string(a.pad_kv) + "[b]: cuDNN's sequence lengths)"
                           : std::string()) +
            (a.score_identity    ? ", identity score_mod"
             : a.score_row_shift ? ", score_mod shifts each row by a kv-independent term (only the logsumexp moves)"
             : a.softcap > 0     ? ", score_mod is a soft cap " + std::to_string(a.softcap) + " * tanh(score / " +
                                       std::to_string(a.softcap) + ") (cuDNN's Softcap modifier)"
             : a.score_pointwise ? ", score_mod as cuDNN pointwise nodes (" + a.score_why.substr(a.score_why.find(' ') + 1) +
                                       (backward ? "; d score_mod / d score = 1, cuDNN's default backward" : "") + ")"
                                 : ", score_mod adds a bias cuDNN takes materialized as [" +
                                       std::string(a.bias_reads_b ? "B" : "1") + ", H, Sq, Skv] (" +
                                       to_string(a.bias_layout) + ")" +
                                       (backward && a.buffer_grads ? "; dBias scattered into its buffers' gradients" : "")) +
            (backward && n.hints.deterministic.value_or(false) ? ", deterministic" : "") +
            (backward ? cudnn_calls_note(g, node, a) : std::string()) +
            (fused_first.empty() ? "" : " (" + fused_first + ", but the generated kernel cannot run: " + fused_not + ")");
    return;
  }
  // The generated tiled kernel: built here, once, so a compiler failure falls back with its reason.
  if (!fused_tried) fused_not = fused_why_not(g, node, target, &src, &build);
  if (pref == KernelPref::Fused) {
    HB_USER_CHECK(fused_not.empty()) << describe(g, node) << ": kernel=\"fused\" was asked for (hinted_context), but the "
                                     << "generated kernel cannot run this FlexAttention: " << fused_not
                                     << ". Drop kernel=\"fused\" to run it on " << (why_not.empty() ? "cuDNN" : "the reference kernel") << ".";
  }
  if (fused_not.empty()) {
    c.kind = backward ? KernelKind::FlexFusedBackward : KernelKind::FlexFusedForward;
    c.why = "fused: tiled over the block mask, generated code (" + src.summary + ")" +
            (backward && fused_row_shift(g, node, a) ? "; score_mod only shifts softmax rows (no logsumexp gradient): "
                                                       "the joint is skipped, its buffer gradients are zero"
                                                     : "") +
            (backward && n.hints.deterministic.value_or(false)
                 ? (g.tensor_type(n.args[0])->device.rfind("cuda", 0) == 0
                        ? std::string("; deterministic: dQ added in key-tile order") +
                              (src.any_buffer_grad()
                                   ? ", the buffer gradient's line sums kept per key tile and added in tile order"
                                   : "")
                        : std::string("; deterministic: per-worker sums added in worker order"))
                 : "") +
            (backward ? dq_launches_note(g, node) : std::string()) +
            (build.cache_hit ? "; from the kernel cache" : "; compiled in " + std::to_string(build.seconds).substr(0, 4) + " s") +
            (pref == KernelPref::Fused ? "; kernel=fused hint" : "") +
            (why_not.empty() ? "" : " (not cuDNN: " + why_not + ")");
    c.source = std::move(src.source);
    c.module = std::move(build.module);
    return;
  }
  c.why += " (not cuDNN: " + why_not + "; not fused: " + fused_not + "); " + what;
}

}  // namespace

bool is_layer_norm_target(const std::string& target) {
  return target == kLayerNormTarget || target == kLayerNormBackwardTarget || target == kLayerNormActTarget ||
         target == kLayerNormActBackwardTarget;
}

std::optional<LayerNormShape> layer_norm_shape(const Node& n) {
  LayerNormShape r;
  r.backward = n.target == kLayerNormBackwardTarget || n.target == kLayerNormActBackwardTarget;
  const bool with_act = n.target == kLayerNormActTarget || n.target == kLayerNormActBackwardTarget;
  if (!r.backward && !with_act && n.target != kLayerNormTarget) return std::nullopt;
  // (input, normalized_shape, weight, bias, eps[, act]) or (grad_out, input, normalized_shape, mean, rstd,
  // weight, bias, output_mask[, act])
  r.input_arg = r.backward ? 1 : 0;
  r.weight_arg = r.backward ? 5 : 2;
  const size_t args = (r.backward ? 8u : 5u) + (with_act ? 1u : 0u);
  if (n.args.size() != args || !n.kwargs.empty()) return std::nullopt;
  if (with_act) {
    const Arg& a = n.args.back();
    const std::optional<RowActivation> act = a.kind == Arg::Kind::Str ? parse_row_activation(a.s) : std::nullopt;
    if (!act || *act == RowActivation::None) return std::nullopt;
    r.act = *act;
  }
  const Arg& shape = n.args[r.input_arg + 1];
  if (shape.kind != Arg::Kind::List || shape.items.empty()) return std::nullopt;
  for (const Arg& d : shape.items) {
    if (d.kind != Arg::Kind::Int) return std::nullopt;
    r.columns *= d.i;
  }
  r.dims = static_cast<int64_t>(shape.items.size());
  return r;
}

std::string layer_norm_rows_why_not(const Graph& g, const Node& n) {
  if (!is_layer_norm_target(n.target)) return "not a layer norm";
  const std::optional<LayerNormShape> ln = layer_norm_shape(n);
  if (!ln) return "its arguments are not the op's, or its normalized shape is not a list of constants";
  const TensorType* x = g.tensor_type(n.args[ln->input_arg]);
  if (!x) return "its input is not a tensor";
  if (x->device.rfind("cuda", 0) != 0) return "on " + x->device;
  if (x->dtype != DType::Float16 && x->dtype != DType::BFloat16 && x->dtype != DType::Float32)
    return std::string("its input is ") + dtype_name(x->dtype);
  if (!x->contiguous_static()) return "its input is not contiguous with static sizes";
  if (!ln->backward && n.type.kind == ValueType::Kind::Tuple && n.type.elems.size() == 3 &&
      n.type.elems[1].kind == ValueType::Kind::Tensor && n.type.elems[1].tensor.dtype != DType::Float32)
    return std::string("its statistics are ") + dtype_name(n.type.elems[1].tensor.dtype);
  const int64_t cols = ln->columns;
  if (cols > kLayerNormRowsMaxColumns)
    return "rows of " + std::to_string(cols) + " (above " + std::to_string(kLayerNormRowsMaxColumns) + ")";
  const int64_t vec = x->dtype == DType::Float32 ? 4 : 8;  // 16-byte accesses
  if (cols % vec != 0) return "rows of " + std::to_string(cols) + " (not a multiple of " + std::to_string(vec) + ")";
  for (size_t k = ln->weight_arg; k < ln->weight_arg + 2; ++k) {
    if (n.args[k].kind == Arg::Kind::None) continue;
    const TensorType* p = g.tensor_type(n.args[k]);
    if (!p || p->dtype != x->dtype) return std::string(k == ln->weight_arg ? "weight" : "bias") + " of another dtype";
  }
  return "";
}

namespace {

// ATen's layer norm on CUDA rows one warp holds: LayerNormRows; else ATen's kernel, and the dump says why.
void choose_layer_norm(const Graph& g, int node, const Target& target, KernelChoice& c) {
  const Node& n = g.nodes[node];
  const std::string why = layer_norm_rows_why_not(g, n);
  if (why.rfind("on ", 0) == 0 || why == "not a layer norm") return;  // (CPU: nothing to say)
  if (why.empty() && target.cuda_kernels) {
    c = {KernelKind::LayerNormRows, "several rows a warp, in registers (codegen/cuda/LayerNorm.cu)"};
    return;
  }
  c.why = "ATen's kernel (not layer-norm-rows: " + (why.empty() ? std::string("no CUDA kernels in this build") : why) + ")";
}

}  // namespace

namespace {

// View ops whose result reinterprets the input's storage at its offset plus a constant.
bool is_alias_view_target(const std::string& t) {
  static const std::set<std::string> views = {
      "aten::view.default",      "aten::t.default",          "aten::permute.default", "aten::transpose.int",
      "aten::expand.default",    "aten::unsqueeze.default",  "aten::squeeze.dim",     "aten::squeeze.dims",
      "aten::squeeze.default",   "aten::detach.default",     "aten::alias.default",   "aten::slice.Tensor",
      "aten::select.int",        "aten::as_strided.default", "aten::_unsafe_view.default"};
  return views.count(t) > 0;
}

bool static_layout(const TensorType& t) {
  if (t.stride.size() != t.shape.size()) return false;
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (!t.shape[d].is_static() || !t.stride[d].is_static()) return false;
  return true;
}

// Argument k of n, positional or by name; null when absent.
const Arg* arg_at(const Node& n, size_t k, const char* name) {
  if (k < n.args.size()) return &n.args[k];
  return n.kwarg(name);
}

// A static integer argument (absent or None: `dflt`); nullopt when it is not a constant integer.
std::optional<int64_t> int_arg(const Node& n, size_t k, const char* name, std::optional<int64_t> dflt) {
  const Arg* a = arg_at(n, k, name);
  if (!a || a->kind == Arg::Kind::None) return dflt;
  if (a->kind == Arg::Kind::Int) return a->i;
  return std::nullopt;
}

}  // namespace

std::vector<bool> returned_through_views(const Graph& g) {
  std::vector<bool> r(g.nodes.size(), false);
  const int out = g.output_node();
  if (out < 0) return r;
  g.nodes[out].for_each_input([&](const Arg& a) { r[a.ref] = true; });
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
    const Node& n = g.nodes[i];
    if (!r[i] || !(n.effects.is_view || n.target == "operator::getitem" || aliases_without_annotation(n))) continue;
    n.for_each_input([&](const Arg& a) { r[a.ref] = true; });
  }
  return r;
}

std::optional<int64_t> view_offset(const Graph& g, const Node& n, int64_t* absolute) {
  const TensorType* in = n.args.empty() ? nullptr : g.tensor_type(n.args[0]);
  if (!in || !static_layout(*in)) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(in->shape.size());
  auto position = [&](int64_t dim, int64_t index, bool end_ok) -> std::optional<int64_t> {
    if (dim < 0) dim += rank;
    if (dim < 0 || dim >= rank) return std::nullopt;
    const int64_t size = in->shape[dim].value;
    if (index < 0) index += size;
    if (index < 0 || index > size || (!end_ok && index == size)) return std::nullopt;
    return index * in->stride[dim].value;
  };
  if (n.target == "aten::slice.Tensor") {
    const auto dim = int_arg(n, 1, "dim", 0), start = int_arg(n, 2, "start", 0);
    if (!dim || !start) return std::nullopt;
    return position(*dim, *start, true);
  }
  if (n.target == "aten::select.int") {
    const auto dim = int_arg(n, 1, "dim", std::nullopt), index = int_arg(n, 2, "index", std::nullopt);
    if (!dim || !index) return std::nullopt;
    return position(*dim, *index, false);
  }
  if (n.target == "aten::as_strided.default") {
    const Arg* off = arg_at(n, 3, "storage_offset");
    if (off && off->kind == Arg::Kind::Int) {
      *absolute = off->i;
      return std::nullopt;
    }
    if (off && off->kind != Arg::Kind::None) return std::nullopt;
  }
  return 0;
}

std::string view_why_not(const Graph& g, int node) {
  const Node& n = g.nodes[node];
  if (n.op != OpKind::CallFunction || !is_alias_view_target(n.target)) return "not a view op";
  const TensorType* in = n.args.empty() ? nullptr : g.tensor_type(n.args[0]);
  if (!in || n.type.kind != ValueType::Kind::Tensor) return "not a tensor's view";
  if (!static_layout(*in) || !static_layout(n.type.tensor)) return "symbolic sizes or strides";
  if (in->dtype != n.type.tensor.dtype) return "another dtype";
  bool computed = false;
  for (size_t k = 1; k < n.args.size(); ++k) n.args[k].for_each_ref([&](const Arg&) { computed = true; });
  for (const auto& kv : n.kwargs) kv.second.for_each_ref([&](const Arg&) { computed = true; });
  int64_t absolute = -1;
  if (!view_offset(g, n, &absolute) && absolute < 0) return "a position that is not a constant inside its dimension";
  if (computed) return "an argument computed at run time";
  return "";
}

KernelKind op_kernel_kind(const Node& n) { return choose(n).kind; }

namespace {

KernelChoice select_kernel(const Graph& g, int node, const Target& target, const std::vector<bool>* returned) {
  KernelChoice c = choose(g.nodes[node]);
  if (c.kind == KernelKind::Aten && target.fast_views && is_alias_view_target(g.nodes[node].target) &&
      view_why_not(g, node).empty() && !(returned ? (*returned)[node] : returned_through_views(g)[node]))
    return {KernelKind::View, ""};
  if (c.kind == KernelKind::FusedPointwise) c = choose_fused(g, g.nodes[node]);
  if (c.kind == KernelKind::FlexForward || c.kind == KernelKind::FlexBackward) choose_flex(g, node, target, c);
  if (c.kind == KernelKind::Aten && is_layer_norm_target(g.nodes[node].target)) choose_layer_norm(g, node, target, c);
  return c;
}

}  // namespace

KernelChoice select_kernel(const Graph& g, int node, const Target& target) {
  return select_kernel(g, node, target, nullptr);
}

KernelPlan select_kernels(const Graph& g, const Target& target) {
  KernelPlan plan;
  const std::vector<bool> returned = returned_through_views(g);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    KernelChoice c = select_kernel(g, i, target, &returned);
    if (c.kind == KernelKind::Unsupported) {
      plan.unsupported.push_back(i);
      plan.unsupported_descriptions.push_back(describe(g, i) + ": " + c.why);
    }
    plan.nodes.push_back(std::move(c));
  }
  // Subgraphs run through the same executor: an unsupported op inside a score_mod is as fatal.
  for (const auto& kv : g.subgraphs) {
    auto sub = std::make_shared<const KernelPlan>(select_kernels(*kv.second, target));
    for (const std::string& d : sub->unsupported_descriptions)
      plan.unsupported_descriptions.push_back("subgraph '" + kv.first + "': " + d);
    plan.subgraphs[kv.first] = std::move(sub);
  }
  return plan;
}

std::string print_kernel_plan(const Graph& g, const KernelPlan& plan) {
  std::ostringstream os;
  os << "kernels " << g.name << " {\n";
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == OpKind::Placeholder || n.op == OpKind::Output) continue;
    os << "  %" << n.name << ": " << kernel_kind_name(plan.nodes[i].kind);
    if (n.op == OpKind::CallFunction) os << " " << n.target;
    if (!plan.nodes[i].why.empty()) os << "  # " << plan.nodes[i].why;
    os << "\n";
  }
  os << "}\n";
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!plan.nodes[i].source.empty()) {
      // A CUDA source ends with the kernel template, and a CPU source holds codegen/FlexMath.h, the same
      // for every node: shown by name only.
      std::string shown = plan.nodes[i].source;
      const size_t m = shown.find(kFlexTemplateMarker);
      if (m != std::string::npos) shown = shown.substr(0, m) + kFlexTemplateMarker + " (its text not shown)\n";
      const size_t a = shown.find(kFlexMathMarker), z = shown.find(kFlexMathEndMarker);
      if (a != std::string::npos && z != std::string::npos)
        shown = shown.substr(0, a) + kFlexMathMarker + " (its text not shown)\n" +
                shown.substr(shown.find('\n', z) + 1);
      os << "source of %" << g.nodes[i].name << " {\n" << shown << "}\n";
    }
  for (const auto& kv : g.subgraphs) {
    auto it = plan.subgraphs.find(kv.first);
    HB_INTERNAL_CHECK(it != plan.subgraphs.end()) << "no kernel plan for subgraph '" << kv.first << "'";
    os << print_kernel_plan(*kv.second, *it->second);
  }
  return os.str();
}

}  // namespace hb

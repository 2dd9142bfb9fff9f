// Kernel selection: decides, for every node, which implementation runs it. Plain C++ (no libtorch):
// the runtime (backend/runtime/Executor.cpp) turns the choices (backend/ir/KernelPlan.h) into
// executable steps, and the dump
// prints them ("the kernels"). A node no implementation covers is listed in `unsupported`, which
// makes the Python side fall back to eager with one warning (or raise under strict mode).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/KernelPlan.h"
#include "backend/ir/Target.h"

namespace hb {

// Selects kernels for g and, recursively, the subgraphs its nodes reference (KernelPlan::subgraphs),
// with what `target` offers (a default Target: no cuDNN, the reference for FlexAttention).
// A hinted_context kernel= hint steers the choice; kernel="cudnn" that cannot be honoured is an
// hb::UserError naming the node and why.
KernelPlan select_kernels(const Graph& g, const Target& target = {});
// The choice for one node, as select_kernels makes it.
KernelChoice select_kernel(const Graph& g, int node, const Target& target = {});
// The kind of implementation a node gets from its op alone (an ATen dispatch, a getitem, a flex op ...),
// before the choices that read its subgraphs or the target: what the placement rule asks per node.
KernelKind op_kernel_kind(const Node& n);
std::string print_kernel_plan(const Graph& g, const KernelPlan& plan);

struct FlexAnalysis;  // codegen/FlexLowering.h
// A flex backward whose score_mod only shifts softmax rows (score + t, t independent of kv_idx) and that
// gets no logsumexp gradient: the score gradient is the incoming one and the bias's gradient is exactly
// zero, so the fused kernel skips the joint graph (FlexFusedCall.cpp).
bool fused_row_shift(const Graph& g, int node, const FlexAnalysis& a);

// LayerNormRows (the runtime's CUDA layer norm over rows up to kLayerNormRowsMaxColumns) takes node n, an
// aten::native_layer_norm or its backward, when this is "": on CUDA, float16, bfloat16 or float32, a
// contiguous input, a constant normalized shape of at most that many elements and a multiple of one
// 16-byte access, weight and bias of the input's dtype. Else why not. (Kernel selection also needs a
// runtime built with its CUDA kernels: Target::cuda_kernels.)
// The same holds for hintbackend::layer_norm_act and its backward (an activation applied to the input
// first: backend/runtime/LayerNormAct.h), whose arguments are native_layer_norm's and its backward's with
// the activation's name last.
inline constexpr const char* kLayerNormTarget = "aten::native_layer_norm.default";
inline constexpr const char* kLayerNormBackwardTarget = "aten::native_layer_norm_backward.default";
inline constexpr const char* kLayerNormActTarget = "hintbackend::layer_norm_act.default";
inline constexpr const char* kLayerNormActBackwardTarget = "hintbackend::layer_norm_act_backward.default";
std::string layer_norm_rows_why_not(const Graph& g, const Node& n);
// A layer norm node's rows as its arguments say them: the normalized shape's elements and dims, the
// positions of the input and the weight (the bias follows it), and the activation applied to the input
// first. nullopt when n is none of the four ops, its arguments are not the schema's, the normalized shape
// is not a list of constants, or the activation is not one the kernels know. The rule, the workspace
// model (codegen/TargetModel.cpp) and the runtime's Call (backend/runtime/LayerNormCall.cpp) all read it
// here.
struct LayerNormShape {
  bool backward = false;
  int64_t columns = 1, dims = 0;
  size_t input_arg = 0, weight_arg = 0;
  RowActivation act = RowActivation::None;
};
std::optional<LayerNormShape> layer_norm_shape(const Node& n);
// One of the four layer norm ops above.
bool is_layer_norm_target(const std::string& target);

// KernelKind::View (backend/runtime/ViewCall.cpp) takes node n when this is "" and the graph does not
// return its result, directly or through views (returned_through_views: an output's alias of an input is
// rebuilt from its view chain by AOTAutograd): a view op whose result's storage offset is its input's plus
// a constant (view, t, permute, transpose, expand, unsqueeze, squeeze, detach, alias, _unsafe_view; slice
// and select at static positions; as_strided), input and result of static sizes and strides, every other
// argument a constant. Else why not ("not a view op" for others).
std::string view_why_not(const Graph& g, int node);
// Per node, whether the graph returns its value or a view of it (through view ops only).
std::vector<bool> returned_through_views(const Graph& g);
// The storage offset a KernelKind::View node adds to its input's, in elements, from its arguments and its
// input's IR strides; nullopt for as_strided with an explicit offset (absolute: `*absolute` is set).
std::optional<int64_t> view_offset(const Graph& g, const Node& n, int64_t* absolute);

// The Python operators and sym functions the runtime evaluates natively (SymOp).
bool is_native_sym_op(const std::string& target);

}  // namespace hb

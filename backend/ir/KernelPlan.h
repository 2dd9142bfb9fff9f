// Kernel choices: which implementation runs each node. The vocabulary shared by kernel selection
// (codegen/KernelSelect.h decides) and the runtime (backend/runtime/ executes what was decided); the
// kernels dump prints it. Plain data: no libtorch.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hb {

enum class KernelKind {
  Input,            // placeholder: a graph input
  Constant,         // get_attr: a tensor constant handed over at compile time
  Aten,             // any dispatcher op (aten::, prims::, custom C++ ops), boxed call through c10
  GetItem,          // operator::getitem on a tuple or list value
  SymOp,            // arithmetic on SymInt/SymFloat/SymBool values (operator::mul, torch::sym_max ...)
  FlexForward,      // higher_order::flex_attention, C++ reference (backend/runtime/FlexAttention.cpp)
  FlexBackward,     // higher_order::flex_attention_backward, C++ reference
  FlexCudnnForward,   // higher_order::flex_attention on cuDNN's SDPA (backend/runtime/CudnnFlexCall.cpp)
  FlexCudnnBackward,  // higher_order::flex_attention_backward on cuDNN's SDPA backward
  FlexFusedForward,   // higher_order::flex_attention, tiled, with generated score/mask code (FlexFusedCall.cpp)
  FlexFusedBackward,  // higher_order::flex_attention_backward, tiled, with the generated joint graph
  ZerosAndScatter,  // flex_lib::zeros_and_scatter: FlexAttention's captured-buffer gradient scatter
  SliceLoop,        // hintbackend::slice_loop: a DFS region run slice by slice (backend/ir/SliceLoop.h)
  FusedPointwise,   // hintbackend::fused_pointwise: one pointwise program (codegen/PointwiseProgram.h)
  LayerNormRows,    // aten::native_layer_norm (and its backward) over narrow rows on CUDA (LayerNormCall.cpp)
  View,             // a view op's alias made without the dispatcher: static layouts, read inside the graph (ViewCall.cpp)
  Output,
  Unsupported,
};
const char* kernel_kind_name(KernelKind k);

// The widest rows (elements of the normalized shape) LayerNormRows takes, forward and backward: the CUDA
// kernels (codegen/cuda/LayerNorm.h) hold a row in one warp's registers. At 2048 a row would take 64
// floats of registers a lane in each of four arrays of the backward.
constexpr int64_t kLayerNormRowsMaxColumns = 1024;
// Blocks an SM of LayerNormRows' backward where it sums the weight's and bias's gradients: each block's
// float partial sums (2 x the row's elements) are its workspace, which the memory plan counts.
constexpr int64_t kLayerNormRowsBlocksPerSm = 4;
// The elementwise activation LayerNormRows may apply to its input before normalizing it, and whose
// derivative its backward applies to the input gradient (hintbackend::layer_norm_act and its backward,
// which fold-layer-norm-activation writes): the op's `act` argument spells it.
enum class RowActivation { None, Gelu, GeluTanh, Silu };
// "gelu" (erf), "gelu_tanh", "silu"; nullopt for any other name ("" and "none" are None).
std::optional<RowActivation> parse_row_activation(const std::string& name);
const char* row_activation_name(RowActivation a);

class HostModule;  // codegen/HostCompiler.h

struct KernelChoice {
  KernelKind kind = KernelKind::Unsupported;
  std::string why;  // for Unsupported: what is missing; otherwise a short note for the dump
  // Generated kernels (FlexFused*): the source (printed by the kernels dump) and the library built from
  // it, which the plan keeps loaded for the runtime.
  std::string source;
  std::shared_ptr<HostModule> module;

  KernelChoice() = default;
  KernelChoice(KernelKind k, std::string w) : kind(k), why(std::move(w)) {}
};

struct KernelPlan {
  std::vector<KernelChoice> nodes;  // parallel to Graph::nodes
  std::vector<int> unsupported;     // node indices, in graph order (subgraphs: see `subgraphs`)
  std::vector<std::string> unsupported_descriptions;  // "%x (target) at file:line: why", whole tree
  // The plans of the graph's subgraphs (slice bodies, score/mask mods, fused bodies), by name.
  std::map<std::string, std::shared_ptr<const KernelPlan>> subgraphs;
};

}  // namespace hb

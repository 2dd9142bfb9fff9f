// Kernels the runtime runs through code of its own rather than one boxed dispatcher call: FlexAttention,
// slice loops, fused pointwise groups, the gradient scatter. Each kind is one file that defines a Call
// and its lowering (the node's arguments resolved once, when the executor is built), and one line in
// the table of Calls.cpp. Adding a kernel is adding such a file, a KernelKind its selection rule picks
// (codegen/KernelSelect.cpp), its test, and that line.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/KernelPlan.h"
#include "backend/ir/Program.h"

namespace hb::rt {

class Executor;

// Per-call counters a Call adds to (the executor's ArenaStats).
struct CallStats {
  int64_t arenas = 0;   // arenas allocated (a slice loop's body arena)
  int64_t written = 0;  // results written straight into a caller's destination
  int64_t workspace = 0;  // the largest workspace one kernel allocated for itself (cuDNN's), in bytes
};

class Call {
 public:
  virtual ~Call() = default;
  // Runs the node on the values in `slots`. `out`: where its result goes when the plan placed it (an
  // arena view) or the caller passed a destination for it; undefined: the call allocates its result.
  virtual c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor& out, CallStats& stats) const = 0;
};

// What a lowering sees: the program (graph, kernel choices, memory plan), the node, the constants.
struct LowerContext {
  const Program& program;
  int node = -1;
  std::string where;  // describe(graph, node), for errors
  std::shared_ptr<const std::vector<at::Tensor>> constants;

  const Graph& graph() const { return *program.graph; }
  const Node& n() const { return program.graph->nodes[node]; }
  // The executor of subgraph argument `a`, with its kernel plan; with its memory plan when
  // `with_memory_plan` (slice-loop bodies, whose IR types are the shapes they run on).
  std::shared_ptr<Executor> subgraph(const Arg& a, bool with_memory_plan = false) const;
};

using Lowering = std::shared_ptr<const Call> (*)(const LowerContext& ctx);

// The lowerings, one per file:
std::shared_ptr<const Call> lower_flex_attention(const LowerContext& ctx);  // FlexAttentionCall.cpp (fw and bw)
std::shared_ptr<const Call> lower_slice_loop(const LowerContext& ctx);      // SliceLoopCall.cpp
std::shared_ptr<const Call> lower_fused_pointwise(const LowerContext& ctx); // FusedPointwiseCall.cpp
std::shared_ptr<const Call> lower_zeros_and_scatter(const LowerContext& ctx);  // FlexAttentionCall.cpp
std::shared_ptr<const Call> lower_cudnn_flex_attention(const LowerContext& ctx);  // CudnnFlexCall.cpp (fw and bw)
std::shared_ptr<const Call> lower_fused_flex_attention(const LowerContext& ctx);  // FlexFusedCall.cpp (fw and bw)
std::shared_ptr<const Call> lower_layer_norm(const LowerContext& ctx);            // LayerNormCall.cpp (fw and bw)
std::shared_ptr<const Call> lower_view(const LowerContext& ctx);                  // ViewCall.cpp

// The table (Calls.cpp): the lowering for kernel kind k, or null when the executor runs k itself
// (inputs, constants, ATen ops, getitem, sym ops, the output).
Lowering find_lowering(KernelKind k);

}  // namespace hb::rt

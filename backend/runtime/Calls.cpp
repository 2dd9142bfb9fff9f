#include "backend/runtime/Call.h"

#include "backend/ir/Error.h"
#include "backend/runtime/Executor.h"

namespace hb::rt {

Lowering find_lowering(KernelKind k) {
  switch (k) {
    case KernelKind::FlexForward:
    case KernelKind::FlexBackward: return lower_flex_attention;
    case KernelKind::FlexCudnnForward:
    case KernelKind::FlexCudnnBackward: return lower_cudnn_flex_attention;
    case KernelKind::FlexFusedForward:
    case KernelKind::FlexFusedBackward: return lower_fused_flex_attention;
    case KernelKind::ZerosAndScatter: return lower_zeros_and_scatter;
    case KernelKind::SliceLoop: return lower_slice_loop;
    case KernelKind::FusedPointwise: return lower_fused_pointwise;
    case KernelKind::LayerNormRows: return lower_layer_norm;
    case KernelKind::View: return lower_view;
    default: return nullptr;
  }
}

std::shared_ptr<Executor> LowerContext::subgraph(const Arg& a, bool with_memory_plan) const {
  HB_USER_CHECK(a.kind == Arg::Kind::Graph) << where << ": expected a subgraph argument, got " << static_cast<int>(a.kind);
  auto it = program.graph->subgraphs.find(a.s);
  HB_USER_CHECK(it != program.graph->subgraphs.end()) << where << ": unknown subgraph '" << a.s << "'";
  auto kp = program.kernels->subgraphs.find(a.s);
  HB_INTERNAL_CHECK(kp != program.kernels->subgraphs.end()) << where << ": no kernel plan for subgraph '" << a.s << "'";
  HB_USER_CHECK(kp->second->unsupported_descriptions.empty())
      << where << ": subgraph '" << a.s << "' uses an unsupported op: " << kp->second->unsupported_descriptions.front();
  Program sub;
  sub.graph = it->second;
  sub.kernels = kp->second;
  sub.keep_across_calls = program.keep_across_calls;
  if (program.invariants) {
    auto inv = program.invariants->subgraphs.find(a.s);
    if (inv != program.invariants->subgraphs.end()) sub.invariants = inv->second;
  }
  if (with_memory_plan && program.memory) {
    auto mp = program.memory->bodies.find(a.s);
    if (mp != program.memory->bodies.end()) sub.memory = mp->second;
  }
  return std::make_shared<Executor>(std::move(sub), constants);
}

}  // namespace hb::rt

#include "backend/ir/KernelPlan.h"

namespace hb {

const char* kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Input: return "input";
    case KernelKind::Constant: return "constant";
    case KernelKind::Aten: return "aten-dispatch";
    case KernelKind::GetItem: return "getitem";
    case KernelKind::SymOp: return "sym-op";
    case KernelKind::FlexForward: return "flex-attention-reference";
    case KernelKind::FlexBackward: return "flex-attention-backward-reference";
    case KernelKind::FlexCudnnForward: return "flex-attention-cudnn";
    case KernelKind::FlexCudnnBackward: return "flex-attention-backward-cudnn";
    case KernelKind::FlexFusedForward: return "flex-attention-fused";
    case KernelKind::FlexFusedBackward: return "flex-attention-backward-fused";
    case KernelKind::ZerosAndScatter: return "zeros-and-scatter";
    case KernelKind::SliceLoop: return "slice-loop";
    case KernelKind::FusedPointwise: return "fused-pointwise";
    case KernelKind::LayerNormRows: return "layer-norm-rows";
    case KernelKind::View: return "view";
    case KernelKind::Output: return "output";
    case KernelKind::Unsupported: return "UNSUPPORTED";
  }
  return "?";
}

std::optional<RowActivation> parse_row_activation(const std::string& name) {
  if (name.empty() || name == "none") return RowActivation::None;
  if (name == "gelu") return RowActivation::Gelu;
  if (name == "gelu_tanh") return RowActivation::GeluTanh;
  if (name == "silu") return RowActivation::Silu;
  return std::nullopt;
}

const char* row_activation_name(RowActivation a) {
  switch (a) {
    case RowActivation::None: return "none";
    case RowActivation::Gelu: return "gelu";
    case RowActivation::GeluTanh: return "gelu_tanh";
    case RowActivation::Silu: return "silu";
  }
  return "?";
}

}  // namespace hb

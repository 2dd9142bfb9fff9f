// Kernel selection: decides, for every node, which implementation runs it. Plain C++ (no libtorch):
// the runtime (backend/runtime/Executor.cpp) turns the choices into executable steps, and the dump
// prints them ("the kernels"). A node no implementation covers is listed in `unsupported`, which
// makes the Python side fall back to eager with one warning (or raise under strict mode).
#pragma once
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

enum class KernelKind {
  Input,            // placeholder: a graph input
  Constant,         // get_attr: a tensor constant handed over at compile time
  Aten,             // any dispatcher op (aten::, prims::, custom C++ ops), boxed call through c10
  GetItem,          // operator::getitem on a tuple or list value
  SymOp,            // arithmetic on SymInt/SymFloat/SymBool values (operator::mul, torch::sym_max ...)
  FlexForward,      // higher_order::flex_attention, C++ reference (backend/runtime/FlexAttention.cpp)
  FlexBackward,     // higher_order::flex_attention_backward, C++ reference
  ZerosAndScatter,  // flex_lib::zeros_and_scatter: FlexAttention's captured-buffer gradient scatter
  SliceLoop,        // hintbackend::slice_loop: a DFS region run slice by slice (passes/SliceSchedule.h)
  FusedPointwise,   // hintbackend::fused_pointwise: one pointwise program (codegen/PointwiseProgram.h)
  Output,
  Unsupported,
};
const char* kernel_kind_name(KernelKind k);

struct KernelChoice {
  KernelKind kind = KernelKind::Unsupported;
  std::string why;  // for Unsupported: what is missing; otherwise a short note for the dump
};

struct KernelPlan {
  std::vector<KernelChoice> nodes;  // parallel to Graph::nodes
  std::vector<int> unsupported;     // node indices, in graph order (subgraphs: see nested)
  std::vector<std::string> unsupported_descriptions;  // "%x (target) at file:line: why", whole tree
};

// Selects kernels for g and, recursively, the subgraphs its nodes reference.
KernelPlan select_kernels(const Graph& g);
std::string print_kernel_plan(const Graph& g, const KernelPlan& plan);

// The Python operators and sym functions the runtime evaluates natively (SymOp).
bool is_native_sym_op(const std::string& target);

}  // namespace hb

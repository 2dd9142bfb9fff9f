// Kernel selection: decides, for every node, which implementation runs it. Plain C++ (no libtorch):
// the runtime (backend/runtime/Executor.cpp) turns the choices (backend/ir/KernelPlan.h) into
// executable steps, and the dump
// prints them ("the kernels"). A node no implementation covers is listed in `unsupported`, which
// makes the Python side fall back to eager with one warning (or raise under strict mode).
#pragma once
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/KernelPlan.h"

namespace hb {

// Selects kernels for g and, recursively, the subgraphs its nodes reference (KernelPlan::subgraphs).
KernelPlan select_kernels(const Graph& g);
// The choice for one node, as select_kernels makes it (the placement rule asks it per node).
KernelChoice select_kernel(const Graph& g, int node);
std::string print_kernel_plan(const Graph& g, const KernelPlan& plan);

// The Python operators and sym functions the runtime evaluates natively (SymOp).
bool is_native_sym_op(const std::string& target);

}  // namespace hb

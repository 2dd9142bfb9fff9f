// A compiled program: what the pipeline hands the runtime (XLA's Executable, Inductor's CompiledFxGraph).
// The graph after every pass, the kernel chosen for each node, and the memory plan, decided once at
// compile time (passes/Pipeline.h, compile_program); the runtime (backend/runtime/Executor.h) runs it
// as given, adding only the tensor constants, which the bindings hand over.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/KernelPlan.h"
#include "backend/ir/MemoryPlan.h"

namespace hb {

struct Program {
  std::shared_ptr<const Graph> graph;
  std::shared_ptr<const KernelPlan> kernels;  // with the subgraphs' plans
  std::shared_ptr<const MemoryPlan> memory;   // with the slice bodies' plans; null: nothing placed
  std::vector<std::string> notes;             // what the passes decided, for the dump
  std::vector<std::string> warnings;          // hints the passes could not honor, for the user
  // Whether the runtime may keep device values from one call for the next: the steps that read only
  // constants run once (Executor::find_invariant_steps), kernels cache index tensors. Off under CUDA graphs
  // (CompileSettings::keep_across_calls): values made in the warm-up live in the graphs' memory pool, where
  // cudagraph trees refuse allocations that are not outputs, and a replay costs those steps no host time.
  bool keep_across_calls = true;
};

}  // namespace hb

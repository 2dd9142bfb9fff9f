// A compiled program: what the pipeline hands the runtime (XLA's Executable, Inductor's CompiledFxGraph).
// The graph after every pass, the kernel chosen for each node, and the memory plan, decided once at
// compile time (passes/Pipeline.h, compile_program); the runtime (backend/runtime/Executor.h) runs it
// as given, adding only the tensor constants, which the bindings hand over.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/KernelPlan.h"
#include "backend/ir/MemoryPlan.h"

namespace hb {

// The values a compiled graph computes alike on every call (passes/CallInvariance.h decides): the runtime
// runs their nodes once per executor and keeps what the other nodes read.
struct CallInvariants {
  std::vector<bool> runs_once;       // per node: call-invariant and not a constant (skipped after a first run)
  std::vector<bool> kept;            // per node: a call-invariant value a per-call node (or the output) reads
  std::vector<bool> copied_outputs;  // per output position: an invariant value, copied each call (empty: none)
  bool copy_all_outputs = false;     // the graph returns one invariant value (its elements, if a tuple)
  // The same for the graph's subgraphs (slice bodies, score/mask mods), by name; absent: nothing invariant.
  std::map<std::string, std::shared_ptr<const CallInvariants>> subgraphs;
};

struct Program {
  std::shared_ptr<const Graph> graph;
  std::shared_ptr<const KernelPlan> kernels;  // with the subgraphs' plans
  std::shared_ptr<const MemoryPlan> memory;   // with the slice bodies' plans; null: nothing placed
  std::vector<std::string> notes;             // what the passes decided, for the dump
  std::vector<std::string> warnings;          // hints the passes could not honor, for the user
  // Whether the runtime may keep device values from one call for the next: the nodes of `invariants` run
  // once, kernels cache index tensors. Off under CUDA graphs (PassContext::keep_across_calls, from
  // CompileSettings): values made in the warm-up live in the graphs' memory pool, where cudagraph trees
  // refuse allocations that are not outputs, and a replay costs those steps no host time.
  bool keep_across_calls = true;
  std::shared_ptr<const CallInvariants> invariants;  // null: nothing runs once
};

}  // namespace hb

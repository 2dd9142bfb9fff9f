// The pass pipeline: the one place that lists hintbackend's passes, in order, with why each sits
// where it sits (Pipeline.cpp). Passes mutate the graph and report whether they changed it;
// analyses (Liveness, ...) return data and never mutate.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"
#include "backend/ir/Program.h"

namespace hb {

struct PassContext {
  // Called after every pass with its name and whether it changed the graph (dumps hook in here; null
  // when nothing is dumped, so no IR is printed).
  std::function<void(const std::string& pass, const Graph& g, bool changed)> after_pass;
  // The memory planner's settings and the target's model (what it can place, workspaces): read by the
  // slice chooser, memory-schedule and memory-plan. Values, set by whoever runs the pipeline.
  MemoryPlanOptions memory;
  // Passes turned off by name (options["disable_passes"] or HINTBACKEND_DISABLE_PASSES=a,b).
  std::set<std::string> disabled;
  // Placeholders the caller will pass as zeros, by name (the lean runtime's undefined gradients):
  // fold-zero-inputs folds the adds that read them. Empty for every usual compile.
  std::set<std::string> zero_inputs;
  // Placeholders the caller writes the graph's first outputs back into after each call, in order: output
  // k is the new value of placeholder input_writes[k] (data mutations of inputs that AOTAutograd
  // functionalized: BatchNorm's running statistics, a cache, a counter). write-inputs-in-place writes
  // them in place. Empty: no output is written back.
  std::vector<std::string> input_writes;
  // Verify the IR after every pass (HINTBACKEND_VERIFY_EACH_PASS=1; tests turn it on).
  bool verify_each = false;
  // Free-form notes passes leave for the dump ("slice-legality: %mm ends the region: ...").
  std::vector<std::string> notes;
  // Hints a pass could not honor, for the user (the bindings raise each as a HintBackendHintWarning):
  // "<region at file:line>: schedule='dfs' but nothing can be sliced: ...". Also in notes.
  std::vector<std::string> warnings;
  // slice-schedule's decision per region id: its slice count (1: left whole). The one owner of that
  // decision: the training partition asks it too (bindings, slice_decisions).
  std::map<int, int64_t> slice_counts;
  // memory-plan's result, the compiled program's plan (null until it runs, or when it is disabled).
  std::shared_ptr<const MemoryPlan> memory_plan;
  // Whether the runtime may keep values from one call for the next (false under CUDA graphs); when false,
  // call-invariance finds nothing.
  bool keep_across_calls = true;
  // call-invariance's result, the compiled program's run-once nodes (null: none).
  std::shared_ptr<const CallInvariants> call_invariants;
};

using PassFn = bool (*)(Graph& g, PassContext& ctx);

struct PassInfo {
  const char* name;  // kebab-case, the same spelling as the file pair and the kill switch
  PassFn run;
  const char* why;   // why it sits where it sits
};

// The pipeline, in order.
const std::vector<PassInfo>& pipeline();
// Looks a pass up by name (hb-opt); nullptr if unknown.
const PassInfo* find_pass(const std::string& name);
// Runs every enabled pass in order, calling ctx.after_pass after each.
void run_pipeline(Graph& g, PassContext& ctx);
// Runs the named passes in the given order (hb-opt, tests).
void run_passes(Graph& g, const std::vector<std::string>& names, PassContext& ctx);
// Compiling: the pipeline over g, then kernel selection; the result the runtime runs as given.
Program compile_program(std::shared_ptr<Graph> g, PassContext& ctx);

}  // namespace hb

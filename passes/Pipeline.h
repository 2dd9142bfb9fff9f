// The pass pipeline: the one place that lists hintbackend's passes, in order, with why each sits
// where it sits (Pipeline.cpp). Passes mutate the graph and report whether they changed it;
// analyses (Liveness, ...) return data and never mutate.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

struct PassContext {
  // Called after every pass with its name and whether it changed the graph (dumps hook in here).
  std::function<void(const std::string& pass, const Graph& g, bool changed)> after_pass;
  // Passes turned off by name (options["disable_passes"] or HINTBACKEND_DISABLE_PASSES=a,b).
  std::set<std::string> disabled;
  // Verify the IR after every pass (HINTBACKEND_VERIFY_EACH_PASS=1; tests turn it on).
  bool verify_each = false;
  // Free-form notes passes leave for the dump ("slice-legality: %mm ends the region: ...").
  std::vector<std::string> notes;
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

}  // namespace hb

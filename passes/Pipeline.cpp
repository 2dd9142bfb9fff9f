#include "passes/Pipeline.h"

#include "backend/ir/Error.h"
#include "backend/ir/Verifier.h"
#include "passes/DeadCodeElimination.h"

namespace hb {

const std::vector<PassInfo>& pipeline() {
  static const std::vector<PassInfo> kPipeline = {
      // First: later passes and the runtime should not see (or allocate for) values nobody uses.
      {"dead-code-elimination", dead_code_elimination,
       "drops side-effect-free nodes whose values nobody uses, before anything plans memory for them"},
  };
  return kPipeline;
}

const PassInfo* find_pass(const std::string& name) {
  for (const PassInfo& p : pipeline())
    if (name == p.name) return &p;
  return nullptr;
}

namespace {
void run_one(const PassInfo& p, Graph& g, PassContext& ctx) {
  const bool changed = p.run(g, ctx);
  if (ctx.verify_each) {
    try {
      verify(g);
    } catch (const UserError& e) {
      HB_INTERNAL_CHECK(false) << "pass '" << p.name << "' left an invalid graph: " << e.what()
                               << ". Rerun with HINTBACKEND_DUMP_DIR=/tmp/hb to get the IR before and after "
                                  "it, and HINTBACKEND_DISABLE_PASSES="
                               << p.name << " to work around it.";
    }
  }
  if (ctx.after_pass) ctx.after_pass(p.name, g, changed);
}
}  // namespace

void run_pipeline(Graph& g, PassContext& ctx) {
  for (const PassInfo& p : pipeline()) {
    if (ctx.disabled.count(p.name)) {
      ctx.notes.push_back(std::string(p.name) + ": disabled");
      continue;
    }
    run_one(p, g, ctx);
  }
}

void run_passes(Graph& g, const std::vector<std::string>& names, PassContext& ctx) {
  for (const std::string& name : names) {
    const PassInfo* p = find_pass(name);
    HB_USER_CHECK(p != nullptr) << "unknown pass '" << name << "'";
    run_one(*p, g, ctx);
  }
}

}  // namespace hb

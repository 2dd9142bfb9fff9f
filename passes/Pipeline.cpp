#include "passes/Pipeline.h"

#include "backend/ir/Error.h"
#include "backend/ir/Verifier.h"
#include "codegen/KernelSelect.h"
#include "passes/CallInvariance.h"
#include "passes/DeadCodeElimination.h"
#include "passes/FoldCrossEntropyBackward.h"
#include "passes/FoldCrossEntropyForward.h"
#include "passes/FoldLayerNormActivation.h"
#include "passes/FoldScaledAdd.h"
#include "passes/FoldSelectBackward.h"
#include "passes/FoldTransposePairs.h"
#include "passes/FoldZeroInputs.h"
#include "passes/HintPropagation.h"
#include "passes/MemoryPlan.h"
#include "passes/MemorySchedule.h"
#include "passes/PointwiseFusion.h"
#include "passes/RowSoftmaxFusion.h"
#include "passes/SliceLegality.h"
#include "passes/SliceSchedule.h"
#include "passes/SoftmaxUpcast.h"
#include "passes/SplitColumnSum.h"
#include "passes/WriteInputsInPlace.h"

namespace hb {

const std::vector<PassInfo>& pipeline() {
  static const std::vector<PassInfo> kPipeline = {
      // First: later passes and the runtime should not see (or allocate for) values nobody uses.
      {"dead-code-elimination", dead_code_elimination,
       "drops side-effect-free nodes whose values nobody uses, before anything plans memory for them"},
      {"fold-zero-inputs", fold_zero_inputs,
       "adds of a placeholder the caller passes as zeros (an undefined gradient: ctx.zero_inputs, else it does "
       "nothing) read as their other operand; first after DCE, so that every later pass sees the placeholder "
       "unread"},
      // Then: regions are checked once, on the graph the scheduling passes will see.
      {"hint-propagation", hint_propagation,
       "checks the user's hinted_context hints against the graph (after DCE, so unused values cannot fail "
       "it) before any pass schedules or slices by region"},
      {"fold-softmax-upcast", fold_softmax_upcast,
       "drops the float32 copy a half-precision softmax input gets (CUDA's half_to_float softmax reads it "
       "directly); before slice-legality, so slice loops and the memory passes never see the copy"},
      {"fold-select-backward", fold_select_backward,
       "a sum of select_backward gradients covering a dimension (unbind's gradient) into one stack: no n "
       "full-size zero tensors alive together; before slice-legality and the fusions, which would otherwise "
       "slice or fuse the adds"},
      {"fold-transpose-pairs", fold_transpose_pairs,
       "a transpose of a transpose (AOTAutograd's linear backward: t(t(w)), t(t(mm))) read as its source: "
       "fewer dispatches a step; before slice-legality, so the slicing rules and every later pass see mm "
       "read the weight and the gradient returned directly"},
      {"fold-scaled-add", fold_scaled_add,
       "an add (or sub) of a tensor times a constant that nothing else reads reads the tensor with the "
       "constant as alpha (AOTAutograd's decomposition of add(a, b, alpha=s) undone: no full-size temporary); "
       "before slice-legality, like the other folds, and before write-inputs-in-place, which then writes a "
       "buffer's `mul_(d).add_(x, alpha=s)` with eager's two ops"},
      {"slice-legality", slice_legality_pass,
       "analysis after hint-propagation (regions and hints final): the dump says what each region can slice"},
      {"slice-schedule", slice_schedule,
       "rewrites DFS/auto regions into slice loops; after legality, before memory-plan, which plans the final order"},
      {"write-inputs-in-place", write_inputs_in_place,
       "an input the caller writes an output back into (ctx.input_writes: a module's buffers, BatchNorm's "
       "statistics, a cache) written by the node that computes it; after slice-schedule, whose legality rules "
       "read the functional ops, and before pointwise-fusion, which could take an update into a group"},
      {"fold-cross-entropy-backward", fold_cross_entropy_backward,
       "nll_loss_backward and the log-softmax gradient into one op writing one [N, C] buffer (not two); after "
       "slice-schedule (whose legality rules read the plain ops, and whose loop bodies it folds too), before "
       "pointwise-fusion and the memory passes, which then plan the one buffer"},
      {"fold-cross-entropy-forward", fold_cross_entropy_forward,
       "log-softmax and nll_loss_forward into one op taking the rows a chunk at a time (no [N, C] log-"
       "probabilities); beside fold-cross-entropy-backward and for the same reasons"},
      {"split-column-sum", split_column_sum,
       "on CUDA, a sum over a contiguous tensor's leading dims (a bias gradient) into hintbackend::column_sum "
       "(float32 partial sums, then their sum: nothing staged in a global buffer as ATen's sum does); after "
       "slice-schedule (whose legality rules read the plain sum), before the memory passes, which place its result (its parts x C float partial sums are the "
       "op's own workspace, from the caching allocator)"},
      {"row-softmax-fusion", row_softmax_fusion,
       "softmax chains and their gradients into row kernels; after slice-schedule (whose legality rules read "
       "the plain ops, and whose loop bodies it fuses too: a DFS backward recomputes the softmax in its "
       "gradient's kernel), before pointwise-fusion, which would take the chain's scalar mul"},
      {"fold-layer-norm-activation", fold_layer_norm_activation,
       "on CUDA, a GELU or SiLU whose only reader is a layer norm into the layer norm (and, in the backward, the "
       "activation's recompute and its backward into the layer norm's backward), for LayerNormRows' kernels; "
       "after slice-schedule (whose legality rules read the plain ops), before pointwise-fusion, which could "
       "take the activation into a group, and the memory passes, which then never plan its result"},
      {"pointwise-fusion", pointwise_fusion,
       "groups elementwise chains into one kernel call each; after slice-schedule (whose legality rules "
       "read plain ATen ops, and whose loop bodies it fuses too), before memory-plan (fewer, final buffers)"},
      {"memory-schedule", memory_schedule,
       "reorders top-level nodes for a lower simulated peak; after every pass that adds or removes nodes, "
       "before memory-plan, which plans the order it leaves"},
      // Plans offsets over the final order; a pass after it that changed the graph would invalidate the plan.
      {"memory-plan", memory_plan_pass,
       "analysis over the final order: the program's memory plan (arena offsets, in-place reuse, direct "
       "output writes) for ctx.memory's target; the runtime runs it as given"},
      {"call-invariance", call_invariance,
       "analysis: the nodes that compute the same value on every call (from constants only), which the "
       "runtime runs once; after memory-plan, whose direct output writes it reads, and changes no node"},
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

Program compile_program(std::shared_ptr<Graph> g, PassContext& ctx) {
  run_pipeline(*g, ctx);
  Program p;
  // Kernel selection reads the final graph; the memory plan was made for the same graph (its target
  // asks the same per-node choice, codegen/TargetModel.h).
  p.kernels = std::make_shared<const KernelPlan>(select_kernels(*g, ctx.memory.target));
  p.memory = ctx.memory_plan;
  p.keep_across_calls = ctx.keep_across_calls;
  p.invariants = ctx.call_invariants;
  p.notes = ctx.notes;
  p.warnings = ctx.warnings;
  p.graph = std::move(g);
  return p;
}

}  // namespace hb

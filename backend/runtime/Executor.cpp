#include "backend/runtime/Executor.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <optional>

#include "backend/ir/Aliasing.h"
#include "backend/ir/Error.h"
#include "backend/ir/Liveness.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/BatchNormInPlace.h"
#include "backend/runtime/Call.h"
#include "backend/runtime/ColumnSum.h"
#include "backend/runtime/CrossEntropyBackward.h"
#include "backend/runtime/CrossEntropyForward.h"
#include "backend/runtime/LayerNormAct.h"
#include "backend/runtime/Placement.h"
#include "backend/runtime/RowSoftmax.h"
#include "backend/runtime/SymOps.h"

namespace hb::rt {

// A node whose result the graph returns, written into the caller's destination for it when it passes
// one (MemoryPlan::output_writes).
struct DirectWrite {
  int output = -1;                            // index among the graph's outputs
  std::optional<c10::OperatorHandle> out_op;  // ATen ops; none for fused pointwise groups
  std::vector<int64_t> sizes;                 // the node's IR shape (static, contiguous)
  int64_t numel = 0;                          // product of sizes
};

struct Step {
  KernelKind kind = KernelKind::Aten;
  int node = -1;
  std::optional<c10::OperatorHandle> op;  // Aten
  std::vector<ArgSpec> args;
  size_t num_returns = 1;
  SymCode sym = SymCode::Add;       // SymOp: resolved from the target at plan time
  std::shared_ptr<const Call> call;  // the kinds Call.h's table lowers
  std::vector<int> release;         // slots to drop after this step
  std::shared_ptr<const Placement> place;    // set: the result goes into the arena (the memory plan)
  std::shared_ptr<const DirectWrite> write;  // set: may write straight into a caller's result
  bool fresh_result = false;        // a result that must not alias the arena (see keep_out_of_arena)
  std::string label;                // the profiler's name for the step: "hb %node (kernel kind)"
  bool invariant = false;           // reads only constants and invariant steps: skipped once kept
  bool keep = false;                // an invariant value a running step reads: kept by the first run
};

namespace {
thread_local std::string failure_site;  // note_failure_site: innermost first
}  // namespace

void note_failure_site(const std::string& where) {
  failure_site += (failure_site.empty() ? "" : ", inside ") + where;
}

std::string take_failure_site() {
  std::string s = std::move(failure_site);
  failure_site.clear();
  return s;
}

namespace {

Step plan_aten(const Graph& g, int i) {
  Step s;
  s.kind = KernelKind::Aten;
  s.node = i;
  AtenArgs a = aten_args(g, i, describe(g, i));
  s.op = a.op;
  s.num_returns = a.op.schema().returns().size();
  s.args = std::move(a.args);
  return s;
}


// The out= overload a planned ATen step writes through; the plan was made with this runtime's target,
// so it must exist (fused groups write through their kernel and need none).
std::optional<c10::OperatorHandle> out_op_of(const Graph& g, const Step& s) {
  if (s.kind == KernelKind::FusedPointwise) return std::nullopt;
  HB_INTERNAL_CHECK(s.kind == KernelKind::Aten && s.op)
      << describe(g, s.node) << ": the memory plan placed a " << kernel_kind_name(s.kind) << " result";
  auto out = find_out_overload(*s.op);
  HB_INTERNAL_CHECK(out.has_value()) << describe(g, s.node)
                                     << ": the memory plan placed a result whose op has no out= overload (was it "
                                        "planned for another target than the runtime's?)";
  return out;
}

const std::shared_ptr<const MemoryPlan>& empty_plan() {
  static const auto p = std::make_shared<const MemoryPlan>();
  return p;
}

}  // namespace

Executor::Executor(Program program, std::shared_ptr<const std::vector<at::Tensor>> constants)
    : program_(std::move(program)), constants_(std::move(constants)) {
  const Graph& g = *program_.graph;
  const KernelPlan& kernels = *program_.kernels;
  plan_ = program_.memory ? program_.memory : empty_plan();
  HB_INTERNAL_CHECK(kernels.nodes.size() == g.nodes.size()) << "kernel plan does not match the graph";
  HB_INTERNAL_CHECK(kernels.unsupported.empty()) << "executor built for a graph with unsupported nodes";
  link_row_softmax_ops();  // the ops row-softmax-fusion writes must be registered with the dispatcher
  link_cross_entropy_backward_ops();  // and the ones fold-cross-entropy-backward and -forward write
  link_cross_entropy_forward_ops();
  link_column_sum_ops();  // and the one split-column-sum writes
  link_layer_norm_act_ops();  // and the ones fold-layer-norm-activation writes
  link_batch_norm_in_place_ops();  // and the one write-inputs-in-place writes
  placeholders_ = g.placeholders();
  const Liveness live = liveness(g);
  std::vector<int> step_of(g.nodes.size(), -1);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    const std::string where = describe(g, i);
    Step s;
    s.node = i;
    s.kind = kernels.nodes[i].kind;
    switch (s.kind) {
      case KernelKind::Input:
        if (live.last_use[i] == i) release_inputs_.push_back(i);
        continue;
      case KernelKind::Output:
        for (const Arg& a : n.args) s.args.push_back(convert_untyped(a, where));
        break;
      case KernelKind::Constant:
        HB_USER_CHECK(constants_ && n.constant_index < static_cast<int>(constants_->size()))
            << where << ": constant #" << n.constant_index << " was not handed over";
        break;
      case KernelKind::Aten:
        s = plan_aten(g, i);
        break;
      case KernelKind::GetItem:
        HB_USER_CHECK(n.args.size() == 2 && n.args[1].kind == Arg::Kind::Int)
            << where << ": getitem takes a value and a constant integer index";
        s.args.push_back(convert_untyped(n.args[0], where));
        s.args.push_back(constant(c10::IValue(n.args[1].i)));
        break;
      case KernelKind::SymOp:
        s.sym = sym_code(n.target, where);
        HB_USER_CHECK(n.args.size() == (sym_unary_code(s.sym) ? 1u : 2u))
            << where << ": '" << n.target << "' takes " << (sym_unary_code(s.sym) ? "one operand" : "two operands")
            << ", got " << n.args.size();
        for (const Arg& a : n.args) s.args.push_back(convert_untyped(a, where));
        break;
      case KernelKind::Unsupported:
        HB_INTERNAL_CHECK(false) << where << " is unsupported";
        break;
      default: {
        const Lowering lower = find_lowering(s.kind);
        HB_INTERNAL_CHECK(lower) << where << ": no lowering for kernel kind " << kernel_kind_name(s.kind);
        s.call = lower(LowerContext{program_, i, where, constants_});
        break;
      }
    }
    s.release = live.release_after[i];
    s.label = "hb %" + n.name + " (" + kernel_kind_name(s.kind) + ")";
    max_stack_ = std::max(max_stack_, s.args.size() + s.num_returns);
    // Results that are fresh memory by the plan's model (not a view): checked against the arena.
    s.fresh_result = (s.kind == KernelKind::Aten && !n.effects.is_view && !n.effects.mutates &&
                      !aliases_without_annotation(n)) ||
                     s.kind == KernelKind::FlexForward || s.kind == KernelKind::FlexBackward ||
                     s.kind == KernelKind::FlexCudnnForward || s.kind == KernelKind::FlexCudnnBackward ||
                     s.kind == KernelKind::FlexFusedForward || s.kind == KernelKind::FlexFusedBackward ||
                     s.kind == KernelKind::ZerosAndScatter || s.kind == KernelKind::LayerNormRows;
    step_of[i] = static_cast<int>(steps_.size());
    steps_.push_back(std::move(s));
  }
  if (constants_)
    for (const at::Tensor& c : *constants_) constants_require_grad_ |= c.defined() && c.requires_grad();
  place_results(step_of);
  apply_invariants();
}

void Executor::apply_invariants() {
  // The nodes call-invariance found (passes/CallInvariance.h) run in the first complete run only; it keeps
  // the values later runs read. One the plan placed in the arena gets its own memory instead (the arena is
  // reused within a call): the memory dump still shows it placed.
  const CallInvariants* inv = program_.invariants.get();
  if (!program_.keep_across_calls || !inv) return;
  for (Step& s : steps_) {
    s.invariant = inv->runs_once.at(s.node);
    s.keep = inv->kept.at(s.node);
    if (s.invariant) s.place.reset();
  }
  copied_outputs_ = inv->copied_outputs;
  copy_all_outputs_ = inv->copy_all_outputs;
}

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs) const {
  // One arena per busy period of the plan (usually one per call), only when something is placed:
  // allocated at the period's first placed result and dropped after its last one dies, so it lives
  // no longer than the values it holds.
  const bool lazy = plan_->arena_for_calls && places(inputs);
  return run(std::move(inputs), at::Tensor(), lazy);
}

Executor::~Executor() = default;

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs, at::Tensor arena, bool lazy,
                                       const std::vector<at::Tensor>* dests) const {
  const Graph& g = *program_.graph;
  // AOT graphs are functional and run outside autograd (inside autograd.Function.forward/backward, or
  // as an inference graph whose outputs need no grad): skip the Autograd kernels, keep ADInplaceOrView so
  // in-place ops still bump version counters and views keep their base.
  at::AutoDispatchBelowAutograd below_autograd;
  HB_USER_CHECK(inputs.size() == placeholders_.size())
      << "graph '" << g.name << "' takes " << placeholders_.size() << " inputs, got " << inputs.size();
  std::vector<c10::IValue> slots(g.nodes.size());
  for (size_t k = 0; k < placeholders_.size(); ++k) slots[placeholders_[k]] = std::move(inputs[k]);
  for (int r : release_inputs_) slots[r] = c10::IValue();
  std::vector<c10::IValue> stack;
  stack.reserve(max_stack_);
  std::vector<c10::IValue> outputs;
  const c10::StorageImpl* arena_storage = arena.defined() ? arena.storage().unsafeGetStorageImpl() : nullptr;
  int64_t placed = 0, largest_arena = arena.defined() ? plan_->arena_bytes : 0, written = 0;
  CallStats stats;
  // The caller's destination for a step's output, viewed with the step's IR shape; undefined if none fits.
  auto dest_of = [&](const Step& s) -> at::Tensor {
    if (!s.write || !dests || s.write->output >= static_cast<int>(dests->size())) return at::Tensor();
    const at::Tensor& d = (*dests)[s.write->output];
    if (!d.defined() || !d.is_contiguous() || d.numel() != s.write->numel) return at::Tensor();
    return d.view(s.write->sizes);
  };
  // Invariant values the first run kept (apply_invariants): their steps are skipped.
  const std::shared_ptr<const std::vector<std::pair<int, c10::IValue>>> kept = std::atomic_load(&kept_);
  std::vector<std::pair<int, c10::IValue>> keeping;
  if (kept)
    for (const auto& [node, v] : *kept) slots[node] = v;
  for (const Step& s : steps_) {
    if (kept && s.invariant) continue;
    // A host-time range per step under torch.profiler (the trace shows which node the host spends on);
    // an inactive profiler costs one check.
    RECORD_FUNCTION(s.label, std::vector<c10::IValue>());
    if (lazy && s.place && !arena.defined()) {
      const int64_t bytes = plan_->segments.at(s.place->segment).bytes;
      arena = new_arena(bytes);
      arena_storage = arena.storage().unsafeGetStorageImpl();
      largest_arena = std::max(largest_arena, bytes);
      ++allocations_;
    }
    try {
      switch (s.kind) {
        case KernelKind::Aten:
          stack.clear();
          for (const ArgSpec& a : s.args) stack.push_back(build_arg(a, slots));
          if (s.write) {  // straight into the caller's result, through the out= overload (output_writes)
            at::Tensor out = dest_of(s);
            if (out.defined()) {
              stack.push_back(out);
              s.write->out_op->callBoxed(stack);
              slots[s.node] = std::move(out);
              ++written;
              break;
            }
          }
          if (s.place && arena_storage) {  // into the arena, through the out= overload
            at::Tensor out = arena_view(arena, *s.place);
            stack.push_back(out);
            s.place->out_op->callBoxed(stack);
            HB_INTERNAL_CHECK(out.sizes().equals(s.place->sizes))
                << describe(g, s.node) << ": result shape " << out.sizes() << " is not the IR type's; "
                << "rerun with HINTBACKEND_ARENA=0 and report it with a dump (dump_dir)";
            slots[s.node] = std::move(out);
            ++placed;
            break;
          }
          s.op->callBoxed(stack);
          if (s.num_returns == 1) slots[s.node] = std::move(stack[0]);
          else if (s.num_returns == 0) slots[s.node] = c10::IValue();
          else slots[s.node] = c10::ivalue::Tuple::create(std::move(stack));
          break;
        case KernelKind::Constant:
          slots[s.node] = (*constants_)[g.nodes[s.node].constant_index];
          break;
        case KernelKind::GetItem:
          slots[s.node] = get_item(build_arg(s.args[0], slots), s.args[1].value.toInt(), [&] { return describe(g, s.node); });
          break;
        case KernelKind::SymOp:
          slots[s.node] = s.args.size() == 1
                              ? sym_unary(s.sym, build_arg(s.args[0], slots), [&] { return describe(g, s.node); })
                              : sym_binary(s.sym, build_arg(s.args[0], slots), build_arg(s.args[1], slots),
                                           [&] { return describe(g, s.node); });
          break;
        case KernelKind::Output: {
          const c10::IValue v = build_arg(s.args.at(0), slots);
          if (v.isTuple()) {
            for (const c10::IValue& x : v.toTupleRef().elements()) outputs.push_back(x);
          } else {
            outputs.push_back(v);
          }
          for (size_t k = 0; (copy_all_outputs_ || !copied_outputs_.empty()) && k < outputs.size(); ++k) {
            const bool copy = copy_all_outputs_ || (k < copied_outputs_.size() && copied_outputs_[k]);
            if (copy && outputs[k].isTensor() && outputs[k].toTensor().defined())
              outputs[k] = outputs[k].toTensor().clone(at::MemoryFormat::Preserve);
          }
          if (arena_storage)  // never: the plan does not place what is returned (but outputs outlive the arena)
            for (c10::IValue& x : outputs) keep_out_of_arena(x, arena_storage);
          break;
        }
        case KernelKind::Input:
        case KernelKind::Unsupported:
          HB_INTERNAL_CHECK(false) << "unexpected step kind " << kernel_kind_name(s.kind);
          break;
        default: {  // a kernel of ours (Call.h): straight into the caller's destination or the arena if planned
          at::Tensor out = dest_of(s);
          if (out.defined()) ++written;
          else if (s.place && arena_storage) {
            out = arena_view(arena, *s.place);
            ++placed;
          }
          slots[s.node] = s.call->run(slots, out, stats);
          break;
        }
      }
    } catch (c10::Error& e) {
      // The same error (torch.OutOfMemoryError stays one), with the node named: every enclosing
      // executor (a slice loop's graph) adds its own line.
      e.add_context("hintbackend: while running " + describe(g, s.node));
      throw;
    } catch (...) {
      // An exception we cannot annotate (a Python kernel's): its node is kept for the caller.
      note_failure_site(describe(g, s.node));
      throw;
    }
    if (s.fresh_result && arena_storage) keep_out_of_arena(slots[s.node], arena_storage);
    if (!kept && s.keep) keeping.emplace_back(s.node, slots[s.node]);
    for (int r : s.release) slots[r] = c10::IValue();
    if (lazy && arena.defined() && segment_ends_[s.node]) {
      // Every value placed in this period is dead: the storage goes back to the allocator with the
      // last view of it, and the next period (if any) allocates its own.
      arena.reset();
      arena_storage = nullptr;
    }
  }
  if (!kept && !keeping.empty())  // a complete run: later runs skip the invariant steps
    std::atomic_store(&kept_, std::make_shared<const std::vector<std::pair<int, c10::IValue>>>(std::move(keeping)));
  last_arena_bytes_ = largest_arena;
  last_written_ = written + stats.written;
  last_workspace_ = stats.workspace;
  last_placed_ = placed;
  allocations_ += stats.arenas;
  return outputs;
}

// ---- the memory plan onto the steps ---------------------------------------------------------------

void Executor::place_results(const std::vector<int>& step_of) {
  const Graph& g = *program_.graph;
  const MemoryPlan& plan = *plan_;
  if (!plan.device.empty()) arena_device_ = c10::Device(plan.device);
  segment_ends_.assign(g.nodes.size(), false);
  for (const ArenaSegment& seg : plan.segments) segment_ends_[seg.end] = true;
  for (const PlannedBuffer& b : plan.buffers) {
    for (size_t k = 0; k < b.values.size(); ++k) {
      const ValueRef& v = b.values[k];
      const Node& node = g.nodes[v.node];
      HB_INTERNAL_CHECK(v.elem < 0 && step_of[v.node] >= 0 && node.type.kind == ValueType::Kind::Tensor)
          << describe(g, v.node) << ": the memory plan placed a value the runtime cannot place";
      const TensorType& t = node.type.tensor;
      if (k > 0) {
        // In place: the op writes over an input that dies here, through its out= overload. Only the
        // ops the planner allows (may_write_over_input: all safe with out == that input), same layout,
        // or both plain row-major over the same elements (the input read through a reshape).
        const TensorType& first = g.nodes[b.values[0].node].type.tensor;
        bool same = may_write_over_input(node) && first.dtype == t.dtype && first.shape.size() == t.shape.size();
        for (size_t d = 0; same && d < t.shape.size(); ++d)
          same = first.shape[d].value == t.shape[d].value && first.stride[d].value == t.stride[d].value;
        same = same || (may_write_over_input(node) && first.same_dense_elements(t));
        HB_INTERNAL_CHECK(same) << describe(g, v.node) << ": in-place reuse of a buffer with another layout";
      }
      const int64_t elem = dtype_bytes(t.dtype);
      HB_INTERNAL_CHECK(b.offset % elem == 0) << describe(g, v.node) << ": arena offset not aligned to its dtype";
      Step& s = steps_[step_of[v.node]];
      s.place = std::make_shared<const Placement>(Placement{out_op_of(g, s), b.offset / elem, b.segment, sizes_of(t),
                                                            strides_of(t),
                                                            caffe2::TypeMeta::fromScalarType(to_scalar_type(t.dtype))});
      s.fresh_result = false;
      max_stack_ = std::max(max_stack_, s.args.size() + 1);
    }
  }
  for (const hb::OutputWrite& w : plan.output_writes) {
    HB_INTERNAL_CHECK(step_of[w.node] >= 0) << describe(g, w.node) << ": an output write planned for an input";
    Step& s = steps_[step_of[w.node]];
    const std::vector<int64_t> sizes = sizes_of(g.nodes[w.node].type.tensor);
    s.write = std::make_shared<const DirectWrite>(
        DirectWrite{w.output, out_op_of(g, s), sizes, c10::multiply_integers(sizes)});
    s.place.reset();  // never both (outputs are never placed anyway)
    max_stack_ = std::max(max_stack_, s.args.size() + 1);
  }
}

bool Executor::places(const std::vector<c10::IValue>& inputs) const {
  return plan_->arena_bytes > 0 && writes_out(inputs);
}

bool Executor::writes_out(const std::vector<c10::IValue>& inputs) const {
  // out= overloads refuse arguments that require grad while autograd records: then run as before.
  if (!c10::GradMode::is_enabled() || c10::impl::tls_is_dispatch_keyset_excluded(c10::autograd_dispatch_keyset))
    return true;
  if (constants_require_grad_) return false;
  for (const c10::IValue& v : inputs)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) return false;
  return true;
}

at::Tensor Executor::new_arena(int64_t bytes) const {
  if (bytes < 0) bytes = plan_->arena_bytes;
  if (bytes == 0) return at::Tensor();
  at::Tensor arena = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(arena_device_));
  // A wrong IR shape must not grow the arena under the views already made of it: fail instead.
  arena.storage().unsafeGetStorageImpl()->set_resizable(false);
  return arena;
}

Executor::ArenaStats Executor::arena_stats() const {
  ArenaStats s;
  s.arena_bytes = last_arena_bytes_.load();
  s.placed = last_placed_.load();
  s.written = last_written_.load();
  s.workspace = last_workspace_.load();
  s.allocations = allocations_.load();
  return s;
}

}  // namespace hb::rt

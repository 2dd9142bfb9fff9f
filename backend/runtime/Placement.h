// The runtime's placement rule and the arena's views. The rule is the runtime's Target
// (backend/ir/Target.h): the IR-level part is codegen/TargetModel.h's, the op part asks the dispatcher
// whether the op has an out= overload with a kernel of its own for the device. The bindings hand it to
// the pipeline, so the memory plan (and the slice chooser, and memory-schedule) see exactly what this
// runtime places; the executor then builds a Placement per planned value and checks it agrees.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <optional>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"
#include "backend/ir/Program.h"
#include "backend/ir/Target.h"

namespace hb::rt {

// The runtime's target: what it can write into an arena, the kernels' workspaces, and how generated
// kernels are built (`host`: none by default).
Target runtime_target(const HostCompileSettings& host = {}, const CudaCompileSettings& cuda = {});

// A Program for a hand-built graph as it is (no passes): kernel choices, the memory plan (under the
// runtime's target and `opt`'s settings; opt.target is replaced) and the call invariants. For the
// runtime tests; the bindings compile through the pipeline (passes/Pipeline.h, compile_program).
Program program_of(std::shared_ptr<Graph> g, MemoryPlanOptions opt = {});

// The out= overload of a functional op: by the usual names first ("<overload>_out", "out"), then any
// overload of the same name with the out= shape (sum.dim_IntList -> sum.IntList_out,
// threshold_backward -> threshold_backward.grad_input).
std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op);

// A result the runtime writes into the call's arena: an ATen op runs through its out= overload (a
// fused pointwise group's kernel writes directly) into a view of the arena with the IR type's layout.
struct Placement {
  std::optional<c10::OperatorHandle> out_op;  // ATen ops; none for fused pointwise groups
  int64_t offset = 0;  // elements of `dtype` from the arena's start
  int segment = 0;     // the plan's busy period: in a call, the arena allocated for that period
  std::vector<int64_t> sizes, strides;
  caffe2::TypeMeta dtype;
};

// A value's place in the arena: a tensor sharing the arena's storage (which keeps it alive) with the
// planned layout. Built directly, without a dispatcher call per value.
at::Tensor arena_view(const at::Tensor& arena, const Placement& p);

// A result the plan treats as fresh memory must not point into the arena: the arena's bytes are
// reused once the plan's buffers die, and outputs outlive the call. An op whose schema hides that it
// returns an alias of an arena value would break both, so such a result is copied out (never seen
// with ATen's own ops: aten::_unsafe_view, the one known case, is planned as a view).
void keep_out_of_arena(c10::IValue& v, const c10::StorageImpl* arena);

}  // namespace hb::rt

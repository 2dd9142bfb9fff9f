// The runtime: executes an IR graph with no Python in the per-node path. The constructor turns
// the graph and its kernel plan into a list of steps once (dispatcher handles resolved, constant
// arguments converted to IValues against the op's schema, release lists from liveness); run()
// then walks the steps.
//
// Memory: the constructor also decides which results it can place (an ATen op with its own out=
// kernel, or a fused pointwise group; one tensor of static contiguous layout) and computes the
// memory plan over those only (passes/MemoryPlan.h). A run() then allocates one arena per busy
// period of the plan (at::empty, so on CUDA from the caching allocator; most graphs have one period)
// at the period's first placed result, writes each placed result into a view of it at its planned
// offset, and drops it after the period's last placed value dies.
// Calls skip the arena where it would raise the simulated peak (arena_for_calls()). Everything else
// (inputs, outputs, views, multi-output ops, ops without out=) is allocated by its op as before and
// released after its last use. Outputs never live in the arena. HINTBACKEND_ARENA=0 (read at
// construction) turns placement off.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "codegen/KernelSelect.h"
#include "passes/MemoryPlan.h"

namespace hb::rt {

struct Step;

class Executor {
 public:
  // `constants`: the document's tensor constants (get_attr nodes index into it), shared by subgraphs.
  // `arena`: place intermediates in one arena per call (also off when HINTBACKEND_ARENA=0).
  Executor(std::shared_ptr<const Graph> graph, const KernelPlan& kernels,
           std::shared_ptr<const std::vector<at::Tensor>> constants, bool arena = true);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Inputs in placeholder order; returns the graph's outputs flattened (one IValue per element of
  // the returned tuple or list; a single value if the graph returns one).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;
  // The same in a caller's arena from new_arena() (slice loops: one arena for all slices); an
  // undefined `arena` runs without placement.
  // `lazy`: allocate the arena at the first placed result and drop it after the last one dies.
  // `dests`: where the caller wants output k (a slice loop passes slice i of its full results); an
  // output whose producer has an out= kernel (or is a fused group) is written there, no copy after.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, at::Tensor arena, bool lazy = false,
                               const std::vector<at::Tensor>* dests = nullptr) const;
  // Whether a run on these inputs places values: the plan has an arena, and autograd will not
  // record (out= overloads refuse inputs that require grad while it does).
  bool places(const std::vector<c10::IValue>& inputs) const;
  // Whether out= overloads accept a run on these inputs (autograd will not record them).
  bool writes_out(const std::vector<c10::IValue>& inputs) const;
  // A fresh arena for one call: arena_bytes() bytes, not resizable, on the plan's device.
  // `bytes` < 0: arena_bytes(), the largest busy period, which holds any period (a slice body's arena).
  at::Tensor new_arena(int64_t bytes = -1) const;

  int num_inputs() const { return static_cast<int>(placeholders_.size()); }
  const Graph& graph() const { return *graph_; }

  // The plan run() uses (empty when placement is off) and its bytes.
  const MemoryPlan& runtime_plan() const { return plan_; }
  int64_t arena_bytes() const { return plan_.arena_bytes; }
  // For the dumps ("memory-plan-runtime"): this graph's plan, why each op's result is not placed,
  // then the plans of the subgraphs it runs (slice_loop bodies, FlexAttention mods).
  std::string memory_plan_text() const;

  struct ArenaStats {
    int64_t arena_bytes = 0;  // the last run's arena (0: none allocated)
    int64_t placed = 0;       // the last run: results written into the arena through out= overloads
    int64_t allocations = 0;  // all runs: arenas allocated, this graph's and its slice_loop bodies'
    int64_t written = 0;      // the last run: outputs written straight into the caller's destinations
                              // (slice-loop bodies: into slice i of the loop's results, every slice counted)
  };
  ArenaStats arena_stats() const;
  // Whether calls use the arena: only when it does not raise the call's simulated peak over allocating
  // per op (the dump's memory-plan-runtime note gives both). Slice-loop bodies use it regardless.
  bool arena_for_calls() const { return arena_pays_ && plan_.arena_bytes > 0; }

 private:
  std::shared_ptr<const Graph> graph_;
  std::shared_ptr<const std::vector<at::Tensor>> constants_;
  std::vector<int> placeholders_;
  std::vector<Step> steps_;
  std::vector<int> release_inputs_;  // placeholders nobody reads: dropped at once
  size_t max_stack_ = 0;

  // Arena placement (plan_arena in Executor.cpp).
  void plan_arena(const std::vector<int>& step_of);
  // Outputs a caller's destination can take (run's `dests`).
  void plan_output_writes(const std::vector<int>& step_of);
  bool arena_enabled_ = true;
  bool constants_require_grad_ = false;
  MemoryPlan plan_;
  std::string arena_note_;    // the simulated peaks with and without the arena (the dump says why it is off)
  std::vector<bool> segment_ends_;  // per node: a busy period of the plan ends there (its arena is dropped)
  bool arena_pays_ = true;    // the arena does not raise the call's simulated peak (else calls skip it)
  c10::Device arena_device_ = c10::Device(c10::kCPU);
  mutable std::atomic<int64_t> last_arena_bytes_{0}, last_placed_{0}, allocations_{0}, last_written_{0};
};

}  // namespace hb::rt

// The runtime: executes a compiled Program (backend/ir/Program.h: the graph after the pipeline, its
// kernel choices and its memory plan) with no Python in the per-node path. It decides nothing: the
// constructor turns the program into a list of steps once (dispatcher handles resolved, constant
// arguments converted to IValues against the op's schema, release lists from liveness, a Call for each
// node a kernel of ours runs (Call.h), a Placement for each value the memory plan placed); run() then
// walks the steps.
//
// Memory: a run() allocates one arena per busy period of the plan (at::empty, so on CUDA from the
// caching allocator; most graphs have one) at the period's first placed result, writes each placed
// result into a view of it at its planned offset through the op's out= overload, and drops it after
// the period's last placed value dies. Calls skip the arena where the plan says it would raise the
// simulated peak (MemoryPlan::arena_for_calls). Everything else (inputs, outputs, views, multi-output
// ops, ops without out=) is allocated by its op and released after its last use. Outputs never live in
// the arena. A program without a memory plan places nothing.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"
#include "backend/ir/Program.h"

namespace hb::rt {

struct Step;

// Where the last run that failed with an exception the runtime cannot annotate (a Python kernel's
// error, which must keep its Python type) failed: "%node (op) at file:line, inside %loop ... (slice i
// of N)", innermost first; a c10::Error gets these lines as its own context instead. Per thread;
// take_failure_site() returns it and clears it (the bindings clear it before each run).
void note_failure_site(const std::string& where);
std::string take_failure_site();

class Executor {
 public:
  // `constants`: the document's tensor constants (get_attr nodes index into it), shared by subgraphs.
  Executor(Program program, std::shared_ptr<const std::vector<at::Tensor>> constants);
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
  // output the plan lists in output_writes is written there, no copy after.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, at::Tensor arena, bool lazy = false,
                               const std::vector<at::Tensor>* dests = nullptr) const;
  // Whether a run on these inputs places values: the plan has an arena, and autograd will not
  // record (out= overloads refuse inputs that require grad while it does).
  bool places(const std::vector<c10::IValue>& inputs) const;
  // Whether out= overloads accept a run on these inputs (autograd will not record them).
  bool writes_out(const std::vector<c10::IValue>& inputs) const;
  // A fresh arena for one call: `bytes` (< 0: arena_bytes(), the largest busy period, which holds any
  // period: a slice body's arena), not resizable, on the plan's device.
  at::Tensor new_arena(int64_t bytes = -1) const;

  int num_inputs() const { return static_cast<int>(placeholders_.size()); }
  const Graph& graph() const { return *program_.graph; }
  // The plan run() executes (empty when the program has none) and its bytes.
  const MemoryPlan& plan() const { return *plan_; }
  int64_t arena_bytes() const { return plan_->arena_bytes; }

  struct ArenaStats {
    int64_t arena_bytes = 0;  // the last run's arena (0: none allocated)
    int64_t placed = 0;       // the last run: results written into the arena through out= overloads
    int64_t allocations = 0;  // all runs: arenas allocated, this graph's and its slice_loop bodies'
    int64_t written = 0;      // the last run: outputs written straight into the caller's destinations
                              // (slice-loop bodies: into slice i of the loop's results, every slice counted)
    int64_t workspace = 0;    // the last run: the largest workspace one kernel allocated for itself (cuDNN's
                              // SDPA), its slice-loop bodies' included; the plan's model of it is
                              // kernel_workspace_bytes (codegen/TargetModel.h)
  };
  ArenaStats arena_stats() const;
  // Whether calls use the arena (the plan's decision). Slice-loop bodies use it regardless.
  bool arena_for_calls() const { return plan_->arena_for_calls && plan_->arena_bytes > 0; }
  // How many invariant values the first run kept for later runs (apply_invariants); 0 before it.
  size_t kept_values() const {
    const auto k = std::atomic_load(&kept_);
    return k ? k->size() : 0;
  }

 private:
  Program program_;
  std::shared_ptr<const MemoryPlan> plan_;  // program_.memory, or an empty plan
  std::shared_ptr<const std::vector<at::Tensor>> constants_;
  std::vector<int> placeholders_;
  std::vector<Step> steps_;
  std::vector<int> release_inputs_;  // placeholders nobody reads: dropped at once
  size_t max_stack_ = 0;

  // The memory plan's placements and output writes, onto the steps.
  void place_results(const std::vector<int>& step_of);
  // The program's call-invariant nodes (Program::invariants) onto the steps: which run once, which
  // values the first run keeps, which outputs are copied.
  void apply_invariants();
  mutable std::shared_ptr<const std::vector<std::pair<int, c10::IValue>>> kept_;  // atomic_load/store
  std::vector<bool> copied_outputs_;  // per output position: an invariant value, copied each call
  bool copy_all_outputs_ = false;    // the graph returns one invariant value (its elements, if a tuple)
  bool constants_require_grad_ = false;
  std::vector<bool> segment_ends_;  // per node: a busy period of the plan ends there (its arena is dropped)
  c10::Device arena_device_ = c10::Device(c10::kCPU);
  mutable std::atomic<int64_t> last_arena_bytes_{0}, last_placed_{0}, allocations_{0}, last_written_{0},
      last_workspace_{0};
};

}  // namespace hb::rt

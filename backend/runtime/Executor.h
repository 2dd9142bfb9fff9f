// The runtime: executes an IR graph with no Python in the per-node path. The constructor turns
// the graph and its kernel plan into a list of steps once (dispatcher handles resolved, constant
// arguments converted to IValues against the op's schema, release lists from liveness); run()
// then walks the steps. Each intermediate is released after its last use.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "backend/ir/Graph.h"
#include "codegen/KernelSelect.h"

namespace hb::rt {

struct Step;

class Executor {
 public:
  // `constants`: the document's tensor constants (get_attr nodes index into it), shared by subgraphs.
  Executor(std::shared_ptr<const Graph> graph, const KernelPlan& kernels,
           std::shared_ptr<const std::vector<at::Tensor>> constants);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Inputs in placeholder order; returns the graph's outputs flattened (one IValue per element of
  // the returned tuple or list; a single value if the graph returns one).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  int num_inputs() const { return static_cast<int>(placeholders_.size()); }
  const Graph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const Graph> graph_;
  std::shared_ptr<const std::vector<at::Tensor>> constants_;
  std::vector<int> placeholders_;
  std::vector<Step> steps_;
  std::vector<int> release_inputs_;  // placeholders nobody reads: dropped at once
  size_t max_stack_ = 0;
};

}  // namespace hb::rt

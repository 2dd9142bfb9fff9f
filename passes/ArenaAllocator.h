// Arena allocation strategies (XLA's heap simulator and TFLite's arena planner are the models): given
// buffers with sizes and lifetimes over the order, an offset for each so that buffers live at the same
// time never overlap. The memory planner (passes/MemoryPlan.h) runs each and keeps the smallest arena.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hb {

struct BufferRequest {
  int64_t size = 0;  // aligned
  int start = 0, end = 0;
};
class ArenaAllocator {
 public:
  virtual ~ArenaAllocator() = default;
  virtual const char* name() const = 0;
  // An offset per request such that requests live at the same time never overlap.
  virtual std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const = 0;
};
// Largest first, each into the smallest gap among the time-overlapping buffers placed so far.
class GreedyBySizeAllocator : public ArenaAllocator {
 public:
  const char* name() const override { return "greedy-by-size"; }
  std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const override;
};
// In execution order: frees return their chunk (coalesced), allocations take the smallest free chunk
// that fits, else grow the top.
class BestFitAllocator : public ArenaAllocator {
 public:
  const char* name() const override { return "best-fit"; }
  std::vector<int64_t> place(const std::vector<BufferRequest>& reqs) const override;
};

// The strategy of that name, or null ("greedy-by-size", "best-fit").
const ArenaAllocator* find_allocator(const std::string& name);
// Every strategy, in the order the planner tries them (ties keep the first).
std::vector<const ArenaAllocator*> allocators();

}  // namespace hb

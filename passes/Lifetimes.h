// Lifetimes of a graph's tensor values over its order (analysis; returns data, never mutates): the
// input of the memory planner, the heap simulator and memory-schedule's cost model.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/MemoryPlan.h"

namespace hb {

// Lifetimes over the graph's order (memory-plan's step 1, the heap simulator's input): every tensor
// value (each tuple element separately), the alias root whose storage it lives in (a view, a getitem,
// a mutating op's result and aten::_unsafe_view are not storage of their own), its bytes, the values
// each node reads, and per root the last node reading it or any alias. Roots, bytes and reads do not
// depend on the order (memory-schedule costs its candidate orders with them); `last` does.
struct Lifetimes {
  static constexpr int kForever = std::numeric_limits<int>::max();  // last: the graph returns it
  std::vector<ValueRef> vals;
  std::map<ValueRef, int> id;           // value -> index into vals
  std::vector<int> root;                // per value: index of its alias root
  std::vector<int64_t> bytes;           // per value, unaligned; -1: symbolic shape
  std::vector<int> last;                // per root: last node reading it or any alias; kForever when returned
  std::vector<const TensorType*> type;  // per value, into the graph
  std::vector<std::vector<int>> reads;  // per node: the values it reads (a getitem: only its element)

  int find(int node, int elem) const;  // index of a value, -1 if none
};
Lifetimes lifetimes(const Graph& g);

}  // namespace hb

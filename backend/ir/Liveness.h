// Liveness analysis over a fixed execution order (the node order). Returns data; never mutates.
#pragma once
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

struct Liveness {
  // last_use[i]: index of the last node that reads node i's value; i itself if nobody reads it;
  // kForever if the graph returns it (directly or as the base of a view it returns).
  std::vector<int> last_use;
  // release_after[j]: the values whose last use is node j, so the runtime may drop them after j.
  std::vector<std::vector<int>> release_after;
  static constexpr int kForever = 1 << 30;
};

// A view's result keeps its base alive: a value lives until the last use of any view of it.
Liveness liveness(const Graph& g);

}  // namespace hb

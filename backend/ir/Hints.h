// Typed hints from a hinted_context region (see hoo/ and docs/hints.md). The Python side puts them
// under node.meta["custom"]["hintbackend"]; the importer turns them into this struct, so passes
// never look strings up at run time.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hb {

enum class Schedule { BFS, DFS, Auto };
enum class KernelPref { Auto, Cudnn, Fused, Aten };  // "custom" is read as Fused (its old name)
const char* schedule_name(Schedule s);
const char* kernel_pref_name(KernelPref k);

struct Hints {
  int region = -1;                 // innermost region id; -1 when the node is not in a region
  std::vector<int> path;           // region ids from outermost to innermost
  std::optional<Schedule> schedule;
  std::vector<int64_t> slice_dims; // empty: the default (batch and heads)
  std::optional<int64_t> slices;
  std::optional<int64_t> slice_size;
  std::optional<int64_t> memory_budget;  // bytes
  std::optional<KernelPref> kernel;
  std::optional<bool> deterministic;

  bool empty() const { return region < 0; }
  bool operator==(const Hints& o) const;
  bool operator!=(const Hints& o) const { return !(*this == o); }
};

// `region=2 path=0/2 schedule=dfs slices=16` (empty string for no hints).
std::string to_string(const Hints& h);

}  // namespace hb

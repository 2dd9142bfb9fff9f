// slice-legality (analysis): for each hinted region, which nodes can run slice by slice along the
// hinted dims (batch and heads by default), by per-op rules. Returns data and never mutates; the
// pass entry only writes what it found into the dump notes. slice-schedule consumes the result.
//
// Vocabulary (docs/scheduling.md):
//   extent E     the product of the sliced dims' sizes (B*H for batch x heads).
//   group        where the sliced dims sit in one tensor: `ndims` consecutive dims starting at `dim`
//                whose sizes multiply to E, in row-major (batch-major) order. They may be split or
//                merged differently in different tensors ([B, H, S, D] and its view [B*H, S, D]).
//   slice i      of N equal slices: the flattened indices [i*E/N, (i+1)*E/N) of the group.
//   whole        a value every slice reads in full (a bias broadcast over batch and heads, a scalar).
//   replicated   a whole result every slice computes alike, or whose value nobody may depend on (an
//                attention kernel's RNG seed and offset without dropout): the loop returns slice 0's.
//   summed       a whole result each slice computes a part of, the loop returning their sum: the
//                gradient of a captured buffer that every slice of a flex backward reads whole. Only
//                getitem may read it inside the loop (any other reader ends the sliceable subgraph).
//
// The sliceable subgraph is the longest run of region nodes, in order, that each have a rule; the
// first region node without one ends it (end_node, end_reason). A node outside the region that reads
// a sliced value also ends it, because the loop that replaces the subgraph must run in one place.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"
#include "backend/ir/SliceLoop.h"
#include "passes/Pipeline.h"

namespace hb {

// How one tensor value is split: dims [dim, dim + ndims) carry the slice index; dim == -1: whole.
struct SliceMap {
  int dim = -1;
  int ndims = 0;
  bool sliced() const { return dim >= 0; }
  bool operator==(const SliceMap& o) const { return dim == o.dim && ndims == o.ndims; }
  bool operator!=(const SliceMap& o) const { return !(*this == o); }
};
// "whole" or "dims[0:2]" (half-open).
std::string to_string(const SliceMap& m);

struct SliceInput {
  int node = -1;   // a value defined outside the sliceable subgraph
  SliceMap map;    // how each slice sees it (whole for non-tensors)
};

struct SliceRegion {
  int region = -1;
  Hints hints;                   // the region's hints (from its first node)
  std::vector<int> nodes;        // every node of the region, in order
  std::vector<int64_t> slice_dims;  // as hinted; empty = default (batch and heads)
  // Without a slice_dims hint, a FlexAttention score_mod or mask_mod that reads the head (batch) index
  // narrows the default to batch (heads) only, so the region still slices: why, for the note ("" = not).
  std::string narrowed;
  int64_t extent = 0;            // E; 0 when nothing could be sliced
  // The sliceable subgraph, in node order, and one map per value (one per tuple element).
  std::vector<int> sliceable;
  std::map<int, std::vector<SliceMap>> maps;
  std::vector<SliceInput> inputs;   // in first-use order
  std::vector<int> outputs;         // sliceable nodes whose values are used after it, in order
  // Whole values that are the same in every slice as far as anyone may read them (the RNG seed and
  // offset an attention kernel returns without dropout): they may leave the loop, which returns
  // slice 0's. Every other value leaving the loop must be split by slice.
  std::set<int> replicated;
  // Whole values each slice computes a part of (summed, above): the loop returns their sum.
  std::set<int> summed;
  // FlexAttention nodes whose score_mod/mask_mod read the batch or head index along a sliced dim: q's
  // dims (0 batch, 1 heads) whose indices slice-schedule turns into global ones in the body (each
  // slice reads them from an index table sliced like q).
  std::map<int, std::vector<int>> global_index;
  // Sizes of every distinct group seen (a slice count is valid when it gives a box in each).
  std::vector<std::vector<int64_t>> groups;
  int end_node = -1;             // the node that ends the sliceable subgraph, -1 when none does
  std::string end_reason;

  // Valid slice counts, ascending: divisors N of E such that slice_box works for every group.
  std::vector<int64_t> slice_counts() const;
  bool contains(int node) const { return maps.count(node) > 0; }
};

struct SliceLegality {
  std::vector<SliceRegion> regions;  // in order of each region's first node
};

SliceLegality slice_legality(const Graph& g);

// Whether subgraph `sub` of g reads its k-th placeholder's value (uses that read only its dtype or
// device, such as new_ones, do not count).
bool subgraph_reads_placeholder(const Graph& g, const std::string& sub, int k);

// For the dump:
//   slice-legality region 0 (schedule=dfs): 7 of 9 nodes sliceable along dims [0,1], extent 64
//     inputs: %q dims[0:2], %k dims[0:2], %bias whole
//     outputs: %bmm_1
//     ends at %sum_1 (aten::sum.dim_IntList): reduces over dim 1, a sliced dim
//     slice counts: 1, 2, 4, 8, 16, 32, 64
std::string to_string(const SliceLegality& L, const Graph& g);

// Pass entry: records to_string(slice_legality(g)) in ctx.notes; never changes the graph.
bool slice_legality_pass(Graph& g, PassContext& ctx);

}  // namespace hb

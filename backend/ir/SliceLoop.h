// The slice loop: the op that slice-schedule writes and the runtime executes (a DFS region run one
// slice, or group of slices, at a time). Its contract lives here, in the IR, because both sides read it:
// passes/SliceSchedule.cpp builds loops, backend/runtime/SliceLoopCall.cpp runs them, the memory planner
// plans their bodies.
//
// ============================== THE LOOP NODE CONTRACT (runtime) ==================================
//
//   %slice_loop_0: (T_0, ..., T_m-1) = hintbackend::slice_loop(@slice_body_0, [%x_0, ..., %x_n-1],
//       in_dims=[d_0, ...], in_ndims=[k_0, ...], slices=N, extent=E, out_dims=[o_0, ...], out_ndims=[p_0, ...])
//   %y_0: T_0 = operator::getitem(%slice_loop_0, 0)     (one getitem per result; they keep the names
//   ...                                                 the replaced nodes had)
//
// args[0]  Arg::Kind::Graph: the body, g.subgraphs["slice_body_0"]. Its placeholders are, in order,
//          one per loop input; it returns a tuple of m tensors, one per loop result.
// args[1]  Arg::Kind::List of Ref: the loop inputs x_j (tensors, or non-tensor values passed as is).
// kwargs, always all present, in this order:
//   in_dims    List of Int, one per input: first dim of x_j carrying the slice index; -1 = pass x_j whole
//              (the same value to every slice).
//   in_ndims   List of Int, one per input: how many consecutive dims, from in_dims[j], carry it (their
//              sizes multiply to E; e.g. 2 for [B, H, S, D], 1 for the merged [B*H, S, D]); 0 when whole.
//   slices     Int N >= 2, divides E.
//   extent     Int E: the product of the sliced dims (B*H).
//   out_dims, out_ndims: the same for each result T_k, where out_dims[k] is one of
//              >= 0            split by slice: slice i of r_k is slice i's t_k;
//              kOutReplicated  (-1) whole, the same in every slice as far as anyone may read it (an
//                              attention kernel's RNG seed and offset without dropout): r_k = slice 0's t_k;
//              kOutSummed      (-2) whole, each slice's t_k a part of a sum over slices (the gradient of a
//                              captured buffer every slice reads whole): r_k = t_k summed over the slices.
//              out_ndims[k] is 0 for both whole kinds.
// The loop node's type is a Tuple of the FULL result types T_k (shape, dtype, device).
//
// Execution, with c = E / N:
//   allocate each split result r_k with type T_k (its traced strides), once;
//   for i in 0 .. N-1:                       (slices are independent: any order is correct; the runtime
//                                             runs them in order, so summed results are repeatable)
//     v_j = x_j                                   if in_dims[j] == -1
//         = slice_view(x_j, in_dims[j], in_ndims[j], N, i)   otherwise
//     (t_0, ..., t_m-1) = body(v_0, ..., v_n-1)
//     slice_view(r_k, out_dims[k], out_ndims[k], N, i).copy_(t_k)     (or the body's last op writes
//                                                                      there directly via out=)
//     r_k = t_k if i == 0, r_k += t_k otherwise   for summed results (accumulated in float32 at least)
//   the loop's value is (r_0, ..., r_m-1).
// slice_view(t, d, k, N, i): the view of t where dims d .. d+k-1 are narrowed to the ranges
//   slice_box({t.size(d), ..., t.size(d+k-1)}, N, i) gives (below); it is always a box, so
//   it is a plain view (narrow per dim), never a copy.
// Body values have per-slice shapes (the group dims of each type hold the box sizes); view/expand size
// arguments inside the body are rewritten to those shapes, so the body runs as an ordinary graph.
// The body's intermediates may be planned once (memory_plan of the body graph) and reused by every
// slice; the body's returned values are unplanned there because they land in r_k.
// ===================================================================================================
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

constexpr const char* kSliceLoopTarget = "hintbackend::slice_loop";
constexpr int64_t kOutReplicated = -1;  // out_dims values of whole results (the contract above)
constexpr int64_t kOutSummed = -2;

// One slice_loop node's arguments, read back (runtime, planner, tests). Throws hb::InternalError if malformed.
struct SliceLoopArgs {
  std::string body;                 // subgraph name
  std::vector<int> inputs;          // node indices
  std::vector<int64_t> in_dims, in_ndims, out_dims, out_ndims;
  int64_t slices = 1, extent = 1;
};
SliceLoopArgs slice_loop_args(const Node& loop);

// The body subgraph of a slice_loop node, or nullptr when n is not one (or its body is missing).
const Graph* slice_loop_body(const Graph& g, const Node& n);

// Slice i of `slices` equal slices of a group with sizes `group` (row-major, product E): for each
// group dim, the index range it covers. A slice is always a box when it exists: the dims left of one
// pivot dim get length 1, the pivot is narrowed, the dims right of it stay whole. nullopt when
// `slices` does not divide E or the slice is not a box for these sizes (e.g. E=12 as [3, 4], 6 slices).
struct SliceRange {
  int64_t start = 0;
  int64_t length = 0;
};
std::optional<std::vector<SliceRange>> slice_box(const std::vector<int64_t>& group, int64_t slices, int64_t i);

}  // namespace hb

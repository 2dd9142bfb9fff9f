// slice-schedule: BFS or DFS for each hinted region (docs/scheduling.md).
//
//   bfs   op-major over whole tensors: the region is left as it is.
//   dfs   slice-major: the region's sliceable subgraph (slice-legality) becomes ONE loop node that runs
//         the subgraph once per slice on views of slice i; intermediates are per-slice sized and reused
//         by every slice; results are written into full outputs (no concatenation).
//   auto  the chooser simulates the graph's peak memory for every valid slice count (heap simulator
//         over the rewritten order, memory_plan.h) and keeps the fewest slices whose peak fits
//         memory_budget; no count fits -> hb::UserError naming the budget and the smallest peak.
//
// Slice count: `slices` hint, else extent / `slice_size`, else (dfs with memory_budget, or auto) the
// chooser, else (plain dfs) the extent itself: one batch x head slice at a time. 1 slice = BFS.
// Every decision goes into ctx.notes ("slice-schedule region 0: auto chose slices=8 ...").
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
//   out_dims, out_ndims: the same for each result T_k (never -1: every result is split by slice).
// The loop node's type is a Tuple of the FULL result types T_k (shape, dtype, device).
//
// Execution, with c = E / N:
//   allocate each result r_k with type T_k (contiguous), once;
//   for i in 0 .. N-1:                       (slices are independent: any order is correct)
//     v_j = x_j                                   if in_dims[j] == -1
//         = slice_view(x_j, in_dims[j], in_ndims[j], N, i)   otherwise
//     (t_0, ..., t_m-1) = body(v_0, ..., v_n-1)
//     slice_view(r_k, out_dims[k], out_ndims[k], N, i).copy_(t_k)     (or the body's last op writes
//                                                                      there directly via out=)
//   the loop's value is (r_0, ..., r_m-1).
// slice_view(t, d, k, N, i): the view of t where dims d .. d+k-1 are narrowed to the ranges
//   slice_box({t.size(d), ..., t.size(d+k-1)}, N, i) gives (slice_legality.h); it is always a box, so
//   it is a plain view (narrow per dim), never a copy.
// Body values have per-slice shapes (the group dims of each type hold the box sizes); view/expand size
// arguments inside the body are rewritten to those shapes, so the body runs as an ordinary graph.
// The body's intermediates may be planned once (memory_plan of the body graph) and reused by every
// slice; the body's returned values are unplanned there because they land in r_k.
// ===================================================================================================
#pragma once
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "passes/Pipeline.h"
#include "passes/SliceLegality.h"

namespace hb {

constexpr const char* kSliceLoopTarget = "hintbackend::slice_loop";

// One slice_loop node's arguments, read back (runtime, tests). Throws hb::InternalError if malformed.
struct SliceLoopArgs {
  std::string body;                 // subgraph name
  std::vector<int> inputs;          // node indices
  std::vector<int64_t> in_dims, in_ndims, out_dims, out_ndims;
  int64_t slices = 1, extent = 1;
};
SliceLoopArgs slice_loop_args(const Node& loop);

// Runs `pass` on the body of every slice_loop node of g (passes that rewrite the per-slice work, as
// the fusion passes do); true when it changed any.
bool for_each_slice_body(Graph& g, const std::function<bool(Graph& body)>& pass);

// Rewrites region R's sliceable subgraph into one slice_loop node with `slices` slices (a valid count,
// R computed on this graph). Returns the loop node's index.
int make_slice_loop(Graph& g, const SliceRegion& R, int64_t slices);

// The chooser's view of one candidate: slice count and the simulated peak of the whole graph.
struct SliceCandidate {
  int64_t slices = 1;
  int64_t peak_bytes = 0;
};
// Simulates every valid slice count of R (ascending).
std::vector<SliceCandidate> simulate_slice_counts(const Graph& g, const SliceRegion& R);
// The fewest slices whose peak fits `budget`; throws hb::UserError naming the budget and the
// smallest peak when none does. `region` describes the region in the message.
SliceCandidate choose_slice_count(const std::vector<SliceCandidate>& candidates, int64_t budget,
                                  const std::string& region);

bool slice_schedule(Graph& g, PassContext& ctx);

}  // namespace hb

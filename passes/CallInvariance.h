// call-invariance: the nodes that compute the same value on every call of a compiled graph, so that the
// runtime runs them once per executor and keeps the values the other nodes read. The case it is for:
// flex_attention's default BlockMask, which the traced forward builds from constants on every call
// (arange, index_put, sort, ...: about 25 ATen ops and 0.5 ms of host time a call on the H200, longer
// than cuDNN's forward kernel; docs/flex-attention.md).
//
// A node is call-invariant when it is a constant (get_attr), a getitem, or an ATen op (aten:: only: a
// custom op may read state no argument shows) that does not mutate, draws no random numbers, is not
// written straight into the caller's output (memory-plan's output writes), and reads only
// call-invariant values. When any mutating node writes into a call-invariant value, nothing is. (So a
// chain pointwise-fusion turned into one hintbackend::fused_pointwise node runs every call.)
//
// An analysis: it changes no node. Its result (PassContext::call_invariants, then
// Program::invariants; backend/ir/Program.h) holds, for the graph and each of its subgraphs (a slice
// body's invariants hold across slices too):
//   runs_once       call-invariant nodes other than constants: the runtime skips them after its first
//                   complete run;
//   kept            call-invariant values a per-call node or the output reads: what the first run keeps;
//   copied_outputs  returned positions holding an invariant value (copy_all_outputs: the graph returns
//                   one): copied each call, since the caller may write into what it gets.
// Finds nothing when PassContext::keep_across_calls is false (CUDA graphs: a replay costs these nodes
// no host time, and values kept from the warm-up would sit in the graphs' pool).
//
// The note names them:
//   call-invariance graph forward_0: 24 nodes run once (%arange, %index_put, ...), 3 values kept
//   (%sort, %sum, %to), returned copies: none
#pragma once
#include "passes/Pipeline.h"

namespace hb {

bool call_invariance(Graph& g, PassContext& ctx);

// The analysis alone, for one graph and its subgraphs; `plan` (may be null) gives the output writes.
std::shared_ptr<const CallInvariants> find_call_invariants(const Graph& g, const MemoryPlan* plan);

}  // namespace hb

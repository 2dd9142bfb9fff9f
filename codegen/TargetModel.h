// The target models in plain C++ (backend/ir/Target.h says what a Target is). The runtime's placement
// rule has two parts: what the IR alone decides (an ATen-dispatched op with one fresh tensor result of
// static contiguous layout on a CPU or CUDA device, or a fused pointwise group) and what only the
// dispatcher knows (whether the op has an out= overload with a kernel of its own for the device). The
// first part lives here; the second is a query the caller supplies: the runtime asks the dispatcher
// (backend/runtime/Placement.h), hb-opt reads a placement table that a real run dumped
// (placement.txt), tests say "every op has one".
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "backend/ir/Graph.h"
#include "backend/ir/KernelPlan.h"
#include "backend/ir/Target.h"

namespace hb {

// Why node's result cannot be placed, from the IR alone ("" = it can, once the op query agrees).
// *ask_op: set when the answer also depends on the op query (an ATen-dispatched op).
std::string structural_unplaceable(const Graph& g, int node, bool* ask_op);

// Whether op `n` can write its result through an out= overload on `device` ("" = it can, else why not).
using OutKernelQuery = std::function<std::string(const Node& n, const std::string& device)>;

// The runtime's placement rule with `query` for the op part, and the kernels' workspaces.
Target make_target(std::string name, OutKernelQuery query);
// Every structurally placeable value is placeable (the core tests; hb-opt's default).
Target structural_target();
// The op part read from a placement table ("<target> <device>: ok" or "<target> <device>: <why>" per
// line, as the dumps write it); an op missing from the table is not placed.
Target table_target(const std::string& table_text);
// The table of the ATen ops of g and its subgraphs under `t` (for the dump, so hb-opt can replay a run).
std::string placement_table(const Graph& g, const Target& t);

// The memory a node's kernel allocates and frees while it runs, beyond its results: hintbackend's
// FlexAttention reference (backend/runtime/FlexAttention.h) materializes float32 [B, H, Sq, Skv]
// scores and their derivatives. Per score, as measured on the H200 (benchmarks/slicing.py --region flex,
// B4 H16 S4096: BFS forward 13312 MB, forward+backward 28868 MB, for 2^30 scores): kFlexForwardWorkspace
// and kFlexBackwardWorkspace bytes. 0 for every other node. A flex node cuDNN runs (`cudnn_attention`):
// the bias its path materializes (cudnn_flex_workspace_bytes in FlexLowering.h: a float32 [B|1, H, Sq,
// Skv] bias, and backward its gradient), so a memory_budget slices a learned bias's region finely
// enough; cuDNN's own workspace is known once its graph is built, at run time (small, not S^2).
// A flex node the generated tiled CPU kernel runs (`fused_cpu`: the target builds generated kernels) takes
// working copies of q/k/v (and, backward, out/grad_out and the gradients) in float: about
// kFlexFused{Forward,Backward}Copies [B, Hq, S, D] tensors of 4 bytes (8 for float64), no S^2. One the
// generated CUDA kernels run (`fused_cuda`) takes nothing forward and, backward, the delta rows ([B, Hq,
// Sq] floats) and the float dQ workspace of one launch's (b, kv head) pairs (flex_dq_pairs in
// codegen/FlexKernelAbi.h: a quarter of [B, Hq, Sq, D] at B4 H16 S4096).
// hintbackend::cross_entropy_forward (passes/FoldCrossEntropyForward.h): its chunk's two temporaries,
// 2 x rows x C in the result's dtype, rows as the node says. hintbackend::cross_entropy_backward (either
// form) with a half-precision result off CUDA: one float32 chunk of rows (backend/ir/CrossEntropy.h).
// aten::native_layer_norm_backward that LayerNormRows runs (layer_norm_rows_why_not), asking for the
// weight's or the bias's gradient: its blocks' float partial sums, 2 x the row's elements each, for at most
// kLayerNormRowsPartialBlocks blocks (kLayerNormRowsBlocksPerSm an SM of a 132-SM H100 or H200) and no more
// than the rows. Library workspaces are not modelled.
constexpr int64_t kFlexForwardWorkspace = 13;
constexpr int64_t kLayerNormRowsPartialBlocks = kLayerNormRowsBlocksPerSm * 132;
constexpr int64_t kFlexBackwardWorkspace = 28;
constexpr int64_t kFlexFusedForwardCopies = 4;
constexpr int64_t kFlexFusedBackwardCopies = 9;
int64_t kernel_workspace_bytes(const Graph& g, const Node& n, bool cudnn_attention = false, bool fused_cpu = false,
                               bool fused_cuda = false);

// "cuda" -> "cuda:0"; other devices as they are (the arena's device names).
std::string normalize_device(const std::string& device);

}  // namespace hb

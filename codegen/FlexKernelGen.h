// The FlexAttention kernel generator: turns a flex node's score_mod, mask_mod and (backward) joint graph
// into C++ that a tiled attention kernel inlines in its inner loop (issue 14's `kernel="fused"`).
// Plain C++: it reads the IR and writes source text; codegen/HostCompiler.h builds it, the runtime's
// tiled kernels (backend/runtime/FlexTiledCpu.cpp) call it through codegen/FlexKernelAbi.h.
//
// Every subgraph value is a scalar per score element: the score (the working type T: float, double for
// float64 q/k/v), the indices b, h, q_idx, kv_idx (long long), booleans, and reads of captured buffers
// (`aten::index.Tensor(buf, [i0, ..., i(rank-1)])`, any dtype, read through the buffer's strides with
// eager's negative-index wrap and an out-of-range check). Results take the dtype the IR gives each node:
// floating values compute in T (double for a float64 node), integers in long long, as eager's type
// promotion says. The joint graph's `flex_lib::zeros_and_scatter` becomes an add into the buffer's
// gradient accumulator, one per indexing (several indexings of one buffer are several adds).
//
// What it cannot express (an op outside its table, a partial indexing that yields a tensor, a
// non-scalar intermediate) makes generate_flex_kernel return nullopt with the reason, and kernel
// selection keeps the reference for that node, saying why.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

struct FlexKernelSource {
  std::string source;          // the translation unit (kFlexKernelAbiSource + the functions)
  bool score_mod = false;      // hb_flex_score_* exist (false: the identity)
  bool mask_mod = false;       // hb_flex_mask exists (false: mask_mod is constant true)
  bool joint = false;          // hb_flex_joint_* exist (backward with a score_mod)
  bool joint_grad_zero = false;  // the joint returns no score gradient (score_mod ignores the score)
  std::vector<bool> buffer_grads;  // per score buffer: the joint scatters a gradient into it
  bool any_buffer_grad() const {
    for (bool g : buffer_grads)
      if (g) return true;
    return false;
  }
  bool may_fail = false;       // the code can report an error (a buffer read out of range, a division by 0)
  bool row_shift = false;      // CUDA: score_mod runs once per row (HB_ROW_SHIFT; the backward needs row_lse)
  // Per captured buffer (score buffers, then mask buffers): the sizes and strides the code has as
  // literals (static in the graph), or nullopt where it reads them from the HbFlexBuffer at run time. The
  // runtime checks a buffer against them before every launch (backend/runtime/FlexFusedCall.cpp).
  struct Layout {
    std::vector<int64_t> sizes, strides;
  };
  std::vector<std::optional<Layout>> buffer_layouts;
  std::string summary;         // "score_mod: 9 ops; mask_mod: 1 op; joint: 12 ops, scatters into buffer 0"
};

// Where the generated code runs. Cpu: the scalar functions wrapped in per-tile "C" entry points for
// backend/runtime/FlexTiledCpu.cpp. Cuda: the scalar functions as __device__ code, followed by the tiled
// CUDA kernels (codegen/cuda/FlexTiledKernel.cuh) specialized for the node's head dim and dtype, with
// the entry points hb_flex_cuda_forward / hb_flex_cuda_backward (codegen/FlexKernelAbi.h).
enum class FlexKernelDevice { Cpu, Cuda };

// The kernel source for flex node `node` of g (flex_attention or flex_attention_backward), or nullopt
// with `why` ("score_mod: aten::cumsum.default has no generated form"; on CUDA also "head dim 96 ...").
std::optional<FlexKernelSource> generate_flex_kernel(const Graph& g, int node, std::string* why,
                                                     FlexKernelDevice device = FlexKernelDevice::Cpu);
// Why the generated CUDA backward could not take the attention of flex node `node` (a forward node asks for
// the backward it will have): dtypes, head dim, deterministic=True with a buffer gradient, block sizes, buffer count ("" = it
// could, as far as those go; the subgraphs' translation is generate_flex_kernel's).
std::string flex_cuda_backward_why_not(const Graph& g, int node);
// The marker line before the CUDA kernel template in a generated source: dumps print what precedes it.
inline constexpr const char* kFlexTemplateMarker = "// ---- the tiled kernels: codegen/cuda/FlexTiledKernel.cuh";
// The marker lines around codegen/FlexMath.h's text in a generated CPU source: dumps show it by name.
inline constexpr const char* kFlexMathMarker = "// ---- codegen/FlexMath.h";
inline constexpr const char* kFlexMathEndMarker = "// ---- end of codegen/FlexMath.h";

// The block mask's layout in a flex node's block_mask tuple: where kv_num_blocks, kv_indices,
// full_kv_num_blocks and full_kv_indices sit, and the block sizes. torch 2.11 writes 13 entries
// (Q_LEN, KV_LEN first), 2.5 wrote 11, newer main 17; the block sizes are [-3] and [-2] in all.
struct FlexBlockMaskLayout {
  int kv_num_blocks = -1, kv_indices = -1, full_kv_num_blocks = -1, full_kv_indices = -1;
  int q_num_blocks = -1, q_indices = -1, full_q_num_blocks = -1, full_q_indices = -1;  // the backward's lists
  int64_t q_block = 0, kv_block = 0;
};
std::optional<FlexBlockMaskLayout> flex_block_mask_layout(const Arg& block_mask, std::string* why);

}  // namespace hb

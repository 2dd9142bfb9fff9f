// What a FlexAttention node asks of a kernel, read from its subgraphs (plain C++): the mask_mod as a band
// on the diagonal (what cuDNN's SDPA expresses natively: no mask, causal, a sliding window), and whether
// the score_mod is the identity or what it computes. Kernel selection (KernelSelect.cpp) writes it into
// the kernels dump for the reference today; kernels that skip masked blocks or lower to cuDNN choose from
// it.
//
// The mask: mask_mod(b, h, q_idx, kv_idx) is evaluated symbolically. Index arithmetic stays affine in
// q_idx and kv_idx; a comparison of two such values that depends only on d = q_idx - kv_idx bounds d;
// `&` intersects bounds; a constant true (torch's noop_mask, `b.new_ones(())`) is no bound. So
// `q_idx >= kv_idx` is the band d in [0, +inf) (causal), `(q_idx >= kv_idx) & (q_idx - kv_idx < 1024)` the
// band [0, 1023] (sliding window). Anything else (a buffer read, b or h, `|`, a non-unit coefficient)
// is not a band, with the reason.
//
// The BlockMask's block lists are not read: they are derived from the same mask_mod (create_block_mask),
// and the reference kernel, whose results every other kernel must match, applies mask_mod alone.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "backend/ir/Graph.h"

namespace hb {

// The band lo <= q_idx - kv_idx <= hi (kNoBound: unbounded on that side).
struct FlexBand {
  static constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
  int64_t lo = -kNoBound;
  int64_t hi = kNoBound;
  bool unbounded() const { return lo == -kNoBound && hi == kNoBound; }
};
std::string to_string(const FlexBand& b);  // "no mask", "causal", "causal window 1024", "band [-3, 5]"

// How an additive bias t reads its buffer, when it is one indexing of one captured buffer (kernels
// then skip the generic materialization on the index grid and the joint graph's scatter):
//   Dense     t = buf[b, h, q_idx, kv_idx] (or buf[h, q_idx, kv_idx], or buf[0, h, q_idx, kv_idx] of a
//             [1, H, Sq, Skv] buf): buf is the bias itself, and its
//             gradient is dBias (summed over a batch buf lacks).
//   Toeplitz  t = buf[sign * (q_idx - kv_idx) + offset, h] (h optional, either order): a relative-
//             position table; the bias is a gather along diagonals and the gradient a sum along them.
//             The head may be read through an integer map, buf[..., map[h]] or buf[..., map[b, h]] (a
//             captured buffer): a DFS slice's global head index (slice-schedule's index table).
//   Grid      anything else: evaluated on the index grid, the gradient through the joint graph.
struct FlexBiasLayout {
  enum class Kind { Grid, Dense, Toeplitz } kind = Kind::Grid;
  int buffer = -1;        // which captured score buffer (Dense, Toeplitz)
  bool has_batch = false;  // Dense: buf's first dim is b
  bool unit_batch = false;  // Dense: buf is [1, H, Sq, Skv], read as buf[0, h, q_idx, kv_idx]
  int sign = 1;            // Toeplitz
  int64_t offset = 0;
  int d_dim = -1, h_dim = -1;  // Toeplitz: buf's dim indexed by the diagonal, by h (-1: none)
  int h_map = -1;          // Toeplitz: dim h_dim reads captured buffer h_map at [h] (or [b, h]), not h
  bool h_map_reads_b = false;  // ... at [b, h]
};
std::string to_string(const FlexBiasLayout& l);  // "dense buf1[b, h, q_idx, kv_idx]", "toeplitz ..."

// A score_mod as cuDNN pointwise nodes over the score: the ops
// it may use, each mapped to one cuDNN pointwise mode (or a short chain) by the runtime. Index inputs:
// q_idx and kv_idx become cuDNN's generated row and column indices; a captured buffer read by one index
// (buf[h], buf[q_idx], buf[kv_idx], buf[b]) becomes a broadcast tensor input; constants are scalars.
enum class ScorePw {
  Add, Sub, Mul, Div, Neg, Abs, Exp, Log, Tanh, Sigmoid, Max, Min,
  Ge, Gt, Le, Lt, Eq, Ne, And, Or, Where, Cast, Index
};
// The op of an ATen target (add.Tensor, tanh.default, ...), or false.
bool score_pw_op(const std::string& target, ScorePw* op);

// Whether score_mod is pointwise cuDNN can run: every op in ScorePw, buffers read whole by one index
// variable, b and h used only to read such buffers; for a backward, the joint graph's score gradient
// must be the incoming gradient itself (d score_mod / d score = 1, cuDNN's default bprop) and no buffer
// may want a gradient. `why` says what stops it.
bool score_pointwise(const Graph& score_mod, const Graph* joint, std::string* why);

struct FlexAnalysis {
  bool band_ok = false;
  FlexBand band;
  std::string mask_why;        // why the mask is not a band (when !band_ok)
  // The mask is `band & (kv_idx < mask buffer pad_kv [b])` (band_ok is false: only cuDNN's path, which
  // takes per-batch key lengths, reads it; `band` holds the band then).
  int pad_kv = -1;
  bool score_identity = false;  // score_mod returns its score unchanged
  // score_mod is `score + t` with t independent of the score and of kv_idx (a learned per-query, per-head
  // or per-batch bias): it shifts each softmax row by t, so the output and the q/k/v gradients are those
  // of the identity; only the logsumexp moves by t, and t's gradient is the logsumexp gradient (zero
  // when there is none).
  bool score_row_shift = false;
  // score_mod is `score + t` with t independent of the score but reading kv_idx (a relative-position or
  // ALiBi bias, a learned relative bias lb[q_idx - kv_idx, h], a dense bias buf[b, h, q_idx, kv_idx]):
  // cuDNN adds t as a bias tensor built as bias_layout says ([B|1, H, Sq, Skv]; bias_reads_* are the
  // indices t reads), and the backward sends cuDNN's dBias into t's buffers the same way.
  bool score_bias = false;
  // score_bias with t = c * (kv_idx - q_idx) or c * (q_idx - kv_idx), c independent of the score, q_idx and
  // kv_idx (ALiBi's slope[h], a relative position's constant): the generated CUDA kernels evaluate t as a
  // ramp along each row, c = score_mod(0, b, h, 0, 1) read once a tile (HB_KV_RAMP).
  bool score_kv_ramp = false;
  bool bias_reads_b = false, bias_reads_h = false, bias_reads_q = false;  // (score_row_shift or score_bias)
  FlexBiasLayout bias_layout;  // score_bias: how t reads its buffer
  // score_mod translates to cuDNN pointwise nodes (ALiBi, relative position): cuDNN evaluates it inside
  // the kernel, with the mask band applied after it; a backward only where d score_mod / d score = 1.
  bool score_pointwise = false;
  std::string pointwise_why;   // why not (when !score_pointwise)
  // score_mod is c * tanh(score / c) (a logit soft cap): cuDNN's own Softcap modifier, forward and
  // backward, runs it (its derivative is not 1, which the generic translation's backward does not take).
  double softcap = 0;          // c, or 0
  std::string score_why;       // what it computes otherwise
  bool uses_max_scores = false;  // the forward's third result is read (cuDNN does not give it)
  // How many captured buffers get a gradient (backward: the joint graph returns one; forward: the
  // buffer is marked requires_grad), and the first such buffer of dtype float32 or float64, or -1.
  int buffer_grads = 0;
  int float_grad_buffer = -1;
};

// The mask band of a mask_mod subgraph (args b, h, q_idx, kv_idx, *buffers), or why it is none.
bool mask_band(const Graph& mask_mod, FlexBand* band, std::string* why);
// The same, also taking a kv padding: the mask may be `kv_idx < buf[b]` (`buf[b] > kv_idx`), alone or
// `&` a band, buf one of the mask_mod's captured buffers (a per-batch key length, as padding and
// attention-gym's length masks write it); *pad is that buffer's position (-1: none).
bool mask_band_with_padding(const Graph& mask_mod, FlexBand* band, int* pad, std::string* why);

// A flex_attention or flex_attention_backward node of g.
FlexAnalysis analyze_flex(const Graph& g, int node);

// Why cuDNN's SDPA cannot run this flex node as flex defines it ("" = it can): q, k, v in fp16 or bf16
// on a CUDA device, [B, H, S, D] with D = Dv a multiple of 8 up to 256 and Hq a multiple of Hkv (GQA);
// a mask that is no band, causal or a causal sliding window; the identity score_mod, a row shift, a
// pointwise score_mod or an additive bias (the mask_mod capturing no buffers); the forward's max_scores
// unused; the backward with no logsumexp gradient.
std::string cudnn_why_not(const Graph& g, int node, const FlexAnalysis& a);

// The bias tensor cuDNN's path builds for flex node `node` ([B|1, H, Sq, Skv], for an additive score_mod
// other than a dense [.., H, Sq, Skv] buffer, which is passed as it is), in bytes: float32, or a
// Toeplitz table's own dtype when that is q's; nullopt when it builds none or the sizes are symbolic.
std::optional<int64_t> materialized_bias_bytes(const Graph& g, int node, const FlexAnalysis& a);

// The memory cuDNN's path takes while it runs flex node `node` beyond its results: cuDNN's own workspace
// (cudnn_sdpa_workspace_bytes), the materialized bias (materialized_bias_bytes), and in a backward its
// gradient (counted in float32, the widest this cuDNN writes it in); a dense buffer in a dtype neither
// float32 nor q's is cast to a float32 copy.
int64_t cudnn_flex_workspace_bytes(const Graph& g, int node, const FlexAnalysis& a);

// cuDNN's own workspace for flex node `node` (what cudnn-frontend's get_workspace_size reports for the
// graph CudnnFlexCall builds), modelled from the shapes and options as an upper bound, measured by
// benchmarks/cudnn_workspace.py: a constant 1 KiB for a forward; a backward adds the float32 row sums of
// dO * O ([B, H, S]), then dP in q's dtype ([B, H, S, Skv] padded to 128) where dBias is wanted or the
// algorithm is deterministic, else a float32 dQ accumulator ([B, H, S, D]), and with GQA float32 per-head
// dK/dV partials ([B, H, Skv, D]); a kv padding adds 8 bytes a batch (cudnn-frontend's sequence-length
// copies). A backward in groups (cudnn_backward_group) counts two groups' (the calls in flight). The
// constant alone when the sizes are symbolic.
int64_t cudnn_sdpa_workspace_bytes(const Graph& g, int node, const FlexAnalysis& a);

// cuDNN's backward runs one call per group of (b, kv head) pairs, so that its float dQ accumulator (or
// its dP, deterministic), its row sums and its GQA partials are those of one group, not of every pair:
// whole batches where a group holds one or more of them, else kv heads (with their query heads) of one
// batch. The group is flex_dq_pairs' (codegen/FlexKernelAbi.h: at least 1024 CTAs of 64 keys a call,
// the rule of the generated backward's dQ launches), rounded down to a divisor of B, or of Hkv, so that
// every call has one shape and one cuDNN graph. Two calls are in flight at a time, on two streams, so
// the workspace is two calls'. One rule for the runtime (CudnnFlexCall), the memory plan
// (cudnn_sdpa_workspace_bytes) and the kernels dump.
struct CudnnBackwardGroup {
  int64_t batches = 1, kv_heads = 1;  // per call
  int64_t calls = 1;
};
CudnnBackwardGroup cudnn_backward_group(int64_t B, int64_t Hkv, int64_t Skv);
// Whether flex node's cuDNN backward runs in groups: every form but an additive bias, whose dBias cuDNN
// sums over a broadcast batch (a [1, H, Sq, Skv] bias) in one call.
bool cudnn_backward_grouped(const FlexAnalysis& a);
// The group of flex node `node`: a forward's, or a backward's that runs whole, is one call of every
// pair; with symbolic sizes, {1, 1, 1} (the runtime groups by the sizes it gets).
CudnnBackwardGroup cudnn_backward_group(const Graph& g, int node, const FlexAnalysis& a);

// The generated CUDA backward's dQ launches for flex_attention_backward node `node` (flex_dq_pairs):
// (b, kv head) pairs in all and per launch, the launches, and the float dQ workspace of one launch
// ([pairs per launch x Hq/Hkv x Sq, D] floats, D padded to the head dim the kernels are built for, as
// the runtime allocates it). nullopt off CUDA, with symbolic sizes, or where Hq is not a multiple of Hkv.
// One rule for the memory plan (kernel_workspace_bytes) and the kernels dump.
struct FlexDqLaunches {
  // per_launch: a launch's pairs (flex_dq_pairs' on one stream, half of it on two: flex_dq_streams);
  // workspace_bytes: the float workspace of flex_dq_pairs' pairs (both streams' halves).
  int64_t pairs = 0, per_launch = 0, launches = 1, streams = 1, workspace_bytes = 0;
};
std::optional<FlexDqLaunches> flex_cuda_dq_launches(const Graph& g, int node);

}  // namespace hb

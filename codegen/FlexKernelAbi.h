// The interface between a generated FlexAttention kernel (codegen/FlexKernelGen.h writes its source) and
// the code that calls it (backend/runtime/FlexTiledCpu.cpp): plain C structs and "C" entry points, so
// the generated translation unit needs no hintbackend or torch header. The struct definitions are
// written once, in the macro below: the host compiles them from here and the generator pastes the same
// text into every kernel source (kFlexKernelAbiSource), so the two sides cannot drift apart.
//
// Entry points of a generated kernel (T = float "f32" or double "f64"; each present only when the node
// needs it, see FlexKernelSource):
//   void hb_flex_score_<T>(T* s, HbFlexTile* t)        s[i*ld + j] = score_mod(s[i*ld + j], b, h, q0+i, k0+j)
//   void hb_flex_mask(unsigned char* keep, HbFlexTile* t) keep[i*ld + j] = mask_mod(b, h, q0+i, k0+j)
//   void hb_flex_joint_<T>(const T* s, T* ds, HbFlexTile* t)
//       ds[i*ld + j] = d score_mod / d score * ds[i*ld + j] at the pre-mod score s; the captured buffers'
//       gradients are added into score_buffers[n].grad (dense double accumulators, buffer n's shape, row-major)
// for i < nq, j < nk. A buffer read or scatter out of range sets t->error (kFlexErrorIndex) and the
// index, and uses element 0 instead, so the caller can raise eager's IndexError after the tile.
//
// A CUDA kernel (codegen/cuda/FlexTiledKernel.cuh, called from backend/runtime/FlexTiledCuda.cpp) has
// instead int hb_flex_cuda_forward / hb_flex_cuda_backward(const HbFlexCudaArgs*, cudaStream_t as void*)
// and hb_flex_cuda_error_string; its buffers' gradients are float accumulators added to atomically, and
// the first error a thread reports lands in HbFlexCudaArgs::error.
#pragma once

#define HB_FLEX_MAX_BUFFERS 6  /* captured buffers per score_mod / mask_mod on CUDA */
#define HB_FLEX_KERNEL_ABI                                                                              \
  struct HbFlexBuffer {                                                                                 \
    const void* data;        /* the captured tensor, read through its strides */                        \
    void* grad;              /* joint only: dense, double (CPU) or float (CUDA), or null */             \
    long long sizes[8];                                                                                 \
    long long strides[8];    /* in elements */                                                          \
    int rank;                                                                                           \
  };                                                                                                    \
  struct HbFlexTile {                                                                                   \
    long long b, h;          /* batch and query-head index */                                           \
    long long q0, k0;        /* the tile's first query and key position */                             \
    int nq, nk, ld;          /* rows, columns, row stride of the tile arrays */                         \
    int error;               /* 0, or kFlexErrorIndex */                                                \
    int error_buffer;        /* which buffer (score buffers first, then mask buffers) */                \
    long long error_index;   /* the index that was out of range */                                      \
    long long error_size;    /* the size of the dimension it indexed */                                 \
    const HbFlexBuffer* score_buffers;                                                                  \
    const HbFlexBuffer* mask_buffers;                                                                   \
    /* CUDA backward, a step's line reduction of a buffer gradient (hb_scatter, FlexTiledKernel.cuh): */ \
    int line_mode;           /* 0 off, 1 on, 2 probing: hb_scatter notes the first buffer and offset */ \
    int line_buf;            /* the buffer the step reduces */                                          \
    long long line_pred;     /* the element's predicted offset in it */                                 \
    float line_val;          /* the element's value, once taken */                                      \
    int line_taken;          /* 1 once an hb_scatter call of this element took the line */              \
  };                                                                                                    \
  /* One of a BlockMask's block lists: num [bm, hm, rows] counts, idx [bm, hm, rows, cols] indices,  */ \
  /* int32, contiguous; bm, hm are 1 (broadcast) or B, H. num == 0: the mask has no such list.       */ \
  struct HbFlexBlockList {                                                                              \
    const int* num;                                                                                     \
    const int* idx;                                                                                     \
    long long bm, hm, rows, cols;                                                                       \
  };                                                                                                    \
  /* The CUDA kernels' arguments (codegen/cuda/FlexTiledKernel.cuh), passed by value. Pointers are   */ \
  /* device pointers; strides are in elements for (batch, head, sequence), the last dim contiguous.  */ \
  struct HbFlexCudaArgs {                                                                               \
    const void* q; const void* k; const void* v;                                                        \
    long long q_strides[3], k_strides[3], v_strides[3];                                                 \
    void* out; long long o_strides[3];  /* forward: written; backward: read */                          \
    float* lse;                         /* [B, Hq, Sq] base 2; forward: written; backward: read */      \
    float* max_scores;                  /* forward: [B, Hq, Sq] base 2 */                               \
    const void* dout; long long do_strides[3];  /* backward */                                          \
    const float* dlse;                  /* backward: [B, Hq, Sq], or null */                            \
    float* delta;                       /* backward: [B, Hq, Sq] workspace */                           \
    float* dq;      /* backward: float workspace, dQ of dq_pairs (b, kv head) pairs: [dq_pairs Hq/Hkv Sq, D] */ \
    void* dq_out;   /* backward: dQ, [B, Hq, Sq, D] of q's dtype, contiguous; the launcher rounds dq into it */ \
    long long dq_pairs; /* backward: (b, kv head) pairs per launch, each launch's dQ summed in dq (flex_dq_pairs) */ \
    long long bh0, dq_row0; /* backward, set by the launcher: the launch's first (b, kv head) pair (b Hkv + kv  */ \
                            /* head) and its first query row (b Hq + h) Sq, which is row 0 of dq               */ \
    int pairs_fast;         /* ... and 1 where its grid has pairs along x (FlexTiledKernel.cuh, bwd_grid)      */ \
    void* dk; void* dv;                 /* backward: [B, Hkv, Skv, D] */                                \
    long long B, Hq, Sq, Bkv, Hkv, Skv;                                                                 \
    float scale;                                                                                        \
    long long q_block, kv_block;                                                                        \
    HbFlexBlockList kv_list, kv_full_list, q_list, q_full_list;                                         \
    HbFlexBuffer score_buffers[HB_FLEX_MAX_BUFFERS];                                                    \
    HbFlexBuffer mask_buffers[HB_FLEX_MAX_BUFFERS];                                                     \
    long long* error;  /* device: [code, buffer, index, size, b, h], zeroed; the first error */         \
    int run_joint;     /* backward: 0 skips the joint (a row shift: the buffers' gradients are 0) */    \
    int* dq_order;     /* backward, deterministic=True: [B, Hq, ceil(Sq / 64)] counters, zeroed; else null */ \
    int* dq_rank;      /* ... and [bm, hm (the kv lists'), kv_list.rows, ceil(Skv / 64)] workspace */     \
    /* backward, deterministic=True with a buffer gradient: a window of line sums per (b, q head, 64-key */ \
    /* tile), [B Hq T][scatter_len] floats (T = ceil(Skv / 64)), zeroed, then [B Hq][scatter_len + 64 T] */ \
    /* for the merged rows; each window's first key, then each row's, B Hq (T + 1) filled with LLONG_MIN */ \
    /* (FlexTiledKernel.cuh, line_reduce and flex_window_rows); else null */                               \
    float* scatter_win; long long* scatter_start; long long scatter_len;                                 \
    float* row_lse;    /* backward, HB_ROW_SHIFT: [B, Hq, Sq] workspace, the logsumexp less the row shift */ \
  };                                                                                                    \
  /* The deterministic windows' sizes, one rule for the runtime, the launcher and the lab: a window's     */ \
  /* floats (scatter_len) for Sq query rows: Sq rounded up to 128, plus the diagonals of a 128-row step   */ \
  /* past the last row; a merged row's for T key tiles (64 keys each); all the floats of B Hq rows.      */ \
  inline long long flex_window_len(long long sq) { return (sq + 127) / 128 * 128 + 192; }            \
  inline long long flex_merged_len(long long window_len, long long tiles) { return window_len + 64 * tiles; } \
  inline long long flex_window_floats(long long rows, long long tiles, long long window_len) {       \
    return rows * tiles * window_len + rows * flex_merged_len(window_len, tiles);                    \
  }                                                                                                  \
  /* The backward's (b, kv head) pairs per launch, of B Hkv pairs with Skv keys: the launcher sums each  */ \
  /* launch's dQ in a float workspace of that many pairs' rows, rounds it into dQ and reuses it, so the   */ \
  /* workspace is a fraction of dQ's B Hq Sq D floats. A launch keeps at least flex_dq_launch_ctas CTAs  */ \
  /* of 64 keys (about four waves of a 132-SM GPU at two CTAs per SM), and the launches are even.        */ \
  inline long long flex_dq_pairs(long long pairs, long long skv) {                                   \
    const long long flex_dq_launch_ctas = 1024, tiles = (skv + 63) / 64 > 0 ? (skv + 63) / 64 : 1;    \
    const long long least = (flex_dq_launch_ctas + tiles - 1) / tiles;                                \
    if (pairs < 2 * least) return pairs;                                                              \
    const long long launches = pairs / least;                                                         \
    return (pairs + launches - 1) / launches;                                                         \
  }                                                                                                  \
  /* The streams those launches take (per: flex_dq_pairs'): 2 where there are several launches and not */ \
  /* deterministic=True; then each launch takes per / 2 pairs and one half of the workspace, the halves */ \
  /* in turn, one on the caller's stream and one on a side stream, so that a launch's last CTAs share   */ \
  /* the GPU with the next launch's first (hb_flex_cuda_backward).                                      */ \
  inline long long flex_dq_streams(long long pairs, long long per, int deterministic) {              \
    return per < pairs && per >= 2 && !deterministic ? 2 : 1;                                          \
  }

/* The generated prelude's CUDA hb_scatter (codegen/FlexKernelGen.cpp says what it does), one text for the */
/* generator (stringified) and for benchmarks/lab_mods (expanded where HB_FN is defined).               */
#define HB_FLEX_SCATTER_CUDA                                                                            \
  HB_FN void hb_scatter(HbFlexTile* t, int buffer, void* grad, long long off, double v) {              \
    if (t->line_mode == 2) {                                                                            \
      if (t->line_buf < 0) t->line_buf = buffer, t->line_pred = off;                                    \
      return;                                                                                           \
    }                                                                                                   \
    const float x = (float)v;                                                                           \
    if (t->line_mode == 1 && !t->line_taken && buffer == t->line_buf && off == t->line_pred) {          \
      t->line_val = x, t->line_taken = 1;                                                               \
      return;                                                                                           \
    }                                                                                                   \
    if (x != 0.f) atomicAdd((float*)grad + off, x);                                                     \
  }

/* A scatter as the joint's instantiation LINE calls it; ISL: the scatter that the generator proved to run */
/* along a line of every tile (HB_LINE_STATIC in codegen/cuda/FlexTiledKernel.cuh). LINE 0 scatters (the */
/* CPU kernels call only this); LINE 1 hands the line scatter's value to the CUDA kernel's line tile,   */
/* which sums it per line; LINE 2 only notes the line scatter's offset (the key of the step's first     */
/* element) and scatters nothing. One text for the generator and benchmarks/lab_mods.                  */
#define HB_FLEX_SCATTER_LINE                                                                            \
  template <int LINE, bool ISL>                                                                         \
  HB_FN void hb_scatter_s(HbFlexTile* t, int buffer, void* grad, long long off, double v) {             \
    if (LINE == 2) {                                                                                    \
      if (ISL) t->line_pred = off;                                                                      \
      return;                                                                                           \
    }                                                                                                   \
    if (LINE == 1 && ISL) {                                                                             \
      t->line_val = (float)v;                                                                           \
      return;                                                                                           \
    }                                                                                                   \
    hb_scatter(t, buffer, grad, off, v);                                                                \
  }

#define HB_FLEX_STR2(...) #__VA_ARGS__
#define HB_FLEX_STR(...) HB_FLEX_STR2(__VA_ARGS__)

namespace hb {

HB_FLEX_KERNEL_ABI

constexpr int kFlexErrorIndex = 1;
constexpr int kFlexErrorOrder = 3;  // deterministic=True: a key tile waited past its turn (see FlexTiledKernel.cuh)
constexpr int kFlexErrorWindow = 4;  // deterministic=True: a buffer gradient's window off its row (flex_window_rows)
// The definitions above as source text, for the generated translation unit.
inline constexpr const char* kFlexKernelAbiSource =
    "#define HB_FLEX_MAX_BUFFERS " HB_FLEX_STR(HB_FLEX_MAX_BUFFERS) "\n" HB_FLEX_STR(HB_FLEX_KERNEL_ABI);
constexpr int kFlexMaxCudaBuffers = HB_FLEX_MAX_BUFFERS;

// The head dim the CUDA kernels are built for when q/k have head dim `qk` and v `vd`: the smallest of
// 16, 32, 64, 128 and 256 that holds both; 0 where none does. The runtime pads q, k, v (and the
// backward's out and dO) with zero columns up to it: zero columns add nothing to q k^T, and give zero
// columns of the output and of dQ, dK, dV, which it cuts off (FlexTiledCuda.cpp). Both directions take
// the same head dims.
constexpr int flex_cuda_head_dim(long long qk, long long vd) {
  const long long d = qk > vd ? qk : vd;
  if (qk < 1 || vd < 1) return 0;
  for (int built : {16, 32, 64, 128, 256})
    if (d <= built) return built;
  return 0;
}

// Whether a direction runs the SIMT kernels (codegen/cuda/FlexSimtKernel.cuh: CUDA cores, float FMA)
// rather than the tensor cores' (FlexTiledKernel.cuh): float32 q/k/v both ways (the tensor cores would
// take float32 as TF32), and the backward at head dim 256. The template's HB_SIMT_FWD / HB_SIMT_BWD.
constexpr bool flex_cuda_simt(bool f32, int head_dim, bool backward) { return f32 || (backward && head_dim > 128); }

using FlexScoreF32 = void (*)(float* s, HbFlexTile* t);
using FlexScoreF64 = void (*)(double* s, HbFlexTile* t);
using FlexMaskFn = void (*)(unsigned char* keep, HbFlexTile* t);
using FlexJointF32 = void (*)(const float* s, float* ds, HbFlexTile* t);
using FlexJointF64 = void (*)(const double* s, double* ds, HbFlexTile* t);
// The CUDA entry points: 0 or a cudaError_t code (a launch failure); hb_flex_cuda_error_string names it.
using FlexCudaLaunch = int (*)(const HbFlexCudaArgs* a, void* stream);
using FlexCudaErrorString = const char* (*)(int code);

}  // namespace hb

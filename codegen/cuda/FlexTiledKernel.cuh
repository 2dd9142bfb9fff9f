// FlexAttention's tiled CUDA kernels (issue 14's kernel="fused" on CUDA): FlashAttention-2's algorithm
// with the user's score_mod, mask_mod and joint graph inlined per score element, in two forms: on the
// tensor cores' mma.sync (CuTe's SM80 atoms: ldmatrix, cp.async, m16n8k16 with float accumulators; sm_80
// and later), and on Hopper's warpgroup MMAs (CuTe's SM90 GMMA atoms; sm_90a, head dims 64 and 128). Not
// compiled into the extension: codegen/FlexKernelGen.cpp pastes this text after the generated scalar
// functions, and codegen/HostCompiler.h builds the unit with nvcc at compile time (for sm_90a with
// HB_SM90=1 on an H100/H200).
//
// The generated part defines, before this text:
//   HB_D            head dim of q, k and v (16, 32, 64, 128; the forward also 256)
//   HB_HALF         1: float16 q/k/v, 0: bfloat16 (or float32, with HB_F32)
//   HB_F32          1: float32 q/k/v: the SIMT kernels (codegen/cuda/FlexSimtKernel.cuh) run both ways
//   HB_SCORE_MOD    1: hb_score_mod<float>(score, b, h, q, kv, tile) exists (0: the identity)
//   HB_MASK_MOD     1: hb_mask_mod(b, h, q, kv, tile) exists (0: no mask_mod)
//   HB_JOINT        1: hb_joint<float, LINE>(score, b, h, q, kv, grad, tile) exists (0: the identity)
//   HB_SCATTER      1: the joint scatters into a buffer's gradient (hb_scatter_s)
//   HB_LINE_STATIC  1: the generator proved that one scatter, into buffer HB_LINE_BUF, has the offset
//                   base(b, h) + HB_LINE_ALPHA q + HB_LINE_BETA kv over every tile inside both sequences,
//                   along rows, columns or diagonals (LineStep below)
//   HB_DETERMINISTIC 1: deterministic=True: the backward adds dQ in key-tile order (dq_turn_wait below)
//   HB_ROW_SHIFT    1: score_mod is score + t(b, h, q) (a per-query, per-head or per-batch bias): the kernels
//                   run the identity, the forward moves each row's logsumexp and max by t = score_mod(0, b,
//                   h, q, 0), and the backward (only where no logsumexp gradient asks for t's) takes the
//                   logsumexp back by t per row first (fwd_store, flex_bwd_pre)
//   HB_KV_RAMP      1 (forward only): score_mod is score + c(b, h) * (kv - q) (ALiBi; c * (q - kv) has the
//                   slope -c): the tensor-core forwards read c = score_mod(0, b, h, 0, 1) once a tile and add
//                   each score's bias along the row as a ramp (KvRamp below) instead of calling score_mod
// and the ABI structs of codegen/FlexKernelAbi.h (HbFlexCudaArgs and what it holds).
//
// Layout and semantics follow the reference (backend/runtime/FlexAttention.h): scores are
// scale * q.k, then score_mod, then mask_mod (-inf); logsumexp and max_scores are base 2; a row that
// attends to nothing gets out = 0 and logsumexp = -inf. Tiles follow the BlockMask: listed partial
// blocks run mask_mod, full blocks skip it, unlisted blocks are never touched.
//
// mma.sync forms. Forward: one CTA of 4 warps per 64 query rows of one (b, h); each warp owns 16 rows. K
// and V tiles of FN rows stream through shared memory (cp.async: V loads while S = Q K^T runs, the next K
// while P.V runs). Backward: one CTA of 8 warps per 64 key rows of one (b, kv head); it walks the query
// tiles (128 rows) that the BlockMask's q lists give for its kv block, over every query head of its GQA
// group, the next step's Q and dO loading (double-buffered) while the current one computes. Per tile:
// S and dP with warps over query rows; P and dS go to shared memory; dV += P^T dO and dK += dS^T Q with
// warps over key rows (warps 0-3 dV, 4-7 dK); dQ += dS K with warps over query rows, added into a float
// accumulator with float2 atomics. Buffer gradients: the joint's scatters (hb_scatter, in the generated
// prelude), summed per step along the tile's rows, columns or diagonals where the scatter's offset runs
// along them (LineStep below), else one float atomic per element.
// Registers and shared memory (nvcc -Xptxas -v, D 128): forward 168 registers, 48 KiB; backward 244
// registers, 192 KiB (one CTA per SM).
// The wgmma forms are described at their section below. Float32 q/k/v (both ways) and the backward at
// head dim 256 run the SIMT kernels of codegen/cuda/FlexSimtKernel.cuh instead (CUDA cores, float FMA),
// pasted after this text; the entry points at the end pick them (HB_SIMT_FWD, HB_SIMT_BWD).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <mutex>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

// Hopper: the generated unit is built for sm_90a with HB_SM90=1 (codegen/HostCompiler.cpp); head dims 64
// and 128 then run on warpgroup MMAs, the others on the sm_80 kernels.
#ifndef HB_SM90
#define HB_SM90 0
#endif
#ifndef HB_SCATTER  // 1: the joint scatters into a buffer's gradient (hb_scatter)
#define HB_SCATTER 0
#endif
#ifndef HB_LINE_STATIC
#define HB_LINE_STATIC 0
#endif
#ifndef HB_DETERMINISTIC
#define HB_DETERMINISTIC 0
#endif
#ifndef HB_ROW_SHIFT
#define HB_ROW_SHIFT 0
#endif
#ifndef HB_KV_RAMP
#define HB_KV_RAMP 0
#endif
#ifndef HB_F32
#define HB_F32 0
#endif
// Which directions run the SIMT kernels (codegen/cuda/FlexSimtKernel.cuh): float32 both ways (the tensor
// cores would take it as TF32), and the backward at head dim 256 (past the mma.sync backward's registers).
#define HB_SIMT_FWD HB_F32
#define HB_SIMT_BWD (HB_F32 || HB_D > 128)
// flex_bwd_ws keeps dS without the scale (a multiply a score fewer): it scales dK once at its end and dQ
// where flex_dq_round rounds it. 0: dS scaled per score (the lab's baseline).
#ifndef HB_DS_UNSCALED
#define HB_DS_UNSCALED 1
#endif
#ifndef HB_BWD_DQ_FIRST  // flex_bwd_wg's dQ half before dV and dK; 0: after them (the lab's baseline)
#define HB_BWD_DQ_FIRST 1
#endif
// Whether the score_mod runs per score element (a row shift runs once per row instead).
#define HB_SCORE_ELEM (HB_SCORE_MOD && !HB_ROW_SHIFT)
#define HB_WG (HB_SM90 && !HB_F32 && (HB_D == 64 || HB_D == 128))
// Whether the Hopper backward may run flex_bwd_ws (3 warpgroups per 128 keys, below) instead of
// flex_bwd_wg: bf16/fp16 at D 64 and 128, any score_mod and joint, deterministic or not; a buffer gradient
// scatter only at D 128 (at D 64 flex_bwd_wg ran the learned relative bias faster: docs/flex-attention.md);
// the launcher then takes it where the kv blocks are multiples of 128 rows.
// HB_BWD_WS=0 never runs it (the lab's baseline: -DHB_BWD_WS=0 times flex_bwd_wg alone).
#ifndef HB_BWD_WS
#define HB_BWD_WS 1
#endif
#define HB_WS (HB_BWD_WS && HB_WG && (!HB_SCATTER || HB_D == 128))
#if HB_WG
#include <utility>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#endif

namespace hbk {

constexpr int D = HB_D;
#if HB_F32
// float32: only the SIMT kernels run; Elem2, pack2 and Mma stand in so that the mma.sync helpers compile.
using Elem = float;
using Elem2 = float2;
using Mma = cute::SM80_16x8x16_F32BF16BF16F32_TN;  // (unused)
__device__ __forceinline__ Elem2 pack2(float x, float y) { return make_float2(x, y); }
#elif HB_HALF
using Elem = __half;
using Elem2 = __half2;
using Mma = cute::SM80_16x8x16_F32F16F16F32_TN;
__device__ __forceinline__ Elem2 pack2(float x, float y) { return __floats2half2_rn(x, y); }
#else
using Elem = __nv_bfloat16;
using Elem2 = __nv_bfloat162;
using Mma = cute::SM80_16x8x16_F32BF16BF16F32_TN;
__device__ __forceinline__ Elem2 pack2(float x, float y) { return __floats2bfloat162_rn(x, y); }
#endif
static_assert(D == 16 || D == 32 || D == 64 || D == 128 || D == 256, "head dim");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int CH = D / 8;  // 16-byte chunks per row of a [rows][D] tile

// Shared-memory tiles are rows of 16-byte chunks, XOR-swizzled so that ldmatrix's 8 row addresses
// fall in 8 different bank groups.
template <int C>
__device__ __forceinline__ int sw(int row, int chunk) {
  constexpr int S = C >= 8 ? 7 : C - 1;
  return row * C + (chunk ^ (row & S));
}

__device__ __forceinline__ uint32_t as_u32(Elem2 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ uint32_t pack(float x, float y) { return as_u32(pack2(x, y)); }

__device__ __forceinline__ void ldsm(const uint4* p, uint32_t (&r)[4]) {
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void ldsm_t(const uint4* p, uint32_t (&r)[4]) {
  cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(p), r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Mma::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b0, b1, c[0], c[1], c[2], c[3]);
}

__device__ __forceinline__ long long lmin(long long x, long long y) { return x < y ? x : y; }

// Rows row0 .. row0 + ROWS - 1 of a [rows][D] matrix at `base` (row stride `ld` elements, 16-byte aligned
// rows) into a swizzled tile; rows at or past `len` are zero-filled (and not read).
template <int ROWS, int NT>
__device__ __forceinline__ void load_tile(uint4* s, const Elem* base, long long row0, long long ld, long long len) {
  for (int i = threadIdx.x; i < ROWS * CH; i += NT) {
    const int r = i / CH, c = i % CH;
    const bool ok = row0 + r < len;
    const Elem* src = base + (ok ? (row0 + r) * ld + c * 8 : 0);
    cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(src),
                                                                 *reinterpret_cast<cute::uint128_t*>(&s[sw<CH>(r, c)]), ok);
  }
}

// The first error a generated function reported (an index out of range, a division by zero).
__device__ void report(long long* err, const HbFlexTile& t) {
  if (!err || !t.error) return;
  if (atomicCAS(reinterpret_cast<unsigned long long*>(err), 0ull, (unsigned long long)t.error) == 0ull) {
    err[1] = t.error_buffer;
    err[2] = t.error_index;
    err[3] = t.error_size;
    err[4] = t.b;
    err[5] = t.h;
  }
}

// Row r of a block list for (b, h), broadcast over b or h where the list has size 1 there.
__device__ __forceinline__ long long list_row(const HbFlexBlockList& l, long long b, long long h, long long r) {
  return ((l.bm == 1 ? 0 : b) * l.hm + (l.hm == 1 ? 0 : h)) * l.rows + r;
}

// The tiles one list walk visits: blocks idx[0..n) of `list` (partial) then of `full`, each cut into
// `sub` tiles of `tile` rows; tile i -> (first row, full?).
struct Walk {
  const int* part;
  const int* full;
  int npart, nfull, sub;
  long long block, tile, len;
  __device__ Walk(const HbFlexBlockList& p, const HbFlexBlockList& f, long long b, long long h, long long row,
                  long long block_, long long tile_, long long len_)
      : block(block_), tile(tile_), len(len_) {
    auto at = [&](const HbFlexBlockList& l, const int** idx) {
      if (!l.num) {
        *idx = nullptr;
        return 0;
      }
      const long long r = list_row(l, b, h, row);
      *idx = l.idx + r * l.cols;
      return (int)lmin(l.num[r], l.cols);
    };
    npart = at(p, &part);
    nfull = at(f, &full);
    const long long per = block / tile, need = (len + tile - 1) / tile;
    sub = (int)(per < need ? per : need);
  }
  __device__ int count() const { return (npart + nfull) * sub; }
  // The backward's step i: the lists' tiles in order, or with deterministic=True in reverse (dq_turn_wait:
  // then a causal or banded mask's key tiles reach each query tile in the same step, in turn order). The
  // SIMT backward's; the tensor-core backwards count along (Steps).
  __device__ long long step(int i, bool* is_full) const {
    i = HB_DETERMINISTIC ? count() - 1 - i : i;
    const int k = i / sub;
    return at(k, i - k * sub, is_full);
  }
  // The forward's tile i. sub is 1 where the block list's blocks are the kernel's tiles, the usual case:
  // no division there, about 30 instructions a tile off flex_fwd_pp's consumers (SASS, D 64).
  __device__ long long first(int i, bool* is_full) const {
    const int k = sub == 1 ? i : i / sub, r = sub == 1 ? 0 : i - k * sub;
    return at(k, r, is_full);
  }
  // Tile r of the lists' block k (partial blocks first, then full ones).
  __device__ long long at(int k, int r, bool* is_full) const {
    *is_full = k >= npart;
    const long long blk = *is_full ? full[k - npart] : part[k];
    return blk * block + (long long)r * tile;
  }
};

// A walk's tiles in order, counted along instead of divided out: tile r of block k. Where a block holds
// several tiles, first's division ran for each tile in every producer and consumer thread of flex_fwd_pp:
// so it did for every call without a BlockMask, since torch passes block_mask=None as one block of 2^30
// rows each way (the walk: 32 tiles of block 0 at S 4096), and the lab timed its 128-row blocks. Measured
// on the H200 (benchmarks/flex_kernel_lab.cu, mask 2: torch's empty BlockMask; B4 H16 S4096): forward
// D 64 0.77 -> 0.70 ms, D 128 0.98 -> 0.92; with Steps counting along too, the backward D 64 2.36 -> 2.33
// (128-row blocks 2.38 -> 2.34, block-causal 1.31 -> 1.29), D 128 about the same (3.52 -> 3.50).
struct WalkPos {
  int k = 0, r = 0;
  __device__ long long at(const Walk& w, bool* is_full) const { return w.at(k, r, is_full); }
  __device__ void advance(const Walk& w) {
    if (++r == w.sub) r = 0, ++k;
  }
};

// A backward CTA's steps: every query tile of `tile` rows that its key block's q lists give (Walk), for each
// query head of kv head hk's group (h in [hk G, (hk + 1) G), G = Hq / Hkv) in turn; a step is (h, that
// head's walk, its position (k, r) in the walk). next() is the step after it (whose Q and dO load while this one computes); done()
// past the last. One walk for every backward kernel (flex_bwd, flex_bwd_wg, flex_bwd_ws).
struct Steps {
  const HbFlexCudaArgs* a;
  long long b, kblk, tile, h, hend;
  Walk walk;
  // The step: tile r of the walk's block k, counted along (backwards with HB_DETERMINISTIC, in Walk::step's
  // order) rather than divided out of a step number (WalkPos says why).
  int k = 0, r = 0;
  __device__ Steps(const HbFlexCudaArgs& args, long long b_, long long hk, long long kblk_, long long tile_)
      : a(&args), b(b_), kblk(kblk_), tile(tile_), h(hk * (args.Hq / args.Hkv)),
        hend((hk + 1) * (args.Hq / args.Hkv)), walk(head(h)) {
    begin();
    settle();
  }
  __device__ Walk head(long long hh) const { return Walk(a->q_list, a->q_full_list, b, hh, kblk, a->q_block, tile, a->Sq); }
  __device__ bool done() const { return h >= hend; }
  __device__ void begin() {
    if (HB_DETERMINISTIC) k = walk.npart + walk.nfull - 1, r = walk.sub - 1;
    else k = r = 0;
  }
  __device__ void settle() {  // past heads with no step
    while ((HB_DETERMINISTIC ? k < 0 : k >= walk.npart + walk.nfull) && ++h < hend) walk = head(h), begin();
  }
  __device__ long long q0(bool* full) const { return walk.at(k, r, full); }
  __device__ Steps next() const {
    Steps n = *this;
    if (!HB_DETERMINISTIC && ++n.r == walk.sub) n.r = 0, ++n.k;
    if (HB_DETERMINISTIC && --n.r < 0) n.r = walk.sub - 1, --n.k;
    n.settle();
    return n;
  }
};


// ------------------------------------------------------------- per-element work shared by the kernels
// A thread's scores are in the tensor cores' accumulator layout: s[j][2 r + c] is query row lq + 8 r
// (lq = 16 x warp + lane / 4) and key column 8 j + 2 (lane % 4) + c of the tile. mma.sync's m16n8 tiles
// and wgmma's m64nN accumulators (a warp's 16 rows of its warpgroup's 64) are both this layout.

// With a score_mod, score_elem leaves log2 e to its caller, whose exponent takes it in its FFMA: one
// multiply a score less (H200, the lab's forward, B4 H16 S4096: ALiBi D 64 0.89 -> 0.85 ms, D 128 1.12 ->
// 1.07; softcap D 64 1.08 -> 1.00, D 128 1.20 -> 1.18; relative bias D 128 1.73 -> 1.66). Without one it
// multiplies, as before: there the change moved the D 64 forward's code and cost it 2% (0.74 -> 0.76 ms).
constexpr float kElemToBase2 = HB_SCORE_ELEM ? kLog2e : 1.f;

// HB_KV_RAMP: the score_mod's bias c (kv - q) at a thread's elements of a tile in the accumulator layout.
// Element (j, r, c) of the thread whose first row is qi0 lies at kv - q = d + c + 8 (j - r), d = k0 - qi0 +
// 2 (lane % 4), so its bias is base[c] + c8 (j - r): one FFMA, and the same one for (j, 0) and (j + 1, 1).
// Within a tile the distances are small (|j - r| < NC / 8), so the ramp rounds as the score_mod's own
// product c * (kv - q) does, to within an ulp of the bias.
struct KvRamp {
  float base[2], c8;
  __device__ __forceinline__ float at(int j, int r, int c) const { return fmaf(c8, (float)(j - r), base[c]); }
};
#if HB_KV_RAMP
__device__ __forceinline__ KvRamp kv_ramp(long long b, long long h, int qi0, int k0, HbFlexTile& t) {
  const float c = hb_score_mod<float>(0.f, b, h, 0, 1, &t);  // score_mod(0, b, h, 0, 1) = c * (1 - 0)
  const int d = k0 - qi0 + 2 * (int)(threadIdx.x & 3);
  return {{c * (float)d, c * (float)(d + 1)}, c * 8.f};
}
#else
__device__ __forceinline__ KvRamp kv_ramp(long long, long long, int, int, HbFlexTile&) { return {{0.f, 0.f}, 0.f}; }
#endif

// One score: scaled, through the score_mod and the mask_mod (partial blocks only); -inf where masked or
// outside both sequences (`in`). Base 2 once multiplied by kElemToBase2 (the caller does: the tensor-core
// kernels in softmax_tile's exponent, fwd_scores). GUARD false: the tile lies inside both sequences, and the
// score_mod is called unconditionally, so that the compiler may share the reads every element makes alike
// (`slope[h]`, `bias[q]`) instead of one guarded load per element. Positions are int: sequence lengths are
// below 2^31. Every forward kernel's per-element work (score_elems below, the SIMT kernels' fwd_elems).
// RAMP (HB_KV_RAMP, the tensor-core layout's callers): the score_mod is the scaled score plus `bias`.
template <bool GUARD, bool RAMP = false>
__device__ __forceinline__ float score_elem(float s, const HbFlexCudaArgs& a, long long b, long long h, int qi, int ki,
                                            bool in, bool full, HbFlexTile& t, float bias = 0.f) {
  float x;
  if (RAMP) {
    x = fmaf(s, a.scale, bias);
  } else {
    x = s * a.scale;
#if HB_SCORE_ELEM
    if (!GUARD || in) x = hb_score_mod<float>(x, b, h, qi, ki, &t);
#endif
  }
  bool keep = in;
#if HB_MASK_MOD
  // GUARD false: called whatever `in` says (it is true), so that nothing conditions one element's call
  // against another's (fwd_scores).
  if (!full) keep = GUARD ? keep && hb_mask_mod(b, h, qi, ki, &t) : hb_mask_mod(b, h, qi, ki, &t);
#endif
  return keep ? x * (kLog2e / kElemToBase2) : -INFINITY;  // (x itself with a score_mod)
}

// A thread's scores of a tile (score_elem each). `inside`: the tile lies inside both sequences. Such a
// tile with nothing to call per element only scales (fwd_scores).
template <int NC, bool GUARD>
__device__ __forceinline__ void score_elems(float (&s)[NC / 8][4], const HbFlexCudaArgs& a, long long b, long long h,
                                            int qi0, int k0, bool full, HbFlexTile& t) {
  const int t4 = threadIdx.x & 3, sq = (int)a.Sq, skv = (int)a.Skv;
  const KvRamp ramp = kv_ramp(b, h, qi0, k0, t);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qi0 + 8 * r;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int ki = k0 + j * 8 + 2 * t4 + c;
        s[j][2 * r + c] = score_elem<GUARD, HB_KV_RAMP>(s[j][2 * r + c], a, b, h, qi, ki, !GUARD || (qi < sq && ki < skv),
                                                        full, t, ramp.at(j, r, c));
      }
  }
}

// Returns the factor the scores still need, left to softmax_tile's exponent (one FFMA a score instead of
// a multiply and a subtract): kElemToBase2 after score_elems; on a tile with nothing to call per element,
// when the scale is positive, the scale times log2 e.
template <int NC>
__device__ __forceinline__ float fwd_scores(float (&s)[NC / 8][4], const HbFlexCudaArgs& a, long long b, long long h,
                                            long long qi0, long long k0, bool full, bool inside, HbFlexTile& t) {
  if (!HB_SCORE_ELEM && (full || !HB_MASK_MOD) && inside) {
    const float sl = a.scale * kLog2e;
    if (sl > 0.f) return sl;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= sl;
    return 1.f;
  }
  // Inside both sequences, `full` as a literal in each copy: a partial tile's mask_mod calls then share one
  // basic block, so the reads every element of a row or column makes alike (`doc[q]`, `doc[kv]`) are made
  // once (2 + NC / 4 a thread, not 2 per score: score_elem).
  if (inside && HB_MASK_MOD && full) score_elems<NC, false>(s, a, b, h, (int)qi0, (int)k0, true, t);
  else if (inside) score_elems<NC, false>(s, a, b, h, (int)qi0, (int)k0, false, t);
  else score_elems<NC, true>(s, a, b, h, (int)qi0, (int)k0, full, t);
  return kElemToBase2;
}

// 2^x by the hardware's approximation (the one exp2f uses), subnormal results flushed to 0: exp2f spends
// four more instructions a call keeping them, and a probability below 2^-126 adds nothing to a softmax.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax over a tile of scores, each base 2 once multiplied by sl > 0 (fwd_scores), each row's 4
// threads sharing its maximum: s becomes P, the running max m and sum l move, and corr is what the output
// accumulator must be scaled by.
template <int NC>
__device__ __forceinline__ void softmax_tile(float (&s)[NC / 8][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             float sl = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m[r], mx * sl);
    const float shift = mnew == -INFINITY ? 0.f : mnew;
    corr[r] = ex2(m[r] - shift);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float p = ex2(fmaf(s[j][2 * r + c], sl, -shift));
        s[j][2 * r + c] = p;
        sum += p;
      }
    l[r] = l[r] * corr[r] + sum;
    m[r] = mnew;
  }
}

__device__ __forceinline__ void rescale(float (&o)[D / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
}

// A query row's end, from its running max m and its sum (over all the row's threads): the factor of its
// outputs (1 / sum) and its logsumexp and max, in base 2. HB_ROW_SHIFT: the row's shift t = score_mod(0, b,
// h, q, 0) moves both by t (natural units); where t is -inf every score of the row is (out 0, logsumexp
// -inf, as a row that attends to nothing), where it is +inf or NaN they are NaN, as the softmax of such
// scores is.
struct RowEnd {
  float inv, lse, max;
};
__device__ __forceinline__ RowEnd row_end(float m, float sum, const HbFlexCudaArgs& a, long long b, long long h,
                                          long long qi, HbFlexTile& t) {
  float inv = sum == 0.f ? 0.f : 1.f / sum, shift = 0.f;
#if HB_ROW_SHIFT
  shift = hb_score_mod<float>(0.f, b, h, qi, 0, &t) * kLog2e;
  if (!isfinite(shift)) {
    inv = shift == -INFINITY ? 0.f : NAN;
    sum = shift == -INFINITY ? 0.f : sum;
  }
#endif
  return {inv, sum == 0.f ? -INFINITY : m + log2f(sum) + shift, sum == 0.f ? -INFINITY : m + shift};
}

// Normalize and store a thread's two output rows (qi0, qi0 + 8), with their logsumexp and max (row_end).
__device__ __forceinline__ void fwd_store(const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                          const HbFlexCudaArgs& a, long long b, long long h, long long qi0,
                                          HbFlexTile& t) {
  const int t4 = threadIdx.x & 3;
  Elem* O = (Elem*)a.out + b * a.o_strides[0] + h * a.o_strides[1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const long long qi = qi0 + 8 * r;
    if (qi >= a.Sq) continue;
    const RowEnd e = row_end(m[r], sum, a, b, h, qi, t);
    Elem* row = O + qi * a.o_strides[2];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<Elem2*>(row + j * 8 + 2 * t4) = pack2(o[j][2 * r] * e.inv, o[j][2 * r + 1] * e.inv);
    if (t4 == 0) {
      const long long at = (b * a.Hq + h) * a.Sq + qi;
      a.lse[at] = e.lse;
      a.max_scores[at] = e.max;
    }
  }
}

// A step's line reduction of the joint's buffer gradient (HB_SCATTER). The scatter's offset is a
// function of (b, h, q, kv) that the kernel probes at three points of the step's ROWS x COLS tile,
// (0, 0), (1, 0) and (0, 1): when those say the offset moves along rows (alpha per query row, 0 per key
// column: a per-query bias), along columns, or along diagonals (alpha per row, -alpha per column: a
// relative bias lb[q - kv]), each element predicts its offset as key0 + alpha row + beta column, and
// its first scatter into exactly that offset (hb_scatter checks every element: the probe is a guess,
// never trusted) leaves its value in a [ROWS][COLS + 1] float tile in the P and dS tiles' shared memory
// (which no one reads while the per-element code runs) instead of an atomic; every other scatter, and
// every step where the probe finds no such line or the tile crosses a sequence's end, adds atomically.
// After the step, one thread per line sums it and adds the sum with one atomic: a relative bias's 64 x 64
// step costs 127 atomics instead of 4096 contended ones. Per step: line_probe() before the per-element
// code, then (if on) line_reduce(), which begins and ends with a barrier; after it P and dS may be
// stored again. Where the generator proved the line (HB_LINE_STATIC), line_probe takes alpha and beta
// from it, and no element predicts or checks its offset.
struct LineStep {
  float* tile;           // [ROWS][COLS + 1], or null: off
  int kind;              // 0 off, 1 rows, 2 columns, 3 diagonals
  int buf;
  long long key0, alpha, beta;
};

// The backward's grid. A launch of part of the (b, kv head) pairs (flex_dq_pairs) has its pairs along x
// and key tiles along y, so that it starts every pair's first key tile before any pair's second: a causal
// mask's longest CTAs (its first key tiles, which walk every query row) start first and its shortest end
// the launch, whose tail, paid once per launch, would otherwise be a long CTA's (H200, D128 B4 H16 S4096,
// block-causal backward in 4 launches: 2.81 ms against 3.31 with key tiles along x). A launch of every
// pair has key tiles along x: pairs along x would keep every pair's Q and dO in use at once, more than L2
// holds (6.89 ms against 5.18 without a mask). a.pairs_fast says which; bwd_tile() is a CTA's key tile,
// bwd_tiles() the launch's key tiles, bwd_pair() its pair less the launch's first.
__device__ __forceinline__ long long bwd_tile(const HbFlexCudaArgs& a) { return a.pairs_fast ? blockIdx.y : blockIdx.x; }
__device__ __forceinline__ long long bwd_tiles(const HbFlexCudaArgs& a) { return a.pairs_fast ? gridDim.y : gridDim.x; }
__device__ __forceinline__ long long bwd_pair(const HbFlexCudaArgs& a) { return a.pairs_fast ? blockIdx.x : blockIdx.y; }
inline dim3 bwd_grid(long long tiles, long long pairs, bool pairs_fast) {
  return pairs_fast ? dim3((unsigned)pairs, (unsigned)tiles) : dim3((unsigned)tiles, (unsigned)pairs);
}

// The deterministic scatter's window (line_reduce) of (b, query head h) and this CTA's key tile.
__device__ __forceinline__ long long window_of(const HbFlexCudaArgs& a, long long b, long long h) {
  return (b * a.Hq + h) * bwd_tiles(a) + bwd_tile(a);
}

template <int ROWS, int COLS>
constexpr int kLineTileBytes = HB_SCATTER ? ROWS * (COLS + 1) * 4 : 0;

#if HB_SCATTER && HB_LINE_STATIC
// The generator proved the line (HB_LINE_*): the step's key is the line scatter's offset at (q0, k0),
// which the joint's LINE 2 instantiation notes without scattering; every element of the step then hands
// its value over unchecked (hb_joint<float, 1>).
template <int ROWS, int COLS>
__device__ __forceinline__ LineStep line_probe(float* tile, long long b, long long h, long long q0, long long k0,
                                               bool inside, HbFlexTile& t, const HbFlexCudaArgs& a) {
  constexpr long long alpha = HB_LINE_ALPHA, beta = HB_LINE_BETA;
  constexpr int kind = beta == 0 ? 1 : alpha == 0 ? 2 : 3;
  static_assert(beta == 0 || alpha == 0 || alpha == -beta, "HB_LINE_ALPHA/BETA: not a line");
  LineStep l{nullptr, 0, -1, 0, 0, 0};
  if ((!inside && !HB_DETERMINISTIC) || !a.run_joint || !a.score_buffers[HB_LINE_BUF].grad) return l;
  const int e = t.error, eb = t.error_buffer;  // the key's reads must not report: restore what it sets
  const long long ei = t.error_index, es = t.error_size;
  hb_joint<float, 2>(0.f, b, h, q0, k0, 1.f, &t);
  t.error = e, t.error_buffer = eb, t.error_index = ei, t.error_size = es;
  l.tile = tile, l.kind = kind, l.buf = HB_LINE_BUF, l.key0 = t.line_pred, l.alpha = alpha, l.beta = beta;
  return l;
}

#elif HB_SCATTER
template <int ROWS, int COLS>
__device__ __forceinline__ LineStep line_probe(float* tile, long long b, long long h, long long q0, long long k0,
                                               bool inside, HbFlexTile& t, const HbFlexCudaArgs&) {
  LineStep l{nullptr, 0, -1, 0, 0, 0};
  t.line_mode = 0;
  if (!inside) return l;
  const int e = t.error, eb = t.error_buffer;  // the probe's reads must not report: restore what it sets
  const long long ei = t.error_index, es = t.error_size;
  long long key[3];
  int buf[3];
  t.line_mode = 2;
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    t.line_buf = -1;
    hb_joint<float>(0.f, b, h, q0 + (p == 1), k0 + (p == 2), 1.f, &t);
    key[p] = t.line_pred, buf[p] = t.line_buf;
  }
  t.error = e, t.error_buffer = eb, t.error_index = ei, t.error_size = es;
  t.line_mode = 0;
  if (buf[0] < 0 || buf[1] != buf[0] || buf[2] != buf[0]) return l;
  l.alpha = key[1] - key[0], l.beta = key[2] - key[0];
  l.kind = l.beta == 0 ? 1 : l.alpha == 0 ? 2 : l.alpha == -l.beta ? 3 : 0;
  if (!l.kind) return l;
  l.tile = tile, l.buf = buf[0], l.key0 = key[0];
  t.line_mode = 1, t.line_buf = buf[0];
  return l;
}
#endif

#if HB_SCATTER && HB_DETERMINISTIC && !HB_LINE_STATIC
#error "deterministic=True with a buffer gradient needs the generator's proven line (HB_LINE_STATIC)"
#endif

#if HB_SCATTER
// deterministic=True (HB_DETERMINISTIC): no atomic. Each (b, q head, key tile) owns a window of floats in
// a.scatter_win (its index w: window_of below), indexed by the line's position j in the key space it
// sweeps: the query row q0 + i of a row line, the key column i of a column line, q0 + i for the diagonal
// i (row - column = i - (COLS - 1)), 0 where every element shares one key. The CTA walks its steps in
// a fixed order and the one thread that sums a line adds it into the window (a line's j is its own
// within a step; steps are ordered by the barriers), so a window's sums are the same in every run.
// a.scatter_start[w] notes the key at j = 0 (the same at every step); flex_window_rows and flex_window_sum
// then add the windows into the buffer's gradient in a fixed order.
// NT threads reduce, tid the caller's index among them, barrier `bar` theirs (0: the whole CTA's, NT
// threads; flex_bwd_ws: a consumer warpgroup's own).
template <int ROWS, int COLS, int NT>
__device__ __forceinline__ void line_reduce(const LineStep& l, const HbFlexCudaArgs& a, long long q0, long long w,
                                            int tid = threadIdx.x, int bar = 0) {
  const auto sync = [bar] {
    if (bar == 0)
      __syncthreads();
    else
      asm volatile("bar.sync %0, %1;" : : "r"(bar), "n"(NT) : "memory");
  };
  sync();  // every element's value is in the tile
  const int n = l.kind == 1 ? ROWS : l.kind == 2 ? COLS : ROWS + COLS - 1;
#if HB_DETERMINISTIC
  float* win = a.scatter_win + w * a.scatter_len;
  if (tid == 0)
    a.scatter_start[w] = l.kind == 1 ? l.key0 - l.alpha * q0 : l.kind == 2 ? l.key0 : l.key0 - l.alpha * (q0 + COLS - 1);
  if (l.alpha == 0 && l.beta == 0) {  // one key for the whole tile: one thread, in a fixed order
    if (tid == 0) {
      float sum = 0.f;
      for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < COLS; ++c) sum += l.tile[r * (COLS + 1) + c];
      win[0] += sum;
    }
    sync();
    return;
  }
#else
  float* grad = (float*)a.score_buffers[l.buf].grad;
#endif
  for (int i = tid; i < n; i += NT) {
    float sum = 0.f;
    long long key;
    if (l.kind == 1) {
      for (int c = 0; c < COLS; ++c) sum += l.tile[i * (COLS + 1) + c];
      key = l.key0 + l.alpha * i;
    } else if (l.kind == 2) {
      for (int r = 0; r < ROWS; ++r) sum += l.tile[r * (COLS + 1) + i];
      key = l.key0 + l.beta * i;
    } else {
      const int d = i - (COLS - 1);  // row - column
      const int r0 = d > 0 ? d : 0, r1 = d + COLS < ROWS ? d + COLS : ROWS;
      for (int r = r0; r < r1; ++r) sum += l.tile[r * (COLS + 1) + (r - d)];
      key = l.key0 + l.alpha * d;
    }
#if HB_DETERMINISTIC
    (void)key;
    win[l.kind == 2 ? i : q0 + i] += sum;
#else
    if (sum != 0.f) atomicAdd(grad + key, sum);
#endif
  }
  sync();  // P and dS may overwrite the tile
}
#endif

// One backward element: s (its score) becomes P = exp(score - lse) and dp becomes dS = P (dP - delta)
// through the joint graph, times the scale (SCALED; else the caller scales dK and dQ); 0 where masked or
// outside both sequences (`in`). GUARD as in
// score_elem. LINE: the step reduces a buffer gradient along lines (`line`, a tile inside both sequences),
// and the element's line value goes to the line tile at (lq, lk), its row and column in the step (row
// stride `ld`). Every backward kernel's per-element work (p_ds_elems below, the SIMT kernels' p_ds_simt).
template <bool GUARD, bool LINE, bool SCALED = true>
__device__ __forceinline__ void p_ds_elem(float& s, float& dp, const HbFlexCudaArgs& a, long long b, long long h, int qi,
                                          int ki, bool in, float lse, float delta, bool full, int lq, int lk, int ld,
                                          HbFlexTile& t, const LineStep& line) {
  const float s0 = s * a.scale;
  float x = s0;
#if HB_SCORE_ELEM
  if (!GUARD || in) x = hb_score_mod<float>(x, b, h, qi, ki, &t);
#endif
  bool keep = in && lse != -INFINITY;
#if HB_MASK_MOD
  // GUARD false: the mask_mod is called first, whatever the row's logsumexp, so that its reads are shared
  // across the step's elements (score_elem; bwd_p_ds passes `full` as a literal).
  if (!full) keep = GUARD ? keep && hb_mask_mod(b, h, qi, ki, &t) : hb_mask_mod(b, h, qi, ki, &t) && keep;
#endif
  const float p = keep ? ex2(x * kLog2e - lse) : 0.f;
  float ds = p * (dp - delta);
#if HB_SCATTER
  if (LINE) t.line_val = 0.f;
  if (LINE && !HB_LINE_STATIC) t.line_taken = 0, t.line_pred = line.key0 + line.alpha * lq + line.beta * lk;
#endif
#if HB_JOINT
  if (keep && a.run_joint) ds = hb_joint<float, LINE && HB_LINE_STATIC ? 1 : 0>(s0, b, h, qi, ki, ds, &t);
#endif
#if HB_SCATTER
  if (LINE) line.tile[lq * ld + lk] = t.line_val;
#endif
  s = p;
  dp = keep ? (SCALED ? ds * a.scale : ds) : 0.f;
}

// A thread's elements of a step (p_ds_elem each); `row0` is (b, h)'s first logsumexp row.
template <int NC, bool GUARD, bool LINE, bool SCALED = true>
__device__ __forceinline__ void p_ds_elems(float (&s)[NC / 8][4], float (&dp)[NC / 8][4], const HbFlexCudaArgs& a,
                                           long long b, long long h, int q0, int lq, int k0, bool full, long long row0,
                                           HbFlexTile& t, const LineStep& line) {
  const int t4 = threadIdx.x & 3, sq = (int)a.Sq, skv = (int)a.Skv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = q0 + lq + 8 * r;
    const bool qin = !GUARD || qi < sq;
    const float lse = qin ? a.lse[row0 + qi] : -INFINITY;
    const float delta = qin ? a.delta[row0 + qi] : 0.f;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int ki = k0 + j * 8 + 2 * t4 + c;
        p_ds_elem<GUARD, LINE, SCALED>(s[j][2 * r + c], dp[j][2 * r + c], a, b, h, qi, ki,
                                       !GUARD || (qin && ki < skv), lse, delta, full, lq + 8 * r,
                                       j * 8 + 2 * t4 + c, NC + 1, t, line);
      }
  }
}

// The step's P and dS (p_ds_elems), or with nothing to call per element on a tile inside both sequences,
// the short way. SCALED: as p_ds_elem's.
template <int NC, bool SCALED = true>
__device__ __forceinline__ void bwd_p_ds(float (&s)[NC / 8][4], float (&dp)[NC / 8][4], const HbFlexCudaArgs& a,
                                         long long b, long long h, long long q0, int lq, long long k0, bool full,
                                         bool inside, long long row0, HbFlexTile& t, const LineStep& line) {
  const int t4 = threadIdx.x & 3;
  if (!HB_SCORE_ELEM && !HB_JOINT && (full || !HB_MASK_MOD) && inside) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lse = a.lse[row0 + q0 + lq + 8 * r], delta = a.delta[row0 + q0 + lq + 8 * r];
      const float shift = lse == -INFINITY ? INFINITY : lse, sl = a.scale * kLog2e;
#pragma unroll
      for (int j = 0; j < NC / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = ex2(s[j][2 * r + c] * sl - shift);
          s[j][2 * r + c] = p;
          dp[j][2 * r + c] = SCALED ? p * (dp[j][2 * r + c] - delta) * a.scale : p * (dp[j][2 * r + c] - delta);
        }
    }
  } else if (HB_SCATTER && line.tile) {
#if HB_DETERMINISTIC
    if (!inside) {  // deterministic=True: a tile across a sequence's end sums its lines too (no atomic)
      p_ds_elems<NC, true, true, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, full, row0, t, line);
      return;
    }
#endif
    // (`full` as a literal in each copy inside both sequences: fwd_scores says why)
    if (HB_MASK_MOD && full)
      p_ds_elems<NC, false, true, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, true, row0, t, line);
    else
      p_ds_elems<NC, false, true, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, false, row0, t, line);
  } else if (inside && HB_MASK_MOD && full) {
    p_ds_elems<NC, false, false, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, true, row0, t, line);
  } else if (inside) {
    p_ds_elems<NC, false, false, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, false, row0, t, line);
  } else {
    p_ds_elems<NC, true, false, SCALED>(s, dp, a, b, h, (int)q0, lq, (int)k0, full, row0, t, line);
  }
}

// P and dS of a thread's two rows (lq, lq + 8) into [rows][NC] shared tiles, as element pairs; idx(row,
// chunk) is the tile's layout.
template <int NC, class Idx>
__device__ __forceinline__ void store_p_ds(const float (&p)[NC / 8][4], const float (&ds)[NC / 8][4], uint4* sP,
                                           uint4* sdS, int lq, Idx idx) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) {
      const int at = idx(lq + 8 * r, j);
      reinterpret_cast<Elem2*>(&sP[at])[t4] = pack2(p[j][2 * r], p[j][2 * r + 1]);
      reinterpret_cast<Elem2*>(&sdS[at])[t4] = pack2(ds[j][2 * r], ds[j][2 * r + 1]);
    }
}

// dQ rows (qi0, qi0 + 8), columns d0 + [0, NC) of a thread, added into the float accumulator, as PTX
// `red`. atomicAdd, whose result goes unused, compiles to the same fire-and-forget reduction, except in a
// kernel with a fence after it (deterministic=True: dq_turn_done), where ptxas makes it an atomic that
// returns, and each thread waits for its round trip (ATOMG instead of REDG in the SASS).
template <int NC>
__device__ __forceinline__ void add_dq(const float (&dq)[NC / 8][4], const HbFlexCudaArgs& a, long long row0,
                                       long long qi0, int d0) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long qi = qi0 + 8 * r;
    if (qi >= a.Sq) continue;
    float* dst = a.dq + (row0 - a.dq_row0 + qi) * D + d0 + 2 * t4;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) {
#if __CUDA_ARCH__ >= 900
      asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" : : "l"(dst + j * 8), "f"(dq[j][2 * r]),
                   "f"(dq[j][2 * r + 1]) : "memory");
#else
      asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" : : "l"(dst + j * 8), "f"(dq[j][2 * r]) : "memory");
      asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" : : "l"(dst + j * 8 + 1), "f"(dq[j][2 * r + 1]) : "memory");
#endif
    }
  }
}

#if HB_DETERMINISTIC
// deterministic=True (HB_DETERMINISTIC, a.dq_order): the CTAs that add into one query step's dQ rows
// take turns, in the order of their 64-row key tiles, so that every dQ element gets its sums in the same
// order on every run (within a CTA each element gets one add per step). dq_order[(b Hq + h) ceil(Sq / 64)
// + q0 / 64] counts the key tiles done with the step; the CTA of key tile kt waits until it equals kt's
// rank among the key tiles that visit the step's query block (dq_rank, which flex_dq_rank fills from the
// BlockMask's kv lists, each listed block kv_block / 64 tiles), adds, and counts itself. A key tile waits
// only for lower ones, which were launched before it, so every wait ends; one that waits for seconds (kv
// lists that do not match the q lists) reports kFlexErrorOrder and adds out of turn. The walks run in
// reverse (Walk::step), and the wgmma kernel computes dQ before its turn, so that a turn holds only the
// adds (docs/flex-attention.md, "Deterministic backward on CUDA").
// The rank table's rows: (b, h, query block), b and h broadcast where both lists broadcast them (the
// launcher and backend/runtime/FlexTiledCuda.cpp size it alike).
__device__ __forceinline__ long long dq_rank_row(const HbFlexCudaArgs& a, long long b, long long h, long long r) {
  const long long bm = a.kv_list.bm > a.kv_full_list.bm ? a.kv_list.bm : a.kv_full_list.bm;
  const long long hm = a.kv_list.hm > a.kv_full_list.hm ? a.kv_list.hm : a.kv_full_list.hm;
  return ((bm == 1 ? 0 : b) * hm + (hm == 1 ? 0 : h)) * a.kv_list.rows + r;
}
__global__ void flex_dq_rank(const __grid_constant__ HbFlexCudaArgs a) {
  const long long bm = a.kv_list.bm > a.kv_full_list.bm ? a.kv_list.bm : a.kv_full_list.bm;
  const long long hm = a.kv_list.hm > a.kv_full_list.hm ? a.kv_list.hm : a.kv_full_list.hm, nr = a.kv_list.rows;
  const long long tiles = (a.Skv + 63) / 64, per = a.kv_block / 64;
  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < bm * hm * nr;
       row += (long long)gridDim.x * blockDim.x) {
    const long long b = row / (hm * nr), h = row / nr % hm, r = row % nr;
    int* rank = a.dq_rank + row * tiles;
    for (long long t = 0; t < tiles; ++t) rank[t] = 0;
    for (int f = 0; f < 2; ++f) {  // mark the listed tiles
      const HbFlexBlockList& l = f ? a.kv_full_list : a.kv_list;
      if (!l.num) continue;
      const long long lr = list_row(l, b, h, r);
      const int n = (int)lmin(l.num[lr], l.cols);
      for (int e = 0; e < n; ++e)
        for (long long t = (long long)l.idx[lr * l.cols + e] * per, u = 0; u < per && t < tiles; ++t, ++u) rank[t] = 1;
    }
    for (long long t = 0, before = 0; t < tiles; ++t) {  // -> the number of listed tiles below t
      const int listed = rank[t];
      rank[t] = (int)before;
      before += listed;
    }
  }
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int* dq_turn_counter(const HbFlexCudaArgs& a, long long b, long long h, long long q0) {
  return a.dq_order + (b * a.Hq + h) * ((a.Sq + 63) / 64) + q0 / 64;
}
// One thread waits until key tile kt's turn at query step q0 has come.
__device__ __forceinline__ void dq_turn_spin(const HbFlexCudaArgs& a, long long b, long long h, long long q0,
                                             long long kt, HbFlexTile& t) {
  const int want = a.dq_rank[dq_rank_row(a, b, h, q0 / a.q_block) * ((a.Skv + 63) / 64) + kt];
  const int* c = dq_turn_counter(a, b, h, q0);
  for (long long spins = 0; ld_acquire(c) < want; ++spins) {
    if (spins > (1ll << 23)) {
      if (!t.error) t.error = 3, t.error_buffer = -1, t.error_index = q0, t.error_size = kt;  // kFlexErrorOrder
      break;
    }
    __nanosleep(32);
  }
}
// Before the step's dQ adds: the CTA of key tile kt waits for its turn.
__device__ __forceinline__ void dq_turn_wait(const HbFlexCudaArgs& a, long long b, long long h, long long q0,
                                             long long kt, HbFlexTile& t) {
  if (q0 >= a.Sq) return;  // (a step past the end adds nothing)
  if (threadIdx.x == 0) dq_turn_spin(a, b, h, q0, kt, t);
  __syncthreads();
}
// After them: they are visible before the next key tile's turn.
__device__ __forceinline__ void dq_turn_done(const HbFlexCudaArgs& a, long long b, long long h, long long q0) {
  if (q0 >= a.Sq) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(dq_turn_counter(a, b, h, q0), 1);
}
#endif

// A thread's rows (lk, lk + 8) of a [rows][D] accumulator to dst (row stride D), rows below `valid`.
__device__ __forceinline__ void store_rows(const float (&acc)[D / 8][4], Elem* dst, int lk, int valid) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kr = lk + 8 * r;
    if (kr >= valid) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<Elem2*>(dst + (long long)kr * D + j * 8 + 2 * t4) = pack2(acc[j][2 * r], acc[j][2 * r + 1]);
  }
}

// ---------------------------------------------------------------------------------------------- forward
constexpr int FW = 4, FT = FW * 32, FM = FW * 16;  // warps, threads, query rows per CTA
constexpr int FN = D <= 128 ? 64 : 32;             // key rows per tile
constexpr int kFwdSmem = (FM + 2 * FN) * CH * 16;

#if !HB_SIMT_FWD
__global__ void __launch_bounds__(FT) flex_fwd(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ uint4 smem[];
  uint4* sQ = smem;
  uint4* sK = sQ + FM * CH;
  uint4* sV = sK + FN * CH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const long long b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq, hk = h / (a.Hq / a.Hkv), bk = a.Bkv == 1 ? 0 : b;
  const long long q0 = (long long)blockIdx.x * FM;
  const Elem* Q = (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1];
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  const Walk walk(a.kv_list, a.kv_full_list, b, h, q0 / a.q_block, a.kv_block, FN, a.Skv);
  const int ntiles = walk.count();
  HbFlexTile t = {};
  t.b = b, t.h = h, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;

  load_tile<FM, FT>(sQ, Q, q0, a.q_strides[2], a.Sq);
  bool full = false;
  long long k0 = ntiles ? walk.first(0, &full) : 0;
  if (ntiles) load_tile<FN, FT>(sK, K, k0, a.k_strides[2], a.Skv);
  cute::cp_async_fence();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int i = 0; i < ntiles; ++i) {
    cute::cp_async_wait<0>();
    __syncthreads();
    load_tile<FN, FT>(sV, V, k0, a.v_strides[2], a.Skv);
    cute::cp_async_fence();

    float s[FN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      ldsm(&sQ[sw<CH>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))], qa);
#pragma unroll
      for (int j = 0; j < FN / 16; ++j) {
        uint32_t kb[4];
        ldsm(&sK[sw<CH>(j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1))], kb);
        mma(s[2 * j], qa, kb[0], kb[1]);
        mma(s[2 * j + 1], qa, kb[2], kb[3]);
      }
    }
    const float sl = fwd_scores<FN>(s, a, b, h, q0 + warp * 16 + g, k0, full, k0 + FN <= a.Skv && q0 + FM <= a.Sq, t);
    float corr[2];
    softmax_tile<FN>(s, m, l, corr, sl);
    rescale(o, corr);
    cute::cp_async_wait<0>();
    __syncthreads();  // V has landed; every warp is done with K
    if (i + 1 < ntiles) {
      k0 = walk.first(i + 1, &full);
      load_tile<FN, FT>(sK, K, k0, a.k_strides[2], a.Skv);
    }
    cute::cp_async_fence();
    // O += P V (P straight from the accumulators: two n8 tiles make one k16 A fragment).
#pragma unroll
    for (int kk = 0; kk < FN / 16; ++kk) {
      const uint32_t pa[4] = {pack(s[2 * kk][0], s[2 * kk][1]), pack(s[2 * kk][2], s[2 * kk][3]),
                              pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int jd = 0; jd < D / 16; ++jd) {
        uint32_t vb[4];
        ldsm_t(&sV[sw<CH>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), jd * 2 + (lane >> 4))], vb);
        mma(o[2 * jd], pa, vb[0], vb[1]);
        mma(o[2 * jd + 1], pa, vb[2], vb[3]);
      }
    }
  }
  fwd_store(o, m, l, a, b, h, q0 + warp * 16 + g, t);
  report(a.error, t);
}
#endif  // !HB_SIMT_FWD

// --------------------------------------------------------------------------------------------- backward
// (every head dim: the SIMT backward, FlexSimtKernel.cuh, takes 256 and float32, with flex_bwd_pre below)
constexpr int BW = 8, BT = BW * 32;  // warps, threads
constexpr int BM = BW * 16;          // query rows per step
constexpr int BN = 64;               // key rows per CTA
constexpr int PC = BN / 8;           // chunks per row of the [BM][BN] P and dS tiles
// The line tile (LineStep) overlays P and dS, the last in shared memory, and may reach past them.
constexpr int kBwdLineExtra =
    (kLineTileBytes<BM, BN> > 2 * BM * PC * 16 ? kLineTileBytes<BM, BN> - 2 * BM * PC * 16 + 15 : 0) / 16 * 16;
constexpr int kBwdSmem = (2 * BN * CH + 4 * BM * CH + 2 * BM * PC) * 16 + kBwdLineExtra;

// delta[row] = sum(out * grad_out) - grad_logsumexp (natural units): dS = P (dP - delta).
// A row's out and grad_out are read 16 bytes a lane (kPreLanes lanes a row, several rows a warp) where
// both are 16-byte aligned, else an element a lane, a warp a row: the 16-byte form took the D 128 call from
// 0.070 to 0.045 ms (B4 H16 S4096 bf16, the H200, benchmarks/flex.py --profile).
constexpr int kPreVec = 16 / (int)sizeof(Elem);                                // elements a 16-byte read
constexpr int kPreLanes = D / kPreVec < 32 ? D / kPreVec : 32;                // lanes a row
constexpr int kPreRows = 32 / kPreLanes;                                      // rows a warp
__host__ __device__ inline bool pre_vec(const HbFlexCudaArgs& a) {  // whether the 16-byte reads apply
  return ((reinterpret_cast<uintptr_t>(a.out) | reinterpret_cast<uintptr_t>(a.dout)) % 16 == 0) &&
         (a.o_strides[0] | a.o_strides[1] | a.o_strides[2] | a.do_strides[0] | a.do_strides[1] | a.do_strides[2]) %
                 kPreVec == 0;
}
__global__ void flex_bwd_pre(const __grid_constant__ HbFlexCudaArgs a) {
  const long long rows = a.B * a.Hq * a.Sq;
  const int lane = threadIdx.x % 32;
  const bool vec = pre_vec(a);
  const int per = vec ? kPreRows : 1;  // rows a warp
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long row0 = ((long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * per; row0 < rows;
       row0 += warps * per) {
    const long long row = row0 + (vec ? lane / kPreLanes : 0);
    const bool mine = row < rows;
    const long long b = row / (a.Hq * a.Sq), h = (row / a.Sq) % a.Hq, qi = row % a.Sq;
    const Elem* o = (const Elem*)a.out + b * a.o_strides[0] + h * a.o_strides[1] + qi * a.o_strides[2];
    const Elem* d = (const Elem*)a.dout + b * a.do_strides[0] + h * a.do_strides[1] + qi * a.do_strides[2];
    float acc = 0.f;
    if (vec) {
      if (mine) {
#pragma unroll
        for (int c = (lane % kPreLanes) * kPreVec; c < D; c += kPreLanes * kPreVec) {
          const uint4 ov = *reinterpret_cast<const uint4*>(o + c), dv = *reinterpret_cast<const uint4*>(d + c);
          const Elem* oe = reinterpret_cast<const Elem*>(&ov);
          const Elem* de = reinterpret_cast<const Elem*>(&dv);
#pragma unroll
          for (int e = 0; e < kPreVec; ++e) acc += float(oe[e]) * float(de[e]);
        }
      }
#pragma unroll
      for (int x = kPreLanes / 2; x > 0; x >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, x);
      if (lane % kPreLanes != 0 || !mine) continue;
    } else {
      for (int c = lane; c < D; c += 32) acc += float(o[c]) * float(d[c]);
#pragma unroll
      for (int x = 16; x > 0; x >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, x);
      if (lane != 0) continue;
    }
    a.delta[row] = acc - (a.dlse ? a.dlse[row] * (1.f / kLn2) : 0.f);
#if HB_ROW_SHIFT
    // The identity's logsumexp: the forward's, less the row's shift (the main kernel reads it as a.lse).
    {
      HbFlexTile t = {};
      t.b = b, t.h = h, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;
      const float shift = hb_score_mod<float>(0.f, b, h, qi, 0, &t) * kLog2e;
      a.row_lse[row] = isfinite(shift) ? a.lse[row] - shift : -INFINITY;
      report(a.error, t);
    }
#endif
  }
}

#if !HB_WG && !HB_SIMT_BWD  // (the Hopper and SIMT kernels have their own backward)
__global__ void __launch_bounds__(BT, 1) flex_bwd(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ uint4 smem[];
  uint4* sK = smem;
  uint4* sV = sK + BN * CH;
  uint4* sQ = sV + BN * CH;     // [2][Q, dO] tiles of BM rows: the step's and the next one's
  uint4* sP = sQ + 4 * BM * CH;
  uint4* sdS = sP + BM * PC;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const long long bh = bwd_pair(a) + a.bh0, b = bh / a.Hkv, hk = bh % a.Hkv, bk = a.Bkv == 1 ? 0 : b;
  const long long k0 = bwd_tile(a) * BN;
  const int kvalid = (int)lmin(BN, a.Skv - k0);
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  load_tile<BN, BT>(sK, K, k0, a.k_strides[2], a.Skv);
  load_tile<BN, BT>(sV, V, k0, a.v_strides[2], a.Skv);
  cute::cp_async_fence();

  // Warps 0-3 accumulate dV, 4-7 dK, each over 16 key rows.
  const bool dk_warp = warp >= 4;
  const int krow = (warp & 3) * 16;
  float acc[D / 8][4] = {};
  HbFlexTile t = {};
  t.b = b, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;

  // The steps: every query tile the q lists give, for each query head of the group in turn. Q and dO of
  // the next step load (double-buffered) while this one computes.
  auto load_step = [&](long long h, long long q0, int buf) {
    load_tile<BM, BT>(sQ + buf * 2 * BM * CH, (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1], q0,
                      a.q_strides[2], a.Sq);
    load_tile<BM, BT>(sQ + (buf * 2 + 1) * BM * CH, (const Elem*)a.dout + b * a.do_strides[0] + h * a.do_strides[1], q0,
                      a.do_strides[2], a.Sq);
  };
  Steps st(a, b, hk, k0 / a.kv_block, BM);
  bool full = false;
  if (!st.done()) load_step(st.h, st.q0(&full), 0);
  cute::cp_async_fence();
  for (int buf = 0; !st.done(); buf ^= 1) {
    const long long h = st.h, q0 = st.q0(&full);
    t.h = h;
    const long long row0 = (b * a.Hq + h) * a.Sq;
    const Steps nx = st.next();
    cute::cp_async_wait<0>();
    __syncthreads();  // this step's Q and dO have landed; the last step's readers of the other buffer are done
    if (!nx.done()) {
      bool unused;
      load_step(nx.h, nx.q0(&unused), buf ^ 1);
    }
    cute::cp_async_fence();
    const uint4* sQ = smem + 2 * BN * CH + buf * 2 * BM * CH;
    const uint4* sdO = sQ + BM * CH;
    {

      // S = Q K^T and dP = dO V^T for this warp's 16 query rows.
      float s[BN / 8][4] = {}, dp[BN / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4], da[4];
        ldsm(&sQ[sw<CH>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))], qa);
        ldsm(&sdO[sw<CH>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))], da);
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
          uint32_t kb[4], vb[4];
          const int r = j * 16 + (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
          ldsm(&sK[sw<CH>(r, c)], kb);
          ldsm(&sV[sw<CH>(r, c)], vb);
          mma(s[2 * j], qa, kb[0], kb[1]);
          mma(s[2 * j + 1], qa, kb[2], kb[3]);
          mma(dp[2 * j], da, vb[0], vb[1]);
          mma(dp[2 * j + 1], da, vb[2], vb[3]);
        }
      }
      const bool inside = k0 + BN <= a.Skv && q0 + BM <= a.Sq;
#if HB_SCATTER
      const LineStep line = line_probe<BM, BN>(reinterpret_cast<float*>(sP), b, h, q0, k0, inside, t, a);
#else
      const LineStep line{};
#endif
      bwd_p_ds<BN>(s, dp, a, b, h, q0, warp * 16 + g, k0, full, inside, row0, t, line);
#if HB_SCATTER
      if (line.tile) line_reduce<BM, BN, BT>(line, a, q0, window_of(a, b, h));
#endif
      store_p_ds<BN>(s, dp, sP, sdS, warp * 16 + g, [](int r, int c) { return sw<PC>(r, c); });
      __syncthreads();

      // dV += P^T dO (warps 0-3) or dK += dS^T Q (warps 4-7), over this warp's 16 key rows.
      const uint4* sA = dk_warp ? sdS : sP;
      const uint4* sB = dk_warp ? sQ : sdO;
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t pa[4];
        ldsm_t(&sA[sw<PC>(kk * 16 + (lane & 7) + ((lane >> 4) << 3), krow / 8 + ((lane >> 3) & 1))], pa);
#pragma unroll
        for (int jd = 0; jd < D / 16; ++jd) {
          uint32_t bb[4];
          ldsm_t(&sB[sw<CH>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), jd * 2 + (lane >> 4))], bb);
          mma(acc[2 * jd], pa, bb[0], bb[1]);
          mma(acc[2 * jd + 1], pa, bb[2], bb[3]);
        }
      }
      // dQ += dS K for this warp's 16 query rows, 32 columns at a time, into the float accumulator.
      constexpr int QC = D < 32 ? D : 32;
      uint32_t dsa[BN / 16][4];  // this warp's dS rows as A fragments, loaded once for every column chunk
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) ldsm(&sdS[sw<PC>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))], dsa[kk]);
#if HB_DETERMINISTIC
      dq_turn_wait(a, b, h, q0, bwd_tile(a), t);
#endif
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += QC) {
        float dq[QC / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          const uint32_t (&da)[4] = dsa[kk];
#pragma unroll
          for (int jd = 0; jd < QC / 16; ++jd) {
            uint32_t kb[4];
            ldsm_t(&sK[sw<CH>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), d0 / 8 + jd * 2 + (lane >> 4))], kb);
            mma(dq[2 * jd], da, kb[0], kb[1]);
            mma(dq[2 * jd + 1], da, kb[2], kb[3]);
          }
        }
        add_dq<QC>(dq, a, row0, q0 + warp * 16 + g, d0);
      }
#if HB_DETERMINISTIC
      dq_turn_done(a, b, h, q0);
#endif
    }
    st = nx;
  }
  report(a.error, t);
  // dK, dV rows of (b, kv head): [B, Hkv, Skv, D] contiguous (summed over b by the caller when k, v
  // broadcast over the batch).
  store_rows(acc, (Elem*)(dk_warp ? a.dk : a.dv) + ((b * a.Hkv + hk) * a.Skv + k0) * D, krow + g, kvalid);
}
#endif  // !HB_WG && !HB_SIMT_BWD

// ------------------------------------------------------------------------------ Hopper (sm_90a) kernels
// The same algorithm and per-element code on warpgroup MMAs (wgmma through CuTe's SM90 GMMA atoms): a
// warpgroup of 4 warps multiplies 64 rows at a time with its B operand (and A, unless it comes from
// registers) read from shared memory by the tensor cores, once per warpgroup instead of once per warp.
// Tiles live in GMMA's 128-byte-swizzled canonical form: [rows][D] as 64-column panels of 128-byte rows,
// each 8-row group 1024 bytes, 16-byte chunks XOR-ed with the row (the same swizzle as sw<8>). A tile is
// K-major for an operand whose reduction runs along its columns (Q, K, dO, V in S and dP) and MN-major
// where it runs along its rows (V in P V, K in dS K, P, dS, dO and Q in the dV and dK products).
#if HB_WG
template <int R>
__device__ __forceinline__ int pw(int row, int chunk) {
  return (chunk >> 3) * R * 8 + row * 8 + ((chunk & 7) ^ (row & 7));
}

// Part `part` of PARTS (whole rows each) of a ROWS x D tile into shared memory, thread tid of NT taking
// every NT-th 16-byte chunk; rows at or past `len` are zero-filled (and not read). NT is a multiple of the
// chunks in a row, so a thread keeps its column and steps its row by NT / CH: each chunk costs a pointer
// add, a compare and the copy (a division form cost about 30 instructions a chunk, 7 per score in the
// forward at D 128).
template <int ROWS, int NT, int PARTS = 1>
__device__ __forceinline__ void load_panels(uint4* s, const Elem* base, long long row0, long long ld, long long len,
                                            int tid = threadIdx.x, int part = 0) {
  constexpr int N = ROWS * CH / PARTS;  // chunks of a part
  constexpr int RS = NT / CH;           // rows a pass of the threads covers
  static_assert(ROWS % PARTS == 0 && NT % CH == 0, "parts of whole rows, passes of whole rows");
  const int i0 = part * N + tid, c = i0 % CH, r0 = i0 / CH;
  const int left = (int)lmin(len - row0, ROWS);  // rows inside the sequence
  const Elem* src = base + (row0 + r0) * ld + c * 8;
  const long long step = RS * ld;
#pragma unroll
  for (int k = 0; k < (N + NT - 1) / NT; ++k, src += step) {
    if (N % NT != 0 && tid + k * NT >= N) break;
    const int r = r0 + k * RS;
    const bool ok = r < left;
    const int at = RS % 8 == 0 ? pw<ROWS>(r0, c) + k * RS * 8 : pw<ROWS>(r, c);
    cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
        *reinterpret_cast<const cute::uint128_t*>(ok ? src : base), *reinterpret_cast<cute::uint128_t*>(&s[at]), ok);
  }
}

// A GMMA shared-memory descriptor (128-byte swizzle); byte offsets.
__device__ __forceinline__ uint64_t gmma_desc(const uint4* p, uint32_t lbo, uint32_t sbo) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = (uint16_t)(cute::cast_smem_ptr_to_uint(p) >> 4);
  d.bitfield.leading_byte_offset_ = (uint16_t)(lbo >> 4);
  d.bitfield.stride_byte_offset_ = (uint16_t)(sbo >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = (uint8_t)cute::SM90::GMMA::LayoutType::B128;
  return d.desc_;
}
// A descriptor moved by `chunks` 16-byte chunks: an add to its start address field, which cannot carry out
// (shared memory ends below 2^18 bytes, the 14-bit field's reach), so that a tile's descriptor is built
// once and each MMA's k-step is one integer add (building it from the address took about 5 instructions an
// MMA, SASS).
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t chunks) {
  return ((d >> 32) << 32) | (uint32_t)((uint32_t)d + chunks);
}
// K-major: rows row0 .. row0 + 63 (a multiple of 8) of an R-row tile, columns 16 kk .. 16 kk + 15.
template <int R>
__device__ __forceinline__ uint64_t kmajor(const uint4* tile, int row0, int kk) {
  return desc_at(gmma_desc(tile, 16, 1024), (kk >> 2) * R * 8 + row0 * 8 + (kk & 3) * 2);
}
// MN-major: rows 16 kk .. 16 kk + 15 of an R-row tile, all its columns (the panels R x 128 bytes apart).
template <int R>
__device__ __forceinline__ uint64_t mnmajor(const uint4* tile, int kk) {
  return desc_at(gmma_desc(tile, R * 128, 1024), kk * 16 * 8);
}

using cute::SM90::GMMA::Major;
template <int N, Major A, Major B>
struct WgSS;
template <int N, Major B>
struct WgRS;
#if HB_HALF
template <Major A, Major B> struct WgSS<64, A, B> { using Op = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<A, B>; };
template <Major A, Major B> struct WgSS<128, A, B> { using Op = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_SS<A, B>; };
template <Major B> struct WgRS<64, B> { using Op = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_RS<Major::K, B>; };
template <Major B> struct WgRS<128, B> { using Op = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_RS<Major::K, B>; };
#else
template <Major A, Major B> struct WgSS<64, A, B> { using Op = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<A, B>; };
template <Major A, Major B> struct WgSS<128, A, B> { using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<A, B>; };
template <Major B> struct WgRS<64, B> { using Op = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<Major::K, B>; };
template <Major B> struct WgRS<128, B> { using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<Major::K, B>; };
#endif

template <class Op, int M, size_t... I>
__device__ __forceinline__ void ss_fma(uint64_t a, uint64_t b, float (&d)[M], bool acc, std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., acc ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
template <class Op, int M, size_t... I>
__device__ __forceinline__ void rs_fma(const uint32_t (&a)[4], uint64_t b, float (&d)[M], bool acc, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., acc ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
// D (64 x N, the accumulator layout as float[N / 8][4]) (+)= A B, A from shared memory or registers.
template <Major MA, Major MB, int N>
__device__ __forceinline__ void wg_ss(uint64_t a, uint64_t b, float (&d)[N / 8][4], bool acc) {
  ss_fma<typename WgSS<N, MA, MB>::Op>(a, b, reinterpret_cast<float(&)[N / 2]>(d), acc, std::make_index_sequence<N / 2>{});
}
template <Major MB, int N>
__device__ __forceinline__ void wg_rs(const uint32_t (&a)[4], uint64_t b, float (&d)[N / 8][4], bool acc) {
  rs_fma<typename WgRS<N, MB>::Op>(a, b, reinterpret_cast<float(&)[N / 2]>(d), acc, std::make_index_sequence<N / 2>{});
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(d[j][e]);
}
// Shared-memory writes (cp.async, stores) made visible to the tensor cores' reads, then a CTA barrier.
__device__ __forceinline__ void sync_for_wgmma() {
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
}
// A 64 x N accumulator as bf16/fp16 A fragments, one per 16 columns (two n8 tiles make one k16), fenced
// so that the MMAs that read them need no implicit wait.
template <int N>
__device__ __forceinline__ void a_frags(const float (&s)[N / 8][4], uint32_t (&f)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    f[kk][0] = pack(s[2 * kk][0], s[2 * kk][1]), f[kk][1] = pack(s[2 * kk][2], s[2 * kk][3]);
    f[kk][2] = pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), f[kk][3] = pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(f[kk][e]);
  }
}

// Forward: one CTA of 2 warpgroups per 128 query rows (each warpgroup 64), key/value tiles of WFN rows
// (64; 128-row tiles, at D 64 and 128 where the BlockMask's kv blocks allow, go to flex_fwd_pp below,
// unless HB_FWD_PP=0) double-buffered (the next tile's copies go out once S is issued, so S need not wait
// for the block list's read). S = Q K^T and O += P V are wgmma, P from registers. Issuing S first took the
// D 64 forward from 1.25 to 1.16 ms (H100, B4 H16 S4096). Registers and shared memory at D 128 (nvcc
// -Xptxas -v): 198 registers and 160 KiB with 128-row tiles, 162 and 96 KiB with 64; the backward 254
// registers and 112 KiB, two CTAs per SM. Measured on the H200 with
// benchmarks/flex_kernel_lab.cu (D 128, B4 H16 S4096): forward 1.73 ms, backward 5.29 ms (the mma.sync
// forms 2.42 and 7.55). Tried and not kept: an S_{i+1} product in flight during tile i's softmax
// (2.09 ms: ptxas serialized the warpgroup MMAs around it), a backward of 2 warpgroups per CTA sharing
// 128-row query steps (6.16 ms: one CTA per SM, nothing to overlap its per-element work with; flex_bwd_ws
// below, kept, shares 64-row steps and overlaps with its split schedule and a dQ writer warpgroup).
constexpr int WFM = 128, WFT = 256;
template <int WFN>
constexpr int kFwdWgSmem = (WFM + 4 * WFN) * CH * 16;

template <int WFN>
__global__ void __launch_bounds__(WFT, 1) flex_fwd_wg(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ __align__(1024) uint4 wsmem[];
  uint4* sQ = wsmem;
  uint4* sKV = sQ + WFM * CH;  // [2][K, V] tiles of WFN rows
  const int warp = threadIdx.x / 32, wg = warp / 4, g = (threadIdx.x % 32) >> 2;
  const long long b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq, hk = h / (a.Hq / a.Hkv), bk = a.Bkv == 1 ? 0 : b;
  const long long q0 = (long long)blockIdx.x * WFM;
  const Elem* Q = (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1];
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  const Walk walk(a.kv_list, a.kv_full_list, b, h, q0 / a.q_block, a.kv_block, WFN, a.Skv);
  const int ntiles = walk.count();
  HbFlexTile t = {};
  t.b = b, t.h = h, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;
  auto load_kv = [&](long long k0, int buf) {
    load_panels<WFN, WFT>(sKV + buf * 2 * WFN * CH, K, k0, a.k_strides[2], a.Skv);
    load_panels<WFN, WFT>(sKV + (buf * 2 + 1) * WFN * CH, V, k0, a.v_strides[2], a.Skv);
  };

  load_panels<WFM, WFT>(sQ, Q, q0, a.q_strides[2], a.Sq);
  bool full = false;
  long long k0 = ntiles ? walk.first(0, &full) : 0;
  if (ntiles) load_kv(k0, 0);
  cute::cp_async_fence();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int i = 0; i < ntiles; ++i) {
    const int buf = i & 1;
    cute::cp_async_wait<0>();
    sync_for_wgmma();  // tile i has landed; every warpgroup is done with tile i - 1's buffer
    const uint4* sK = sKV + buf * 2 * WFN * CH;
    const uint4* sV = sK + WFN * CH;

    float s[WFN / 8][4];
    fence_acc(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, WFN>(kmajor<WFM>(sQ, wg * 64, kk), kmajor<WFN>(sK, 0, kk), s, kk > 0);
    cute::warpgroup_commit_batch();
    // The next tile's copies go out while S runs (their position is a read of the block list).
    bool full_next = false;
    long long k_next = 0;
    if (i + 1 < ntiles) {
      k_next = walk.first(i + 1, &full_next);
      load_kv(k_next, buf ^ 1);
    }
    cute::cp_async_fence();
    cute::warpgroup_wait<0>();
    fence_acc(s);

    const float sl = fwd_scores<WFN>(s, a, b, h, q0 + warp * 16 + g, k0, full, k0 + WFN <= a.Skv && q0 + WFM <= a.Sq, t);
    float corr[2];
    softmax_tile<WFN>(s, m, l, corr, sl);
    rescale(o, corr);

    uint32_t pa[WFN / 16][4];
    a_frags<WFN>(s, pa);
    fence_acc(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < WFN / 16; ++kk) wg_rs<Major::MN, D>(pa[kk], mnmajor<WFN>(sV, kk), o, true);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_acc(o);
    k0 = k_next, full = full_next;
  }
  fwd_store(o, m, l, a, b, h, q0 + warp * 16 + g, t);
  report(a.error, t);
}

// The forward at 128-key tiles (D 64 and 128), with its two warpgroups out of step ("ping-pong", as
// FlashAttention-3 schedules them): while one warpgroup's scores go through score_mod and the softmax on
// the CUDA cores, the other's products run on the tensor cores. Named barriers 1 and 2 pass the turn: a
// warpgroup issues its MMAs only on its turn and passes it on right after. Each turn issues S = Q K^T of
// tile i and O += P V of tile i - 1 (P kept in registers), so that P V also runs during the warpgroup's
// own softmax of tile i. Keys and values move through FNS stages each, guarded by mbarriers instead of a
// CTA barrier per tile: `full` completes when a tile's copies have landed (each copying thread's cp.async
// completion arriving), `empty` when the 256 consumer threads are done reading it (keys after S, values
// after P V, a tile later). The producer warpgroup (below) refills a stage as soon as it is empty. Before
// it, the consumers copied: a warpgroup refilled key tile i - 1's stage and value tile i - 2's at the end
// of its tile i, when the other warpgroup (half a tile behind) had released them. Registers and shared
// memory at D 128 (nvcc -Xptxas -v): 194 and 224 KiB. Measured on an H100 with benchmarks/flex_kernel_lab.cu
// (D 128, B4 H16 S4096), forward 1.734 ms -> 1.535 (317 -> 358 TFLOP/s), block-causal 0.978 -> 0.871; one
// S-only turn with P V right after the softmax gave 1.588. With 64-key tiles it was slower than
// flex_fwd_wg (D 64: 1.172 -> 1.477 ms: a 64-key tile is too short to hide the barriers), so it takes
// 128-key tiles at D 64 too: 1.16 -> 0.99 ms, block-causal 0.65 -> 0.56 (H100, the ninth session, after
// the loads by row steps and ex2). HB_FWD_PP=0 (the lab's baseline) turns it off.
#ifndef HB_FWD_PP
#define HB_FWD_PP 1
#endif
// A third warpgroup (the producer) makes the copies: it loads Q, then each key and value tile into its stage
// once the consumers have released it, so that the consumers' turns hold only their MMAs, score_mod and
// softmax (at D 64 the forward is bound by the consumers' instruction issue: of about 750 instructions a
// tile, SASS, about 150 were the refills' addresses and copies; now about 560). setmaxnreg gives the
// consumers kFpRegs and the producer kFpProducerRegs, from the 384 x 168 registers of the launch. Measured
// on the H200 (the lab, B4 H16 S4096 forward): D 64 1.00 -> 0.81 ms, block-causal 0.56 -> 0.47; D 128
// 1.24 -> 0.98, block-causal 0.71 -> 0.58. HB_FWD_PRODUCER=0 (the lab's baseline) has the consumers copy
// (their refills of tiles i + 2 and i + 1 at the end of tile i), as before.
#ifndef HB_FWD_PRODUCER
#define HB_FWD_PRODUCER 1
#endif
// Three consumer warpgroups (192-row CTAs, FlashAttention-3's shape at D 64) where every query row of the
// CTA lies in one query block of the BlockMask (no BlockMask: torch's empty one is one block of 2^30 rows):
// the turn passes round the three, each key and value tile is read from shared memory by 192 rows instead
// of 128, and a CTA's fixed work (Q's copy, the walk, the stores' tail) is spread over more rows. The
// consumers get 160 registers (512 threads); a unit whose 192-row kernel spills (a score_mod's code) keeps
// 128-row CTAs (fwd_pp_192). HB_FWD_3WG=0 (the lab's baseline) turns it off.
#ifndef HB_FWD_3WG
#define HB_FWD_3WG 1
#endif
// HB_FWD_3WG_TURNS=0 (a lab switch): the three consumers without turns, each issuing as it goes.
#ifndef HB_FWD_3WG_TURNS
#define HB_FWD_3WG_TURNS 1
#endif
constexpr int FNS = 3;
// The registers each thread of a CTA of `threads` holds at entry (one CTA an SM, allocated in units of 8):
// a setmaxnreg split shares these, not the SM's 64 Ki (a split that asks for more never gets them).
constexpr int launch_regs(int threads) { return 65536 / threads / 8 * 8; }
// flex_fwd_pp with NW consumer warpgroups: threads, the consumers' and the producer's registers.
template <int NW>
constexpr int kFpThreads = HB_FWD_PRODUCER ? NW * 128 + 128 : NW * 128;
template <int NW>
constexpr int kFpRegs = NW == 2 ? 232 : 160;
template <int NW>
constexpr int kFpProducerRegs = NW == 2 ? 40 : 32;
static_assert(2 * 128 * kFpRegs<2> + 128 * kFpProducerRegs<2> <= kFpThreads<2> * launch_regs(kFpThreads<2>),
              "flex_fwd_pp: setmaxnreg split");
static_assert(3 * 128 * kFpRegs<3> + 128 * kFpProducerRegs<3> <= 512 * launch_regs(512), "flex_fwd_pp: setmaxnreg split");
// Q, the stages, and mbarriers: full and empty of each key and value stage, and Q's.
template <int WFN, int NW = 2>
constexpr int kFwdPpSmem = (NW * 64 + 2 * FNS * WFN) * CH * 16 + (4 * FNS + 1) * 8;

__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(WFT) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, %1;" : : "r"(id), "r"(WFT) : "memory"); }

template <int WFN, int NW>
__global__ void __launch_bounds__(kFpThreads<NW>, 1) flex_fwd_pp(const __grid_constant__ HbFlexCudaArgs a) {
  static_assert(NW == 2 || (NW == 3 && HB_FWD_PRODUCER), "flex_fwd_pp: 2 consumer warpgroups, or 3 and the producer");
  constexpr int QM = NW * 64, QT = NW * 128;  // query rows, consumer threads
  constexpr bool kTurns = NW == 2 || HB_FWD_3WG_TURNS;
  extern __shared__ __align__(1024) uint4 wsmem[];
  uint4* sQ = wsmem;
  uint4* sKs = sQ + QM * CH;            // [FNS] key tiles of WFN rows
  uint4* sVs = sKs + FNS * WFN * CH;    // [FNS] value tiles
  uint64_t* bar = reinterpret_cast<uint64_t*>(sVs + FNS * WFN * CH);
  uint64_t *kfull = bar, *vfull = bar + FNS, *kempty = bar + 2 * FNS, *vempty = bar + 3 * FNS, *qfull = bar + 4 * FNS;
  const int warp = threadIdx.x / 32, wg = warp / 4, g = (threadIdx.x % 32) >> 2, wtid = threadIdx.x % 128;
  const long long b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq, hk = h / (a.Hq / a.Hkv), bk = a.Bkv == 1 ? 0 : b;
  const long long q0 = (long long)blockIdx.x * QM;
  const Elem* Q = (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1];
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  const Walk walk(a.kv_list, a.kv_full_list, b, h, q0 / a.q_block, a.kv_block, WFN, a.Skv);
  const int ntiles = walk.count();
  constexpr int kLoaders = HB_FWD_PRODUCER ? 128 : WFT;  // the threads whose copies complete a full barrier
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2 * FNS; ++s) cutlass::arch::ClusterBarrier::init(&bar[s], kLoaders);
    for (int s = 2 * FNS; s < 4 * FNS; ++s) cutlass::arch::ClusterBarrier::init(&bar[s], QT);
    cutlass::arch::ClusterBarrier::init(qfull, 128);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // Tile i's copies into its stage, each of the kLoaders threads taking its share of the rows, its copies'
  // completion arriving on full.
  auto load = [&](const Elem* src, long long ld, uint4* tiles, uint64_t* full, int i, long long k0, int tid, int part) {
    load_panels<WFN, 128, kLoaders / 128>(tiles + (i % FNS) * WFN * CH, src, k0, ld, a.Skv, tid, part);
    cutlass::arch::cpasync_barrier_arrive_noinc(&full[i % FNS]);
  };
#if !HB_FWD_PRODUCER
  auto tile_at = [&](int i) {
    bool f;
    return walk.first(i, &f);
  };
#endif
  auto wait = [](uint64_t* b_, int i) { cutlass::arch::ClusterBarrier::wait(&b_[i % FNS], (uint32_t)(i / FNS) & 1u); };
#if HB_FWD_PRODUCER
  if (wg == NW) {  // the producer: Q, then key tile i and value tile i as their stages free up
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" : : "n"(kFpProducerRegs<NW>) : "memory");
    load_panels<QM, 128>(sQ, Q, q0, a.q_strides[2], a.Sq, wtid);
    cutlass::arch::cpasync_barrier_arrive_noinc(qfull);
    WalkPos pos;
    for (int i = 0; i < ntiles; ++i, pos.advance(walk)) {
      bool f;
      const long long k0 = pos.at(walk, &f);
      if (i >= FNS) wait(kempty, i - FNS);
      load(K, a.k_strides[2], sKs, kfull, i, k0, wtid, 0);
      if (i >= FNS) wait(vempty, i - FNS);
      load(V, a.v_strides[2], sVs, vfull, i, k0, wtid, 0);
    }
    cute::cp_async_wait<0>();
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" : : "n"(kFpRegs<NW>) : "memory");
  cutlass::arch::ClusterBarrier::wait(qfull, 0);
#else
  load_panels<QM, 128, 2>(sQ, Q, q0, a.q_strides[2], a.Sq, wtid, wg);
  if (ntiles == 0) cute::cp_async_wait<0>();
  for (int i = 0; i < FNS && i < ntiles; ++i) {
    load(K, a.k_strides[2], sKs, kfull, i, tile_at(i), wtid, wg);
    load(V, a.v_strides[2], sVs, vfull, i, tile_at(i), wtid, wg);
  }
#endif
  HbFlexTile t = {};
  t.b = b, t.h = h, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;
  // The turn goes round the consumers, warpgroup w waiting on barrier 1 + w; the last starts it.
  if (kTurns && wg == NW - 1) named_arrive(1);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[WFN / 16][4] = {};  // P of the tile before, as A fragments
  // Tile i's stage (i % FNS) and its mbarriers' phase ((i / FNS) & 1), and tile i - 1's (0 and 0 at i = 0,
  // whose P V, of a P of 0, reads value stage 0), counted along instead of divided out each tile.
  int st = 0, pst = 0;
  uint32_t ph = 0, pph = 0;
  WalkPos pos;
  for (int i = 0; i < ntiles; ++i, pos.advance(walk)) {
    bool full = false;
    const long long k0 = pos.at(walk, &full);
    cutlass::arch::ClusterBarrier::wait(&kfull[st], ph);
    cutlass::arch::ClusterBarrier::wait(&vfull[pst], pph);
    cutlass::arch::fence_view_async_shared();
    const uint4* sK = sKs + st * WFN * CH;
    float s[WFN / 8][4];
    fence_acc(s);
    fence_acc(o);
    if (kTurns) named_sync(1 + wg);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, WFN>(kmajor<QM>(sQ, wg * 64, kk), kmajor<WFN>(sK, 0, kk), s, kk > 0);
    cute::warpgroup_commit_batch();
    {  // at i = 0, P is 0: a product that adds nothing keeps the MMAs' order the same in every step
      const uint4* sV = sVs + pst * WFN * CH;
#pragma unroll
      for (int kk = 0; kk < WFN / 16; ++kk) wg_rs<Major::MN, D>(pa[kk], mnmajor<WFN>(sV, kk), o, true);
      cute::warpgroup_commit_batch();
    }
    if (kTurns) named_arrive(1 + (wg + 1) % NW);
    cute::warpgroup_wait<1>();
    fence_acc(s);
    cutlass::arch::ClusterBarrier::arrive(&kempty[st]);

    const float sl = fwd_scores<WFN>(s, a, b, h, q0 + warp * 16 + g, k0, full, k0 + WFN <= a.Skv && q0 + QM <= a.Sq, t);
    float corr[2];
    softmax_tile<WFN>(s, m, l, corr, sl);
    cute::warpgroup_wait<0>();
    fence_acc(o);
    if (i > 0) cutlass::arch::ClusterBarrier::arrive(&vempty[pst]);
    rescale(o, corr);
    a_frags<WFN>(s, pa);
#if !HB_FWD_PRODUCER
    if (i >= 1 && i - 1 + FNS < ntiles) {  // key tile i + 2's copies into key tile i - 1's stage
      wait(kempty, i - 1);
      load(K, a.k_strides[2], sKs, kfull, i - 1 + FNS, tile_at(i - 1 + FNS), wtid, wg);
    }
    if (i >= 2 && i - 2 + FNS < ntiles) {  // value tile i + 1's into value tile i - 2's
      wait(vempty, i - 2);
      load(V, a.v_strides[2], sVs, vfull, i - 2 + FNS, tile_at(i - 2 + FNS), wtid, wg);
    }
#endif
    pst = st, pph = ph;
    if (++st == FNS) st = 0, ph ^= 1u;
  }
  if (ntiles > 0) {
    cutlass::arch::ClusterBarrier::wait(&vfull[pst], pph);  // tile ntiles - 1's, after the loop's last step
    cutlass::arch::fence_view_async_shared();
    const uint4* sV = sVs + pst * WFN * CH;
    fence_acc(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < WFN / 16; ++kk) wg_rs<Major::MN, D>(pa[kk], mnmajor<WFN>(sV, kk), o, true);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_acc(o);
  }
  if (kTurns && wg == 0) named_sync(1);
  fwd_store(o, m, l, a, b, h, q0 + warp * 16 + g, t);
  report(a.error, t);
}
template <int WFN, int NW = 2>
int launch_fwd_pp(const HbFlexCudaArgs& a, void* stream) {
  const dim3 grid((unsigned)((a.Sq + NW * 64 - 1) / (NW * 64)), (unsigned)(a.B * a.Hq));
  cudaError_t e = cudaFuncSetAttribute(flex_fwd_pp<WFN, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdPpSmem<WFN, NW>);
  if (e != cudaSuccess) return (int)e;
  flex_fwd_pp<WFN, NW><<<grid, kFpThreads<NW>, kFwdPpSmem<WFN, NW>, (cudaStream_t)stream>>>(a);
  return (int)cudaGetLastError();
}
// Three consumer warpgroups: at D 64 only (a D 128 unit does not build the 192-row kernel: at 160
// registers its accumulators would not fit).
#define HB_FWD_192 (HB_FWD_3WG && HB_FWD_PRODUCER && HB_D == 64)
#if HB_FWD_192
// Whether this call runs 192-row CTAs: every CTA's rows lie in one query block, and the unit's 192-row
// kernel keeps all its registers (no local memory: asked of the driver once); else 128-row CTAs.
inline bool fwd_pp_192(const HbFlexCudaArgs& a) {
  static const bool no_spill = [] {
    cudaFuncAttributes f;
    return cudaFuncGetAttributes(&f, flex_fwd_pp<128, 3>) == cudaSuccess && f.localSizeBytes == 0;
  }();
  return (a.q_block >= a.Sq || a.q_block % 192 == 0) && no_spill;
}
#endif

// Backward: one CTA of one warpgroup per 64 key rows of one (b, kv head), two CTAs per SM (so that one's
// per-element work overlaps the other's MMAs), over the same steps as flex_bwd but of 64 query rows
// (the q lists, every query head of the GQA group, the next step's Q and dO double-buffered): S = Q K^T
// and dP = dO V^T, P and dS to shared memory, then dV += P^T dO, dK += dS^T Q and dQ = dS K (dS from
// registers) in one batch, dQ added into the float accumulator.
constexpr int WBM = 64, WBN = 64, WBT = 128;
constexpr int kBwdWgLineExtra =
    (kLineTileBytes<WBM, WBN> > 2 * WBM * 8 * 16 ? kLineTileBytes<WBM, WBN> - 2 * WBM * 8 * 16 + 15 : 0) / 16 * 16;
constexpr int kBwdWgSmem = (2 * WBN * CH + 4 * WBM * CH + 2 * WBM * 8) * 16 + kBwdWgLineExtra;

__global__ void __launch_bounds__(WBT, 2) flex_bwd_wg(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ __align__(1024) uint4 wsmem[];
  uint4* sK = wsmem;
  uint4* sV = sK + WBN * CH;
  uint4* sQ0 = sV + WBN * CH;
  uint4* sP = sQ0 + 4 * WBM * CH;
  uint4* sdS = sP + WBM * 8;
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) >> 2;
  const long long bh = bwd_pair(a) + a.bh0, b = bh / a.Hkv, hk = bh % a.Hkv, bk = a.Bkv == 1 ? 0 : b;
  const long long k0 = bwd_tile(a) * WBN;
  const int kvalid = (int)lmin(WBN, a.Skv - k0);
  load_panels<WBN, WBT>(sK, (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1], k0, a.k_strides[2], a.Skv);
  load_panels<WBN, WBT>(sV, (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1], k0, a.v_strides[2], a.Skv);
  cute::cp_async_fence();

  float dv[D / 8][4] = {}, dk[D / 8][4] = {};
  HbFlexTile t = {};
  t.b = b, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;

  auto load_step = [&](long long h, long long q0, int buf) {
    load_panels<WBM, WBT>(sQ0 + buf * 2 * WBM * CH, (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1], q0,
                          a.q_strides[2], a.Sq);
    load_panels<WBM, WBT>(sQ0 + (buf * 2 + 1) * WBM * CH,
                          (const Elem*)a.dout + b * a.do_strides[0] + h * a.do_strides[1], q0, a.do_strides[2], a.Sq);
  };
  Steps st(a, b, hk, k0 / a.kv_block, WBM);
  bool full = false;
  if (!st.done()) load_step(st.h, st.q0(&full), 0);
  cute::cp_async_fence();
  for (int buf = 0; !st.done(); buf ^= 1) {
    const long long h = st.h, q0 = st.q0(&full);
    t.h = h;
    const long long row0 = (b * a.Hq + h) * a.Sq;
    const Steps nx = st.next();
    cute::cp_async_wait<0>();
    sync_for_wgmma();
    if (!nx.done()) {
      bool unused;
      load_step(nx.h, nx.q0(&unused), buf ^ 1);
    }
    cute::cp_async_fence();
    const uint4* sQ = sQ0 + buf * 2 * WBM * CH;
    const uint4* sdO = sQ + WBM * CH;

    float s[WBN / 8][4], dp[WBN / 8][4];
    fence_acc(s);
    fence_acc(dp);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, WBN>(kmajor<WBM>(sQ, 0, kk), kmajor<WBN>(sK, 0, kk), s, kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, WBN>(kmajor<WBM>(sdO, 0, kk), kmajor<WBN>(sV, 0, kk), dp, kk > 0);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_acc(s);
    fence_acc(dp);

    const bool inside = k0 + WBN <= a.Skv && q0 + WBM <= a.Sq;
#if HB_SCATTER
    const LineStep line = line_probe<WBM, WBN>(reinterpret_cast<float*>(sP), b, h, q0, k0, inside, t, a);
#else
    const LineStep line{};
#endif
    bwd_p_ds<WBN>(s, dp, a, b, h, q0, warp * 16 + g, k0, full, inside, row0, t, line);
#if HB_SCATTER
    if (line.tile) line_reduce<WBM, WBN, WBT>(line, a, q0, window_of(a, b, h));
#endif
    store_p_ds<WBN>(s, dp, sP, sdS, warp * 16 + g, [](int r, int c) { return pw<WBM>(r, c); });
    uint32_t da[WBN / 16][4];
    a_frags<WBN>(dp, da);
    sync_for_wgmma();

#if HB_BWD_DQ_FIRST && !HB_DETERMINISTIC
    // dQ's first 64 columns go before dV and dK, so that their reductions go out while dV and dK multiply.
    float dq0[8][4];
    fence_acc(dq0);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < WBN / 16; ++kk) wg_rs<Major::MN, 64>(da[kk], mnmajor<WBN>(sK, kk), dq0, kk > 0);
    cute::warpgroup_commit_batch();
#endif
    fence_acc(dv);
    fence_acc(dk);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < WBM / 16; ++kk) wg_ss<Major::MN, Major::MN, D>(mnmajor<WBM>(sP, kk), mnmajor<WBM>(sdO, kk), dv, true);
#pragma unroll
    for (int kk = 0; kk < WBM / 16; ++kk) wg_ss<Major::MN, Major::MN, D>(mnmajor<WBM>(sdS, kk), mnmajor<WBM>(sQ, kk), dk, true);
    cute::warpgroup_commit_batch();
#if HB_DETERMINISTIC
    // dQ whole, then the CTA's turn to add it: the turns hold only the adds.
    float dq[D / 64][8][4];
#pragma unroll
    for (int x = 0; x < D / 64; ++x) {
      fence_acc(dq[x]);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < WBN / 16; ++kk) wg_rs<Major::MN, 64>(da[kk], mnmajor<WBN>(sK + x * WBN * 8, kk), dq[x], kk > 0);
      cute::warpgroup_commit_batch();
    }
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int x = 0; x < D / 64; ++x) fence_acc(dq[x]);
    dq_turn_wait(a, b, h, q0, bwd_tile(a), t);
#pragma unroll
    for (int x = 0; x < D / 64; ++x) add_dq<64>(dq[x], a, row0, q0 + warp * 16 + g, x * 64);
    dq_turn_done(a, b, h, q0);
#else
#if HB_BWD_DQ_FIRST
    cute::warpgroup_wait<1>();  // dQ's first half done; dV and dK may still run
    fence_acc(dq0);
    add_dq<64>(dq0, a, row0, q0 + warp * 16 + g, 0);
#endif
#pragma unroll
    for (int d0 = HB_BWD_DQ_FIRST ? 64 : 0; d0 < D; d0 += 64) {
      float dq[8][4];
      fence_acc(dq);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < WBN / 16; ++kk) wg_rs<Major::MN, 64>(da[kk], mnmajor<WBN>(sK + d0 / 64 * WBN * 8, kk), dq, kk > 0);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_acc(dq);
      add_dq<64>(dq, a, row0, q0 + warp * 16 + g, d0);
    }
    cute::warpgroup_wait<0>();  // dV and dK (at D 64 nothing waited for them above)
#endif
    fence_acc(dv);
    fence_acc(dk);
    st = nx;
  }
  report(a.error, t);
  store_rows(dv, (Elem*)a.dv + ((b * a.Hkv + hk) * a.Skv + k0) * D, warp * 16 + g, kvalid);
  store_rows(dk, (Elem*)a.dk + ((b * a.Hkv + hk) * a.Skv + k0) * D, warp * 16 + g, kvalid);
}
template <int WFN>
int launch_fwd_wg(const HbFlexCudaArgs& a, dim3 grid, void* stream) {
  cudaError_t e = cudaFuncSetAttribute(flex_fwd_wg<WFN>, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdWgSmem<WFN>);
  if (e != cudaSuccess) return (int)e;
  flex_fwd_wg<WFN><<<grid, WFT, kFwdWgSmem<WFN>, (cudaStream_t)stream>>>(a);
  return (int)cudaGetLastError();
}

// Backward at D 64 and 128, FlashAttention-3's CTA shape (flex_bwd_ws): one CTA per
// 128 key rows of one (b, kv head), one CTA per SM, of 3 warpgroups: 2 consumers (warpgroup w owns keys
// k0 + 64 w ..) and a dQ writer. Each step's 64-row Q and dO tiles are loaded once into shared memory
// (cp.async, double-buffered) and read by both consumers, so Q/dO traffic per key is half flex_bwd_wg's.
// At D 64 (kWsLoader) the writer warpgroup makes those copies two steps ahead and hands over each step's
// record (WsStep): copied by the consumers, they were about 300 of 1 600 instructions a step in the
// consumers' loop (SASS), and the D 64 backward went from 2.76 to 2.46 ms (H200 lab, B4 H16 S4096; block-causal
// 1.46 to 1.32). At D 128 the consumers copy (the same time, and one register spilled at 232), and so they do
// with deterministic=True (the writer's turns held the copies back: D 64 2.96 to 3.76 ms). Per step each
// consumer computes its S and dP (64 x 64, SS, two MMA batches);
// on the short path (full or no mask, tile inside both sequences) P is computed while dP multiplies, and
// dV += P^T dO goes out on this warpgroup's P panel before dS is computed (the "split schedule"); else P
// and dS come from bwd_p_ds (the per-element code every backward shares). P and dS go into shared
// [64 q][128 k] tiles (consumer w's keys in panel w); after a barrier of the consumers, consumer w computes
// dQ's columns 64 w .. 64 w + 63 over all 128 keys (dS K, SS: dS K-major, K MN-major), so that the tensor
// cores sum dQ over the CTA's keys (at D 64 consumer w computes all 64 columns over its own 64 keys, and
// the writer adds the two tiles), and dK += dS^T Q. dQ then goes into a swizzled float tile in shared
// memory and the consumers go on; the writer warpgroup reads the tile row by row and adds it into the float
// accumulator with 16-byte reductions (red.global.add.v4.f32; a warp a 512-byte row, coalesced), off the
// consumers' path. setmaxnreg gives the consumers 240 registers and the writer 24 (the launch bound, 384
// threads, leaves 168 at entry; with the writer's copies or deterministic=True 232 and 40, kWsRegs below). Named barriers: 1 the
// consumers (256 threads), 2 + w consumer w (128), kWsFull and kWsEmpty the dQ tile's hand-over (384),
// kWsWriter the writer's own (128).
// deterministic=True: the writer takes the CTA's turn before each step's adds, as its two 64-key tiles
// (dq_turn_wait; rank of the first, the counter moved by both), so only the writer waits, and the
// consumers, one dQ tile ahead, wait only when the next tile is due. Measured (H100, the lab, B4 H16 S4096
// backward): D128 4.00 ms against 3.80 without turns (flex_bwd_wg's turns 7.03), block-causal 2.27 against
// 2.05; D64 3.17 against 3.00, block-causal 1.73 against 1.59.
// Measured and the variants that were tried (float2 reductions from the accumulators, bulk reductions from
// a shared tile, float4 reductions via shuffles, dQ's own-key k-steps from registers, a form pipelined across
// steps): docs/flex-attention.md. Compiled where HB_WS (at the top) holds: Hopper, D 64 or 128, bf16 or
// fp16, a buffer gradient scatter only at D 128; launched where the kv blocks are multiples of 128 rows,
// else flex_bwd_wg runs. A score_mod runs per element on the split schedule, a
// joint's tiles through bwd_p_ds; a buffer gradient along lines is summed per consumer over its 64 x 64
// tile (line_reduce).
// Measured against flex_bwd_wg (H100, the lab, D128 B4 H16 S4096 backward): ALiBi 4.70 against 5.70 ms,
// causal 2.50 against 3.08; a soft cap 8.35 against 9.05.
// HB_BWD_WS=0 (the lab's baseline) turns it off.
#if HB_WS
constexpr int WSN = 128, WSM = 64, WSC = 256, WST = 384;  // keys, query rows a step, consumer threads, threads
// setmaxnreg: consumers, writer. They share the registers the CTA got at launch (384 threads x 168; not the
// SM's 64 Ki): a split that asks for more leaves the consumers' setmaxnreg.inc waiting for ever (the
// deterministic writer at 32 with consumers at 240 hung). The writer 40 for its copies (at 24 it spilled
// about 90 instructions) or its turns (a few spills at D 64, off the consumers' path), the consumers 232 (no
// spills at D 64).
constexpr bool kWsLoader = D == 64 && !HB_DETERMINISTIC;  // the writer makes the Q/dO copies
constexpr int kWsRegs = kWsLoader || HB_DETERMINISTIC ? 232 : 240;
constexpr int kWsWriterRegs = kWsLoader || HB_DETERMINISTIC ? 40 : 24;
static_assert(2 * 128 * kWsRegs + 128 * kWsWriterRegs <= WST * launch_regs(WST), "flex_bwd_ws: setmaxnreg split");
constexpr int kWsFull = 5, kWsEmpty = 6;                  // named barriers of the dQ tile
constexpr int kWsWriter = 7;                              // the writer's own (deterministic=True: its turns)
// The float dQ tiles a step hands the writer: at D 128 one, consumer w's columns 64 w .. 64 w + 63 over the
// CTA's 128 keys; at D 64 two, consumer w's whole dQ over its own 64 keys, which the writer adds.
constexpr int kWsDqTiles = D == 128 ? 1 : 2;
// K, V; Q, dO double-buffered; P, dS; the float dQ tiles and their WsInfo.
// A buffer gradient's line tiles (line_reduce), one [64][65] float tile a consumer, overlay P and dS (then
// the last tiles but the hand-over) and reach 512 bytes past them.
constexpr int kWsLineExtra =
    (2 * kLineTileBytes<WSM, 64> > 2 * WSM * 16 * 16 ? 2 * kLineTileBytes<WSM, 64> - 2 * WSM * 16 * 16 + 15 : 0) / 16 * 16;
// The writer's Q/dO stages: full and empty mbarriers of each, and the step each holds (WsStep).
constexpr int kWsLoadBytes = kWsLoader ? 4 * 8 + 2 * 32 : 0;
constexpr int kBwdWsSmem =
    (2 * WSN * CH + 4 * WSM * CH + 2 * WSM * 16) * 16 + kWsDqTiles * WSM * D * 4 + kWsLineExtra + 16 + kWsLoadBytes;

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" : : "r"(id), "r"(n) : "memory"); }
// Shared-memory writes made visible to the tensor cores, then a barrier of the 256 consumer threads.
__device__ __forceinline__ void cons_sync() {
  cutlass::arch::fence_view_async_shared();
  bar_sync(1, WSC);
}
__device__ __forceinline__ void red_v4(float* p, float x, float y, float z, float w) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" : : "l"(p), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}
// A swizzled [64][D] float dQ tile: element (row, col); 16-byte chunks XOR-ed with row % 8, so that
// the consumers' float2 stores (8 rows a warp) and the writer's float4 row reads avoid bank conflicts.
__device__ __forceinline__ int dqt(int row, int col) { return row * D + (((col >> 2) ^ (row & 7)) << 2) + (col & 3); }
// What the consumers hand the writer with a dQ tile.
struct WsInfo {
  long long off;    // the step's first dQ accumulator row
  int nrows, last;  // rows inside the sequence; 1: the CTA's last step
};
// A Q/dO stage's step, as the writer's walk gave it (the consumers read it instead of walking).
struct WsStep {
  long long q0;
  int h, full, last, pad;
};
static_assert(sizeof(WsStep) <= 32, "kWsLoadBytes");

__global__ void __launch_bounds__(WST, 1) flex_bwd_ws(const __grid_constant__ HbFlexCudaArgs a) {
  static_assert((!HB_SCATTER || D == 128) && (D == 64 || D == 128), "flex_bwd_ws: HB_WS");
  extern __shared__ __align__(1024) uint4 wsmem[];
  uint4* sK = wsmem;
  uint4* sV = sK + WSN * CH;
  uint4* sQ0 = sV + WSN * CH;
  // P and dS: [64 q][128 k], consumer w's keys in panel w; the float dQ tiles: kWsDqTiles x [64][D] (dqt).
#if HB_SCATTER
  // The line tiles overlay P and dS and pass them by kWsLineExtra: P and dS after the dQ tiles.
  float* sdQ = reinterpret_cast<float*>(sQ0 + 4 * WSM * CH);
  uint4* sP = reinterpret_cast<uint4*>(sdQ + kWsDqTiles * WSM * D);
  uint4* sdS = sP + WSM * 16;
  WsInfo* info = reinterpret_cast<WsInfo*>(reinterpret_cast<char*>(sdS + WSM * 16) + kWsLineExtra);
#else
  uint4* sP = sQ0 + 4 * WSM * CH;
  uint4* sdS = sP + WSM * 16;
  float* sdQ = reinterpret_cast<float*>(sdS + WSM * 16);
  WsInfo* info = reinterpret_cast<WsInfo*>(sdQ + kWsDqTiles * WSM * D);
#endif
  uint64_t* qfull = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(info) + 16);  // [2], then qempty [2]
  uint64_t* qempty = qfull + 2;
  WsStep* steps = reinterpret_cast<WsStep*>(qfull + 4);  // [2]
  const int warp = threadIdx.x / 32, wg = warp / 4, g = (threadIdx.x % 32) >> 2, lq = (warp & 3) * 16 + g;
  const long long bh = bwd_pair(a) + a.bh0, b = bh / a.Hkv, hk = bh % a.Hkv, bk = a.Bkv == 1 ? 0 : b;
  const long long k0 = bwd_tile(a) * WSN, kw = k0 + wg * 64;
  Steps st(a, b, hk, k0 / a.kv_block, WSM);
  if constexpr (kWsLoader) {
    if (threadIdx.x == 0) {
      // full: the writer's 128 copying threads (cp.async completion) and its thread 0's arrival after it
      // wrote the stage's WsStep; empty: the 256 consumer threads once the step's MMAs are done
      for (int i = 0; i < 2; ++i) cutlass::arch::ClusterBarrier::init(&qfull[i], 129);
      for (int i = 0; i < 2; ++i) cutlass::arch::ClusterBarrier::init(&qempty[i], WSC);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
  }

  if (wg == 2) {  // the dQ writer: a tile per step, until the consumers mark the last (kWsLoader: and the Q/dO copies)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" : : "n"(kWsWriterRegs) : "memory");
    if (st.done()) return;  // (no steps: the consumers hand over nothing either)
    const int wt = threadIdx.x & 127;
    // Step `ls`'s Q and dO into stage `stage` (two ahead of the consumers), and the step's record.
    auto load = [&](const Steps& ls, int stage) {
      bool f = false;
      const long long q0 = ls.q0(&f);
      load_panels<WSM, 128>(sQ0 + stage * 2 * WSM * CH, (const Elem*)a.q + b * a.q_strides[0] + ls.h * a.q_strides[1],
                            q0, a.q_strides[2], a.Sq, wt);
      load_panels<WSM, 128>(sQ0 + (stage * 2 + 1) * WSM * CH,
                            (const Elem*)a.dout + b * a.do_strides[0] + ls.h * a.do_strides[1], q0, a.do_strides[2],
                            a.Sq, wt);
      cutlass::arch::cpasync_barrier_arrive_noinc(&qfull[stage]);
      if (wt == 0) {
        steps[stage].q0 = q0, steps[stage].h = (int)ls.h, steps[stage].full = f, steps[stage].last = ls.next().done();
        cutlass::arch::ClusterBarrier::arrive(&qfull[stage]);
      }
    };
    Steps ld = st;  // the next step to load
    if constexpr (kWsLoader) {
      load(ld, 0);
      ld = ld.next();
      if (!ld.done()) load(ld, 1), ld = ld.next();
    }
    int i = 0;  // the step whose dQ tile comes next
    [[maybe_unused]] HbFlexTile tw = {};  // deterministic=True: a turn that never came (dq_turn_spin)
    tw.b = b;
    bar_arrive(kWsEmpty, WST);
    for (;; ++i) {
      // Step i's stage frees once its MMAs are done (just after its dQ tile): step i + 2 goes there,
      // with step i + 1's time to land.
      if (kWsLoader && !ld.done()) {
        cutlass::arch::ClusterBarrier::wait(&qempty[i & 1], (uint32_t)(i >> 1) & 1u);
        load(ld, i & 1);
        ld = ld.next();
      }
      bar_sync(kWsFull, WST);
      const long long off = info->off;
      const int nrows = info->nrows, last = info->last;
      float* dst = a.dq + off * D;
#if HB_DETERMINISTIC
      // The CTA's turn, as its two 64-key tiles (dq_turn_wait): the step's (h, q0) from its dQ row (a step
      // past the end of the sequence, no rows, takes none).
      const long long grow = off + a.dq_row0, h = grow / a.Sq - b * a.Hq, q0 = grow % a.Sq;
      const long long kt = 2 * bwd_tile(a), ntiles = (a.Skv + 63) / 64;
      if (wt == 0 && nrows > 0) tw.h = h, dq_turn_spin(a, b, h, q0, kt, tw);
      bar_sync(kWsWriter, 128);
#endif
#pragma unroll 4
      for (int e = 0; e < WSM * D / 4 / 128; ++e) {
        // a warp 32 16-byte chunks of consecutive rows: one row at D 128, two at D 64
        const int c = e * 128 + wt, row = c / (D / 4), ch = c % (D / 4), at = row * D + ((ch ^ (row & 7)) << 2);
        float4 x = *reinterpret_cast<const float4*>(sdQ + at);
        if constexpr (kWsDqTiles == 2) {
          const float4 y = *reinterpret_cast<const float4*>(sdQ + WSM * D + at);
          x.x += y.x, x.y += y.y, x.z += y.z, x.w += y.w;
        }
        if (row < nrows) red_v4(dst + (long long)row * D + ch * 4, x.x, x.y, x.z, x.w);
      }
#if HB_DETERMINISTIC
      __threadfence();  // (dq_turn_done) the adds are visible before the next key tiles' turn
      bar_sync(kWsWriter, 128);
      if (wt == 0 && nrows > 0) atomicAdd(dq_turn_counter(a, b, h, q0), kt + 1 < ntiles ? 2 : 1);
#endif
      if (last) break;
      bar_arrive(kWsEmpty, WST);
    }
    if constexpr (kWsLoader) cute::cp_async_wait<0>();
#if HB_DETERMINISTIC
    if (wt == 0) report(a.error, tw);
#endif
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" : : "n"(kWsRegs) : "memory");

  const int kvalid = (int)lmin(64, a.Skv - kw);
  load_panels<WSN, WSC>(sK, (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1], k0, a.k_strides[2], a.Skv);
  load_panels<WSN, WSC>(sV, (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1], k0, a.v_strides[2], a.Skv);
  cute::cp_async_fence();

  float dv[D / 8][4] = {}, dk[D / 8][4] = {};
  HbFlexTile t = {};
  t.b = b, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;

  // Without the writer's copies (kWsLoader), the consumers copy step i + 1's Q and dO while step i runs.
  auto load_step = [&](long long h, long long q0, int buf) {
    load_panels<WSM, WSC>(sQ0 + buf * 2 * WSM * CH, (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1], q0,
                          a.q_strides[2], a.Sq);
    load_panels<WSM, WSC>(sQ0 + (buf * 2 + 1) * WSM * CH,
                          (const Elem*)a.dout + b * a.do_strides[0] + h * a.do_strides[1], q0, a.do_strides[2], a.Sq);
  };
  bool full = false;
  if constexpr (kWsLoader) {
    cute::cp_async_wait<0>();  // K and V (cons_sync below makes them every consumer's)
  } else {
    if (!st.done()) load_step(st.h, st.q0(&full), 0);
    cute::cp_async_fence();
  }
  for (int i = 0, buf = 0, last = st.done(); !last; ++i, buf ^= 1) {
    long long h, q0;
    if constexpr (kWsLoader) {
      cutlass::arch::ClusterBarrier::wait(&qfull[buf], (uint32_t)(i >> 1) & 1u);  // the writer's copies and record
      const WsStep sp = steps[buf];
      h = sp.h, q0 = sp.q0, full = sp.full, last = sp.last;
      cons_sync();  // both consumers are done with the last step's tiles
    } else {
      h = st.h, q0 = st.q0(&full);
      st = st.next();
      last = st.done();
      cute::cp_async_wait<0>();
      cons_sync();  // this step's Q and dO are in; both consumers are done with the last step's tiles
      if (!last) {
        bool unused;
        load_step(st.h, st.q0(&unused), buf ^ 1);
      }
      cute::cp_async_fence();
    }
    t.h = h;
    const long long row0 = (b * a.Hq + h) * a.Sq;
    const uint4* sQ = sQ0 + buf * 2 * WSM * CH;
    const uint4* sdO = sQ + WSM * CH;

    // This step's logsumexp and delta rows are read before the MMAs (not after their wait), and S and dP go
    // out as two batches, so that the short path can compute P while dP multiplies.
    float lse_r[2], dl_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const long long qi = q0 + lq + 8 * r;
      lse_r[r] = qi < a.Sq ? a.lse[row0 + qi] : -INFINITY;
      dl_r[r] = qi < a.Sq ? a.delta[row0 + qi] : 0.f;
    }
    float s[8][4], dp[8][4];
    fence_acc(s);
    fence_acc(dp);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, 64>(kmajor<WSM>(sQ, 0, kk), kmajor<WSN>(sK, wg * 64, kk), s, kk > 0);
    cute::warpgroup_commit_batch();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wg_ss<Major::K, Major::K, 64>(kmajor<WSM>(sdO, 0, kk), kmajor<WSN>(sV, wg * 64, kk), dp, kk > 0);
    cute::warpgroup_commit_batch();

    const bool inside = kw + 64 <= a.Skv && q0 + WSM <= a.Sq;
    // The split schedule's tiles: inside both sequences with no mask_mod to call (bwd_p_ds's short path's
    // tiles), a score_mod included (per element as p_ds_elem computes it). A joint's tiles go through
    // bwd_p_ds: keeping the scaled scores across the dP wait for it spilled and was slower (a soft cap, D128
    // B4 H16 S4096 on an H100: 8.9 against 8.35 ms).
    const bool fast = (full || !HB_MASK_MOD) && inside && !HB_JOINT;
    if (fast) {  // the split schedule: P, dV on it, then dS
      cute::warpgroup_wait<1>();  // S (dP may still run)
      fence_acc(s);
      const int t4 = threadIdx.x & 3;
      [[maybe_unused]] const float sl = a.scale * kLog2e;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        [[maybe_unused]] const float shift = lse_r[r] == -INFINITY ? INFINITY : lse_r[r];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#if HB_SCORE_ELEM
            const float x = hb_score_mod<float>(s[j][2 * r + c] * a.scale, b, h, (int)q0 + lq + 8 * r,
                                                (int)kw + j * 8 + 2 * t4 + c, &t);
            s[j][2 * r + c] = lse_r[r] == -INFINITY ? 0.f : ex2(x * kLog2e - lse_r[r]);
#else
            s[j][2 * r + c] = ex2(s[j][2 * r + c] * sl - shift);
#endif
          }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          reinterpret_cast<Elem2*>(&sP[pw<WSM>(lq + 8 * r, j + 8 * wg)])[t4] = pack2(s[j][2 * r], s[j][2 * r + 1]);
      }
      cutlass::arch::fence_view_async_shared();
      bar_sync(2 + wg, 128);  // this consumer's P panel
      fence_acc(dv);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < WSM / 16; ++kk)
        wg_ss<Major::MN, Major::MN, D>(mnmajor<WSM>(sP + wg * WSM * 8, kk), mnmajor<WSM>(sdO, kk), dv, true);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<1>();  // dP (dV may still run)
      fence_acc(dp);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c)
            dp[j][2 * r + c] = HB_DS_UNSCALED ? s[j][2 * r + c] * (dp[j][2 * r + c] - dl_r[r])
                                              : s[j][2 * r + c] * (dp[j][2 * r + c] - dl_r[r]) * a.scale;
          reinterpret_cast<Elem2*>(&sdS[pw<WSM>(lq + 8 * r, j + 8 * wg)])[t4] = pack2(dp[j][2 * r], dp[j][2 * r + 1]);
        }
    } else {
      cute::warpgroup_wait<0>();
      fence_acc(s);
      fence_acc(dp);
#if HB_SCATTER
      static_assert(HB_JOINT, "a scatter is a joint's: every step comes here, both consumers to cons_sync below");
      // A buffer gradient along lines: consumer w's [64][65] tile at w x 16 640 bytes into P and dS, which
      // nobody reads now (the last step's MMAs are done; this step's P and dS come after); after its
      // line sums, a barrier of both consumers, since each tile covers part of the other's P or dS.
      const LineStep line = line_probe<WSM, 64>(reinterpret_cast<float*>(sP) + wg * WSM * 65, b, h, q0, kw, inside, t, a);
#else
      const LineStep line{};
#endif
      bwd_p_ds<64, !HB_DS_UNSCALED>(s, dp, a, b, h, q0, lq, kw, full, inside, row0, t, line);
#if HB_SCATTER
      // deterministic=True: consumer w's window is its 64-key tile's, as flex_bwd_wg's CTA of those keys
      // would have it (window_of), so that flex_window_rows merges the same windows; a consumer past the
      // keys' end has none.
      if (line.tile && kw < a.Skv)
        line_reduce<WSM, 64, 128>(line, a, q0, (b * a.Hq + h) * ((a.Skv + 63) / 64) + kw / 64, threadIdx.x & 127, 2 + wg);
      cons_sync();
#endif
      store_p_ds<64>(s, dp, sP, sdS, lq, [wg](int r, int c) { return pw<WSM>(r, c + 8 * wg); });
    }
    cons_sync();  // both consumers' P and dS

    fence_acc(dv);
    fence_acc(dk);
    if (!fast) {
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < WSM / 16; ++kk)
        wg_ss<Major::MN, Major::MN, D>(mnmajor<WSM>(sP + wg * WSM * 8, kk), mnmajor<WSM>(sdO, kk), dv, true);
      cute::warpgroup_commit_batch();
    }
    float dq[8][4];
    fence_acc(dq);
    cute::warpgroup_arrive();
    if constexpr (D == 128) {  // this consumer's 64 columns over the CTA's 128 keys
#pragma unroll
      for (int kk = 0; kk < WSN / 16; ++kk)
        wg_ss<Major::K, Major::MN, 64>(kmajor<WSM>(sdS, 0, kk), mnmajor<WSN>(sK + wg * WSN * 8, kk), dq, kk > 0);
    } else {  // D 64: all columns over this consumer's 64 keys
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wg_ss<Major::K, Major::MN, 64>(kmajor<WSM>(sdS, 0, 4 * wg + kk), mnmajor<WSN>(sK, 4 * wg + kk), dq, kk > 0);
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < WSM / 16; ++kk)
      wg_ss<Major::MN, Major::MN, D>(mnmajor<WSM>(sdS + wg * WSM * 8, kk), mnmajor<WSM>(sQ, kk), dk, true);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();  // dQ done; dK (and dV) may still run
    fence_acc(dq);
    {  // dQ to the writer's tile
      const int t4 = threadIdx.x & 3;
      bar_sync(kWsEmpty, WST);  // the writer is done with the last step's tile
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<float2*>(sdQ + (kWsDqTiles == 2 ? wg * WSM * D : 0) +
                                     dqt(lq + 8 * r, (kWsDqTiles == 2 ? 0 : wg * 64) + 8 * j + 2 * t4)) =
              make_float2(dq[j][2 * r], dq[j][2 * r + 1]);
      if (threadIdx.x == 0) {
        info->off = row0 - a.dq_row0 + q0;
        info->nrows = (int)lmin(WSM, a.Sq - q0);
        info->last = last;
      }
      bar_arrive(kWsFull, WST);
    }
    cute::warpgroup_wait<0>();
    fence_acc(dv);
    fence_acc(dk);
    if constexpr (kWsLoader) cutlass::arch::ClusterBarrier::arrive(&qempty[buf]);  // this step's Q and dO are read
  }
  report(a.error, t);
  store_rows(dv, (Elem*)a.dv + ((b * a.Hkv + hk) * a.Skv + kw) * D, lq, kvalid);
  if (HB_DS_UNSCALED)  // dS came unscaled: dK = scale dS^T Q
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) dk[j][c] *= a.scale;
  store_rows(dk, (Elem*)a.dk + ((b * a.Hkv + hk) * a.Skv + kw) * D, lq, kvalid);
}
#endif  // HB_WS
#endif  // HB_WG

#if HB_DETERMINISTIC && HB_SCATTER && HB_D <= 128
// deterministic=True: the buffer's gradient from the windows line_reduce filled, in two fixed-order passes.
// A window's key at position j is scatter_start + stride j (stride: the line's step in the buffer, alpha
// along rows and diagonals, beta along columns, 0 where one key takes the whole tile). The windows of one
// (b, q head) differ only by where they start: by 64 positions per key tile along diagonals and columns,
// not at all along rows. flex_window_rows merges them, one CTA per (b, q head): each merged position sums
// its windows in key-tile order. flex_window_sum then gives each key the sum of the merged rows that hold
// it, in (b, q head) order. The same additions in the same order in every run. A window start that is not
// a whole number of strides from its row's first, or lies past the merged row, is reported (error code 4)
// rather than dropped.
constexpr long long kWindowStride = HB_LINE_ALPHA != 0 ? HB_LINE_ALPHA : HB_LINE_BETA;

// The merged rows follow the windows in a.scatter_win, their starts the windows' in a.scatter_start.
__global__ void flex_window_rows(const __grid_constant__ HbFlexCudaArgs a, long long tiles, long long merged) {
  const long long len = a.scatter_len, windows = (long long)gridDim.x * tiles, row = blockIdx.x;
  const float* win = a.scatter_win + row * tiles * len;
  const long long* starts = a.scatter_start + row * tiles;
  float* out = a.scatter_win + windows * len + row * merged;
  __shared__ long long first;
  if (threadIdx.x == 0) {  // the row's first key: the smallest start in units of the stride
    long long f = LLONG_MIN;
    for (long long n = 0; n < tiles; ++n) {
      const long long s = starts[n];
      if (s != LLONG_MIN && (f == LLONG_MIN || (kWindowStride < 0 ? s > f : s < f))) f = s;
    }
    first = f;
    a.scatter_start[windows + row] = f;
  }
  __syncthreads();
  if (first == LLONG_MIN) return;
  for (long long k = threadIdx.x; k < merged; k += blockDim.x) {
    float sum = 0.f;
    for (long long n = 0; n < tiles; ++n) {
      const long long s = starts[n];
      if (s == LLONG_MIN) continue;
      const long long off = kWindowStride == 0 ? 0 : (s - first) / kWindowStride;
      const bool off_row = kWindowStride == 0 ? s != first : off < 0 || off + len > merged || (s - first) % kWindowStride != 0;
      if (k == 0 && off_row &&
          a.error && atomicCAS((unsigned long long*)a.error, 0ull, 4ull) == 0ull) {
        a.error[1] = row, a.error[2] = n, a.error[3] = s - first;
      }
      const long long j = k - off;
      if (j >= 0 && j < len) sum += win[n * len + j];
    }
    out[k] = sum;
  }
}

__global__ void flex_window_sum(const __grid_constant__ HbFlexCudaArgs a, long long keys, long long rows,
                                long long windows, long long merged) {
  float* grad = (float*)a.score_buffers[HB_LINE_BUF].grad;
  const float* merged_rows = a.scatter_win + windows * a.scatter_len;
  const long long* firsts = a.scatter_start + windows;
  for (long long key = (long long)blockIdx.x * blockDim.x + threadIdx.x; key < keys;
       key += (long long)gridDim.x * blockDim.x) {
    float sum = 0.f;
    for (long long r = 0; r < rows; ++r) {
      const long long f = firsts[r];
      if (f == LLONG_MIN) continue;  // a (b, q head) no step wrote
      const long long d = key - f;
      long long k = 0;
      if (kWindowStride == 0) {
        if (d != 0) continue;
      } else {
        if (d % kWindowStride != 0) continue;
        k = d / kWindowStride;
        if (k < 0 || k >= merged) continue;
      }
      sum += merged_rows[r * merged + k];
    }
    grad[key] = sum;
  }
}
#endif

// n floats of dQ's workspace, times `scale` (the softmax scale where the kernel left it out of dS, else 1),
// rounded into dQ (q's dtype), four per thread; n is a multiple of 16 (rows of D >= 16 columns) and both
// ends are 16-byte aligned (the caller's tensors; D Elems per row).
__global__ void flex_dq_round(const float* __restrict__ acc, Elem* __restrict__ out, long long n, float scale) {
  for (long long i = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += 4 * (long long)gridDim.x * blockDim.x) {
    const float4 x = *reinterpret_cast<const float4*>(acc + i);
    out[i] = Elem(x.x * scale), out[i + 1] = Elem(x.y * scale), out[i + 2] = Elem(x.z * scale),
    out[i + 3] = Elem(x.w * scale);
  }
}

// The backward's dQ launches on two streams (hb_flex_cuda_backward): 1 keeps them on the caller's stream.
#ifndef HB_DQ_STREAMS
#define HB_DQ_STREAMS 2
#endif
// A side stream of the current device, made once and kept (non-blocking: ordered by events only).
inline cudaError_t side_stream(cudaStream_t* out) {
  static std::mutex mu;
  static cudaStream_t streams[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  if (!streams[dev] && (e = cudaStreamCreateWithFlags(&streams[dev], cudaStreamNonBlocking)) != cudaSuccess) return e;
  *out = streams[dev];
  return cudaSuccess;
}

#if HB_SIMT_FWD || HB_SIMT_BWD
namespace simt {  // codegen/cuda/FlexSimtKernel.cuh, pasted after this text
int launch_fwd(const HbFlexCudaArgs& a, void* stream);
int launch_bwd(const HbFlexCudaArgs& a, long long pairs, void* stream);
int smem(bool backward);
}  // namespace simt
#endif

}  // namespace hbk

// ------------------------------------------------------------------------------------- entry points
extern "C" int hb_flex_cuda_forward(const HbFlexCudaArgs* a, void* stream) {
  if (a->B * a->Hq == 0 || a->Sq == 0) return 0;
#if HB_SIMT_FWD
  return hbk::simt::launch_fwd(*a, stream);
#else
#if HB_WG
  if (a->q_block % hbk::WFM == 0) {  // 128-row CTAs nest in the BlockMask's query blocks
    const dim3 grid((unsigned)((a->Sq + hbk::WFM - 1) / hbk::WFM), (unsigned)(a->B * a->Hq));
    if constexpr (HB_D == 128 || HB_D == 64) {
#if HB_FWD_PP
      if (a->kv_block % 128 == 0) {
#if HB_FWD_192
        if (hbk::fwd_pp_192(*a)) return hbk::launch_fwd_pp<128, 3>(*a, stream);
#endif
        return hbk::launch_fwd_pp<128>(*a, stream);
      }
#else
      if (a->kv_block % 128 == 0) return hbk::launch_fwd_wg<128>(*a, grid, stream);
#endif
    }
    return hbk::launch_fwd_wg<64>(*a, grid, stream);
  }
#endif
  cudaError_t e = cudaFuncSetAttribute(hbk::flex_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize, hbk::kFwdSmem);
  if (e != cudaSuccess) return (int)e;
  const dim3 grid((unsigned)((a->Sq + hbk::FM - 1) / hbk::FM), (unsigned)(a->B * a->Hq));
  hbk::flex_fwd<<<grid, hbk::FT, hbk::kFwdSmem, (cudaStream_t)stream>>>(*a);
  return (int)cudaGetLastError();
#endif  // HB_SIMT_FWD
}

extern "C" int hb_flex_cuda_backward(const HbFlexCudaArgs* a, void* stream) {
  if (a->B * a->Hq == 0 || a->Sq == 0 || a->Skv == 0) return 0;
  const long long rows = a->B * a->Hq * a->Sq;
  const long long pre_rows = 8LL * (hbk::pre_vec(*a) ? hbk::kPreRows : 1);  // rows a block of flex_bwd_pre
  const unsigned pre_blocks = (unsigned)((rows + pre_rows - 1) / pre_rows < 65536 ? (rows + pre_rows - 1) / pre_rows : 65536);
#if HB_ROW_SHIFT
  if (!a->row_lse) return (int)cudaErrorInvalidValue;  // the caller's workspace
#endif
  hbk::flex_bwd_pre<<<pre_blocks, 256, 0, (cudaStream_t)stream>>>(*a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return (int)e;
  HbFlexCudaArgs main_args = *a;  // HB_ROW_SHIFT: the main kernels read the identity's logsumexp
  if (HB_ROW_SHIFT) main_args.lse = a->row_lse;
#if HB_DETERMINISTIC
  if (!a->dq_order || !a->dq_rank) return (int)cudaErrorInvalidValue;  // the caller's counters
  {  // each key tile's turn (dq_turn_wait)
    const long long nrows = (a->kv_list.bm > a->kv_full_list.bm ? a->kv_list.bm : a->kv_full_list.bm) *
                            (a->kv_list.hm > a->kv_full_list.hm ? a->kv_list.hm : a->kv_full_list.hm) * a->kv_list.rows;
    const unsigned blocks = (unsigned)((nrows + 127) / 128 < 1024 ? (nrows + 127) / 128 : 1024);
    hbk::flex_dq_rank<<<blocks, 128, 0, (cudaStream_t)stream>>>(*a);
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
  }
#endif
  // The main kernel once per dq_pairs (b, kv head) pairs, each launch's dQ summed in the float workspace
  // and rounded into dq_out before the next reuses it (flex_dq_pairs says why).
  if (!a->dq || !a->dq_out) return (int)cudaErrorInvalidValue;
  const long long pairs = a->B * a->Hkv, per = a->dq_pairs > 0 && a->dq_pairs < pairs ? a->dq_pairs : pairs;
  const long long pair_rows = a->Hq / a->Hkv * a->Sq;
#if HB_SIMT_BWD
  const float dq_scale = 1.f;
#elif HB_WG
  e = cudaFuncSetAttribute(hbk::flex_bwd_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, hbk::kBwdWgSmem);
  if (e != cudaSuccess) return (int)e;
#if HB_WS
  // flex_bwd_ws's CTAs take 128 keys: kv blocks of a multiple of 128 rows, so that a CTA's keys lie in one
  // block (it walks that block's q lists); else flex_bwd_wg.
  const bool ws = a->kv_block > 0 && a->kv_block % hbk::WSN == 0;
  if (ws && (e = cudaFuncSetAttribute(hbk::flex_bwd_ws, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      hbk::kBwdWsSmem)) != cudaSuccess)
    return (int)e;
  const long long tiles = (a->Skv + (ws ? hbk::WSN : hbk::WBN) - 1) / (ws ? hbk::WSN : hbk::WBN);
  const float dq_scale = ws && HB_DS_UNSCALED ? a->scale : 1.f;  // flex_bwd_ws leaves dQ's scale to the round
#else
  const long long tiles = (a->Skv + hbk::WBN - 1) / hbk::WBN;
  const float dq_scale = 1.f;
#endif
#else
  e = cudaFuncSetAttribute(hbk::flex_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize, hbk::kBwdSmem);
  if (e != cudaSuccess) return (int)e;
  const long long tiles = (a->Skv + hbk::BN - 1) / hbk::BN;
  const float dq_scale = 1.f;
#endif
  // Two streams (flex_dq_streams; HB_DQ_STREAMS 1 keeps one): the workspace's halves take turns, half the
  // pairs a launch, the launches of one half on the caller's stream and of the other on a side stream, so
  // that a launch's last CTAs (the longest under a causal mask, ragged under a document mask) share the GPU
  // with the next launch's first instead of leaving SMs idle until they end.
  const int nstreams = HB_DQ_STREAMS > 1 ? (int)flex_dq_streams(pairs, per, HB_DETERMINISTIC) : 1;
  const long long group = per / nstreams;  // (both halves within the caller's workspace of per pairs)
  cudaStream_t streams[2] = {(cudaStream_t)stream, (cudaStream_t)stream};
  // The events, released on every way out; on a way out before the join below (an error), the side
  // stream's work still joins the caller's stream, so that the caller's stream never runs ahead of writes
  // into the workspace it is about to free.
  struct SideJoin {
    cudaStream_t main = nullptr, side = nullptr;  // side: set while its work is not yet joined
    cudaEvent_t fork = nullptr, join = nullptr;
    ~SideJoin() {
      if (side && join && cudaEventRecord(join, side) == cudaSuccess) cudaStreamWaitEvent(main, join, 0);
      if (fork) cudaEventDestroy(fork);  // (released once their work completes)
      if (join) cudaEventDestroy(join);
    }
  } sj;
  if (nstreams == 2) {
    if ((e = hbk::side_stream(&streams[1])) != cudaSuccess) return (int)e;
    if ((e = cudaEventCreateWithFlags(&sj.fork, cudaEventDisableTiming)) != cudaSuccess) return (int)e;
    if ((e = cudaEventCreateWithFlags(&sj.join, cudaEventDisableTiming)) != cudaSuccess) return (int)e;
    if ((e = cudaEventRecord(sj.fork, streams[0])) != cudaSuccess) return (int)e;  // after flex_bwd_pre
    if ((e = cudaStreamWaitEvent(streams[1], sj.fork, 0)) != cudaSuccess) return (int)e;
    sj.main = streams[0], sj.side = streams[1];
  }
  for (long long p0 = 0, k = 0; p0 < pairs; p0 += group, ++k) {
    const long long n = group < pairs - p0 ? group : pairs - p0, floats = n * pair_rows * HB_D;
    const cudaStream_t st = streams[k % nstreams];
    main_args.dq = a->dq + (k % nstreams) * group * pair_rows * HB_D;
    main_args.bh0 = p0, main_args.dq_row0 = p0 * pair_rows, main_args.pairs_fast = per < pairs;
    if ((e = cudaMemsetAsync(main_args.dq, 0, floats * sizeof(float), st)) != cudaSuccess) return (int)e;
#if HB_SIMT_BWD
    if ((e = (cudaError_t)hbk::simt::launch_bwd(main_args, n, st)) != cudaSuccess) return (int)e;
#elif HB_WG
#if HB_WS
    if (ws)
      hbk::flex_bwd_ws<<<hbk::bwd_grid(tiles, n, per < pairs), hbk::WST, hbk::kBwdWsSmem, st>>>(main_args);
    else
#endif
      hbk::flex_bwd_wg<<<hbk::bwd_grid(tiles, n, per < pairs), hbk::WBT, hbk::kBwdWgSmem, st>>>(main_args);
#else
    hbk::flex_bwd<<<hbk::bwd_grid(tiles, n, per < pairs), hbk::BT, hbk::kBwdSmem, st>>>(main_args);
#endif
    const long long blocks = (floats / 4 + 255) / 256;
    hbk::flex_dq_round<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(
        main_args.dq, (hbk::Elem*)a->dq_out + p0 * pair_rows * HB_D, floats, dq_scale);
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
  }
  if (nstreams == 2) {  // the caller's stream goes on once the side stream's launches are done
    if ((e = cudaEventRecord(sj.join, streams[1])) != cudaSuccess) return (int)e;
    if ((e = cudaStreamWaitEvent(streams[0], sj.join, 0)) != cudaSuccess) return (int)e;
    sj.side = nullptr;  // joined
  }
#if HB_DETERMINISTIC && HB_SCATTER
  if (a->run_joint && a->score_buffers[HB_LINE_BUF].grad) {
    if (!a->scatter_win || !a->scatter_start) return (int)cudaErrorInvalidValue;  // the caller's windows
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
    long long keys = 1;
    for (int d = 0; d < a->score_buffers[HB_LINE_BUF].rank; ++d) keys *= a->score_buffers[HB_LINE_BUF].sizes[d];
    // Windows per 64-key tile (flex_bwd_ws's consumers each keep one, as flex_bwd_wg's CTAs do).
    const long long wtiles = (a->Skv + 63) / 64;
    const long long heads = a->B * a->Hq, windows = heads * wtiles;  // a merged row per (b, q head)
    const long long merged = flex_merged_len(a->scatter_len, wtiles);  // as the caller sized them
    hbk::flex_window_rows<<<(unsigned)heads, 256, 0, (cudaStream_t)stream>>>(*a, wtiles, merged);
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
    const unsigned blocks = (unsigned)((keys + 255) / 256 < 65536 ? (keys + 255) / 256 : 65536);
    if (keys > 0) hbk::flex_window_sum<<<blocks, 256, 0, (cudaStream_t)stream>>>(*a, keys, heads, windows, merged);
  }
#endif
  return (int)cudaGetLastError();
}

extern "C" const char* hb_flex_cuda_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

// The most dynamic shared memory per block that a forward (backward) launch of this unit asks for, in
// bytes, whichever of its kernels the BlockMask's block sizes pick. Kernel selection compares it with the
// GPU's limit (codegen/KernelSelect.cpp), so that a kernel that cannot launch there is never chosen.
extern "C" long long hb_flex_cuda_smem(int backward) {
  const auto most = [](long long x, long long y) { return x > y ? x : y; };
  if (backward) {
#if HB_SIMT_BWD
    return hbk::simt::smem(true);
#elif HB_WS
    return most(hbk::kBwdWgSmem, hbk::kBwdWsSmem);  // flex_bwd_ws where the kv blocks allow
#elif HB_WG
    return hbk::kBwdWgSmem;
#else
    return hbk::kBwdSmem;
#endif
  }
#if HB_SIMT_FWD
  return hbk::simt::smem(false);
#else
  long long m = hbk::kFwdSmem;  // flex_fwd (query blocks that are not multiples of 128 on Hopper)
#if HB_WG
  m = most(m, hbk::kFwdWgSmem<64>);
  if constexpr (HB_D == 128 || HB_D == 64) m = most(m, HB_FWD_PP ? hbk::kFwdPpSmem<128, HB_FWD_192 ? 3 : 2> : hbk::kFwdWgSmem<128>);
#endif
  return m;
#endif
}

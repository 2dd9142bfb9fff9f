// FlexAttention's SIMT CUDA kernels: FlashAttention-2's algorithm on the CUDA cores (float FMA, float
// accumulation, no tensor cores), for what the tensor-core kernels of FlexTiledKernel.cuh do not take:
// float32 q/k/v at every head dim (forward and backward: TF32 would not keep float32's accuracy), and the
// backward at head dim 256 in any dtype (the mma.sync backward's registers and shared memory end at 128).
// Not compiled into the extension: codegen/FlexKernelGen.cpp pastes this text after FlexTiledKernel.cuh
// when the unit needs it (HB_F32, or HB_D > 128), whose entry points call simt::launch_fwd / launch_bwd.
//
// Same semantics and per-element code as the tensor-core kernels (FlexTiledKernel.cuh): the BlockMask's
// kv (forward) and q (backward) lists walked with Walk, partial blocks through the generated mask_mod,
// full blocks without, unlisted blocks skipped; score_mod, mask_mod and the joint per element with the
// same guards (a tile inside both sequences calls them unguarded); base-2 logsumexp; HB_ROW_SHIFT;
// buffer gradients through hb_scatter (atomics) or the step's line reduction (LineStep, line_reduce);
// errors through report(); delta from flex_bwd_pre; GQA/MQA and a batch-broadcast k/v. Extra memory is
// the caller's O(B H S D) (the float dQ accumulator); nothing S x S.
//
// Layout. A CTA has 256 threads in a 16 x 16 grid, ty = thread / 16, tx = thread % 16 (each warp two
// rows of the grid, so a row's 16 threads reduce with shuffles). Every tile lives in shared memory as
// float: [rows][D] rows of 16-byte chunks, XOR-swizzled (sw<D / 4>), so that the 8 threads of a quarter
// warp reading one chunk of 8 different rows (or 8 chunks of one row) meet no bank conflict. A score
// tile [query rows][key columns] is spread as thread (ty, tx) <- rows ty R + i (i < R), columns tx + 16 j;
// a product over the head dim (O, dQ, dK, dV) as rows ty R + i, columns (tx + 16 k) VW + e (float4 groups
// where D >= 64). P and dS go through shared memory transposed ([key][query rows], one float4 per
// thread's four rows), from which the products read four query rows in one load.
// - forward: a CTA per 64 query rows of one (b, h); key/value tiles of FN rows (64; 32 at D 256): S =
//   Q K^T (4 x FC per thread), the scores, an online softmax, P^T to shared memory, O += P V (4 x D / 16
//   per thread in registers). K of the next tile and V of this one load (cp.async) while the other
//   product runs, as in flex_fwd.
// - backward: a CTA per BN key rows of one (b, kv head) (64; 32 at D 256), over the query steps (BM
//   rows: 64; 32 at D 256) the q lists give, for every query head of its GQA group: S = Q K^T and dP =
//   dO V^T, P and dS per element, P^T and dS^T to shared memory, dV += P^T dO and dK += dS^T Q in
//   registers (RK x D / 16 each per thread), dQ = dS K added into the float accumulator (float atomics,
//   `red`). Q and dO are single-buffered: a step's load is not overlapped.
// q/k/v in bfloat16 or float16 (the D 256 backward) are converted to float as they land in shared
// memory (plain loads; cp.async where they are float32).
// deterministic=True is not supported here (codegen/FlexKernelGen.cpp refuses it for these nodes).

#if HB_SIMT_FWD || HB_SIMT_BWD
#if HB_DETERMINISTIC && HB_SIMT_BWD
#error "deterministic=True: the SIMT backward has no ordered dQ (codegen/FlexKernelGen.cpp refuses these nodes)"
#endif

namespace hbk {
namespace simt {

constexpr int NT = 256;    // threads per CTA: a 16 x 16 grid
constexpr int C4 = D / 4;  // 16-byte chunks per row of a [rows][D] float tile
// A thread's columns of a [rows][D] product: NV vectors of VW floats, vector k at column (tx + 16 k) VW.
constexpr int VW = D >= 64 ? 4 : D / 16;
constexpr int NV = D / (16 * VW);
static_assert(VW * NV * 16 == D, "head dim");

// Element `col` of row `row` of a swizzled [rows][4 C] float tile.
template <int C>
__device__ __forceinline__ float* fp(float4* s, int row, int col) {
  return reinterpret_cast<float*>(&s[sw<C>(row, col >> 2)]) + (col & 3);
}
template <int W>
__device__ __forceinline__ void ldf(const float* p, float (&r)[W]) {
  if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else if constexpr (W == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    r[0] = v.x, r[1] = v.y;
  } else {
    r[0] = *p;
  }
}
template <int W>
__device__ __forceinline__ void stf(float* p, const float (&r)[W]) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
  } else if constexpr (W == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(r[0], r[1]);
  } else {
    *p = r[0];
  }
}
__device__ __forceinline__ float dot4(float acc, const float4& x, const float4& y) {
  acc = fmaf(x.x, y.x, acc);
  acc = fmaf(x.y, y.y, acc);
  acc = fmaf(x.z, y.z, acc);
  return fmaf(x.w, y.w, acc);
}

// Rows row0 .. row0 + ROWS - 1 of a [rows][D] matrix of Elem at `base` (row stride `ld` elements, 16-byte
// aligned rows) into a swizzled float tile; rows at or past `len` are zero-filled (and not read). float32:
// cp.async (the caller fences and waits); bfloat16 / float16: 8 elements per load, converted.
template <int ROWS>
__device__ __forceinline__ void load_rows(float4* s, const Elem* base, long long row0, long long ld, long long len) {
#if HB_F32
  for (int i = threadIdx.x; i < ROWS * C4; i += NT) {
    const int r = i / C4, c = i % C4;
    const bool ok = row0 + r < len;
    const float* src = base + (ok ? (row0 + r) * ld + c * 4 : 0);
    cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(src),
                                                                 *reinterpret_cast<cute::uint128_t*>(&s[sw<C4>(r, c)]), ok);
  }
#else
  constexpr int C8 = D / 8;
  for (int i = threadIdx.x; i < ROWS * C8; i += NT) {
    const int r = i / C8, c = i % C8;
    float f[8] = {};
    if (row0 + r < len) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(base + (row0 + r) * ld + c * 8));
      const Elem2* e = reinterpret_cast<const Elem2*>(&u);
#pragma unroll
      for (int x = 0; x < 4; ++x) f[2 * x] = float(e[x].x), f[2 * x + 1] = float(e[x].y);
    }
    s[sw<C4>(r, 2 * c)] = make_float4(f[0], f[1], f[2], f[3]);
    s[sw<C4>(r, 2 * c + 1)] = make_float4(f[4], f[5], f[6], f[7]);
  }
#endif
}

// The 16 threads of a grid row (one half warp) combine their values.
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The forward's score_elems for this layout (score_elem per score; s[i][j]: query row q0 + ty R + i, key
// column k0 + tx + 16 j).
template <int R, int C, bool GUARD>
__device__ __forceinline__ void fwd_elems(float (&s)[R][C], const HbFlexCudaArgs& a, long long b, long long h, int q0,
                                          int k0, bool full, HbFlexTile& t) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16, sq = (int)a.Sq, skv = (int)a.Skv;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int qi = q0 + ty * R + i;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int ki = k0 + tx + 16 * j;
      s[i][j] = score_elem<GUARD>(s[i][j], a, b, h, qi, ki, !GUARD || (qi < sq && ki < skv), full, t) * kElemToBase2;
    }
  }
}

// ---------------------------------------------------------------------------------------------- forward
#if HB_SIMT_FWD
constexpr int FM = 64;                  // query rows per CTA
constexpr int FN = D <= 128 ? 64 : 32;  // key rows per tile
constexpr int FR = FM / 16;             // query rows per thread (4: one float4 of P^T)
constexpr int FC = FN / 16;             // key columns per thread
constexpr int kFwdSmem = (FM * D + 2 * FN * D + FN * FM) * 4;
static_assert(FR == 4, "P^T holds a thread's query rows as one float4");

__global__ void __launch_bounds__(NT, 1) flex_fwd_simt(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ float4 fsm[];
  float4* sQ = fsm;             // [FM][D]
  float4* sK = sQ + FM * C4;    // [FN][D]
  float4* sV = sK + FN * C4;    // [FN][D]
  float4* sPT = sV + FN * C4;   // [FN][FM]: P transposed
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const long long b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq, hk = h / (a.Hq / a.Hkv), bk = a.Bkv == 1 ? 0 : b;
  const long long q0 = (long long)blockIdx.x * FM;
  const Elem* Q = (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1];
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  const Walk walk(a.kv_list, a.kv_full_list, b, h, q0 / a.q_block, a.kv_block, FN, a.Skv);
  const int ntiles = walk.count();
  HbFlexTile t = {};
  t.b = b, t.h = h, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;

  load_rows<FM>(sQ, Q, q0, a.q_strides[2], a.Sq);
  bool full = false;
  long long k0 = ntiles ? walk.first(0, &full) : 0;
  if (ntiles) load_rows<FN>(sK, K, k0, a.k_strides[2], a.Skv);
  cute::cp_async_fence();

  float o[FR][NV][VW] = {};
  float m[FR], l[FR];
#pragma unroll
  for (int i = 0; i < FR; ++i) m[i] = -INFINITY, l[i] = 0.f;
  for (int it = 0; it < ntiles; ++it) {
    cute::cp_async_wait<0>();
    __syncthreads();  // K (and Q) have landed; every thread is done with the last tile's V and P
    load_rows<FN>(sV, V, k0, a.v_strides[2], a.Skv);
    cute::cp_async_fence();

    // S = Q K^T: rows ty FR + i, key columns tx + 16 j.
    float s[FR][FC] = {};
#pragma unroll 4
    for (int c = 0; c < C4; ++c) {
      float4 qv[FR], kv[FC];
#pragma unroll
      for (int i = 0; i < FR; ++i) qv[i] = sQ[sw<C4>(ty * FR + i, c)];
#pragma unroll
      for (int j = 0; j < FC; ++j) kv[j] = sK[sw<C4>(tx + 16 * j, c)];
#pragma unroll
      for (int i = 0; i < FR; ++i)
#pragma unroll
        for (int j = 0; j < FC; ++j) s[i][j] = dot4(s[i][j], qv[i], kv[j]);
    }
    const bool inside = k0 + FN <= a.Skv && q0 + FM <= a.Sq;
    if (!HB_SCORE_ELEM && (full || !HB_MASK_MOD) && inside) {
      const float sl = a.scale * kLog2e;
#pragma unroll
      for (int i = 0; i < FR; ++i)
#pragma unroll
        for (int j = 0; j < FC; ++j) s[i][j] *= sl;
    } else if (inside) {
      fwd_elems<FR, FC, false>(s, a, b, h, (int)q0, (int)k0, full, t);
    } else {
      fwd_elems<FR, FC, true>(s, a, b, h, (int)q0, (int)k0, full, t);
    }
    // Online softmax (softmax_tile): s becomes P, m and the thread's partial sum l move, O is rescaled.
#pragma unroll
    for (int i = 0; i < FR; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < FC; ++j) mx = fmaxf(mx, s[i][j]);
      mx = row_max16(mx);
      const float mnew = fmaxf(m[i], mx);
      const float shift = mnew == -INFINITY ? 0.f : mnew;
      const float corr = exp2f(m[i] - shift);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < FC; ++j) {
        const float p = exp2f(s[i][j] - shift);
        s[i][j] = p;
        sum += p;
      }
      l[i] = l[i] * corr + sum;
      m[i] = mnew;
#pragma unroll
      for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int e = 0; e < VW; ++e) o[i][k][e] *= corr;
    }
    // P^T: key row tx + 16 j, this thread's four query rows as one float4.
#pragma unroll
    for (int j = 0; j < FC; ++j) sPT[sw<FM / 4>(tx + 16 * j, ty)] = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
    cute::cp_async_wait<0>();
    __syncthreads();  // V has landed; P^T is written; every thread is done with K
    if (it + 1 < ntiles) {
      k0 = walk.first(it + 1, &full);
      load_rows<FN>(sK, K, k0, a.k_strides[2], a.Skv);
    }
    cute::cp_async_fence();
    // O += P V.
#pragma unroll 4
    for (int n = 0; n < FN; ++n) {
      const float4 p = sPT[sw<FM / 4>(n, ty)];
      const float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        float v[VW];
        ldf<VW>(fp<C4>(sV, n, (tx + 16 * k) * VW), v);
#pragma unroll
        for (int i = 0; i < FR; ++i)
#pragma unroll
          for (int e = 0; e < VW; ++e) o[i][k][e] = fmaf(pr[i], v[e], o[i][k][e]);
      }
    }
  }
  // Normalize and store (fwd_store), with the rows' logsumexp and max (row_end).
  Elem* O = (Elem*)a.out + b * a.o_strides[0] + h * a.o_strides[1];
#pragma unroll
  for (int i = 0; i < FR; ++i) {
    const float sum = row_sum16(l[i]);
    const long long qi = q0 + ty * FR + i;
    if (qi >= a.Sq) continue;
    const RowEnd end = row_end(m[i], sum, a, b, h, qi, t);
    const float inv = end.inv;
    Elem* row = O + qi * a.o_strides[2];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
#if HB_F32
      float r[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) r[e] = o[i][k][e] * inv;
      stf<VW>(row + (tx + 16 * k) * VW, r);
#else
#pragma unroll
      for (int e = 0; e < VW; ++e) row[(tx + 16 * k) * VW + e] = Elem(o[i][k][e] * inv);
#endif
    }
    if (tx == 0) {
      const long long at = (b * a.Hq + h) * a.Sq + qi;
      a.lse[at] = end.lse;
      a.max_scores[at] = end.max;
    }
  }
  report(a.error, t);
}

int launch_fwd(const HbFlexCudaArgs& a, void* stream) {
  cudaError_t e = cudaFuncSetAttribute(flex_fwd_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdSmem);
  if (e != cudaSuccess) return (int)e;
  const dim3 grid((unsigned)((a.Sq + FM - 1) / FM), (unsigned)(a.B * a.Hq));
  flex_fwd_simt<<<grid, NT, kFwdSmem, (cudaStream_t)stream>>>(a);
  return (int)cudaGetLastError();
}
#endif  // HB_SIMT_FWD

// --------------------------------------------------------------------------------------------- backward
#if HB_SIMT_BWD
constexpr int BN = D <= 128 ? 64 : 32;  // key rows per CTA
constexpr int BM = D <= 128 ? 64 : 32;  // query rows per step
constexpr int RQ = BM / 16;             // query rows per thread (S, dP, dQ)
constexpr int CK = BN / 16;             // key columns per thread (S, dP)
constexpr int RK = BN / 16;             // key rows per thread (dK, dV)
constexpr int PCH = BM / 4;             // chunks per row of the [BN][BM] P^T and dS^T tiles
// The line tile (LineStep, [BM][BN + 1] floats) overlays P^T and dS^T.
static_assert(!HB_SCATTER || BM * (BN + 1) <= 2 * BN * BM, "line tile");
constexpr int kBwdSmem = (2 * BN * D + 2 * BM * D + 2 * BN * BM) * 4;

// P and dS per element (p_ds_elems for this layout, p_ds_elem each): s becomes P, dp becomes dS times the
// scale.
template <bool GUARD, bool LINE>
__device__ __forceinline__ void p_ds_simt(float (&s)[RQ][CK], float (&dp)[RQ][CK], const HbFlexCudaArgs& a, long long b,
                                          long long h, int q0, int k0, bool full, long long row0, HbFlexTile& t,
                                          const LineStep& line) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16, sq = (int)a.Sq, skv = (int)a.Skv;
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int qi = q0 + ty * RQ + i;
    const bool qin = !GUARD || qi < sq;
    const float lse = qin ? a.lse[row0 + qi] : -INFINITY;
    const float delta = qin ? a.delta[row0 + qi] : 0.f;
#pragma unroll
    for (int j = 0; j < CK; ++j) {
      const int ki = k0 + tx + 16 * j;
      p_ds_elem<GUARD, LINE>(s[i][j], dp[i][j], a, b, h, qi, ki, !GUARD || (qin && ki < skv), lse, delta, full,
                             ty * RQ + i, tx + 16 * j, BN + 1, t, line);
    }
  }
}

// dQ rows, columns [col, col + VW) of a thread, added into the float accumulator (add_dq's `red`).
__device__ __forceinline__ void red_dq(float* dst, const float (&v)[VW]) {
#if __CUDA_ARCH__ >= 900
  if constexpr (VW == 4) {
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" : : "l"(dst), "f"(v[0]), "f"(v[1]),
                 "f"(v[2]), "f"(v[3]) : "memory");
    return;
  } else if constexpr (VW == 2) {
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" : : "l"(dst), "f"(v[0]), "f"(v[1]) : "memory");
    return;
  }
#endif
#pragma unroll
  for (int e = 0; e < VW; ++e)
    asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" : : "l"(dst + e), "f"(v[e]) : "memory");
}

__global__ void __launch_bounds__(NT, 1) flex_bwd_simt(const __grid_constant__ HbFlexCudaArgs a) {
  extern __shared__ float4 bsm[];
  float4* sK = bsm;              // [BN][D]
  float4* sV = sK + BN * C4;     // [BN][D]
  float4* sQ = sV + BN * C4;     // [BM][D]
  float4* sdO = sQ + BM * C4;    // [BM][D]
  float4* sPT = sdO + BM * C4;   // [BN][BM]: P transposed
  float4* sdST = sPT + BN * PCH; // [BN][BM]: dS transposed
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const long long G = a.Hq / a.Hkv;
  const long long bh = bwd_pair(a) + a.bh0, b = bh / a.Hkv, hk = bh % a.Hkv, bk = a.Bkv == 1 ? 0 : b;
  const long long k0 = bwd_tile(a) * BN;
  const int kvalid = (int)lmin(BN, a.Skv - k0);
  const Elem* K = (const Elem*)a.k + bk * a.k_strides[0] + hk * a.k_strides[1];
  const Elem* V = (const Elem*)a.v + bk * a.v_strides[0] + hk * a.v_strides[1];
  load_rows<BN>(sK, K, k0, a.k_strides[2], a.Skv);
  load_rows<BN>(sV, V, k0, a.v_strides[2], a.Skv);
  cute::cp_async_fence();

  float dk[RK][NV][VW] = {}, dv[RK][NV][VW] = {};
  HbFlexTile t = {};
  t.b = b, t.score_buffers = a.score_buffers, t.mask_buffers = a.mask_buffers;
  const long long kblk = k0 / a.kv_block;
  for (long long h = hk * G; h < (hk + 1) * G; ++h) {
    const Walk walk(a.q_list, a.q_full_list, b, h, kblk, a.q_block, BM, a.Sq);
    const int nsteps = walk.count();
    t.h = h;
    const long long row0 = (b * a.Hq + h) * a.Sq;
    const Elem* Q = (const Elem*)a.q + b * a.q_strides[0] + h * a.q_strides[1];
    const Elem* dO = (const Elem*)a.dout + b * a.do_strides[0] + h * a.do_strides[1];
    for (int st = 0; st < nsteps; ++st) {
      bool full = false;
      const long long q0 = walk.step(st, &full);
      __syncthreads();  // the last step's readers of Q, dO, P^T and dS^T are done
      load_rows<BM>(sQ, Q, q0, a.q_strides[2], a.Sq);
      load_rows<BM>(sdO, dO, q0, a.do_strides[2], a.Sq);
      cute::cp_async_fence();
      cute::cp_async_wait<0>();
      __syncthreads();  // Q and dO (and, at the first step, K and V) have landed

      // S = Q K^T and dP = dO V^T: query rows ty RQ + i, key columns tx + 16 j.
      float s[RQ][CK] = {}, dp[RQ][CK] = {};
#pragma unroll 4
      for (int c = 0; c < C4; ++c) {
        float4 x[RQ], y[CK];
#pragma unroll
        for (int i = 0; i < RQ; ++i) x[i] = sQ[sw<C4>(ty * RQ + i, c)];
#pragma unroll
        for (int j = 0; j < CK; ++j) y[j] = sK[sw<C4>(tx + 16 * j, c)];
#pragma unroll
        for (int i = 0; i < RQ; ++i)
#pragma unroll
          for (int j = 0; j < CK; ++j) s[i][j] = dot4(s[i][j], x[i], y[j]);
      }
#pragma unroll 4
      for (int c = 0; c < C4; ++c) {
        float4 x[RQ], y[CK];
#pragma unroll
        for (int i = 0; i < RQ; ++i) x[i] = sdO[sw<C4>(ty * RQ + i, c)];
#pragma unroll
        for (int j = 0; j < CK; ++j) y[j] = sV[sw<C4>(tx + 16 * j, c)];
#pragma unroll
        for (int i = 0; i < RQ; ++i)
#pragma unroll
          for (int j = 0; j < CK; ++j) dp[i][j] = dot4(dp[i][j], x[i], y[j]);
      }
      const bool inside = k0 + BN <= a.Skv && q0 + BM <= a.Sq;
#if HB_SCATTER
      const LineStep line = line_probe<BM, BN>(reinterpret_cast<float*>(sPT), b, h, q0, k0, inside, t, a);
#else
      const LineStep line{};
#endif
      if (!HB_SCORE_ELEM && !HB_JOINT && (full || !HB_MASK_MOD) && inside) {  // (bwd_p_ds's short way)
        const float sl = a.scale * kLog2e;
#pragma unroll
        for (int i = 0; i < RQ; ++i) {
          const float lse = a.lse[row0 + q0 + ty * RQ + i], delta = a.delta[row0 + q0 + ty * RQ + i];
          const float shift = lse == -INFINITY ? INFINITY : lse;
#pragma unroll
          for (int j = 0; j < CK; ++j) {
            const float p = exp2f(s[i][j] * sl - shift);
            s[i][j] = p;
            dp[i][j] = p * (dp[i][j] - delta) * a.scale;
          }
        }
      } else if (HB_SCATTER && line.tile) {
        p_ds_simt<false, true>(s, dp, a, b, h, (int)q0, (int)k0, full, row0, t, line);
      } else if (inside) {
        p_ds_simt<false, false>(s, dp, a, b, h, (int)q0, (int)k0, full, row0, t, line);
      } else {
        p_ds_simt<true, false>(s, dp, a, b, h, (int)q0, (int)k0, full, row0, t, line);
      }
#if HB_SCATTER
      if (line.tile) line_reduce<BM, BN, NT>(line, a, q0, 0);  // (its barriers: P^T and dS^T may be stored)
#endif
      // P^T and dS^T: key row tx + 16 j, this thread's RQ query rows in one store.
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        float pr[RQ], dr[RQ];
#pragma unroll
        for (int i = 0; i < RQ; ++i) pr[i] = s[i][j], dr[i] = dp[i][j];
        stf<RQ>(fp<PCH>(sPT, tx + 16 * j, ty * RQ), pr);
        stf<RQ>(fp<PCH>(sdST, tx + 16 * j, ty * RQ), dr);
      }
      __syncthreads();

      // dV += P^T dO and dK += dS^T Q: key rows ty RK + i, head-dim columns (tx + 16 k) VW + e.
#pragma unroll 2
      for (int mc = 0; mc < PCH; ++mc) {
        float4 p[RK], d[RK];
#pragma unroll
        for (int i = 0; i < RK; ++i) p[i] = sPT[sw<PCH>(ty * RK + i, mc)], d[i] = sdST[sw<PCH>(ty * RK + i, mc)];
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {
          const int mrow = mc * 4 + e4;
#pragma unroll
          for (int k = 0; k < NV; ++k) {
            float x[VW], y[VW];
            ldf<VW>(fp<C4>(sdO, mrow, (tx + 16 * k) * VW), x);
            ldf<VW>(fp<C4>(sQ, mrow, (tx + 16 * k) * VW), y);
#pragma unroll
            for (int i = 0; i < RK; ++i) {
              const float pi = e4 == 0 ? p[i].x : e4 == 1 ? p[i].y : e4 == 2 ? p[i].z : p[i].w;
              const float di = e4 == 0 ? d[i].x : e4 == 1 ? d[i].y : e4 == 2 ? d[i].z : d[i].w;
#pragma unroll
              for (int e = 0; e < VW; ++e) {
                dv[i][k][e] = fmaf(pi, x[e], dv[i][k][e]);
                dk[i][k][e] = fmaf(di, y[e], dk[i][k][e]);
              }
            }
          }
        }
      }
      // dQ += dS K: query rows ty RQ + i, head-dim columns (tx + 16 k) VW + e, into the float accumulator.
      float dq[RQ][NV][VW] = {};
#pragma unroll 4
      for (int n = 0; n < BN; ++n) {
        float d[RQ];
        ldf<RQ>(fp<PCH>(sdST, n, ty * RQ), d);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          float y[VW];
          ldf<VW>(fp<C4>(sK, n, (tx + 16 * k) * VW), y);
#pragma unroll
          for (int i = 0; i < RQ; ++i)
#pragma unroll
            for (int e = 0; e < VW; ++e) dq[i][k][e] = fmaf(d[i], y[e], dq[i][k][e]);
        }
      }
#pragma unroll
      for (int i = 0; i < RQ; ++i) {
        const long long qi = q0 + ty * RQ + i;
        if (qi >= a.Sq) continue;
#pragma unroll
        for (int k = 0; k < NV; ++k) red_dq(a.dq + (row0 - a.dq_row0 + qi) * D + (tx + 16 * k) * VW, dq[i][k]);
      }
    }
  }
  cute::cp_async_wait<0>();  // (K and V, where no step ran)
  report(a.error, t);
  // dK, dV rows of (b, kv head): [B, Hkv, Skv, D] contiguous (summed over b by the caller when k, v
  // broadcast over the batch).
  const long long base = ((b * a.Hkv + hk) * a.Skv + k0) * D;
#pragma unroll
  for (int i = 0; i < RK; ++i) {
    const int kr = ty * RK + i;
    if (kr >= kvalid) continue;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      Elem* pk = (Elem*)a.dk + base + (long long)kr * D + (tx + 16 * k) * VW;
      Elem* pv = (Elem*)a.dv + base + (long long)kr * D + (tx + 16 * k) * VW;
#if HB_F32
      stf<VW>(pk, dk[i][k]);
      stf<VW>(pv, dv[i][k]);
#else
#pragma unroll
      for (int e = 0; e < VW; ++e) pk[e] = Elem(dk[i][k][e]), pv[e] = Elem(dv[i][k][e]);
#endif
    }
  }
}

// One launch of (b, kv head) pairs [a.bh0, a.bh0 + pairs).
int launch_bwd(const HbFlexCudaArgs& a, long long pairs, void* stream) {
  cudaError_t e = cudaFuncSetAttribute(flex_bwd_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, kBwdSmem);
  if (e != cudaSuccess) return (int)e;
  flex_bwd_simt<<<bwd_grid((a.Skv + BN - 1) / BN, pairs, a.pairs_fast), NT, kBwdSmem, (cudaStream_t)stream>>>(a);
  return (int)cudaGetLastError();
}
#endif  // HB_SIMT_BWD

// The dynamic shared memory the launches above ask for (hb_flex_cuda_smem).
int smem(bool backward) {
#if HB_SIMT_BWD
  if (backward) return kBwdSmem;
#endif
#if HB_SIMT_FWD
  if (!backward) return kFwdSmem;
#endif
  return 0;
}

}  // namespace simt
}  // namespace hbk
#endif  // HB_SIMT_FWD || HB_SIMT_BWD

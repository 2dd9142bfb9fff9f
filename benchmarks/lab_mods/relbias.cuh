// A learned relative bias for benchmarks/flex_kernel_lab.cu (-DHB_LAB_MODS='"lab_mods/relbias.cuh"', or
// LAB_MODS=benchmarks/lab_mods/relbias.cuh with benchmarks/gpu_session.sh lab): score + lb[q - kv + S - 1, h]
// with a float32 table lb [2S - 1, H] that wants a gradient, written as codegen/FlexKernelGen.cpp writes it
// (32-bit indices, the table's layout as literals, the scatter through hb_scatter_s). LAB_S and LAB_H must be
// the lab's S and H (4096 and 16 by default; set them with LAB_DEFS="-DLAB_S=... -DLAB_H=...").
#ifndef LAB_S
#define LAB_S 4096
#endif
#ifndef LAB_H
#define LAB_H 16
#endif
// The scatter runs along the tiles' diagonals as the generator proves it (HB_LINE_STATIC; -DLAB_LINE_PROBE:
// found by the kernel's run-time probe instead).
// Variants for timing (LAB_DEFS): -DLAB_TABLE_T (the table read as [H][2S - 1], a head's diagonals contiguous:
// a warp's reads of one tile touch a few sectors instead of one 64-byte-strided sector per diagonal; the
// gradient keeps [2S - 1][H]), -DLAB_SCATTER_GLOBAL (one global atomic per score element, no line sums),
// -DLAB_NO_SCATTER (the joint scatters nothing: wrong gradients, timing only), -DLAB_NO_JOINT (no joint
// at all: the score_mod's recompute alone).
#define HB_SCORE_MOD 1
#ifndef LAB_NO_JOINT
#define HB_JOINT 1
#else
#define HB_JOINT 0
#endif
#if !defined(LAB_SCATTER_GLOBAL) && !defined(LAB_NO_SCATTER) && !defined(LAB_NO_JOINT)
#define HB_SCATTER 1
#ifndef LAB_LINE_PROBE
#define HB_LINE_STATIC 1
#define HB_LINE_BUF 0
#define HB_LINE_ALPHA LAB_H
#define HB_LINE_BETA (-LAB_H)
#endif
#endif

HB_FLEX_SCATTER_CUDA  // the generated prelude's hb_scatter and hb_scatter_s (codegen/FlexKernelAbi.h)
HB_FLEX_SCATTER_LINE

template <typename T>
HB_FN T hb_score_mod(T score, long long b, long long h, long long q, long long kv, HbFlexTile* t) {
  const int d = (int)q - (int)kv + (LAB_S - 1);
#ifdef LAB_TABLE_T
  return score + (T)__ldg((const float*)t->score_buffers[0].data + (int)h * (2 * LAB_S - 1) + d);
#else
  return score + (T)__ldg((const float*)t->score_buffers[0].data + d * LAB_H + (int)h);  // HB_LD
#endif
}

template <typename T, int LINE = 0>
HB_FN T hb_joint(T score, long long b, long long h, long long q, long long kv, T grad, HbFlexTile* t) {
  const int d = (int)q - (int)kv + (LAB_S - 1);
#ifndef LAB_NO_SCATTER
  if (LINE || t->score_buffers[0].grad)
    hb_scatter_s<LINE, true>(t, 0, t->score_buffers[0].grad, d * LAB_H + (int)h, (double)grad);
#endif
  return grad;
}

inline void lab_buffers(HbFlexCudaArgs& a, long long B, long long H, long long S) {
  if (S != LAB_S || H != LAB_H) {
    std::fprintf(stderr, "lab_mods/relbias.cuh: built for S %d H %d, run with S %lld H %lld\n", LAB_S, LAB_H, S, H);
    std::exit(1);
  }
  const size_t n = (size_t)(2 * S - 1) * H;
  std::vector<float> lb(n);
  for (size_t i = 0; i < n; ++i) lb[i] = 0.01f * (float)((i * 2654435761u) % 200) - 1.f;
  void *data = nullptr, *grad = nullptr;
  cudaMalloc(&data, n * sizeof(float));
  cudaMalloc(&grad, n * sizeof(float));
  cudaMemcpy(data, lb.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(grad, 0, n * sizeof(float));
  HbFlexBuffer& buf = a.score_buffers[0];
  buf.data = data, buf.grad = grad, buf.rank = 2;
  buf.sizes[0] = 2 * S - 1, buf.sizes[1] = H, buf.strides[0] = H, buf.strides[1] = 1;
#ifdef LAB_TABLE_T
  buf.strides[0] = 1, buf.strides[1] = 2 * S - 1;  // (the values are arbitrary either way)
#endif
}


// ALiBi for benchmarks/flex_kernel_lab.cu (LAB_MODS=benchmarks/lab_mods/alibi.cuh with
// benchmarks/gpu_session.sh lab): score + slope[h] * (kv - q) with a float32 slope buffer [H] that wants no
// gradient, written as codegen/FlexKernelGen.cpp writes it (32-bit indices, the buffer's layout as a
// literal); no joint (d score_mod / d score = 1). Times a score_mod that reads a buffer per element; the
// check is skipped (the framework's CUDA tests check ALiBi).
#define HB_SCORE_MOD 1
#define HB_JOINT 0

template <typename T>
HB_FN T hb_score_mod(T score, long long b, long long h, long long q, long long kv, HbFlexTile* t) {
  const float slope = __ldg((const float*)t->score_buffers[0].data + (int)h);
  return score + (T)(slope * (float)((int)kv - (int)q));
}

inline void lab_buffers(HbFlexCudaArgs& a, long long B, long long H, long long S) {
  std::vector<float> slope((size_t)H);
  for (long long i = 0; i < H; ++i) slope[(size_t)i] = std::exp2(-8.0f * (float)(i + 1) / (float)H);
  void* data = nullptr;
  cudaMalloc(&data, slope.size() * sizeof(float));
  cudaMemcpy(data, slope.data(), slope.size() * sizeof(float), cudaMemcpyHostToDevice);
  HbFlexBuffer& buf = a.score_buffers[0];
  buf.data = data, buf.grad = nullptr, buf.rank = 1;
  buf.sizes[0] = H, buf.strides[0] = 1;
}

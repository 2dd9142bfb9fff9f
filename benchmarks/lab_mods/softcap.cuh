// A soft cap for benchmarks/flex_kernel_lab.cu (LAB_MODS=benchmarks/lab_mods/softcap.cuh with
// benchmarks/gpu_session.sh lab): 30 tanh(score / 30), its joint the gradient times 1 - tanh^2, no captured
// buffer. Times the per-element path with a score_mod and a joint (hb_tanh as the generator writes it for
// 16-bit q/k/v: the hardware's tanh.approx); the check is skipped (the framework's CUDA tests check the soft cap).
#define HB_SCORE_MOD 1
#define HB_JOINT 1

HB_FN float hb_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
HB_FN T hb_score_mod(T score, long long b, long long h, long long q, long long kv, HbFlexTile* t) {
  return (T)30 * hb_tanh(score * (T)(1.0 / 30));
}

template <typename T, int LINE = 0>
HB_FN T hb_joint(T score, long long b, long long h, long long q, long long kv, T grad, HbFlexTile* t) {
  const T th = hb_tanh(score * (T)(1.0 / 30));
  return grad * ((T)1 - th * th);
}

inline void lab_buffers(HbFlexCudaArgs&, long long, long long, long long) {}

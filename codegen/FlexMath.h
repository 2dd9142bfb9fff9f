// Float exp, exp2, log, log2, log1p, expm1 and sigmoid for the generated CPU FlexAttention code: branch-free
// (no calls, no tables; selects pick among computed values), so that the compiler vectorizes the tile loops
// that call them (with -fno-trapping-math: codegen/HostCompiler.cpp), where the C library's expf and logf
// keep a loop scalar (no -ffast-math there, so no vector math library is substituted). Accuracy: within 2 ulp of the correctly rounded result on normal
// arguments, with the C library's special values (inf, NaN, 0, negative arguments of the logs, overflow
// to inf and underflow to 0 through the subnormals); tests/cpp/core/flex_math_test.cpp sweeps them, and
// checks that a loop calling each one vectorizes with the kernels' flags.
//
// Not a header this build compiles into the core: CMake embeds the text in the generated kernels'
// prelude (codegen/FlexKernelGen.cpp, after HB_FN is defined), and the core test includes it with HB_FN
// defined as `static inline`. CUDA builds of the same source keep the device library's functions.
//
// The method is the textbook one (Cody and Waite's range reduction, Cephes' single-precision minimax
// polynomials): exp(x) = 2^n exp(r), r = x - n ln 2 in [-ln2/2, ln2/2], ln 2 split in two so n ln 2 is
// exact; log(x) = e ln 2 + log(m), m in [sqrt(1/2), sqrt(2)); log1p and expm1 by the usual corrections
// of log(1 + x) and exp(x) - 1 near 0 (Goldberg's and Kahan's).

#ifndef HB_FN
#error "define HB_FN before including codegen/FlexMath.h"
#endif

HB_FN float hb_f32_of_bits(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
HB_FN unsigned int hb_bits_of_f32(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }

// exp(r) for |r| <= ln2/2 + a little (Cephes expf's coefficients).
HB_FN float hb_exp_reduced(float r) {
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}

// y * 2^n for an integral float n in [-151, 129]: two factors, so each one's exponent field is normal and a
// subnormal or overflowing result comes from one rounded multiply. n is NaN-free (the caller's select).
HB_FN float hb_scale2(float y, float n) {
  const int ni = (int)n;
  const int n1 = ni >> 1, n2 = ni - n1;  // floor halves: both in [-76, 65]
  return y * hb_f32_of_bits((unsigned int)(n1 + 127) << 23) * hb_f32_of_bits((unsigned int)(n2 + 127) << 23);
}

// round-to-nearest-even of |x| < 2^22 without a call: the 1.5 * 2^23 trick (exact in float arithmetic).
HB_FN float hb_round_small(float x) { return (x + 12582912.0f) - 12582912.0f; }

HB_FN float hb_expf(float x) {
  // Beyond [-104, 89] exp is 0 or inf in float: clamp there so the scale stays in range (the result then
  // underflows or overflows by itself). A NaN passes the clamp (both compares are false).
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float xn = xc == xc ? xc : 0.0f;  // n from a number; the NaN flows through r
  const float n = hb_round_small(xn * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;  // ln 2 = 0.693359375 - 2.12194440e-4: n * the first part is exact
  r = r + n * 2.12194440e-4f;
  return hb_scale2(hb_exp_reduced(r), n);
}

HB_FN float hb_exp2f(float x) {
  const float xc = x < -151.0f ? -151.0f : (x > 129.0f ? 129.0f : x);
  const float xn = xc == xc ? xc : 0.0f;
  const float n = hb_round_small(xn);
  return hb_scale2(hb_exp_reduced((xc - n) * 0.693147180559945309f), n);  // xc - n is exact
}

// log(x) as e + log(m), x = m 2^e with m in [sqrt(1/2), sqrt(2)): e in *e, log(m) returned. Finite
// positive x only (the callers select the special values). Subnormals are scaled into the normal range
// first (by 2^23, counted back in e).
HB_FN float hb_log_parts(float x, float* e_out) {
  const bool sub = x < 1.17549435e-38f;
  const float xs = x * (sub ? 8388608.0f : 1.0f);
  const unsigned int u = hb_bits_of_f32(xs);
  float e = (float)((int)((u >> 23) & 0xffu) - 127) - (sub ? 23.0f : 0.0f);
  float m = hb_f32_of_bits((u & 0x007fffffu) | 0x3f800000u);  // in [1, 2)
  const bool high = m > 1.41421356237309505f;
  const float half = m * 0.5f;
  m = high ? half : m;
  const float e1 = e + 1.0f;
  *e_out = high ? e1 : e;
  const float f = m - 1.0f;  // exact; in [-0.293, 0.415)
  float p = 7.0376836292e-2f;  // Cephes logf's coefficients
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float z = f * f;
  return f + (f * z * p - 0.5f * z);
}

// The C library's special values of a logarithm: log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN
// stays NaN.
HB_FN float hb_log_special(float x, float y) {
  const float inf = hb_f32_of_bits(0x7f800000u), minus_inf = hb_f32_of_bits(0xff800000u),
              nan = hb_f32_of_bits(0x7fc00000u);
  y = x == 0.0f ? minus_inf : y;
  y = x < 0.0f ? nan : y;
  y = x == inf ? inf : y;
  return x == x ? y : x;
}

HB_FN float hb_logf(float x) {
  float e;
  const float lm = hb_log_parts(x, &e);
  // e ln 2 in two parts (ln 2 = 0.693359375 - 2.12194440e-4; e times the first is exact), small first.
  return hb_log_special(x, (lm - 2.12194440e-4f * e) + 0.693359375f * e);
}

// log2(x) = e + log(m) / ln 2: exact for powers of two.
HB_FN float hb_log2f(float x) {
  float e;
  const float lm = hb_log_parts(x, &e);
  return hb_log_special(x, lm * 1.44269504088896341f + e);
}

// log(1 + x): log(u) x / (u - 1) with u = 1 + x rounded, which cancels u's rounding; x itself where u == 1.
HB_FN float hb_log1pf(float x) {
  const float u = 1.0f + x;
  const float inf = hb_f32_of_bits(0x7f800000u);
  const float corrected = hb_logf(u) * (x / (u - 1.0f));  // NaN where u == 1, not selected then
  float y = u == 1.0f ? x : corrected;
  y = x == inf ? inf : y;
  return x == x ? y : x;
}

// exp(x) - 1: near 0, (u - 1) x / log(u) with u = exp(x) rounded (Kahan), which cancels u's rounding;
// elsewhere u - 1 (no cancellation left to fear: |u - 1| > 0.39).
HB_FN float hb_expm1f(float x) {
  const float u = hb_expf(x);
  const float corrected = (u - 1.0f) * (x / hb_logf(u));  // NaN where u == 1, not selected then
  const float near0 = u == 1.0f ? x : corrected;
  const float y = (x > -0.5f && x < 0.5f) ? near0 : u - 1.0f;
  return x == x ? y : x;
}

// 1 / (1 + exp(-x)), as exp(x) / (1 + exp(x)) for x < 0, so that no exp overflows: e = exp(-|x|) <= 1.
HB_FN float hb_sigmoidf(float x) {
  const float e = hb_expf(x < 0.0f ? x : -x);
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

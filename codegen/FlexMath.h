// Float exp, exp2, log, log2, log1p, expm1, sigmoid, sin, cos, tan, erf and erfc for the generated CPU
// FlexAttention code: branch-free (no calls, no tables; selects pick among computed values), so that the
// compiler vectorizes the tile loops that call them (with -fno-trapping-math: codegen/HostCompiler.cpp),
// where the C library's expf and logf keep a loop scalar (no -ffast-math there, so no vector math library is substituted). Accuracy: within 2 ulp of the correctly rounded result on normal
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
// of log(1 + x) and exp(x) - 1 near 0 (Goldberg's and Kahan's). sin, cos, tan, erf and erfc work in double
// (below, with their own accuracy notes), sin, cos and tan for every float.

#ifndef HB_FN
#error "define HB_FN before including codegen/FlexMath.h"
#endif

HB_FN float hb_f32_of_bits(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
HB_FN unsigned int hb_bits_of_f32(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }

// c0 + x (c1 + x (c2 + ...)) by Horner's rule: the polynomials below, coefficients from the constant term up.
template <typename T> HB_FN T hb_horner(T, T c) { return c; }
template <typename T, typename... C> HB_FN T hb_horner(T x, T c, C... cs) { return hb_horner(x, cs...) * x + c; }

// exp(r) for |r| <= ln2/2 + a little (Cephes expf's coefficients).
HB_FN float hb_exp_reduced(float r) {
  const float p = hb_horner(r, 5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f, 8.3334519073e-3f, 1.3981999507e-3f,
                            1.9875691500e-4f);
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
  const float p = hb_horner(f, 3.3333331174e-1f, -2.4999993993e-1f, 2.0000714765e-1f, -1.6668057665e-1f,  // Cephes logf's
                            1.4249322787e-1f, -1.2420140846e-1f, 1.1676998740e-1f, -1.1514610310e-1f, 7.0376836292e-2f);
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

// ---- sin, cos, tan, erf, erfc: in double inside (the float argument converted exactly, the result rounded
// once), so that the argument reduction and the polynomials add nothing a float result can see. The loops
// that call them vectorize as the ones above do, with half as many lanes for the double steps.

// Round-to-nearest-even of |v| < 2^51 without a call (the 1.5 * 2^52 trick).
HB_FN double hb_round_d(double v) { return (v + 6755399441055744.0) - 6755399441055744.0; }

// p - 4 round(p / 4), exactly, for p = a float times a 28-bit piece of 2/pi (at most 52 significant bits):
// in [-2, 2] below 2^53, and 0 from there on, where such a p is a multiple of 4.
HB_FN double hb_mod4(double p) {
  const double m = p - 4.0 * hb_round_d(p * 0.25);
  return __builtin_fabs(p) < 9007199254740992.0 ? m : 0.0;  // (a && of two compares kept GCC from vectorizing)
}

// p added to hi + lo: hi the multiples of 2^-24 (p rounded there; |p| < 2^27), whose sum is exact, lo the rest.
HB_FN void hb_add_split(double p, double* hi, double* lo) {
  const double h = (p + 402653184.0) - 402653184.0;  // 1.5 * 2^28
  *hi += h;
  *lo += p - h;
}

// x - n pi/2 and n's low bits (the quadrant) in *q, for any finite float x, without a table (Payne and
// Hanek's reduction, unrolled): 2/pi in seven pieces of 28 bits, so x times each is exact (24 x 28 bits);
// each product's multiples of 4 dropped (exactly: hb_mod4; the last three products have none), what is
// left split at 2^-24 into a part whose sum is exact and the rest. That is x 2/pi mod 4 to about 2^-68,
// 2/pi's 196 bits covering the largest float's 2^128 with room; r = (that - n) pi/2 keeps its relative
// accuracy even for the floats nearest a multiple of pi/2 (|r| > 2^-30 for every float: the closest,
// 0x1.f37c8ap+95, is 1.6e-9 from a multiple). Cody and Waite's reduction in double would be cheaper (sin
// at 0.65 against 2.0 ns per element), but exact only to |x| ~ 2^30 and wrong past 2^51; this one is right
// for every float and still 3.5x faster than the C library's sinf (7.0-7.3 ns; arguments in [-10, 10], a
// loop of their own, 2-core development machine).
HB_FN double hb_trig_reduce(double x, int* q) {
  double hi = 0.0, lo = 0.0;
  hb_add_split(hb_mod4(x * 0x1.45f306cp-1), &hi, &lo);
  hb_add_split(hb_mod4(x * 0x1.c9c882ap-29), &hi, &lo);
  hb_add_split(hb_mod4(x * 0x1.4fe13a8p-59), &hi, &lo);
  hb_add_split(hb_mod4(x * 0x1.f47d4dp-86), &hi, &lo);
  hb_add_split(x * 0x1.bb81b6cp-113, &hi, &lo);
  hb_add_split(x * 0x1.4acc9ep-143, &hi, &lo);
  hb_add_split(x * 0x1.0e4107cp-170, &hi, &lo);
  hi = hb_mod4(hi);
  const double n = hb_round_d(hi);
  *q = (int)n;
  return ((hi - n) + lo) * 1.5707963267948966;
}

// sin(r) and cos(r) for |r| <= pi/4 (a little beyond): r (1 + r^2 s(r^2)) within 2^-37 of sin relative (a
// product, so sin(-0) = -0), and 1 + r^2 c(r^2) within 2^-33 of cos (minimax-fitted, the usual
// k_sinf/k_cosf degrees).
HB_FN double hb_sin_poly(double r) {
  const double z = r * r;
  return r * (1.0 + z * hb_horner(z, -1.6666666640778158e-01, 8.333329302592715e-03, -1.9839311532217861e-04,
                                  2.718114499894967e-06));
}
HB_FN double hb_cos_poly(double r) {
  const double z = r * r;
  return 1.0 + z * hb_horner(z, -4.9999999694246533e-01, 4.1666620330677445e-02, -1.3886680801024729e-03,
                             2.438348684289715e-05);
}

// sin(x) (cos = 0) or cos(x) (cos = 1) for float x: the reduced argument's sine or cosine by quadrant; NaN
// for NaN and the infinities (x - x is 0 only for a finite x). The reduction's sums make r = +0 of x = -0:
// sin keeps x's zero.
HB_FN float hb_sincosf(float x, int cos) {
  const bool finite = x - x == 0.0f;
  int q;
  const double r = hb_trig_reduce(finite ? (double)x : 0.0, &q);
  q += cos;
  const double s = hb_sin_poly(r), c = hb_cos_poly(r);
  double y = (q & 1) ? c : s;
  y = (q & 2) ? -y : y;
  y = (cos == 0 && x == 0.0f) ? (double)x : y;
  return finite ? (float)y : hb_f32_of_bits(0x7fc00000u);
}
HB_FN float hb_sinf(float x) { return hb_sincosf(x, 0); }
HB_FN float hb_cosf(float x) { return hb_sincosf(x, 1); }

// tan(x) = sin(r) / cos(r), or -cos(r) / sin(r) in the odd quadrants (sin(r) is 0 only at x = 0).
HB_FN float hb_tanf(float x) {
  const bool finite = x - x == 0.0f;
  int q;
  const double r = hb_trig_reduce(finite ? (double)x : 0.0, &q);
  const double s = hb_sin_poly(r), c = hb_cos_poly(r);
  const double y = ((q & 1) ? -c : s) / ((q & 1) ? s : c);
  return finite ? (x == 0.0f ? x : (float)y) : hb_f32_of_bits(0x7fc00000u);
}

// erf(x) for |x| < 1: x p(x^2), within 2^-40 of erf relative (minimax-fitted, degree 17 in x).
HB_FN double hb_erf_small(double x) {
  return x * hb_horner(x * x, 1.1283791670945922, -3.7612638888533517e-01, 1.1283791285788947e-01,
                       -2.6866131435334385e-02, 5.223776493286729e-03, -8.542490576040613e-04, 1.1954836109990347e-04,
                       -1.3898799057598448e-05, 1.0563208718199505e-06);
}

// erfc(a) for a in [1, 10.1]: exp(-a^2) erfcx(a), erfcx(a) = t u(t) with t = 2 / (2 + a), u of degree 9,
// within 2^-31 of erfcx relative (minimax-fitted). a^2 is exact in double; it is split into a float h
// and the rest l (|l| <= 2^-18), exp(-a^2) = exp(-h) (1 - l), so exp's argument carries no rounding (an
// error of d in it is a relative error d in the result, 2^-24 * 100 = 6e-6 at a = 10 unsplit). Past
// h = 64, exp(-h) = exp(-(h - 64)) e^-64 (h - 64 exact), so the float exp stays normal and exact to its 1
// ulp where erfc falls through the subnormals to its underflow (10.06).
HB_FN double hb_erfc_tail(float a) {
  const double ad = a;
  const double a2 = ad * ad;
  const float h = (float)a2;
  const double l = a2 - (double)h;
  const bool far = h > 64.0f;
  const double e = (double)hb_expf(far ? 64.0f - h : -h) * (far ? 1.6038109389511792e-28 : 1.0) * (1.0 - l);
  const double t = 2.0 / (2.0 + ad);
  const double u = hb_horner(t, 0x1.20dd0dee71de1p-2, 0x1.20e872d48e021p-2, 0x1.f88895dbe5047p-3, 0x1.6f0916e648a82p-3,
                             0x1.301ce8cc310f5p-4, 0x1.c87cfe493d9a9p-8, -0x1.ba93d5fa52882p-6, -0x1.8f7fb38e3ad6ep-3,
                             0x1.c562a6581f06bp-3, -0x1.20c039e1c5038p-4);
  return e * (t * u);
}

// |x| clamped to [1, 10.1] for hb_erfc_tail (erfc is 0 in float from 10.06 on; NaN passes).
HB_FN float hb_erf_tail_arg(float x) {
  const float a = x < 0.0f ? -x : x;
  return a > 10.1f ? 10.1f : (a < 1.0f ? 1.0f : a);
}

// erf: the polynomial below 1 in magnitude, 1 - erfc(|x|) with erfc's sign above (erfc(|x|) <= 0.16 there,
// so the subtraction loses nothing); +-1 at +-inf, NaN kept.
HB_FN float hb_erff(float x) {
  const double tail = 1.0 - hb_erfc_tail(hb_erf_tail_arg(x));
  const double y = (x < 1.0f && x > -1.0f) ? hb_erf_small(x) : (x < 0.0f ? -tail : tail);
  return x == x ? (float)y : x;
}

// erfc: the tail from 1 on, 2 - tail(|x|) to -1, 1 - erf(x) between (in double: erfc(1) = 0.16 leaves the
// polynomial's 2^-40 at 2^-37); 0 at +inf, 2 at -inf, NaN kept.
HB_FN float hb_erfcf(float x) {
  const double tail = hb_erfc_tail(hb_erf_tail_arg(x));
  double y = 1.0 - hb_erf_small(x);
  y = x >= 1.0f ? tail : y;
  y = x <= -1.0f ? 2.0 - tail : y;
  return x == x ? (float)y : x;
}

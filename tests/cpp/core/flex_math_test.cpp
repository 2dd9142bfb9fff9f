// codegen/FlexMath.h (the generated CPU code's float exp, exp2, log, log2, log1p, expm1, sigmoid, sin, cos,
// tan, erf, erfc) against the double-precision C library rounded to float: every float of the argument
// ranges that matter, by a stride through the bit patterns, plus the special values and, for sin, cos and
// tan, the floats nearest the multiples of pi/2 (the hardest to reduce). The bound is 2 ulp (units in the
// last place of the float result, subnormal results counted in subnormal units). The same sweeps run
// through the functions as the kernels build them (the host compiler's flags: vectorized, contracted to
// FMA where the CPU has it).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <limits>
#include <string>
#include <vector>

#include "TempDir.h"
#include "codegen/FlexMathText.h"
#include "codegen/HostCompiler.h"

namespace flex_math {
#define HB_FN static inline
#include "codegen/FlexMath.h"
#undef HB_FN
}  // namespace flex_math

namespace {

using Fn = float (*)(float);
using Ref = std::function<double(double)>;
using Batch = std::function<void(float* s, int n)>;  // s[j] = f(s[j]) for j < n

Batch scalar(Fn fn) {
  return [fn](float* s, int n) {
    for (int j = 0; j < n; ++j) s[j] = fn(s[j]);
  };
}

// Floats as ordered integers: the ulp distance between two finite floats is the difference.
int64_t ordered(float f) {
  int32_t i;
  memcpy(&i, &f, 4);
  return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : static_cast<int64_t>(i);
}

int64_t ulps(float got, float want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : INT64_MAX;
  if (std::isinf(want) || std::isinf(got)) return got == want ? 0 : INT64_MAX;
  return std::llabs(ordered(got) - ordered(want));
}

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Every float whose bits lie in [lo, hi] (as ordered magnitudes, both signs where `both_signs`), by a
// stride, checked against ref; returns the worst ulp error and where it was.
struct Worst {
  int64_t ulps = 0;
  float at = 0, got = 0;
};

// fn over the floats in xs against ref, folded into w.
void check(const Batch& fn, const Ref& ref, std::vector<float>& xs, Worst* w) {
  std::vector<float> ys = xs;
  fn(ys.data(), static_cast<int>(ys.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t e = ulps(ys[i], static_cast<float>(ref(static_cast<double>(xs[i]))));
    if (e > w->ulps) *w = {e, xs[i], ys[i]};
  }
  xs.clear();
}

Worst sweep(const Batch& fn, const Ref& ref, float lo, float hi, bool both_signs, uint32_t stride = 257) {
  Worst w;
  uint32_t a, b;
  memcpy(&a, &lo, 4);
  memcpy(&b, &hi, 4);
  std::vector<float> xs;
  for (uint32_t u = a; u <= b && u >= a; u += stride) {
    for (int s = 0; s < (both_signs ? 2 : 1); ++s) xs.push_back(s ? -from_bits(u) : from_bits(u));
    if (xs.size() >= 4096) check(fn, ref, xs, &w);
  }
  check(fn, ref, xs, &w);
  return w;
}

void expect_within(const char* name, const Batch& fn, const Ref& ref, float lo, float hi, bool both_signs,
                   uint32_t stride = 257) {
  const Worst w = sweep(fn, ref, lo, hi, both_signs, stride);
  EXPECT_LE(w.ulps, 2) << name << ": " << w.ulps << " ulp at x = " << w.at << " (got " << w.got << ", want "
                       << static_cast<float>(ref(w.at)) << ")";
}
void expect_within(const char* name, Fn fn, const Ref& ref, float lo, float hi, bool both_signs) {
  expect_within(name, scalar(fn), ref, lo, hi, both_signs);
}

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kTiny = std::numeric_limits<float>::denorm_min();

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(FlexMath, ExpIsWithinTwoUlpFromUnderflowToOverflow) {
  // Arguments from 2^-149 in magnitude up to past overflow; results from 0 through the subnormals to inf.
  expect_within("exp", flex_math::hb_expf, [](double x) { return std::exp(x); }, kTiny, 110.0f, true);
  expect_within("exp2", flex_math::hb_exp2f, [](double x) { return std::exp2(x); }, kTiny, 160.0f, true);
  expect_within("expm1", flex_math::hb_expm1f, [](double x) { return std::expm1(x); }, kTiny, 110.0f, true);
  expect_within("sigmoid", flex_math::hb_sigmoidf, sigmoid, kTiny, 120.0f, true);
}

TEST(FlexMath, LogIsWithinTwoUlpOverEveryPositiveFloat) {
  expect_within("log", flex_math::hb_logf, [](double x) { return std::log(x); }, kTiny,
                std::numeric_limits<float>::max(), false);
  expect_within("log2", flex_math::hb_log2f, [](double x) { return std::log2(x); }, kTiny,
                std::numeric_limits<float>::max(), false);
  expect_within("log1p", flex_math::hb_log1pf, [](double x) { return std::log1p(x); }, kTiny,
                std::numeric_limits<float>::max(), false);
  // log1p's negative side: (-1, 0).
  expect_within("log1p", flex_math::hb_log1pf, [](double x) { return std::log1p(x); }, -kTiny, -0.99999994f, false);
}

// sin, cos and tan reduce every float exactly enough for 2 ulp (hb_trig_reduce).
struct Unary {
  const char* name;
  Fn fn;
  Ref ref;
};
const Unary kTrig[] = {{"sin", flex_math::hb_sinf, [](double x) { return std::sin(x); }},
                       {"cos", flex_math::hb_cosf, [](double x) { return std::cos(x); }},
                       {"tan", flex_math::hb_tanf, [](double x) { return std::tan(x); }}};

TEST(FlexMath, SinCosTanAreWithinTwoUlpOverEveryFloat) {
  for (const Unary& f : kTrig) expect_within(f.name, f.fn, f.ref, kTiny, std::numeric_limits<float>::max(), true);
}

// The floats nearest the multiples of pi/2, where x - n pi/2 cancels the most, so where a reduction with
// too few bits of pi shows (the zeros of sin and cos, tan's zeros and poles; a stride sweep misses them):
// the floats next to every multiple below 2^21 and every 499th up to 2^30, and in each binade from 1 to
// 2^127 the float with the smallest |sin x| and the one with the smallest |cos x| (an exhaustive search
// with the C library's double sincos; the closest of all, 0x1.f37c8ap+95, is 1.6e-9 from a multiple).
TEST(FlexMath, SinCosTanAreWithinTwoUlpNearTheMultiplesOfHalfPi) {
  std::vector<float> xs = {
    0x1p+0f, 0x1.921fb6p+0f, 0x1.921fb6p+1f, 0x1p+1f, 0x1.921fb6p+2f, 0x1.2d97c8p+2f, 0x1.2d97c8p+3f,
    0x1.c463acp+3f, 0x1.2d97c8p+4f, 0x1.78fdbap+4f, 0x1.2d97c8p+5f, 0x1.b7d2aep+5f, 0x1.2d97c8p+6f,
    0x1.e3ce26p+6f, 0x1.2d97c8p+7f, 0x1.f9cbe2p+7f, 0x1.f9cbe2p+8f, 0x1.2298eap+8f, 0x1.f9cbe2p+9f,
    0x1.8e3266p+9f, 0x1.f9cbe2p+10f, 0x1.c3ff24p+10f, 0x1.f9cbe2p+11f, 0x1.17cc5p+11f, 0x1.17cc5p+12f,
    0x1.a3b278p+12f, 0x1.17cc5p+13f, 0x1.5dbf64p+13f, 0x1.17cc5p+14f, 0x1.3ac5dap+14f, 0x1.17cc5p+15f,
    0x1.9a48dep+15f, 0x1.9a48dep+16f, 0x1.019abep+16f, 0x1.9a48dep+17f, 0x1.2af844p+17f, 0x1.9a48dep+18f,
    0x1.04ccbcp+18f, 0x1.04ccbcp+19f, 0x1.87331ap+19f, 0x1.04ccbcp+20f, 0x1.90bdfcp+20f, 0x1.04ccbcp+21f,
    0x1.4ac55cp+21f, 0x1.4ac55cp+22f, 0x1.f0280ap+22f, 0x1.4ac55cp+23f, 0x1.dea9e2p+23f, 0x1.4ac55cp+24f,
    0x1.e768f6p+24f, 0x1.e768f6p+25f, 0x1.4665d2p+25f, 0x1.4665d2p+26f, 0x1.96e764p+26f, 0x1.4665d2p+27f,
    0x1.c157f2p+27f, 0x1.4665d2p+28f, 0x1.08ecc2p+28f, 0x1.08ecc2p+29f, 0x1.27a94ap+29f, 0x1.27a94ap+30f,
    0x1.184b06p+30f, 0x1.27a94ap+31f, 0x1.1ffa28p+31f, 0x1.1ffa28p+32f, 0x1.b7a65ep+32f, 0x1.b7a65ep+33f,
    0x1.ffa4e8p+33f, 0x1.ffa4e8p+34f, 0x1.47d0fep+34f, 0x1.47d0fep+35f, 0x1.c7ba38p+35f, 0x1.47d0fep+36f,
    0x1.abc4ep+36f, 0x1.47d0fep+37f, 0x1.b9bf8cp+37f, 0x1.47d0fep+38f, 0x1.b2c236p+38f, 0x1.47d0fep+39f,
    0x1.7d499ap+39f, 0x1.47d0fep+40f, 0x1.628d4cp+40f, 0x1.628d4cp+41f, 0x1.f917a4p+41f, 0x1.628d4cp+42f,
    0x1.add278p+42f, 0x1.628d4cp+43f, 0x1.882fe2p+43f, 0x1.628d4cp+44f, 0x1.ce01eap+44f, 0x1.628d4cp+45f,
    0x1.f0eaeep+45f, 0x1.f0eaeep+46f, 0x1.5118cap+46f, 0x1.f0eaeep+47f, 0x1.a101dcp+47f, 0x1.f0eaeep+48f,
    0x1.705312p+48f, 0x1.705312p+49f, 0x1.b09fp+49f, 0x1.705312p+50f, 0x1.b86d92p+50f, 0x1.b86d92p+51f,
    0x1.dc7ad2p+51f, 0x1.dc7ad2p+52f, 0x1.ee8172p+52f, 0x1.ee8172p+53f, 0x1.f784c2p+53f, 0x1.f784c2p+54f,
    0x1.fc066ap+54f, 0x1.fc066ap+55f, 0x1.fe473ep+55f, 0x1.fe473ep+56f, 0x1.ff67a8p+56f, 0x1.ff67a8p+57f,
    0x1.0f79ap+57f, 0x1.0f79ap+58f, 0x1.97367p+58f, 0x1.0f79ap+59f, 0x1.535808p+59f, 0x1.0f79ap+60f,
    0x1.3168d4p+60f, 0x1.0f79ap+61f, 0x1.20713ap+61f, 0x1.0f79ap+62f, 0x1.f51874p+62f, 0x1.0f79ap+63f,
    0x1.f90e4p+63f, 0x1.0f79ap+64f, 0x1.c82258p+64f, 0x1.c82258p+65f, 0x1.06006p+65f, 0x1.c82258p+66f,
    0x1.5619c2p+66f, 0x1.5619c2p+67f, 0x1.f8aad6p+67f, 0x1.f8aad6p+68f, 0x1.a7624cp+68f, 0x1.a7624cp+69f,
    0x1.45b9bcp+69f, 0x1.a7624cp+70f, 0x1.d83694p+70f, 0x1.d83694p+71f, 0x1.bfcc7p+71f, 0x1.d83694p+72f,
    0x1.cc0182p+72f, 0x1.cc0182p+73f, 0x1.5c0e66p+73f, 0x1.5c0e66p+74f, 0x1.9407f4p+74f, 0x1.5c0e66p+75f,
    0x1.ee18d2p+75f, 0x1.5c0e66p+76f, 0x1.13093p+76f, 0x1.13093p+77f, 0x1.9c8dc8p+77f, 0x1.13093p+78f,
    0x1.57cb7cp+78f, 0x1.13093p+79f, 0x1.356a56p+79f, 0x1.13093p+80f, 0x1.f4a21cp+80f, 0x1.13093p+81f,
    0x1.eaf918p+81f, 0x1.13093p+82f, 0x1.e62496p+82f, 0x1.13093p+83f, 0x1.8dc776p+83f, 0x1.8dc776p+84f,
    0x1.1cd69ap+84f, 0x1.8dc776p+85f, 0x1.32ede2p+85f, 0x1.32ede2p+86f, 0x1.605aacp+86f, 0x1.32ede2p+87f,
    0x1.e31b38p+87f, 0x1.32ede2p+88f, 0x1.744e28p+88f, 0x1.32ede2p+89f, 0x1.abb4bp+89f, 0x1.abb4bp+90f,
    0x1.4ea126p+90f, 0x1.abb4bp+91f, 0x1.40c784p+91f, 0x1.40c784p+92f, 0x1.0b50eep+92f, 0x1.0b50eep+93f,
    0x1.f4f9cp+93f, 0x1.0b50eep+94f, 0x1.d05738p+94f, 0x1.0b50eep+95f, 0x1.f37c8ap+95f, 0x1.f37c8ap+96f,
    0x1.14799p+96f, 0x1.f37c8ap+97f, 0x1.693fc2p+97f, 0x1.f37c8ap+98f, 0x1.ae5e26p+98f, 0x1.f37c8ap+99f,
    0x1.d0ed58p+99f, 0x1.f37c8ap+100f, 0x1.0b05dep+100f, 0x1.f37c8ap+101f, 0x1.7f4134p+101f, 0x1.7f4134p+102f,
    0x1.33dbfp+102f, 0x1.7f4134p+103f, 0x1.598e92p+103f, 0x1.7f4134p+104f, 0x1.cc383p+104f, 0x1.cc383p+105f,
    0x1.a5bcb2p+105f, 0x1.a5bcb2p+106f, 0x1.32aea6p+106f, 0x1.a5bcb2p+107f, 0x1.df43b8p+107f,
    0x1.df43b8p+108f, 0x1.2928e2p+108f, 0x1.2928e2p+109f, 0x1.a0f9dp+109f, 0x1.a0f9dp+110f, 0x1.484dd6p+110f,
    0x1.484dd6p+111f, 0x1.b08c4ap+111f, 0x1.b08c4ap+112f, 0x1.e4ab84p+112f, 0x1.b08c4ap+113f,
    0x1.2674fcp+113f, 0x1.b08c4ap+114f, 0x1.517106p+114f, 0x1.517106p+115f, 0x1.80fea8p+115f,
    0x1.80fea8p+116f, 0x1.e262b8p+116f, 0x1.80fea8p+117f, 0x1.20befep+117f, 0x1.20befep+118f,
    0x1.f99756p+118f, 0x1.f99756p+119f, 0x1.2ceb8p+119f, 0x1.2ceb8p+120f, 0x1.c3614p+120f, 0x1.2ceb8p+121f,
    0x1.d8660ap+121f, 0x1.d8660ap+122f, 0x1.fe037ap+122f, 0x1.fe037ap+123f, 0x1.eb34c2p+123f,
    0x1.fe037ap+124f, 0x1.f49c1ep+124f, 0x1.fe037ap+125f, 0x1.f94fccp+125f, 0x1.fe037ap+126f, 0x1.7b9b4p+126f,
    0x1.7b9b4p+127f, 0x1.fc490ap+127f,
  };
  for (long long k = 1; k * 1.5707963267948966 < 1073741824.0; k += k < (1 << 21) ? 1 : 499) {
    const float x = static_cast<float>(k * 1.5707963267948966);
    xs.insert(xs.end(), {std::nextafter(x, 0.0f), x, std::nextafter(x, kInf)});
  }
  for (size_t i = 0, n = xs.size(); i < n; ++i) xs.push_back(-xs[i]);
  for (const Unary& f : kTrig) {
    std::vector<float> copy = xs;
    Worst w;
    check(scalar(f.fn), f.ref, copy, &w);
    EXPECT_LE(w.ulps, 2) << f.name << ": " << w.ulps << " ulp at x = " << w.at << " (got " << w.got << ", want "
                         << static_cast<float>(f.ref(w.at)) << ")";
  }
}

TEST(FlexMath, ErfAndErfcAreWithinTwoUlpOverTheirWholeRange) {
  // To 20: erf is +-1 in float from 3.92 on, erfc 2 below -3.92 and 0 above 10.06.
  expect_within("erf", flex_math::hb_erff, [](double x) { return std::erf(x); }, kTiny, 20.0f, true);
  expect_within("erfc", flex_math::hb_erfcf, [](double x) { return std::erfc(x); }, kTiny, 20.0f, true);
}

// erfc's tail, every 3rd float from 1 (erfc 0.16) to 10.1: its relative accuracy as it falls through
// the normal floats and the subnormals to 0 (exp(-x^2) underflows first: the code must not lose it).
TEST(FlexMath, ErfcKeepsItsRelativeAccuracyInTheTailDownToUnderflow) {
  const Ref erfc = [](double x) { return std::erfc(x); };
  expect_within("erfc", scalar(flex_math::hb_erfcf), erfc, 1.0f, 10.1f, false, 3);
  // The last float whose erfc is not 0, and the first whose is, agree with the library's.
  float x = 10.0f;
  while (static_cast<float>(erfc(x)) != 0.0f) x = std::nextafter(x, kInf);
  EXPECT_EQ(flex_math::hb_erfcf(x), 0.0f) << x;
  const float last = std::nextafter(x, 0.0f);
  EXPECT_EQ(flex_math::hb_erfcf(last), static_cast<float>(erfc(last))) << last;
  EXPECT_GT(flex_math::hb_erfcf(last), 0.0f) << last;
}

TEST(FlexMath, SpecialValuesAreTheCLibrarys) {
  struct Case {
    const char* name;
    Fn fn;
    float (*lib)(float);
  };
  const Case cases[] = {
      {"exp", flex_math::hb_expf, [](float x) { return std::exp(x); }},
      {"exp2", flex_math::hb_exp2f, [](float x) { return std::exp2(x); }},
      {"expm1", flex_math::hb_expm1f, [](float x) { return std::expm1(x); }},
      {"log", flex_math::hb_logf, [](float x) { return std::log(x); }},
      {"log2", flex_math::hb_log2f, [](float x) { return std::log2(x); }},
      {"log1p", flex_math::hb_log1pf, [](float x) { return std::log1p(x); }},
      {"sigmoid", flex_math::hb_sigmoidf, [](float x) { return 1.0f / (1.0f + std::exp(-x)); }},
      {"sin", flex_math::hb_sinf, [](float x) { return std::sin(x); }},
      {"cos", flex_math::hb_cosf, [](float x) { return std::cos(x); }},
      {"tan", flex_math::hb_tanf, [](float x) { return std::tan(x); }},
      {"erf", flex_math::hb_erff, [](float x) { return std::erf(x); }},
      {"erfc", flex_math::hb_erfcf, [](float x) { return std::erfc(x); }},
  };
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, -1.0f, -2.0f, 1.0f, 2.0f, 0.5f, -0.5f,
                            1e-30f, -1e-30f, kTiny, 88.0f, 89.0f, -104.0f, 128.0f, -150.0f, 1e30f, -1e30f,
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  for (const Case& c : cases) {
    for (float x : specials) {
      const float got = c.fn(x), want = c.lib(x);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << c.name << "(" << x << ") = " << got << ", want NaN";
      } else {
        EXPECT_LE(ulps(got, want), 2) << c.name << "(" << x << ") = " << got << ", want " << want;
      }
    }
  }
  // Exact where the C library is: exp(0) = 1, log(1) = 0, exp2 and log2 of powers of two; the odd functions
  // keep the sign of a zero; erf and erfc at 0 and the infinities.
  EXPECT_EQ(flex_math::hb_expf(0.0f), 1.0f);
  EXPECT_EQ(flex_math::hb_logf(1.0f), 0.0f);
  for (Fn odd : {flex_math::hb_sinf, flex_math::hb_tanf, flex_math::hb_erff}) {
    EXPECT_TRUE(odd(0.0f) == 0.0f && !std::signbit(odd(0.0f)));
    EXPECT_TRUE(odd(-0.0f) == 0.0f && std::signbit(odd(-0.0f)));
  }
  EXPECT_EQ(flex_math::hb_cosf(0.0f), 1.0f);
  EXPECT_EQ(flex_math::hb_cosf(-0.0f), 1.0f);
  EXPECT_EQ(flex_math::hb_erfcf(0.0f), 1.0f);
  EXPECT_EQ(flex_math::hb_erff(kInf), 1.0f);
  EXPECT_EQ(flex_math::hb_erff(-kInf), -1.0f);
  EXPECT_EQ(flex_math::hb_erfcf(kInf), 0.0f);
  EXPECT_EQ(flex_math::hb_erfcf(-kInf), 2.0f);
  for (int n = -149; n <= 127; ++n) {
    EXPECT_EQ(flex_math::hb_exp2f(static_cast<float>(n)), std::ldexp(1.0f, n)) << "exp2(" << n << ")";
    EXPECT_EQ(flex_math::hb_log2f(std::ldexp(1.0f, n)), static_cast<float>(n)) << "log2(2^" << n << ")";
  }
}

// What the header is for: a loop over a tile calling any of its functions vectorizes under the flags the
// generated kernels are built with (a branch or a guarded float operation would keep it scalar). GCC
// says so with -fopt-info-vec; another compiler skips the test.
TEST(FlexMath, TileLoopsCallingItVectorizeWithTheKernelsFlags) {
  const std::string dir = hb::test::temp_dir();
  std::string version;
  {
    FILE* p = popen("env -u LD_PRELOAD c++ --version 2>&1", "r");
    ASSERT_NE(p, nullptr);
    char buf[256];
    while (fgets(buf, sizeof buf, p)) version += buf;
    pclose(p);
  }
  if (version.find("Free Software Foundation") == std::string::npos || version.find("clang") != std::string::npos)
    GTEST_SKIP() << "not GCC: " << version;
  const char* fns[] = {"hb_expf", "hb_exp2f", "hb_expm1f", "hb_logf", "hb_log2f", "hb_log1pf", "hb_sigmoidf",
                       "hb_sinf", "hb_cosf", "hb_tanf", "hb_erff", "hb_erfcf"};
  std::string src = "#include <cstring>\n#define HB_FN static inline __attribute__((always_inline))\n";
  src += hb::kFlexMathSource;
  src += "\n";
  for (const char* f : fns)  // one loop per line, so a message's line says whose loop it is
    src += std::string("extern \"C\" void loop_") + f + "(float* s, int n) { for (int j = 0; j < n; ++j) s[j] = " + f +
           "(s[j]); }\n";
  { std::ofstream(dir + "/vec.cpp") << src; }
  std::string out;
  {
    const std::string cmd = "cd " + dir + " && env -u LD_PRELOAD c++ " + hb::host_compile_flags() +
                            " -fopt-info-vec-optimized -c vec.cpp -o vec.o 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[1024];
    while (fgets(buf, sizeof buf, p)) out += buf;
    ASSERT_EQ(pclose(p), 0) << out;
  }
  int line = 1;
  for (char c : src) line += c == '\n';
  line -= static_cast<int>(std::size(fns));  // the first loop's line: the loops are the source's last lines
  for (const char* f : fns) {
    EXPECT_NE(out.find("vec.cpp:" + std::to_string(line) + ":"), std::string::npos)
        << "the loop calling " << f << " (vec.cpp:" << line << ") did not vectorize:\n" << out;
    ++line;
  }
}

// The functions as the generated kernels are built (build_host_module: the host compiler and its flags, so
// vectorized, and contracted to FMA where the CPU has it, unlike this test's own build of them): each range
// swept again, by a wider stride, through a loop over each function.
TEST(FlexMath, TheKernelsBuildOfItIsAsAccurate) {
  struct Range {
    const char* fn;
    Ref ref;
    float lo, hi;
    bool both_signs;
  };
  const Range ranges[] = {
      {"hb_expf", [](double x) { return std::exp(x); }, kTiny, 110.0f, true},
      {"hb_exp2f", [](double x) { return std::exp2(x); }, kTiny, 160.0f, true},
      {"hb_expm1f", [](double x) { return std::expm1(x); }, kTiny, 110.0f, true},
      {"hb_sigmoidf", sigmoid, kTiny, 120.0f, true},
      {"hb_logf", [](double x) { return std::log(x); }, kTiny, std::numeric_limits<float>::max(), false},
      {"hb_log2f", [](double x) { return std::log2(x); }, kTiny, std::numeric_limits<float>::max(), false},
      {"hb_log1pf", [](double x) { return std::log1p(x); }, kTiny, std::numeric_limits<float>::max(), false},
      {"hb_log1pf", [](double x) { return std::log1p(x); }, -kTiny, -0.99999994f, false},
      {"hb_sinf", [](double x) { return std::sin(x); }, kTiny, std::numeric_limits<float>::max(), true},
      {"hb_cosf", [](double x) { return std::cos(x); }, kTiny, std::numeric_limits<float>::max(), true},
      {"hb_tanf", [](double x) { return std::tan(x); }, kTiny, std::numeric_limits<float>::max(), true},
      {"hb_erff", [](double x) { return std::erf(x); }, kTiny, 20.0f, true},
      {"hb_erfcf", [](double x) { return std::erfc(x); }, kTiny, 20.0f, true},
  };
  std::string src = "#include <cstring>\n#define HB_FN static inline __attribute__((always_inline))\n";
  src += hb::kFlexMathSource;
  std::set<std::string> looped;
  for (const Range& r : ranges)
    if (looped.insert(r.fn).second)
      src += std::string("\nextern \"C\" void loop_") + r.fn + "(float* s, int n) { for (int j = 0; j < n; ++j) s[j] = " +
             r.fn + "(s[j]); }";
  const hb::HostBuild build = hb::build_host_module(src + "\n", {"c++", hb::test::temp_dir()});
  ASSERT_TRUE(build.module) << build.error;
  for (const Range& r : ranges) {
    auto* loop = reinterpret_cast<void (*)(float*, int)>(build.module->symbol(("loop_" + std::string(r.fn)).c_str()));
    ASSERT_NE(loop, nullptr) << r.fn;
    expect_within(r.fn, Batch(loop), r.ref, r.lo, r.hi, r.both_signs, 1021);
  }
}

}  // namespace

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

// sin, cos and tan: their reduction is exact enough for 2 ulp up to 2^30 in magnitude (HB_TRIG_MAX), and
// NaN beyond (see hb_trig_reduce).
const float kTrigMax = HB_TRIG_MAX;
struct Unary {
  const char* name;
  Fn fn;
  Ref ref;
};
const Unary kTrig[] = {{"sin", flex_math::hb_sinf, [](double x) { return std::sin(x); }},
                       {"cos", flex_math::hb_cosf, [](double x) { return std::cos(x); }},
                       {"tan", flex_math::hb_tanf, [](double x) { return std::tan(x); }}};

TEST(FlexMath, SinCosTanAreWithinTwoUlpUpTo2To30) {
  for (const Unary& f : kTrig) expect_within(f.name, f.fn, f.ref, kTiny, kTrigMax, true);
}

// The floats nearest the multiples of pi/2, where x - n pi/2 cancels the most, so where a reduction with
// too few bits of pi shows (the zeros of sin and cos, tan's zeros and poles): every multiple below 2^21 and
// every 499th above, up to 2^30, each with its two neighbours.
TEST(FlexMath, SinCosTanAreWithinTwoUlpNearTheMultiplesOfHalfPi) {
  std::vector<float> xs;
  for (long long k = 1; k * 1.5707963267948966 < kTrigMax; k += k < (1 << 21) ? 1 : 499) {
    const float x = static_cast<float>(k * 1.5707963267948966);
    for (float y : {std::nextafter(x, 0.0f), x, std::nextafter(x, kInf)})
      if (y <= kTrigMax) xs.insert(xs.end(), {y, -y});
  }
  for (const Unary& f : kTrig) {
    std::vector<float> copy = xs;
    Worst w;
    check(scalar(f.fn), f.ref, copy, &w);
    EXPECT_LE(w.ulps, 2) << f.name << ": " << w.ulps << " ulp at x = " << w.at << " (got " << w.got << ", want "
                         << static_cast<float>(f.ref(w.at)) << ")";
  }
}

// Past 2^30 the reduction would need pi to ~190 bits: NaN there, never a wrong number.
TEST(FlexMath, SinCosTanBeyond2To30AreNaNNotAWrongNumber) {
  const float beyond[] = {std::nextafter(kTrigMax, kInf), 2e9f, 1e20f, std::numeric_limits<float>::max(), kInf, kNaN};
  for (const Unary& f : kTrig) {
    for (float x : beyond) {
      EXPECT_TRUE(std::isnan(f.fn(x))) << f.name << "(" << x << ") = " << f.fn(x);
      EXPECT_TRUE(std::isnan(f.fn(-x))) << f.name << "(" << -x << ") = " << f.fn(-x);
    }
    for (float x : {kTrigMax, -kTrigMax})
      EXPECT_LE(ulps(f.fn(x), static_cast<float>(f.ref(x))), 2) << f.name << "(" << x << ") = " << f.fn(x);
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
    bool trig = false;  // reduces only |x| <= 2^30
  };
  const Case cases[] = {
      {"exp", flex_math::hb_expf, [](float x) { return std::exp(x); }},
      {"exp2", flex_math::hb_exp2f, [](float x) { return std::exp2(x); }},
      {"expm1", flex_math::hb_expm1f, [](float x) { return std::expm1(x); }},
      {"log", flex_math::hb_logf, [](float x) { return std::log(x); }},
      {"log2", flex_math::hb_log2f, [](float x) { return std::log2(x); }},
      {"log1p", flex_math::hb_log1pf, [](float x) { return std::log1p(x); }},
      {"sigmoid", flex_math::hb_sigmoidf, [](float x) { return 1.0f / (1.0f + std::exp(-x)); }},
      {"sin", flex_math::hb_sinf, [](float x) { return std::sin(x); }, true},
      {"cos", flex_math::hb_cosf, [](float x) { return std::cos(x); }, true},
      {"tan", flex_math::hb_tanf, [](float x) { return std::tan(x); }, true},
      {"erf", flex_math::hb_erff, [](float x) { return std::erf(x); }},
      {"erfc", flex_math::hb_erfcf, [](float x) { return std::erfc(x); }},
  };
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, -1.0f, -2.0f, 1.0f, 2.0f, 0.5f, -0.5f,
                            1e-30f, -1e-30f, kTiny, 88.0f, 89.0f, -104.0f, 128.0f, -150.0f, 1e30f};
  for (const Case& c : cases) {
    for (float x : specials) {
      if (c.trig && std::isfinite(x) && std::fabs(x) > kTrigMax) continue;  // NaN there (above)
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
      {"hb_sinf", [](double x) { return std::sin(x); }, kTiny, kTrigMax, true},
      {"hb_cosf", [](double x) { return std::cos(x); }, kTiny, kTrigMax, true},
      {"hb_tanf", [](double x) { return std::tan(x); }, kTiny, kTrigMax, true},
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

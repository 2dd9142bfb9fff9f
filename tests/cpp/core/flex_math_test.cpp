// codegen/FlexMath.h (the generated CPU code's float exp, exp2, log, log2, log1p, expm1, sigmoid) against
// the double-precision C library rounded to float: every float of the argument ranges that matter, by a
// stride through the bit patterns, plus the special values. The bound is 2 ulp (units in the last place
// of the float result, subnormal results counted in subnormal units).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

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
  float at = 0;
};

Worst sweep(Fn fn, const Ref& ref, float lo, float hi, bool both_signs, uint32_t stride = 257) {
  Worst w;
  uint32_t a, b;
  memcpy(&a, &lo, 4);
  memcpy(&b, &hi, 4);
  for (uint32_t u = a; u <= b && u >= a; u += stride) {
    for (int s = 0; s < (both_signs ? 2 : 1); ++s) {
      const float x = s ? -from_bits(u) : from_bits(u);
      const float want = static_cast<float>(ref(static_cast<double>(x)));
      const int64_t e = ulps(fn(x), want);
      if (e > w.ulps) w = {e, x};
    }
  }
  return w;
}

void expect_within(const char* name, Fn fn, const Ref& ref, float lo, float hi, bool both_signs) {
  const Worst w = sweep(fn, ref, lo, hi, both_signs);
  EXPECT_LE(w.ulps, 2) << name << ": " << w.ulps << " ulp at x = " << w.at << " (got " << fn(w.at) << ", want "
                       << static_cast<float>(ref(w.at)) << ")";
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
  };
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, -1.0f, -2.0f, 1.0f, 2.0f, 0.5f, -0.5f,
                            1e-30f, -1e-30f, kTiny, 88.0f, 89.0f, -104.0f, 128.0f, -150.0f, 1e30f};
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
  // Exact where the C library is: exp(0) = 1, log(1) = 0, exp2 and log2 of powers of two.
  EXPECT_EQ(flex_math::hb_expf(0.0f), 1.0f);
  EXPECT_EQ(flex_math::hb_logf(1.0f), 0.0f);
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
  const char* fns[] = {"hb_expf", "hb_exp2f", "hb_expm1f", "hb_logf", "hb_log2f", "hb_log1pf", "hb_sigmoidf"};
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
  line -= 7;  // the first loop's line: the loops are the source's last 7 lines
  for (const char* f : fns) {
    EXPECT_NE(out.find("vec.cpp:" + std::to_string(line) + ":"), std::string::npos)
        << "the loop calling " << f << " (vec.cpp:" << line << ") did not vectorize:\n" << out;
    ++line;
  }
}

}  // namespace

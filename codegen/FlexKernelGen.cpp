#include "codegen/FlexKernelGen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "codegen/FlexKernelAbi.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "codegen/FlexMathText.h"
#include "codegen/FlexSimtKernelText.h"
#include "codegen/FlexTiledKernelText.h"

namespace hb {

namespace {

// Helpers every kernel source carries after the ABI structs. HB_FN marks the inlined scalar functions
// (a CUDA build of the same source makes them __device__).
constexpr const char* kPrelude = R"(
#include <cmath>
#include <cstring>
#ifdef __CUDACC__
#define HB_FN static __device__ __forceinline__
// A captured buffer's element: read-only while a kernel runs, so through the read-only data path. Its
// global address space also tells nvcc that the read does not alias the kernel's shared-memory stores
// (the backward's line tile), so the reads of the next score elements issue before the stores of the
// last: the relative bias's backward went 9.8 -> 7.7 ms on an H100 (docs/flex-attention.md).
#define HB_LD(p) __ldg(p)
#else
#define HB_FN static inline __attribute__((always_inline))
#define HB_LD(p) (*(p))
#endif
HB_FN float hb_bf16(unsigned short v) { unsigned int u = (unsigned int)v << 16; float f; memcpy(&f, &u, 4); return f; }
HB_FN float hb_f16(unsigned short v) {
  const unsigned int sign = (unsigned int)(v & 0x8000u) << 16, exp = (v >> 10) & 0x1f, man = v & 0x3ffu;
  unsigned int u;
  if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
  else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13);
  else if (man == 0) u = sign;
  else { float f = (float)man * 5.9604644775390625e-8f; return sign ? -f : f; }
  float f; memcpy(&f, &u, 4); return f;
}
HB_FN void hb_fail(HbFlexTile* t, int code, int buffer, long long index, long long size) {
  if (!t->error) { t->error = code; t->error_buffer = buffer; t->error_index = index; t->error_size = size; }
}
// eager's indexing: a negative index counts from the end; out of range is an error (element 0 is read).
HB_FN long long hb_index(long long i, long long size, HbFlexTile* t, int buffer) {
  const long long w = i < 0 ? i + size : i;
  if (w < 0 || w >= size) { hb_fail(t, 1, buffer, i, size); return 0; }
  return w;
}
HB_FN long long hb_floordiv(long long a, long long b, HbFlexTile* t) {
  if (b == 0) { hb_fail(t, 2, -1, a, 0); return 0; }
  long long q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) --q; return q;
}
HB_FN long long hb_truncdiv(long long a, long long b, HbFlexTile* t) {
  if (b == 0) { hb_fail(t, 2, -1, a, 0); return 0; }
  return a / b;
}
HB_FN long long hb_mod(long long a, long long b, HbFlexTile* t) {
  if (b == 0) { hb_fail(t, 2, -1, a, 0); return 0; }
  long long r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;
}
HB_FN long long hb_fmod(long long a, long long b, HbFlexTile* t) {
  if (b == 0) { hb_fail(t, 2, -1, a, 0); return 0; }
  return a % b;
}
template <typename T> HB_FN T hb_max(T a, T b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
template <typename T> HB_FN T hb_min(T a, T b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
// tanh: the library's in double; in float a clamped rational function (Eigen's coefficients; within
// 3.5e-7 of tanh relative, NaN kept), branch-free, so the CPU's tile loops vectorize, and on CUDA with
// the fast division (2 ulp) about a third of tanhf's instructions (a soft cap runs it once per score in
// the forward and three times in the backward). A CUDA unit for 16-bit q/k/v (HB_TANH_APPROX) uses the
// hardware's tanh instead: one instruction, with an error near 2^-11, about the rounding of a 16-bit score
// (the float64 tests hold the result to twice eager's error); a soft cap's lab backward went 8.6 -> 5.3 ms
// (H100, D 128, B4 H16 S4096).
HB_FN double hb_tanh(double x) { return std::tanh(x); }
HB_FN float hb_tanh(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750 && defined(HB_TANH_APPROX)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float c = 7.90531110763549805f;  // tanh is 1 in float beyond
  x = x < -c ? -c : (x > c ? c : x);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
#ifdef __CUDACC__
  return __fdividef(x * p, q);  // q lies in [4.9e-3, 1]: far from __fdividef's range limits
#else
  return x * p / q;
#endif
#endif
}
template <typename T> HB_FN T hb_pymod(T a, T b) { const T r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <typename T> HB_FN T hb_sign(T x) { return (T)((x > T(0)) - (x < T(0))); }
// The joint's gradient scatter into element `off` of score buffer `buffer`'s gradient: a double
// accumulator per CPU worker. On CUDA a float accumulator, added to atomically, except where the backward
// kernel reduces the step along lines (codegen/cuda/FlexTiledKernel.cuh, LineStep): there an element's
// first scatter into the offset the kernel predicted for it (line_pred) hands its value to the kernel,
// which sums the step's values along the tile's rows, columns or diagonals and adds each sum once. While
// the kernel probes (line_mode 2), a call only notes its buffer and offset.
#ifdef __CUDACC__
)" HB_FLEX_STR(HB_FLEX_SCATTER_CUDA) R"(
#else
HB_FN void hb_scatter(HbFlexTile*, int, void* grad, long long off, double v) { ((double*)grad)[off] += v; }
#endif
// The joint's scatters call hb_scatter_s<LINE, ISL> (codegen/FlexKernelAbi.h says what it does).
)" HB_FLEX_STR(HB_FLEX_SCATTER_LINE) R"(
)";

// The exponentials, logarithms, sin, cos, tan, erf and erfc the generated code calls (unary_math): in double
// the C library's; in float on the CPU codegen/FlexMath.h's branch-free forms (kFlexMathSource, pasted
// before this), so the tile loops that call them vectorize; on CUDA the device library's.
constexpr const char* kMathFunctions = R"(
#ifdef __CUDACC__
#define HB_MATH_F32(name, cpu) HB_FN float hb_##name(float x) { return std::name(x); }
#else
#define HB_MATH_F32(name, cpu) HB_FN float hb_##name(float x) { return cpu(x); }
#endif
#define HB_MATH(name, cpu) HB_MATH_F32(name, cpu) HB_FN double hb_##name(double x) { return std::name(x); }
HB_MATH(exp, hb_expf)
HB_MATH(exp2, hb_exp2f)
HB_MATH(expm1, hb_expm1f)
HB_MATH(log, hb_logf)
HB_MATH(log2, hb_log2f)
HB_MATH(log1p, hb_log1pf)
HB_MATH(sin, hb_sinf)
HB_MATH(cos, hb_cosf)
HB_MATH(tan, hb_tanf)
HB_MATH(erf, hb_erff)
HB_MATH(erfc, hb_erfcf)
#undef HB_MATH
#undef HB_MATH_F32
HB_FN double hb_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
#ifdef __CUDACC__
HB_FN float hb_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
#else
HB_FN float hb_sigmoid(float x) { return hb_sigmoidf(x); }
#endif
// The activations and their derivatives (the joint's *_backward ops), as ATen's CPU kernels define them;
// both sides of a select are computed, so the tile loops stay branch-free.
template <typename T> HB_FN T hb_silu(T x) { return x * hb_sigmoid(x); }
template <typename T> HB_FN T hb_silu_bwd(T g, T x) { const T s = hb_sigmoid(x); return g * s * (T(1) + x * (T(1) - s)); }
template <typename T> HB_FN T hb_gelu(T x) { return T(0.5) * x * (T(1) + hb_erf(x * T(0.70710678118654752440))); }
template <typename T> HB_FN T hb_gelu_bwd(T g, T x) {
  const T cdf = T(0.5) * (T(1) + hb_erf(x * T(0.70710678118654752440)));
  return g * (cdf + x * T(0.39894228040143267794) * hb_exp(T(-0.5) * x * x));
}
template <typename T> HB_FN T hb_gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + hb_tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
}
template <typename T> HB_FN T hb_gelu_tanh_bwd(T g, T x) {
  const T th = hb_tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
  const T inner = T(0.79788456080286535588) * (T(1) + T(3) * T(0.044715) * x * x);
  return g * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * inner);
}
template <typename T> HB_FN T hb_softplus(T x, T beta, T threshold) {
  return x * beta > threshold ? x : hb_log1p(hb_exp(x * beta)) / beta;
}
template <typename T> HB_FN T hb_softplus_bwd(T g, T x, T beta, T threshold) {
  const T z = hb_exp(x * beta);
  return x * beta > threshold ? g : g * z / (z + T(1));
}
/* elu(x, alpha, scale, input_scale) (celu: elu(x, alpha, 1, 1 / alpha)); its derivative from the input, or
   from the result where is_result. */
template <typename T> HB_FN T hb_elu(T x, T alpha, T scale, T in) {
  return x <= T(0) ? hb_expm1(x * in) * (alpha * scale) : x * scale;
}
template <typename T> HB_FN T hb_celu(T x, T alpha) { return hb_elu<T>(x, alpha, T(1), T(1) / alpha); }
template <typename T> HB_FN T hb_elu_bwd(T g, T x, T alpha, T scale, T in, bool is_result) {
  const T neg = alpha * scale;
  return x <= T(0) ? (is_result ? g * in * (x + neg) : g * in * neg * hb_exp(x * in)) : g * scale;
}
template <typename T> HB_FN T hb_leaky_relu(T x, T slope) { return x > T(0) ? x : x * slope; }
template <typename T> HB_FN T hb_leaky_relu_bwd(T g, T x, T slope) { return x > T(0) ? g : g * slope; }
template <typename T> HB_FN T hb_hardtanh(T x, T lo, T hi) { return hb_min<T>(hb_max<T>(x, lo), hi); }
template <typename T> HB_FN T hb_hardtanh_bwd(T g, T x, T lo, T hi) { return (x <= lo || x >= hi) ? T(0) : g; }
template <typename T> HB_FN T hb_hardsigmoid(T x) { return hb_min<T>(hb_max<T>(x + T(3), T(0)), T(6)) / T(6); }
template <typename T> HB_FN T hb_hardsigmoid_bwd(T g, T x) {  /* ATen's slope: 1/6 rounded to float, in every dtype */
  return (x > T(-3) && x < T(3)) ? g * T(1.0f / 6.0f) : T(0);
}
template <typename T> HB_FN T hb_hardswish(T x) { return x * hb_min<T>(hb_max<T>(x + T(3), T(0)), T(6)) / T(6); }
template <typename T> HB_FN T hb_hardswish_bwd(T g, T x) {
  return x < T(-3) ? T(0) : x <= T(3) ? g * (x / T(3) + T(0.5)) : g;
}
template <typename T> HB_FN T hb_mish(T x) { return x * hb_tanh(hb_log1p(hb_exp(x))); }
template <typename T> HB_FN T hb_mish_bwd(T g, T x) {
  const T s = hb_sigmoid(x), ts = hb_tanh(hb_log1p(hb_exp(x)));
  return g * (ts + x * s * (T(1) - ts * ts));
}
template <typename T> HB_FN T hb_logaddexp(T a, T b) {
  const T m = a > b ? a : b, d = a > b ? a - b : b - a;
  return (a == b && (a - a) != (a - a)) ? a : m + hb_log1p(hb_exp(-d));  /* equal infinities: themselves */
}
template <typename T> HB_FN T hb_logaddexp2(T a, T b) {
  const T m = a > b ? a : b, d = a > b ? a - b : b - a;
  return (a == b && (a - a) != (a - a)) ? a : m + hb_log1p(hb_exp2(-d)) * T(1.44269504088896340736);
}
template <typename T> HB_FN T hb_xlogy(T x, T y) { return y != y ? y : (x == T(0) ? T(0) : x * hb_log(y)); }
template <typename T> HB_FN T hb_sinc(T x) {
  const T p = x * T(3.14159265358979323846);
  return x == T(0) ? T(1) : hb_sin(p) / p;
}
template <typename T> HB_FN T hb_frac(T x) { return x - std::trunc(x); }
template <typename T> HB_FN T hb_rad2deg(T x) { return x * T(57.295779513082320876798154814105); }
template <typename T> HB_FN T hb_deg2rad(T x) { return x * T(0.017453292519943295769236907684886); }
HB_FN float hb_max_finite(float) { return 3.40282346638528859812e+38F; }  /* nan_to_num's default bounds */
HB_FN double hb_max_finite(double) { return 1.79769313486231570815e+308; }
template <typename T> HB_FN T hb_nan_to_num(T x, T nan, T posinf, T neginf) {
  return x != x ? nan : x == (T)INFINITY ? posinf : x == -(T)INFINITY ? neginf : x;
}
#define HB_STD2(name) template <typename T> HB_FN T hb_##name(T a, T b) { return std::name(a, b); }
HB_STD2(atan2)
HB_STD2(hypot)
HB_STD2(copysign)
#undef HB_STD2
template <typename T> HB_FN T hb_lerp(T a, T b, T w) { return w < T(0.5) ? a + w * (b - a) : b - (b - a) * (T(1) - w); }
)";

// The kind of a scalar value in the generated code.
enum class K { T, Double, Int, Bool, Buffer, Scatter, None };

const char* ctype(K k) {
  switch (k) {
    case K::T: return "T";
    case K::Double: return "double";
    case K::Int: return "long long";
    case K::Bool: return "bool";
    default: return "void";
  }
}
bool floating(K k) { return k == K::T || k == K::Double; }

// The values an integer can take, where known: roles from the node's static sizes, literals, and what
// arithmetic on them gives. A value whose range fits in 32 bits is emitted as int (the GPU's integer
// units are 32-bit: 64-bit arithmetic costs two or three instructions per op); an index whose range lies
// inside the dimension it indexes is read without hb_index's check.
struct Range {
  int64_t lo = 0, hi = 0;
  bool fits32() const { return lo >= INT32_MIN && hi <= INT32_MAX; }
};

// A value as base + q * q_idx + kv * kv_idx, where base does not depend on q_idx or kv_idx: (0, 0) for a
// value of b, h, literals and buffers read there. What lets the generator prove that a scatter's offset
// runs along a line of every tile (rows, columns or diagonals).
struct Affine {
  int64_t q = 0, kv = 0;
  bool independent() const { return q == 0 && kv == 0; }
};
std::optional<Affine> affine_combine(const std::optional<Affine>& a, const std::optional<Affine>& b, int64_t scale) {
  if (!a || !b) return std::nullopt;
  const __int128 q = static_cast<__int128>(a->q) + static_cast<__int128>(b->q) * scale;
  const __int128 kv = static_cast<__int128>(a->kv) + static_cast<__int128>(b->kv) * scale;
  if (q < INT32_MIN || q > INT32_MAX || kv < INT32_MIN || kv > INT32_MAX) return std::nullopt;
  return Affine{static_cast<int64_t>(q), static_cast<int64_t>(kv)};
}

struct Val {
  K kind = K::None;
  std::string expr;
  int buffer = -1;          // K::Buffer: which buffer
  bool const_true = false;  // a constant true (a noop mask)
  std::optional<Range> range = std::nullopt;  // K::Int / K::Bool: the values it can take, where known
  bool i32 = false;            // K::Int held in a C int (else long long)
  std::optional<Affine> aff = std::nullopt;  // how it moves with q_idx and kv_idx, where known
  // A literal's value (a range of one).
  std::optional<int64_t> constant() const {
    if (range && range->lo == range->hi) return range->lo;
    return std::nullopt;
  }
};

// Interval arithmetic, nullopt where an operand is unknown or a bound leaves int64.
std::optional<Range> checked(__int128 lo, __int128 hi) {
  if (lo < INT64_MIN || hi > INT64_MAX) return std::nullopt;
  return Range{static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}
std::optional<Range> range_add(const std::optional<Range>& a, const std::optional<Range>& b, bool subtract) {
  if (!a || !b) return std::nullopt;
  if (subtract) return checked(static_cast<__int128>(a->lo) - b->hi, static_cast<__int128>(a->hi) - b->lo);
  return checked(static_cast<__int128>(a->lo) + b->lo, static_cast<__int128>(a->hi) + b->hi);
}
std::optional<Range> range_mul(const std::optional<Range>& a, const std::optional<Range>& b) {
  if (!a || !b) return std::nullopt;
  const __int128 c[4] = {static_cast<__int128>(a->lo) * b->lo, static_cast<__int128>(a->lo) * b->hi,
                         static_cast<__int128>(a->hi) * b->lo, static_cast<__int128>(a->hi) * b->hi};
  return checked(*std::min_element(c, c + 4), *std::max_element(c, c + 4));
}
std::optional<Range> range_union(const std::optional<Range>& a, const std::optional<Range>& b) {
  if (!a || !b) return std::nullopt;
  return Range{std::min(a->lo, b->lo), std::max(a->hi, b->hi)};
}
int64_t floor_div(int64_t x, int64_t y) {  // y > 0
  return x >= 0 ? x / y : -((-x + y - 1) / y);
}
// Floor division by a positive divisor: monotone in each operand.
std::optional<Range> floordiv_range(const std::optional<Range>& a, const std::optional<Range>& b) {
  if (!a || !b || b->lo <= 0) return std::nullopt;
  const int64_t c[4] = {floor_div(a->lo, b->lo), floor_div(a->lo, b->hi), floor_div(a->hi, b->lo), floor_div(a->hi, b->hi)};
  return Range{*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
}
// What an integer buffer element can hold.
std::optional<Range> dtype_range(DType d) {
  switch (d) {
    case DType::Int32: return Range{INT32_MIN, INT32_MAX};
    case DType::Int16: return Range{INT16_MIN, INT16_MAX};
    case DType::Int8: return Range{INT8_MIN, INT8_MAX};
    case DType::UInt8: return Range{0, UINT8_MAX};
    case DType::Bool: return Range{0, 1};
    default: return std::nullopt;
  }
}

std::string cast(const Val& v, K to) {
  if (v.kind == to) return v.expr;
  if (to == K::Bool) return "(" + v.expr + " != 0)";
  return "((" + std::string(ctype(to)) + ")(" + v.expr + "))";
}

K promote(K a, K b) {
  if (a == K::Double || b == K::Double) return K::Double;
  if (a == K::T || b == K::T) return K::T;
  if (a == K::Int || b == K::Int) return K::Int;
  return K::Bool;
}

std::optional<K> kind_of_dtype(DType d) {
  switch (d) {
    case DType::Float64: return K::Double;
    case DType::Float32: case DType::Float16: case DType::BFloat16: return K::T;
    case DType::Int8: case DType::Int16: case DType::Int32: case DType::Int64: case DType::UInt8: return K::Int;
    case DType::Bool: return K::Bool;
    default: return std::nullopt;
  }
}

// How a buffer element of dtype d is read at element offset `off` of buffer `buf` (an HbFlexBuffer).
std::optional<std::string> load(DType d, const std::string& buf, const std::string& off) {
  auto ld = [&](const char* type) { return std::string("HB_LD((const ") + type + "*)" + buf + ".data + (" + off + "))"; };
  switch (d) {
    case DType::Float32: return ld("float");
    case DType::Float64: return ld("double");
    case DType::BFloat16: return "hb_bf16(" + ld("unsigned short") + ")";
    case DType::Float16: return "hb_f16(" + ld("unsigned short") + ")";
    case DType::Int64: return ld("long long");
    case DType::Int32: return ld("int");
    case DType::Int16: return ld("short");
    case DType::Int8: return ld("signed char");
    case DType::UInt8: return ld("unsigned char");
    case DType::Bool: return "(" + ld("unsigned char") + " != 0)";
    default: return std::nullopt;
  }
}

std::string float_literal(double v) {
  if (std::isnan(v)) return "((T)NAN)";
  if (std::isinf(v)) return v > 0 ? "((T)INFINITY)" : "(-(T)INFINITY)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return "((T)" + s + ")";
}

std::string op_name(const std::string& target, std::string* overload) {
  const size_t ns = target.find("::");
  const size_t start = ns == std::string::npos ? 0 : ns + 2;
  const size_t dot = target.find('.', start);
  *overload = dot == std::string::npos ? "" : target.substr(dot + 1);
  return target.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
}

// Where an argument of an activation's prelude call comes from: the node's argument `at`, an operand (the op
// fails as "is <op> <name>" without it), a scalar (else the keyword `name`, else torch's default `dflt`), a
// bool flag that is a constant in the graph, or one of nan_to_num's bounds (by default the largest finite
// value, with dflt's sign).
struct ActArg {
  enum Kind { Operand, Scalar, Flag, Bound } kind;
  size_t at;
  const char* name;
  double dflt = 0;
};
// The prelude function an op calls, and its arguments in order. gelu's: `approximate` (positional at
// approximate_at, else the keyword) 'tanh' calls tanh_fn instead.
struct Activation {
  const char* fn;
  std::vector<ActArg> args;
  const char* tanh_fn = nullptr;
  size_t approximate_at = 0;
};

// The activations, their derivatives and the other float functions the generator writes through the
// prelude's hb_* forms (emit's activations branch), by op name.
const std::map<std::string, Activation>& activations() {
  // Operands 0 and 1 (a derivative's grad and self: emit checks both first).
  const ActArg x{ActArg::Operand, 0, ""}, y{ActArg::Operand, 1, "with one operand"};
  auto s = [](size_t at, const char* name, double dflt) { return ActArg{ActArg::Scalar, at, name, dflt}; };
  static const std::map<std::string, Activation> m = {
      {"silu", {"hb_silu", {x}}},
      {"silu_backward", {"hb_silu_bwd", {x, y}}},
      {"gelu", {"hb_gelu", {x}, "hb_gelu_tanh", 1}},
      {"gelu_backward", {"hb_gelu_bwd", {x, y}, "hb_gelu_tanh_bwd", 2}},
      {"softplus", {"hb_softplus", {x, s(1, "beta", 1), s(2, "threshold", 20)}}},
      {"softplus_backward", {"hb_softplus_bwd", {x, y, s(2, "beta", 1), s(3, "threshold", 20)}}},
      {"mish", {"hb_mish", {x}}},
      {"mish_backward", {"hb_mish_bwd", {x, y}}},
      {"leaky_relu", {"hb_leaky_relu", {x, s(1, "negative_slope", 0.01)}}},
      {"leaky_relu_backward", {"hb_leaky_relu_bwd", {x, y, s(2, "negative_slope", 0.01)}}},
      {"hardtanh", {"hb_hardtanh", {x, s(1, "min_val", -1), s(2, "max_val", 1)}}},
      {"hardtanh_backward", {"hb_hardtanh_bwd", {x, y, s(2, "min_val", -1), s(3, "max_val", 1)}}},
      {"hardsigmoid", {"hb_hardsigmoid", {x}}},
      {"hardsigmoid_backward", {"hb_hardsigmoid_bwd", {x, y}}},
      {"hardswish", {"hb_hardswish", {x}}},
      {"hardswish_backward", {"hb_hardswish_bwd", {x, y}}},
      {"elu", {"hb_elu", {x, s(1, "alpha", 1), s(2, "scale", 1), s(3, "input_scale", 1)}}},
      {"celu", {"hb_celu", {x, s(1, "alpha", 1)}}},
      // (grad, alpha, scale, input_scale, is_result, self_or_result)
      {"elu_backward", {"hb_elu_bwd", {x, {ActArg::Operand, 5, "without its input or result"}, s(1, "alpha", 1),
                                       s(2, "scale", 1), s(3, "input_scale", 1), {ActArg::Flag, 4, "is_result"}}}},
      {"frac", {"hb_frac", {x}}},
      {"rad2deg", {"hb_rad2deg", {x}}},
      {"deg2rad", {"hb_deg2rad", {x}}},
      {"sinc", {"hb_sinc", {x}}},
      {"nan_to_num", {"hb_nan_to_num", {x, s(1, "nan", 0), {ActArg::Bound, 2, "posinf", 1}, {ActArg::Bound, 3, "neginf", -1}}}},
      {"atan2", {"hb_atan2", {x, y}}},
      {"hypot", {"hb_hypot", {x, y}}},
      {"copysign", {"hb_copysign", {x, y}}},
      {"logaddexp", {"hb_logaddexp", {x, y}}},
      {"logaddexp2", {"hb_logaddexp2", {x, y}}},
      {"xlogy", {"hb_xlogy", {x, y}}},
      {"lerp", {"hb_lerp", {x, y, {ActArg::Operand, 2, "without a weight"}}}}};  // lerp.Scalar and lerp.Tensor
  return m;
}

const std::map<std::string, std::string>& unary_math() {
  static const std::map<std::string, std::string> m = {
      {"exp", "hb_exp"}, {"exp2", "hb_exp2"}, {"log", "hb_log"}, {"log2", "hb_log2"},
      {"log10", "std::log10"}, {"log1p", "hb_log1p"}, {"expm1", "hb_expm1"}, {"tanh", "hb_tanh"},
      {"sin", "hb_sin"}, {"cos", "hb_cos"}, {"tan", "hb_tan"}, {"sinh", "std::sinh"},
      {"cosh", "std::cosh"}, {"asin", "std::asin"}, {"acos", "std::acos"}, {"atan", "std::atan"},
      {"asinh", "std::asinh"}, {"acosh", "std::acosh"}, {"atanh", "std::atanh"},
      {"sqrt", "std::sqrt"}, {"erf", "hb_erf"}, {"erfc", "hb_erfc"}, {"floor", "std::floor"},
      {"ceil", "std::ceil"}, {"trunc", "std::trunc"}, {"round", "std::nearbyint"}, {"abs", "std::fabs"},
      {"sigmoid", "hb_sigmoid"}};
  return m;
}

// Which placeholders a subgraph has, in order: the score and index arguments, then the buffers.
enum class Role { Score, B, H, Q, KV, Grad, Buffer };

// The sizes the index roles range over (b < B, h < H, q < Sq, kv < Skv), where static: the kernels
// call the scalar functions only with indices inside the sequences.
struct RoleExtents {
  std::optional<int64_t> b, h, q, kv;
};

// A captured buffer's layout as the generated code bakes it in (sizes and strides static in the graph),
// or none (read from the HbFlexBuffer at run time).
struct BufferLayout {
  bool fixed = false;
  std::vector<int64_t> sizes, strides;
  // Per dimension, how the reads' index in it moves (kMovesKv | kMovesQ; kMovesUnknown where no affine form
  // is known), over every strided read of the buffer (read_layout below chooses the strides from it).
  std::vector<unsigned> moves;
  int64_t elem_bytes = 0;
};
constexpr unsigned kMovesKv = 1, kMovesQ = 2, kMovesUnknown = 4;

// The strides a captured buffer's reads are generated for, where not the graph's: when every index of its
// reads is affine and the index moves with kv_idx in exactly one dimension (else, in none, with q_idx in
// exactly one), that dimension goes innermost (stride 1), the others packed after it in the order of the
// graph's strides. A warp's lanes read neighbouring q_idx and kv_idx, so their
// reads then fall in a few sectors instead of one each: a relative bias lb[q - kv + S - 1, h] stored
// [2S - 1][H] puts a warp's 14 distinct entries 64 bytes apart, read as [H][2S - 1] they are neighbours.
// The runtime copies the buffer into these strides before each call (FlexFusedCall's laid_out), so only a
// buffer of at most 16 MiB with no stride-0 dimension moves. nullopt: the graph's strides stay.
std::optional<std::vector<int64_t>> read_layout(const BufferLayout& l) {
  if (!l.fixed || l.moves.size() != l.sizes.size() || l.sizes.empty()) return std::nullopt;
  int kv = -1, q = -1, nkv = 0, nq = 0;
  int64_t numel = 1;
  for (size_t d = 0; d < l.sizes.size(); ++d) {
    if (l.moves[d] & kMovesUnknown) return std::nullopt;
    if (l.moves[d] & kMovesKv) kv = static_cast<int>(d), ++nkv;
    if (l.moves[d] & kMovesQ) q = static_cast<int>(d), ++nq;
    if (l.sizes[d] > 1 && l.strides[d] == 0) return std::nullopt;
    numel *= l.sizes[d];
  }
  const int inner = nkv == 1 ? kv : nkv == 0 && nq == 1 ? q : -1;
  if (inner < 0 || l.sizes[inner] == 1 || l.strides[inner] == 1 || numel * l.elem_bytes > (int64_t{16} << 20))
    return std::nullopt;
  std::vector<int> order;  // outermost first: the graph's order of strides, `inner` last
  for (size_t d = 0; d < l.sizes.size(); ++d)
    if (static_cast<int>(d) != inner) order.push_back(static_cast<int>(d));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return std::abs(l.strides[a]) > std::abs(l.strides[b]); });
  order.push_back(inner);
  std::vector<int64_t> strides(l.sizes.size());
  int64_t next = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) strides[*it] = next, next *= l.sizes[*it];
  return strides;
}

// Translates one subgraph into the body of a scalar function. `buffers_expr`: "t->score_buffers" or
// "t->mask_buffers"; `buffer_base`: the buffer's number in error reports.
class Translator {
 public:
  Translator(const Graph& g, std::vector<Role> roles, std::string buffers_expr, int buffer_base, bool joint,
             RoleExtents extents = {})
      : g_(g), roles_(std::move(roles)), bufs_(std::move(buffers_expr)), buffer_base_(buffer_base), joint_(joint),
        extents_(extents) {}

  // Emits the statements; false with why_ set when something has no generated form.
  bool run() {
    vals_.assign(g_.nodes.size(), Val{});
    if (joint_ && !map_scatters()) return false;
    int placeholder = 0;
    for (int i = 0; i < static_cast<int>(g_.nodes.size()); ++i) {
      const Node& n = g_.nodes[i];
      if (n.op == OpKind::Placeholder) {
        if (!bind_placeholder(i, placeholder++)) return false;
      } else if (n.op == OpKind::GetAttr) {
        return fail(i, "reads a constant tensor");
      } else if (n.op == OpKind::CallFunction) {
        ++ops_;
        if (!emit(i)) return false;
        if (vals_[i].kind != K::Scatter) vals_[i].aff = affine_of(i);
      }
    }
    return true;
  }

  const std::string& why() const { return why_; }
  std::string body() const { return body_.str(); }
  int ops() const { return ops_; }
  // The code can report an error at run time (it reads a buffer, or divides integers).
  bool may_fail() const { return may_fail_; }
  const Val& val(int node) const { return vals_[node]; }
  // The output node's items (a single value or a tuple/list).
  std::vector<Arg> outputs() const {
    const int o = g_.output_node();
    if (o < 0 || g_.nodes[o].args.empty()) return {};
    const Arg& a = g_.nodes[o].args[0];
    if (a.kind == Arg::Kind::Tuple || a.kind == Arg::Kind::List) return a.items;
    return {a};
  }
  Val value(const Arg& a) const {
    Val v;
    switch (a.kind) {
      case Arg::Kind::Ref: return vals_[a.ref];
      case Arg::Kind::Int:
        v.kind = K::Int;
        v.range = Range{a.i, a.i};
        v.aff = Affine{};
        // A literal that fits in 32 bits stays int, so arithmetic with int values stays 32-bit (their sum
        // is range-checked where it is defined).
        v.i32 = a.i > INT32_MIN && a.i <= INT32_MAX;
        if (v.i32) v.expr = a.i < 0 ? "(" + std::to_string(a.i) + ")" : std::to_string(a.i);
        else v.expr = a.i == std::numeric_limits<int64_t>::min() ? "(-9223372036854775807LL - 1)" : std::to_string(a.i) + "LL";
        return v;
      case Arg::Kind::Float: v.kind = K::T; v.expr = float_literal(a.f); v.aff = Affine{}; return v;
      case Arg::Kind::Bool:
        v.kind = K::Bool, v.expr = a.b ? "true" : "false", v.const_true = a.b, v.range = Range{a.b, a.b};
        v.aff = Affine{};
        return v;
      default: return v;  // K::None
    }
  }
  // Per buffer of this subgraph (by its number): the layout the code bakes in.
  const std::map<int, BufferLayout>& layouts() const { return layouts_; }
  // Strides to bake in instead of the graph's, per buffer (read_layout); before run().
  void override_strides(std::map<int, std::vector<int64_t>> strides) { stride_overrides_ = std::move(strides); }
  // The scatter whose offset is buffer + q_idx * along.q + kv_idx * along.kv over every tile inside both
  // sequences, where the joint has one (the first such).
  struct LineScatter {
    int buffer;
    Affine along;
  };
  const std::optional<LineScatter>& line() const { return line_; }
  int scatter_count() const { return static_cast<int>(scatter_of_.size()); }
  std::set<int> scatter_buffers() const {
    std::set<int> s;
    for (const auto& kv : scatter_of_) s.insert(kv.second);
    return s;
  }

 private:
  bool fail(int node, const std::string& what) {
    why_ = "%" + g_.nodes[node].name + " (" + g_.nodes[node].target + ") " + what;
    return false;
  }

  bool bind_placeholder(int i, int p) {
    Val& v = vals_[i];
    if (p < static_cast<int>(roles_.size())) {
      switch (roles_[p]) {
        case Role::Score: v = {K::T, "score"}; return true;
        case Role::Grad: v = {K::T, "grad"}; return true;
        case Role::B: return bind_role(v, "b", extents_.b, Affine{});
        case Role::H: return bind_role(v, "h", extents_.h, Affine{});
        case Role::Q: return bind_role(v, "q", extents_.q, Affine{1, 0});
        case Role::KV: return bind_role(v, "kv", extents_.kv, Affine{0, 1});
        case Role::Buffer: break;
      }
    }
    v.kind = K::Buffer;
    v.buffer = p - static_cast<int>(roles_.size());
    // A captured number (a SymInt of a dynamic shape): the runtime passes it as a 0-dim tensor of int64,
    // float64 or bool (backend/runtime/FlexAttention.h, captured_tensors).
    const ValueType::Kind vk = g_.nodes[i].type.kind;
    if (vk == ValueType::Kind::Int || vk == ValueType::Kind::SymInt || vk == ValueType::Kind::Float ||
        vk == ValueType::Kind::Bool) {
      const std::string data = bufs_ + "[" + std::to_string(v.buffer) + "].data";
      if (vk == ValueType::Kind::Float) v = {K::Double, "(*(const double*)" + data + ")"};
      else if (vk == ValueType::Kind::Bool) v = {K::Bool, "(*(const bool*)" + data + ")"};
      else v = {K::Int, "(*(const long long*)" + data + ")"};
      v.aff = Affine{};
      return true;
    }
    const TensorType& t = g_.nodes[i].type.tensor;
    if (g_.nodes[i].type.kind != ValueType::Kind::Tensor || t.shape.size() > 8)
      return fail(i, "is a captured buffer of unknown type or rank above 8");
    if (!load(t.dtype, "", "")) return fail(i, std::string("is a captured buffer of dtype ") + dtype_name(t.dtype));
    buffer_types_[v.buffer] = t;
    BufferLayout& l = layouts_[v.buffer];
    l.fixed = t.stride.size() == t.shape.size();
    for (size_t d = 0; d < t.shape.size() && l.fixed; ++d) {
      l.fixed = t.shape[d].is_static() && t.stride[d].is_static();
      if (l.fixed) l.sizes.push_back(t.shape[d].value), l.strides.push_back(t.stride[d].value);
    }
    if (!l.fixed) l.sizes.clear(), l.strides.clear();
    if (auto o = stride_overrides_.find(v.buffer); l.fixed && o != stride_overrides_.end() && o->second.size() == l.sizes.size())
      l.strides = o->second;
    l.moves.assign(l.sizes.size(), 0);
    l.elem_bytes = dtype_bytes(t.dtype);
    return true;
  }

  // An index role: int over a static extent below 2^31 (the caller passes long long), else long long.
  static bool bind_role(Val& v, const char* name, const std::optional<int64_t>& extent, Affine aff) {
    v.kind = K::Int;
    v.aff = aff;
    if (extent && *extent >= 1 && *extent <= INT32_MAX) {
      v.expr = std::string("((int)") + name + ")";
      v.range = Range{0, *extent - 1};
      v.i32 = true;
    } else {
      v.expr = name;
    }
    return true;
  }

  // zeros_and_scatter nodes -> the buffer whose gradient they are (from the joint's outputs).
  bool map_scatters() {
    const std::vector<Arg> outs = outputs();
    for (size_t k = 5; k < outs.size(); ++k) {
      if (outs[k].kind == Arg::Kind::None) continue;
      if (outs[k].kind != Arg::Kind::Ref) return fail(g_.output_node(), "returns a buffer gradient that is not a value");
      if (!collect_scatters(outs[k].ref, static_cast<int>(k) - 5)) return false;
    }
    return true;
  }
  bool collect_scatters(int node, int buffer) {
    const Node& n = g_.nodes[node];
    std::string ov;
    const std::string op = op_name(n.target, &ov);
    if (n.target == "flex_lib::zeros_and_scatter.default") {
      scatter_of_[node] = buffer;
      return true;
    }
    if (op == "add" && n.args.size() == 2 && n.args[0].kind == Arg::Kind::Ref && n.args[1].kind == Arg::Kind::Ref) {
      sums_.insert(node);
      return collect_scatters(n.args[0].ref, buffer) && collect_scatters(n.args[1].ref, buffer);
    }
    return fail(node, "is a buffer gradient that is not a sum of zeros_and_scatter");
  }

  // How node i's value moves with q_idx and kv_idx: integer sums, differences, negations and products
  // by a literal of such values stay affine; any op on values that do not move does not move; anything
  // else is unknown.
  std::optional<Affine> affine_of(int i) const {
    const Node& n = g_.nodes[i];
    std::string ov;
    const std::string op = op_name(n.target, &ov);
    const bool int_result = vals_[i].kind == K::Int;
    std::vector<Val> a;
    for (const Arg& x : n.args) a.push_back(value(x));
    auto ints = [&](size_t k) { return k < a.size() && a[k].kind == K::Int && a[k].aff; };
    if (int_result && (op == "add" || op == "sub" || op == "rsub") && ints(0) && ints(1)) {
      std::optional<int64_t> scale = 1;
      const Arg* alpha = a.size() > 2 ? &n.args[2] : n.kwarg("alpha");
      if (alpha && alpha->kind != Arg::Kind::None) scale = value(*alpha).constant();
      if (scale) {
        if (op == "add") return affine_combine(a[0].aff, a[1].aff, *scale);
        if (op == "sub") return affine_combine(a[0].aff, a[1].aff, -*scale);
        return affine_combine(a[1].aff, a[0].aff, -*scale);
      }
    }
    if (int_result && op == "mul" && ints(0) && ints(1)) {
      if (const auto c = a[1].constant()) return affine_combine(Affine{}, a[0].aff, *c);
      if (const auto c = a[0].constant()) return affine_combine(Affine{}, a[1].aff, *c);
    }
    if (int_result && op == "neg" && ints(0)) return affine_combine(Affine{}, a[0].aff, -1);
    if (int_result && ints(0) &&
        (op == "_to_copy" || op == "to" || op == "convert_element_type" || op == "clone" || op == "alias" ||
         op == "detach" || op == "lift_fresh_copy" || op == "view" || op == "reshape" || op == "_unsafe_view" ||
         op == "contiguous" || op == "positive"))
      return a[0].aff;
    bool independent = true;
    n.for_each_input([&](const Arg& x) {
      const Val& v = vals_[x.ref];
      if (v.kind != K::Buffer && !(v.aff && v.aff->independent())) independent = false;
    });
    return independent ? std::optional<Affine>(Affine{}) : std::nullopt;
  }

  // The element offset of buffer `b` at `indices` (strided read, or row-major for the gradient). With
  // the buffer's layout static, sizes and strides are literals, an index proven inside its dimension is
  // used as it is (one proven inside [-size, size) only wraps), and an offset below 2^31 is int.
  // `line`, where given: the offset as an Affine where every index that moves with q_idx or kv_idx is
  // proven inside its dimension (then the offset is exactly affine over a tile inside both sequences),
  // else nullopt.
  bool offset(int node, int buffer, const std::vector<Arg>& indices, bool dense, std::string* out,
              std::optional<Affine>* line = nullptr) {
    if (line) line->reset();
    const TensorType& t = buffer_types_[buffer];
    if (indices.size() != t.shape.size())
      return fail(node, "indexes a rank-" + std::to_string(t.shape.size()) + " buffer with " +
                            std::to_string(indices.size()) + " indices (only whole-element reads are generated)");
    const std::string B = bufs_ + "[" + std::to_string(buffer) + "]";
    const BufferLayout& l = layouts_.at(buffer);
    if (l.fixed) {
      int64_t extent = 1;  // the largest offset + 1 (dense: the element count; strided: the span read)
      for (size_t d = 0; d < l.sizes.size(); ++d)
        extent = dense ? extent * l.sizes[d] : extent + (l.sizes[d] - 1) * std::abs(l.strides[d]);
      const bool small = extent <= INT32_MAX;
      std::optional<Affine> aff = Affine{};
      std::string o;
      for (size_t d = 0; d < indices.size(); ++d) {
        const Val iv = value(indices[d]);
        if (iv.kind != K::Int && iv.kind != K::Bool) return fail(node, "indexes with a non-integer index");
        if (!dense && d < l.moves.size())
          layouts_[buffer].moves[d] |= !iv.aff ? kMovesUnknown : (iv.aff->kv ? kMovesKv : 0) | (iv.aff->q ? kMovesQ : 0);
        const int64_t size = l.sizes[d];
        const std::string S = std::to_string(size);
        std::string idx;
        if (iv.range && iv.range->lo >= 0 && iv.range->hi < size) {
          idx = iv.kind == K::Int ? iv.expr : "((int)" + iv.expr + ")";
        } else if (iv.range && iv.range->lo >= -size && iv.range->hi < size) {
          idx = "(" + iv.expr + " < 0 ? " + iv.expr + " + " + S + " : " + iv.expr + ")";
        } else {
          may_fail_ = true;  // an index out of range
          idx = "hb_index(" + cast(iv, K::Int) + ", " + S + "LL, t, " + std::to_string(buffer_base_ + buffer) + ")";
        }
        if (!small) idx = "((long long)" + idx + ")";
        const bool checked_idx = idx.find("hb_index(") != std::string::npos;
        if (dense && aff) {
          const bool inside = iv.range && iv.range->lo >= 0 && iv.range->hi < size;
          int64_t row_stride = 1;  // row-major: the sizes after d
          for (size_t e = d + 1; e < l.sizes.size(); ++e) row_stride *= l.sizes[e];
          if (iv.aff && (inside || iv.aff->independent())) aff = affine_combine(aff, iv.aff, row_stride);
          else aff.reset();
        }
        if (dense) o = d ? "(" + o + ") * " + S + " + " + idx : idx;
        else if (l.strides[d] != 0 && size != 1)
          o += (o.empty() ? "" : " + ") + idx + (l.strides[d] == 1 ? "" : " * " + std::to_string(l.strides[d]));
        else if (checked_idx) o += (o.empty() ? "" : " + ") + idx + " * 0";  // adds nothing; still checked
      }
      *out = o.empty() ? "0" : o;
      if (line && dense) *line = aff;
      return true;
    }
    std::string o = dense ? "0LL" : "";
    for (size_t d = 0; d < indices.size(); ++d) {
      const Val iv = value(indices[d]);
      if (iv.kind != K::Int && iv.kind != K::Bool) return fail(node, "indexes with a non-integer index");
      const std::string D = std::to_string(d);
      may_fail_ = true;  // an index out of range
      const std::string idx = "hb_index(" + cast(iv, K::Int) + ", " + B + ".sizes[" + D + "], t, " +
                              std::to_string(buffer_base_ + buffer) + ")";
      if (dense) o = "(" + o + ") * " + B + ".sizes[" + D + "] + " + idx;
      else o += (d ? " + " : "") + idx + " * " + B + ".strides[" + D + "]";
    }
    if (o.empty()) o = "0LL";
    *out = o;
    return true;
  }

  void def(int i, K kind, const std::string& expr, std::optional<Range> range = std::nullopt) {
    const std::string name = "v" + std::to_string(i);
    const bool narrow = kind == K::Int && range && range->fits32();
    body_ << "  const " << (narrow ? "int" : ctype(kind)) << " " << name << " = " << expr << ";  // %"
          << g_.nodes[i].name << "\n";
    vals_[i] = {kind, name};
    if (kind == K::Int) vals_[i].range = range, vals_[i].i32 = narrow;
    if (kind == K::Bool) vals_[i].range = Range{0, 1};
  }

  bool emit(int i) {
    const Node& n = g_.nodes[i];
    std::string ov;
    const std::string op = op_name(n.target, &ov);
    if (scatter_of_.count(i)) return emit_scatter(i);
    if (sums_.count(i) || n.target == "flex_lib::zeros_and_scatter.default") {  // a sum of scatters, or a dead one
      vals_[i].kind = K::Scatter;
      return true;
    }
    if (n.type.kind != ValueType::Kind::Tensor || !n.type.tensor.shape.empty())
      return fail(i, "is not a scalar per score element");
    const std::optional<K> rk = kind_of_dtype(n.type.tensor.dtype);
    if (!rk) return fail(i, std::string("has dtype ") + dtype_name(n.type.tensor.dtype));
    const K R = *rk;
    std::vector<Val> a;
    for (const Arg& x : n.args) a.push_back(value(x));
    for (const Arg& x : n.args)
      if (x.kind == Arg::Kind::Ref && (vals_[x.ref].kind == K::Scatter))
        return fail(i, "uses a buffer gradient as a value");
    auto kw = [&](const char* name) -> std::optional<Val> {
      const Arg* x = n.kwarg(name);
      if (!x || x->kind == Arg::Kind::None) return std::nullopt;
      return value(*x);
    };
    auto scalar = [&](size_t k) { return k < a.size() && a[k].kind != K::None && a[k].kind != K::Buffer && a[k].kind != K::Scatter; };
    const bool unary = scalar(0);
    const bool binary = scalar(0) && scalar(1);
    // Arithmetic in the result's kind; a boolean result computes on integers and tests != 0.
    const K C = R == K::Bool ? K::Int : R;
    auto wrap = [&](const std::string& e) { return R == K::Bool ? "(" + e + " != 0)" : e; };

    // The range of an integer result (R == K::Int), where the operands' ranges give it.
    auto int_range = [&](std::optional<Range> r) { return R == K::Int ? r : std::nullopt; };
    // Integer arithmetic is int only where its result is proven to fit: otherwise the operands are
    // widened first (two int values can overflow int before the result is stored in a long long).
    auto narrow = [&](const std::optional<Range>& r) { return R == K::Int && r && r->fits32(); };
    auto opnd = [&](const Val& v, bool in32) {
      return C == K::Int && !in32 && v.i32 ? "((long long)" + v.expr + ")" : cast(v, C);
    };
    if ((op == "add" || op == "sub") && binary) {
      std::optional<Val> alpha = a.size() > 2 && scalar(2) ? std::optional<Val>(a[2]) : kw("alpha");
      std::optional<Range> ry = alpha ? range_mul(alpha->range, a[1].range) : a[1].range;
      const std::optional<Range> r = range_add(a[0].range, ry, op == "sub");
      const bool n32 = narrow(r) && ry->fits32();  // alpha * y is computed on its own first
      std::string y = opnd(a[1], n32);
      if (alpha) y = opnd(*alpha, n32) + " * " + y;
      def(i, R, wrap(opnd(a[0], n32) + (op == "add" ? " + " : " - ") + y), int_range(r));
    } else if (op == "rsub" && binary) {
      std::optional<Val> alpha = a.size() > 2 && scalar(2) ? std::optional<Val>(a[2]) : kw("alpha");
      std::optional<Range> rx = alpha ? range_mul(alpha->range, a[0].range) : a[0].range;
      const std::optional<Range> r = range_add(a[1].range, rx, true);
      const bool n32 = narrow(r) && rx->fits32();
      std::string x = opnd(a[0], n32);
      if (alpha) x = opnd(*alpha, n32) + " * " + x;
      def(i, R, wrap(opnd(a[1], n32) + " - " + x), int_range(r));
    } else if (op == "mul" && binary) {
      const std::optional<Range> r = range_mul(a[0].range, a[1].range);
      def(i, R, wrap(opnd(a[0], narrow(r)) + " * " + opnd(a[1], narrow(r))), int_range(r));
    } else if ((op == "div" || op == "true_divide") && binary) {
      std::optional<std::string> mode;
      const Arg* m = n.kwarg("rounding_mode");
      if (m && m->kind == Arg::Kind::Str) mode = m->s;
      if (ov == "Tensor_mode" && a.size() > 2 && n.args[2].kind == Arg::Kind::Str) mode = n.args[2].s;
      if (R == K::Int || R == K::Bool) {
        if (!mode) return fail(i, "divides integers into an integer without a rounding mode");
        may_fail_ = true;  // a division by zero
        def(i, R, wrap(std::string(*mode == "floor" ? "hb_floordiv(" : "hb_truncdiv(") + cast(a[0], K::Int) + ", " +
                       cast(a[1], K::Int) + ", t)"),
            int_range(*mode == "floor" ? floordiv_range(a[0].range, a[1].range) : std::nullopt));
      } else {
        const std::string q = cast(a[0], R) + " / " + cast(a[1], R);
        def(i, R, !mode ? q : (*mode == "floor" ? "std::floor(" : "std::trunc(") + q + ")");
      }
    } else if ((op == "maximum" || op == "minimum" || op == "fmax" || op == "fmin") && binary) {
      const bool mx = op == "maximum" || op == "fmax";
      if (floating(R)) def(i, R, std::string(mx ? "hb_max<" : "hb_min<") + ctype(R) + ">(" + cast(a[0], R) + ", " + cast(a[1], R) + ")");
      else def(i, R, wrap("(" + cast(a[0], C) + (mx ? " > " : " < ") + cast(a[1], C) + " ? " + cast(a[0], C) + " : " + cast(a[1], C) + ")"),
               int_range(range_union(a[0].range, a[1].range)));
    } else if (op == "pow" && binary) {
      if (!floating(R)) return fail(i, "raises integers to a power");
      def(i, R, "std::pow(" + cast(a[0], R) + ", " + cast(a[1], R) + ")");
    } else if ((op == "remainder" || op == "fmod" || op == "floor_divide") && binary) {
      if (floating(R)) {
        const std::string x = cast(a[0], R), y = cast(a[1], R);
        def(i, R, op == "remainder" ? "hb_pymod<" + std::string(ctype(R)) + ">(" + x + ", " + y + ")"
                  : op == "fmod"    ? "std::fmod(" + x + ", " + y + ")"
                                    : "std::floor(" + x + " / " + y + ")");
      } else {
        may_fail_ = true;  // a division by zero
        std::optional<Range> r;
        if (op == "remainder" && a[1].range && a[1].range->lo > 0) r = Range{0, a[1].range->hi - 1};
        if (op == "floor_divide") r = floordiv_range(a[0].range, a[1].range);
        def(i, R, wrap(std::string(op == "remainder" ? "hb_mod(" : op == "fmod" ? "hb_fmod(" : "hb_floordiv(") +
                       cast(a[0], K::Int) + ", " + cast(a[1], K::Int) + ", t)"), int_range(r));
      }
    } else if ((op == "eq" || op == "ne" || op == "lt" || op == "le" || op == "gt" || op == "ge") && binary) {
      static const std::map<std::string, std::string> sym = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                             {"le", "<="}, {"gt", ">"}, {"ge", ">="}};
      const K P = promote(a[0].kind, a[1].kind);
      def(i, R, cast(Val{K::Bool, "(" + cast(a[0], P) + " " + sym.at(op) + " " + cast(a[1], P) + ")"}, R));
    } else if ((op == "logical_and" || op == "logical_or" || op == "logical_xor") && binary) {
      const std::string s = op == "logical_and" ? " && " : op == "logical_or" ? " || " : " != ";
      def(i, R, cast(Val{K::Bool, "(" + cast(a[0], K::Bool) + s + cast(a[1], K::Bool) + ")"}, R));
    } else if (op == "logical_not" && unary) {
      def(i, R, cast(Val{K::Bool, "(!" + cast(a[0], K::Bool) + ")"}, R));
    } else if ((op == "bitwise_and" || op == "bitwise_or" || op == "bitwise_xor" || op == "__and__" ||
                op == "__or__" || op == "__xor__") && binary) {
      if (floating(R)) return fail(i, "is a bitwise op on floating values");
      const std::string s = (op == "bitwise_and" || op == "__and__") ? " & " : (op == "bitwise_or" || op == "__or__") ? " | " : " ^ ";
      def(i, R, wrap("(" + cast(a[0], K::Int) + s + cast(a[1], K::Int) + ")"));
    } else if (op == "bitwise_not" && unary) {
      if (floating(R)) return fail(i, "is a bitwise op on floating values");
      def(i, R, R == K::Bool ? "(!" + cast(a[0], K::Bool) + ")" : "(~" + cast(a[0], K::Int) + ")");
    } else if (op == "where" && a.size() == 3 && scalar(0) && scalar(1) && scalar(2)) {
      def(i, R, "(" + cast(a[0], K::Bool) + " ? " + cast(a[1], R) + " : " + cast(a[2], R) + ")",
          int_range(range_union(a[1].range, a[2].range)));
    } else if (op == "masked_fill" && a.size() == 3 && scalar(0) && scalar(1) && scalar(2)) {
      def(i, R, "(" + cast(a[1], K::Bool) + " ? " + cast(a[2], R) + " : " + cast(a[0], R) + ")");
    } else if ((op == "clamp" || op == "clamp_min" || op == "clamp_max") && unary) {
      std::optional<Val> lo, hi;
      if (op == "clamp_min") lo = a.size() > 1 ? std::optional<Val>(a[1]) : std::nullopt;
      else if (op == "clamp_max") hi = a.size() > 1 ? std::optional<Val>(a[1]) : std::nullopt;
      else {
        if (a.size() > 1 && scalar(1)) lo = a[1];
        else lo = kw("min");
        if (a.size() > 2 && scalar(2)) hi = a[2];
        else if (!hi) hi = kw("max");
      }
      if (!floating(R)) {  // as torch: max with the lower bound, then min with the upper (which wins)
        if (R != K::Int) return fail(i, "clamps into a " + std::string(ctype(R)));
        std::string e = cast(a[0], C);
        std::optional<Range> r = a[0].range;
        auto bound = [&](const std::optional<Val>& v, bool upper) {
          if (!v || v->kind == K::None) return;
          const std::string b = cast(*v, C);
          e = "(" + e + (upper ? " > " : " < ") + b + " ? " + b + " : " + e + ")";
          if (!r || !v->range) r = std::nullopt;
          else if (upper) r = Range{std::min(r->lo, v->range->lo), std::min(r->hi, v->range->hi)};
          else r = Range{std::max(r->lo, v->range->lo), std::max(r->hi, v->range->hi)};
        };
        bound(lo, false);
        bound(hi, true);
        def(i, R, e, r);
        return true;
      }
      std::string e = cast(a[0], R);
      if (lo && lo->kind != K::None) e = "hb_max<" + std::string(ctype(R)) + ">(" + e + ", " + cast(*lo, R) + ")";
      if (hi && hi->kind != K::None) e = "hb_min<" + std::string(ctype(R)) + ">(" + e + ", " + cast(*hi, R) + ")";
      def(i, R, e);
    } else if (unary_math().count(op) && unary) {
      if (floating(R)) def(i, R, unary_math().at(op) + "(" + cast(a[0], R) + ")");
      else if (op == "abs") {
        const std::string x = "((long long)" + cast(a[0], K::Int) + ")";  // -INT_MIN fits only in 64 bits
        def(i, R, "(" + x + " < 0 ? -" + x + " : " + x + ")");
      }
      else if (op == "floor" || op == "ceil" || op == "trunc" || op == "round") def(i, R, cast(a[0], R));
      else return fail(i, "computes " + op + " into an integer");
    } else if (op == "neg" && unary) {
      const std::optional<Range> r =
          a[0].range ? checked(-static_cast<__int128>(a[0].range->hi), -static_cast<__int128>(a[0].range->lo)) : std::nullopt;
      def(i, R, wrap("(-" + opnd(a[0], narrow(r)) + ")"), int_range(r));
    } else if ((op == "rsqrt" || op == "reciprocal") && unary && floating(R)) {
      const std::string one = "((" + std::string(ctype(R)) + ")1)";
      def(i, R, one + " / " + (op == "rsqrt" ? "std::sqrt(" + cast(a[0], R) + ")" : cast(a[0], R)));
    } else if (op == "relu" && unary) {
      const std::string x = cast(a[0], C);
      def(i, R, wrap("(" + x + " < 0 ? (" + ctype(C) + ")0 : " + x + ")"));
    } else if ((op == "sign" || op == "sgn") && unary) {  // (sgn: abs's derivative in a joint graph)
      def(i, R, floating(R) ? "hb_sign<" + std::string(ctype(R)) + ">(" + cast(a[0], R) + ")"
                            : wrap("(long long)((" + cast(a[0], K::Int) + " > 0) - (" + cast(a[0], K::Int) + " < 0))"));
    } else if (op == "threshold_backward" && binary && scalar(2) && floating(R)) {  // relu's derivative
      def(i, R, "(" + cast(a[1], R) + " <= " + cast(a[2], R) + " ? (" + ctype(R) + ")0 : " + cast(a[0], R) + ")");
    } else if ((op == "tanh_backward" || op == "sigmoid_backward") && binary && floating(R)) {
      const std::string gr = cast(a[0], R), y = cast(a[1], R), one = "((" + std::string(ctype(R)) + ")1)";
      def(i, R, op == "tanh_backward" ? gr + " * (" + one + " - " + y + " * " + y + ")"
                                      : gr + " * (" + one + " - " + y + ") * " + y);
    } else if (activations().count(op) && unary) {
      if (!floating(R)) return fail(i, "computes " + op + " into an integer");
      const Activation& f = activations().at(op);
      const bool bwd = op.size() > 9 && op.compare(op.size() - 9, 9, "_backward") == 0;  // (grad, self, ...)
      if (bwd && !binary) return fail(i, "is " + op + " without a gradient and an input");
      std::string fn = f.fn;
      if (f.tanh_fn) {
        std::string approximate = "none";
        if (const Arg* m = n.kwarg("approximate"); m && m->kind == Arg::Kind::Str) approximate = m->s;
        const size_t ap = f.approximate_at;
        if (ap < n.args.size() && n.args[ap].kind == Arg::Kind::Str) approximate = n.args[ap].s;
        if (approximate != "none" && approximate != "tanh") return fail(i, "is gelu with approximate='" + approximate + "'");
        if (approximate == "tanh") fn = f.tanh_fn;
      }
      const std::string T = ctype(R);
      std::string e = fn + "<" + T + ">(";
      for (const ActArg& p : f.args) {
        if (&p != &f.args.front()) e += ", ";
        if (p.kind == ActArg::Operand) {
          if (!scalar(p.at)) return fail(i, "is " + op + " " + p.name);
          e += cast(a[p.at], R);
        } else if (p.kind == ActArg::Flag) {  // a constant in the graph
          const Arg* b = p.at < n.args.size() ? &n.args[p.at] : n.kwarg(p.name);
          e += b && b->kind == Arg::Kind::Bool && b->b ? "true" : "false";
        } else if (p.at < a.size() && a[p.at].kind != K::None) {  // a scalar or bound: positional, else keyword, else default
          e += cast(a[p.at], R);
        } else if (const std::optional<Val> v = kw(p.name); v && (p.kind == ActArg::Scalar || v->kind != K::None)) {
          e += cast(*v, R);  // (a bound's keyword with no scalar value takes the default)
        } else {
          e += p.kind == ActArg::Bound ? std::string(p.dflt < 0 ? "-" : "") + "hb_max_finite((" + T + ")0)"
                                       : cast(Val{K::T, float_literal(p.dflt)}, R);
        }
      }
      def(i, R, e + ")");
    } else if ((op == "empty_like" || op == "fill") && (unary || op == "empty_like")) {
      // fill(x, v) is v (the joint writes `empty_like(x)` then fills it); an unfilled empty_like is 0
      if (op == "fill" && !(a.size() > 1 && scalar(1))) return fail(i, "is fill without a value");
      def(i, R, op == "fill" ? cast(a[1], R) : cast(Val{K::Int, "0"}, R));
    } else if ((op == "_to_copy" || op == "to" || op == "convert_element_type" || op == "clone" || op == "alias" ||
                op == "detach" || op == "lift_fresh_copy" || op == "view" || op == "reshape" || op == "_unsafe_view" ||
                op == "type_as" || op == "contiguous" || op == "positive") && unary) {
      // Within a kind the generated code computes in one type (T is float for every floating dtype), so a
      // conversion there is its operand, not a statement: a bf16 joint's `_to_copy(grad)` stays `grad`,
      // the identity (HB_JOINT 0), and the backward keeps its split schedule.
      if (a[0].kind == R) {
        vals_[i] = a[0];
        return true;
      }
      def(i, R, cast(a[0], R), int_range(a[0].kind == K::Int || a[0].kind == K::Bool ? a[0].range : std::nullopt));
      vals_[i].const_true = a[0].const_true;
    } else if (op == "scalar_tensor" || op == "full" || op == "new_full" || op == "full_like" || op == "new_ones" ||
               op == "ones" || op == "ones_like" || op == "new_zeros" || op == "zeros" || op == "zeros_like") {
      Val fill;
      if (op == "scalar_tensor") fill = a.empty() ? Val{} : a[0];
      else if (op == "full") fill = a.size() > 1 ? a[1] : Val{};
      else if (op == "new_full" || op == "full_like") fill = a.size() > (op == "new_full" ? 2u : 1u) ? a[op == "new_full" ? 2 : 1] : Val{};
      else if (op.find("ones") != std::string::npos) fill = Val{K::Int, "1LL"};
      else fill = Val{K::Int, "0LL"};
      if (fill.kind == K::None || fill.kind == K::Buffer) return fail(i, "is a constant with no scalar value");
      def(i, R, cast(fill, R));
      vals_[i].const_true = R == K::Bool && (fill.expr == "1LL" || fill.expr == "true" || fill.expr == "((T)1.0)");
    } else if (op == "index" && a.size() == 2 && a[0].kind == K::Buffer && n.args[1].kind == Arg::Kind::List) {
      for (const Arg& x : n.args[1].items)
        if (x.kind == Arg::Kind::None) return fail(i, "indexes with None (a slice): only whole-element reads are generated");
      std::string off;
      if (!offset(i, a[0].buffer, n.args[1].items, /*dense=*/false, &off)) return false;
      const std::string B = bufs_ + "[" + std::to_string(a[0].buffer) + "]";
      const TensorType& bt = buffer_types_[a[0].buffer];
      const std::optional<K> bk = kind_of_dtype(bt.dtype);
      def(i, R, cast(Val{bk ? *bk : K::T, *load(bt.dtype, B, off)}, R), int_range(dtype_range(bt.dtype)));
    } else {
      return fail(i, "has no generated form");
    }
    return true;
  }

  bool emit_scatter(int i) {
    const Node& n = g_.nodes[i];
    const int buffer = scatter_of_.at(i);
    if (n.args.size() != 3 || n.args[1].kind != Arg::Kind::List) return fail(i, "is a malformed zeros_and_scatter");
    // The scattered buffer: the joint's placeholder number (roles_ first).
    auto it = buffer_types_.find(buffer);
    if (it == buffer_types_.end()) return fail(i, "scatters into buffer " + std::to_string(buffer) + ", which the joint does not take");
    for (const Arg& x : n.args[1].items)
      if (x.kind == Arg::Kind::None) return fail(i, "scatters with None (a slice)");
    std::string off;
    std::optional<Affine> aff;
    if (!offset(i, buffer, n.args[1].items, /*dense=*/true, &off, &aff)) return false;
    const Val v = value(n.args[2]);
    if (v.kind == K::None || v.kind == K::Buffer || v.kind == K::Scatter) return fail(i, "scatters no scalar value");
    const std::string B = bufs_ + "[" + std::to_string(buffer) + "]";
    // The first scatter whose offset runs along rows (a per-query bias), columns (per key) or diagonals
    // (q_idx - kv_idx: a relative bias) of every tile is the kernel's line scatter (HB_LINE_STATIC).
    const bool is_line = !line_ && aff && (aff->kv == 0 || aff->q == 0 || aff->q == -aff->kv);
    if (is_line) line_ = LineScatter{buffer, *aff};
    body_ << "  if (" << (is_line ? "LINE || " : "") << B << ".grad) hb_scatter_s<LINE, " << (is_line ? "true" : "false")
          << ">(t, " << buffer << ", " << B << ".grad, " << off << ", " << cast(v, K::Double) << ");  // %" << n.name
          << "\n";
    vals_[i].kind = K::Scatter;
    return true;
  }

  const Graph& g_;
  std::vector<Role> roles_;
  std::string bufs_;
  int buffer_base_ = 0;
  bool joint_ = false;
  std::vector<Val> vals_;
  RoleExtents extents_;
  std::map<int, TensorType> buffer_types_;
  std::map<int, BufferLayout> layouts_;
  std::map<int, std::vector<int64_t>> stride_overrides_;
  std::map<int, int> scatter_of_;  // zeros_and_scatter node -> buffer
  std::set<int> sums_;             // add nodes that only sum scatters
  std::optional<LineScatter> line_;
  std::ostringstream body_;
  std::string why_;
  int ops_ = 0;
  bool may_fail_ = false;
};

const Graph* subgraph(const Graph& g, const Arg& a) {
  if (a.kind != Arg::Kind::Graph) return nullptr;
  auto it = g.subgraphs.find(a.s);
  return it == g.subgraphs.end() ? nullptr : it->second.get();
}

std::string plural(int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

}  // namespace

std::optional<FlexBlockMaskLayout> flex_block_mask_layout(const Arg& bm, std::string* why) {
  if ((bm.kind != Arg::Kind::Tuple && bm.kind != Arg::Kind::List)) {
    *why = "the block mask is not a tuple";
    return std::nullopt;
  }
  const int n = static_cast<int>(bm.items.size());
  FlexBlockMaskLayout l;
  int base = -1;
  if (n == 13 || n == 17) base = 2;  // (Q_LEN, KV_LEN, kv_num_blocks, ...): torch 2.11, newer main
  else if (n == 11) base = 0;        // torch 2.5
  if (base < 0) {
    *why = "the block mask has " + std::to_string(n) + " entries (11, 13 or 17 are known)";
    return std::nullopt;
  }
  l.kv_num_blocks = base;
  l.kv_indices = base + 1;
  l.full_kv_num_blocks = base + 2;
  l.full_kv_indices = base + 3;
  l.q_num_blocks = base + 4;
  l.q_indices = base + 5;
  l.full_q_num_blocks = base + 6;
  l.full_q_indices = base + 7;
  if (bm.items[base].kind != Arg::Kind::Ref || bm.items[base + 1].kind != Arg::Kind::Ref) {
    *why = "the block mask's kv_num_blocks/kv_indices are not tensors";
    return std::nullopt;
  }
  const Arg& qb = bm.items[n - 3];
  const Arg& kb = bm.items[n - 2];
  if (qb.kind != Arg::Kind::Int || kb.kind != Arg::Kind::Int || qb.i <= 0 || kb.i <= 0) {
    *why = "the block mask's block sizes are not constant positive integers";
    return std::nullopt;
  }
  l.q_block = qb.i;
  l.kv_block = kb.i;
  return l;
}

namespace {

// Whether deterministic=True asks for an order the CUDA backward cannot give: some captured buffer gets
// a gradient (analyze_flex: the joint returns one, or the forward graph marks the buffer requires_grad),
// which it adds with atomics.
bool wants_ordered_scatter(const Graph& g, int node) {
  return g.nodes[node].hints.deterministic.value_or(false) && analyze_flex(g, node).buffer_grads > 0;
}

// Why the CUDA kernels cannot take flex node n ("" = they can): dtypes, head dims, block sizes.
std::string cuda_why_not(const Graph& g, const Node& n, bool backward, const FlexBlockMaskLayout& l, int nscore,
                         int nmask, bool ordered_scatter, int* head_dim, DType* elem) {
  const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]), *v = g.tensor_type(n.args[2]);
  if (!q || !k || !v || q->shape.size() != 4 || k->shape.size() != 4 || v->shape.size() != 4)
    return "q, k, v are not 4-d tensors";
  if (q->dtype != DType::BFloat16 && q->dtype != DType::Float16 && q->dtype != DType::Float32)
    return std::string("q is ") + dtype_name(q->dtype) + " (the CUDA kernels take bfloat16, float16 and float32)";
  if (k->dtype != q->dtype || v->dtype != q->dtype) return "q, k and v differ in dtype";
  const Dim& dq = q->shape[3];
  const Dim& dk = k->shape[3];
  const Dim& dv = v->shape[3];
  if (!dq.is_static() || !dv.is_static() || !dk.is_static()) return "the head dim is symbolic";
  if (dk.value != dq.value)
    return "k's head dim " + std::to_string(dk.value) + " differs from q's " + std::to_string(dq.value);
  const int built = flex_cuda_head_dim(dq.value, dv.value);
  if (built == 0)
    return "head dim " + std::to_string(dq.value) + (dv.value != dq.value ? ", value head dim " + std::to_string(dv.value) : "") +
           " (the CUDA kernels take head dims up to 256)";
  // float32 (both ways) and the backward at head dim 256 run the SIMT kernels (FlexSimtKernel.cuh), which
  // add dQ with atomics in no fixed order.
  const bool simt = flex_cuda_simt(q->dtype == DType::Float32, built, backward);
  if (backward && simt && n.hints.deterministic.value_or(false))
    return std::string("deterministic=True, which the CUDA SIMT backward (") +
           (q->dtype == DType::Float32 ? "float32" : "head dim " + std::to_string(built)) +
           ") does not give: it adds dQ with atomics in no fixed order";
  if (backward && ordered_scatter)
    return "deterministic=True with a buffer gradient, which the CUDA backward adds in a fixed order only where the "
           "joint scatters along the tiles' lines (the backward node's joint decides)";
  if (nscore > kFlexMaxCudaBuffers || nmask > kFlexMaxCudaBuffers)
    return "more than " + std::to_string(kFlexMaxCudaBuffers) + " captured buffers";
  // The tiles must nest in the BlockMask's blocks (the forward's 64 query rows and 64 (D 256: 32) key
  // rows; the mma.sync backward's 128 query rows and 64 key rows, the SIMT backward's 64 x 64, 32 x 32 at
  // D 256).
  const int64_t qt = backward ? (simt ? (built <= 128 ? 64 : 32) : 128) : 64;
  const int64_t kt = built <= 128 ? 64 : 32;
  if (l.q_block % qt != 0 || l.kv_block % kt != 0)
    return "block sizes " + std::to_string(l.q_block) + " x " + std::to_string(l.kv_block) + " (the CUDA " +
           (backward ? "backward" : "forward") + " needs multiples of " + std::to_string(qt) + " x " + std::to_string(kt) + ")";
  *head_dim = built;
  *elem = q->dtype;
  return "";
}

}  // namespace

std::string flex_cuda_backward_why_not(const Graph& g, int node) {
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  if (n.args.size() != (backward ? 14u : 9u)) return "unexpected argument count";
  std::string why;
  const std::optional<FlexBlockMaskLayout> layout = flex_block_mask_layout(n.args[backward ? 9 : 4], &why);
  if (!layout) return why;
  auto count = [](const Arg& a) {
    return (a.kind == Arg::Kind::Tuple || a.kind == Arg::Kind::List) ? static_cast<int>(a.items.size()) : 0;
  };
  int head_dim = 0;
  DType elem = DType::BFloat16;
  return cuda_why_not(g, n, /*backward=*/true, *layout, count(n.args[backward ? 12 : 7]),
                      count(n.args[backward ? 13 : 8]), wants_ordered_scatter(g, node), &head_dim, &elem);
}

std::optional<FlexKernelSource> generate_flex_kernel(const Graph& g, int node, std::string* why, FlexKernelDevice device) {
  const Node& n = g.nodes[node];
  const bool backward = n.target == "higher_order::flex_attention_backward";
  if (!backward && n.target != "higher_order::flex_attention") {
    *why = "not a flex_attention node";
    return std::nullopt;
  }
  if (n.args.size() != (backward ? 14u : 9u)) {
    *why = "unexpected argument count";
    return std::nullopt;
  }
  const Graph* score = subgraph(g, n.args[backward ? 7 : 3]);
  const Graph* joint = backward ? subgraph(g, n.args[8]) : nullptr;
  const Arg& bm = n.args[backward ? 9 : 4];
  const std::optional<FlexBlockMaskLayout> layout = flex_block_mask_layout(bm, why);
  if (!layout) return std::nullopt;
  const Graph* mask = subgraph(g, bm.items.back());
  if (!score || !mask || (backward && !joint)) {
    *why = "a score_mod, mask_mod or joint subgraph is missing";
    return std::nullopt;
  }
  auto count_tuple = [](const Arg& a) {
    return (a.kind == Arg::Kind::Tuple || a.kind == Arg::Kind::List) ? static_cast<int>(a.items.size()) : 0;
  };
  const int nscore = count_tuple(n.args[backward ? 12 : 7]);
  const int nmask = count_tuple(n.args[backward ? 13 : 8]);
  const bool cuda = device == FlexKernelDevice::Cuda;
  int head_dim = 0;
  DType elem = DType::BFloat16;
  if (cuda) {
    // deterministic=True with a buffer gradient: decided below, once the joint says whether its scatter runs
    // along the tiles' lines.
    *why = cuda_why_not(g, n, backward, *layout, nscore, nmask, /*ordered_scatter=*/false, &head_dim, &elem);
    if (!why->empty()) return std::nullopt;
    if (backward && (layout->q_num_blocks < 0 || bm.items[layout->q_num_blocks].kind != Arg::Kind::Ref ||
                     bm.items[layout->q_indices].kind != Arg::Kind::Ref)) {
      *why = "the block mask has no q block lists (the CUDA backward walks them)";
      return std::nullopt;
    }
  }

  // The index roles' extents, where static: b < B, h < Hq, q < Sq, kv < Skv.
  RoleExtents ext;
  if (const TensorType *q = g.tensor_type(n.args[0]), *k = g.tensor_type(n.args[1]);
      q && k && q->shape.size() == 4 && k->shape.size() == 4) {
    auto st = [](const Dim& d) { return d.is_static() ? std::optional<int64_t>(d.value) : std::nullopt; };
    ext = {st(q->shape[0]), st(q->shape[1]), st(q->shape[2]), st(k->shape[2])};
  }
  using R = Role;
  // Translated twice where read_layout moves a buffer: the first run finds how the reads move, the second
  // bakes the chosen strides in.
  std::optional<Translator> ts, tm, tj;
  std::map<int, std::vector<int64_t>> score_strides, mask_strides;
  for (int round = 0; round < 2; ++round) {
    ts.emplace(*score, std::vector<Role>{R::Score, R::B, R::H, R::Q, R::KV}, "t->score_buffers", 0, false, ext);
    ts->override_strides(score_strides);
    if (!ts->run()) {
      *why = "score_mod: " + ts->why();
      return std::nullopt;
    }
    tm.emplace(*mask, std::vector<Role>{R::B, R::H, R::Q, R::KV}, "t->mask_buffers", nscore, false, ext);
    tm->override_strides(mask_strides);
    if (!tm->run()) {
      *why = "mask_mod: " + tm->why();
      return std::nullopt;
    }
    if (backward) {
      tj.emplace(*joint, std::vector<Role>{R::Score, R::B, R::H, R::Q, R::KV, R::Grad}, "t->score_buffers", 0, true, ext);
      tj->override_strides(score_strides);
      if (!tj->run()) {
        *why = "joint graph: " + tj->why();
        return std::nullopt;
      }
    }
    if (round) break;
    for (int b = 0; b < nscore; ++b) {  // the score_mod's reads and the joint's (its recompute) alike
      const auto s = ts->layouts().find(b);
      std::optional<BufferLayout> l;
      if (s != ts->layouts().end()) l = s->second;
      if (tj)
        if (const auto j = tj->layouts().find(b); j != tj->layouts().end()) {
          if (!l) l = j->second;
          else if (l->moves.size() == j->second.moves.size())
            for (size_t d = 0; d < l->moves.size(); ++d) l->moves[d] |= j->second.moves[d];
        }
      if (l)
        if (std::optional<std::vector<int64_t>> st = read_layout(*l)) score_strides[b] = *st;
    }
    for (const auto& [b, l] : tm->layouts())
      if (std::optional<std::vector<int64_t>> st = read_layout(l)) mask_strides[b] = *st;
    if (score_strides.empty() && mask_strides.empty()) break;
  }

  FlexKernelSource out;
  std::ostringstream src, wrap;  // the scalar functions; the CPU tile wrappers
  src << "// Generated by hintbackend (codegen/FlexKernelGen.cpp) for %" << n.name << " (" << n.target << ")"
      << (cuda ? ", CUDA" : "") << ".\n"
      << kFlexKernelAbiSource << "\n";
  if (cuda && (elem == DType::BFloat16 || elem == DType::Float16)) src << "#define HB_TANH_APPROX 1\n";
  src << kPrelude;
  if (!cuda) src << kFlexMathMarker << "\n" << kFlexMathSource << kFlexMathEndMarker << "\n";
  src << kMathFunctions;

  // score_mod: the identity when it returns its score placeholder.
  const std::vector<Arg> so = ts->outputs();
  if (so.empty()) {
    *why = "score_mod returns nothing";
    return std::nullopt;
  }
  const Val sv = ts->value(so[0]);
  if (sv.kind == K::None || sv.kind == K::Buffer || sv.kind == K::Scatter) {
    *why = "score_mod returns no scalar";
    return std::nullopt;
  }
  out.score_mod = sv.expr != "score";
  if (out.score_mod) {
    src << "\ntemplate <typename T>\nHB_FN T hb_score_mod(T score, long long b, long long h, long long q, long long kv, "
           "HbFlexTile* t) {\n"
        << ts->body() << "  return " << cast(sv, K::T) << ";\n}\n";
    wrap << "template <typename T>\nstatic void hb_score_tile(T* s, HbFlexTile* t) {\n"
         << "  const long long b = t->b, h = t->h;\n"
         << "  for (int i = 0; i < t->nq; ++i) {\n    T* row = s + (long long)i * t->ld;\n"
         << "    const long long q = t->q0 + i;\n"
         << "    for (int j = 0; j < t->nk; ++j) row[j] = hb_score_mod<T>(row[j], b, h, q, t->k0 + j, t);\n  }\n}\n"
         << "extern \"C\" void hb_flex_score_f32(float* s, HbFlexTile* t) { hb_score_tile<float>(s, t); }\n"
         << "extern \"C\" void hb_flex_score_f64(double* s, HbFlexTile* t) { hb_score_tile<double>(s, t); }\n";
  }

  const std::vector<Arg> mo = tm->outputs();
  const Val mv = mo.empty() ? Val{} : tm->value(mo[0]);
  if (mv.kind == K::None || mv.kind == K::Buffer || mv.kind == K::Scatter) {
    *why = "mask_mod returns no scalar";
    return std::nullopt;
  }
  out.mask_mod = !mv.const_true;
  if (out.mask_mod) {
    src << "\nHB_FN bool hb_mask_mod(long long b, long long h, long long q, long long kv, HbFlexTile* t) {\n"
        << "  typedef float T;\n" << tm->body() << "  return " << cast(mv, K::Bool) << ";\n}\n";
    wrap << "extern \"C\" void hb_flex_mask(unsigned char* keep, HbFlexTile* t) {\n"
         << "  const long long b = t->b, h = t->h;\n"
         << "  for (int i = 0; i < t->nq; ++i) {\n    unsigned char* row = keep + (long long)i * t->ld;\n"
         << "    const long long q = t->q0 + i;\n"
         << "    for (int j = 0; j < t->nk; ++j) row[j] = hb_mask_mod(b, h, q, t->k0 + j, t);\n  }\n}\n";
  }

  out.buffer_grads.assign(nscore, false);
  if (backward) {
    const std::vector<Arg> jo = tj->outputs();
    if (jo.size() != 5u + nscore) {
      *why = "joint graph returns " + std::to_string(jo.size()) + " values, expected 5 + " + std::to_string(nscore);
      return std::nullopt;
    }
    for (int b : tj->scatter_buffers())
      if (b < nscore) out.buffer_grads[b] = true;
    // deterministic=True adds a buffer gradient in a fixed order only where it is one scatter that the
    // generator proved to run along the tiles' rows, columns or diagonals (FlexTiledKernel.cuh, line_reduce).
    if (cuda && wants_ordered_scatter(g, node) && (!tj->line() || tj->scatter_count() != 1)) {
      *why = "deterministic=True, and the joint's buffer gradient is " +
             (tj->scatter_count() != 1 ? std::to_string(tj->scatter_count()) + " scatters"
                                        : std::string("not a scatter along the tiles' rows, columns or diagonals")) +
             " (the CUDA backward adds only one such scatter in a fixed order)";
      return std::nullopt;
    }
    const Val gv = tj->value(jo[0]);
    out.joint_grad_zero = gv.kind == K::None;
    // The identity's joint returns its grad: nothing to call.
    out.joint = out.joint_grad_zero || gv.expr != "grad" || out.any_buffer_grad();
    if (out.joint) {
      if (!out.joint_grad_zero && (gv.kind == K::Buffer || gv.kind == K::Scatter)) {
        *why = "joint graph returns no scalar score gradient";
        return std::nullopt;
      }
      src << "\ntemplate <typename T, int LINE = 0>\nHB_FN T hb_joint(T score, long long b, long long h, long long q, long long kv, "
             "T grad, HbFlexTile* t) {\n"
          << tj->body() << "  return " << (out.joint_grad_zero ? "(T)0" : cast(gv, K::T)) << ";\n}\n";
      wrap << "template <typename T>\nstatic void hb_joint_tile(const T* s, T* ds, HbFlexTile* t) {\n"
           << "  const long long b = t->b, h = t->h;\n"
           << "  for (int i = 0; i < t->nq; ++i) {\n"
           << "    const T* srow = s + (long long)i * t->ld;\n    T* drow = ds + (long long)i * t->ld;\n"
           << "    const long long q = t->q0 + i;\n"
           << "    for (int j = 0; j < t->nk; ++j) drow[j] = hb_joint<T>(srow[j], b, h, q, t->k0 + j, drow[j], t);\n"
           << "  }\n}\n"
           << "extern \"C\" void hb_flex_joint_f32(const float* s, float* ds, HbFlexTile* t) { hb_joint_tile<float>(s, ds, t); }\n"
           << "extern \"C\" void hb_flex_joint_f64(const double* s, double* ds, HbFlexTile* t) { hb_joint_tile<double>(s, ds, t); }\n";
    }
  }
  out.may_fail = ts->may_fail() || tm->may_fail() || (tj && tj->may_fail());
  // The layouts the code bakes in; the score_mod and the joint read the same buffers, so they must agree.
  auto baked = [](const Translator& t, int b) -> std::optional<FlexKernelSource::Layout> {
    auto it = t.layouts().find(b);
    if (it == t.layouts().end() || !it->second.fixed) return std::nullopt;
    return FlexKernelSource::Layout{it->second.sizes, it->second.strides};
  };
  for (int b = 0; b < nscore; ++b) {
    std::optional<FlexKernelSource::Layout> l = baked(*ts, b);
    if (tj) {
      const std::optional<FlexKernelSource::Layout> lj = baked(*tj, b);
      if (tj->layouts().count(b) && (l.has_value() != lj.has_value() || (l && (l->sizes != lj->sizes || l->strides != lj->strides)))) {
        *why = "score buffer " + std::to_string(b) + " has another layout in the joint graph than in score_mod";
        return std::nullopt;
      }
      if (!ts->layouts().count(b)) l = lj;
    }
    out.buffer_layouts.push_back(l);
  }
  for (int b = 0; b < nmask; ++b) out.buffer_layouts.push_back(baked(*tm, b));
  // A score_mod that only shifts rows (score + t(b, h, q)) runs once per row, not per score (HB_ROW_SHIFT):
  // in the forward always, in the backward where no logsumexp gradient asks for t's gradient (the joint is
  // skipped then, and the buffers' gradients are zero).
  // A score_mod that adds c(b, h) * (kv_idx - q_idx) (ALiBi, a relative position) is a ramp along each row:
  // the tensor-core forwards read c = score_mod(0, b, h, 0, 1) once a tile and add each score's bias in
  // two FFMAs (HB_KV_RAMP). The backward still calls score_mod per score (its ramp is not yet checked on a
  // GPU: docs/flex-attention.md, "ALiBi as a ramp").
  bool row_shift = false, kv_ramp = false;
  if (cuda && out.score_mod) {
    const FlexAnalysis fa = analyze_flex(g, node);
    row_shift = backward ? fused_row_shift(g, node, fa) : fa.score_row_shift;
    kv_ramp = fa.score_kv_ramp && !row_shift && !backward;
  }
  if (cuda) {
    const bool f32 = elem == DType::Float32;
    src << "\n#define HB_D " << head_dim << "\n#define HB_HALF " << (elem == DType::Float16 ? 1 : 0)
        << "\n#define HB_F32 " << (f32 ? 1 : 0) << "\n#define HB_SCORE_MOD "
        << (out.score_mod ? 1 : 0) << "\n#define HB_MASK_MOD " << (out.mask_mod ? 1 : 0) << "\n#define HB_JOINT "
        << (out.joint && !row_shift ? 1 : 0) << "\n#define HB_SCATTER "
        << (out.any_buffer_grad() && !row_shift ? 1 : 0) << "\n";
    if (row_shift) src << "#define HB_ROW_SHIFT 1\n";
    // (#ifndef: an nvcc flag -DHB_KV_RAMP=0 times or checks the per-score path in the same build.)
    if (kv_ramp) src << "#ifndef HB_KV_RAMP\n#define HB_KV_RAMP 1\n#endif\n";
    out.row_shift = row_shift;
    if (backward && n.hints.deterministic.value_or(false)) src << "#define HB_DETERMINISTIC 1\n";
    if (tj && tj->line())
      src << "#define HB_LINE_STATIC 1\n#define HB_LINE_BUF " << tj->line()->buffer << "\n#define HB_LINE_ALPHA "
          << tj->line()->along.q << "LL\n#define HB_LINE_BETA " << tj->line()->along.kv << "LL\n";
    src << kFlexTemplateMarker << "\n" << kFlexCudaKernelTemplate;
    // The SIMT kernels, where the unit has one (float32; the backward at head dim 256, which every unit of
    // that head dim holds): codegen/cuda/FlexSimtKernel.cuh, after the template whose entry points call them.
    if (flex_cuda_simt(f32, head_dim, /*backward=*/true)) src << kFlexSimtKernelTemplate;
  } else {
    src << wrap.str();
  }
  out.source = src.str();
  std::ostringstream sum;
  if (cuda) {
    const int64_t dqk = g.tensor_type(n.args[0])->shape[3].value, dv = g.tensor_type(n.args[2])->shape[3].value;
    sum << "CUDA, head dim " << head_dim;
    if (dqk != head_dim || dv != head_dim)
      sum << " (q/k " << dqk << ", v " << dv << ", padded with zero columns)";
    sum << ", " << dtype_name(elem);
    if (flex_cuda_simt(elem == DType::Float32, head_dim, backward))
      sum << ", SIMT (CUDA cores, float FMA" << (elem == DType::Float32 ? ", no TF32" : "") << ")";
    sum << "; ";
  }
  sum << "score_mod: " << (out.score_mod ? plural(ts->ops(), "op") + (row_shift ? " run once per row (a row shift)"
                                                                     : kv_ramp ? ", a ramp in kv_idx - q_idx (its slope once a tile)" : "")
                                         : "identity")
      << "; mask_mod: " << (out.mask_mod ? plural(tm->ops(), "op") : "none");
  if (backward) {
    sum << "; joint: " << (out.joint ? plural(tj->ops(), "op") : "identity");
    std::string scat;
    for (int b = 0; b < nscore; ++b)
      if (out.buffer_grads[b]) scat += (scat.empty() ? "" : ", ") + std::to_string(b);
    if (!scat.empty()) sum << ", gradient scattered into buffer " << scat;
    if (cuda && tj->line()) {
      const Affine& l = tj->line()->along;
      sum << " (buffer " << tj->line()->buffer << " summed per tile along its "
          << (l.kv == 0 ? "rows" : l.q == 0 ? "columns" : "diagonals") << ": offset moves " << l.q << " per q_idx, "
          << l.kv << " per kv_idx)";
    }
  }
  // read_layout's choices: the buffer is copied into these strides before each call.
  auto relaid = [&](const std::map<int, std::vector<int64_t>>& strides, int base) {
    for (const auto& [b, st] : strides) {
      sum << "; buffer " << base + b << " read with strides [";
      for (size_t d = 0; d < st.size(); ++d) sum << (d ? ", " : "") << st[d];
      sum << "] (a copy a call)";
    }
  };
  relaid(score_strides, 0);
  relaid(mask_strides, nscore);
  out.summary = sum.str();
  return out;
}

}  // namespace hb

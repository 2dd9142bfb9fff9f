// Pointwise programs: a fused group of elementwise ops (passes/PointwiseFusion.h) compiled into a
// small register program that a kernel evaluates chunk by chunk. Plain C++ (no libtorch): the op
// table here is the one place that says which ops fuse and what each computes; the runtime's CPU
// kernel (backend/runtime/FusedPointwise.cpp) feeds it strided, broadcast operands.
//
// Semantics follow eager ATen's for the same dtype: every op computes in T (float for f32, f16 and
// bf16; double for f64), Python scalars are converted to T, NaN propagates as in ATen (relu(NaN) is
// NaN, maximum/minimum propagate NaN). Unlike eager, f16/bf16 groups keep intermediates in float
// instead of rounding after every op (as Inductor does).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb {

constexpr const char* kFusedPointwiseTarget = "hintbackend::fused_pointwise";

enum class PwOp : uint8_t {
  Load, Const,                                        // input #a; the constant k
  Add, Sub, Mul, Div, Maximum, Minimum,               // (a, b)
  Neg, Relu, Sigmoid, Tanh, Exp, Log, Sqrt, Rsqrt, Abs, Reciprocal, Sin, Cos, Log1p, Expm1, Erf,
  Silu, Gelu, GeluTanh,                               // (a)
  LeakyRelu, PowScalar,                               // (a) with k: slope, exponent
  ThresholdBackward,                                  // (grad a, self b) with k: threshold
  SigmoidBackward, TanhBackward,                      // (grad a, output b)
  SiluBackward,                                       // (grad a, self b)
};
const char* pw_op_name(PwOp op);

// Register r holds the value of code[r]; the program's result is the last register.
struct PwInstr {
  PwOp op = PwOp::Const;
  int a = -1, b = -1;
  double k = 0.0;
};

struct PointwiseProgram {
  int num_inputs = 0;
  std::vector<PwInstr> code;
  // "r0 = load 0; r1 = const 0.5; r2 = mul r0 r1; ..." for the kernel dump.
  std::string to_string() const;
};

// Devices a fused pointwise kernel exists for ("cpu"). The fusion pass leaves other devices alone.
bool has_pointwise_kernel(const std::string& device);

// Whether node i can join a fused group: an op of the table, not in-place or a view, a floating
// result (f16, bf16, f32, f64) on a device with a kernel, every tensor operand of that same dtype
// and device, every other operand a constant number. `why` says what fails (for the notes).
bool is_fusable_pointwise(const Graph& g, int i, std::string* why = nullptr);

// Compiles a fused body (placeholders = the program's inputs, fusable nodes, output = one value).
// Throws hb::InternalError when the body is not such a graph.
PointwiseProgram compile_pointwise(const Graph& body);

// ---- evaluation ----------------------------------------------------------------------------------
// One op on one element: the single definition of each op's meaning, shared by the CPU loop below
// and the CUDA kernel (codegen/cuda/FusedPointwise.cu). x, y: operands (y unused by unary ops); k: the
// instruction's constant. Load and Const are handled by the evaluators.
#ifdef __CUDACC__
#define HB_HD __host__ __device__
#else
#define HB_HD
#endif

namespace pw {
// Math through the overloads each side has: std:: on the host, CUDA's float/double overloads on the device.
#ifdef __CUDA_ARCH__
#define HB_PW_MATH(name) \
  HB_HD inline float name(float v) { return ::name##f(v); } \
  HB_HD inline double name(double v) { return ::name(v); }
#else
#define HB_PW_MATH(name) \
  inline float name(float v) { return std::name(v); } \
  inline double name(double v) { return std::name(v); }
#endif
HB_PW_MATH(exp) HB_PW_MATH(log) HB_PW_MATH(tanh) HB_PW_MATH(sqrt) HB_PW_MATH(sin) HB_PW_MATH(cos)
HB_PW_MATH(log1p) HB_PW_MATH(expm1) HB_PW_MATH(erf) HB_PW_MATH(fabs)
#undef HB_PW_MATH
#ifdef __CUDA_ARCH__
HB_HD inline float pow(float a, float b) { return ::powf(a, b); }
HB_HD inline double pow(double a, double b) { return ::pow(a, b); }
HB_HD inline bool isnan(float v) { return ::isnan(v); }
HB_HD inline bool isnan(double v) { return ::isnan(v); }
#else
inline float pow(float a, float b) { return std::pow(a, b); }
inline double pow(double a, double b) { return std::pow(a, b); }
inline bool isnan(float v) { return std::isnan(v); }
inline bool isnan(double v) { return std::isnan(v); }
#endif
}  // namespace pw

// Every computing op, for the evaluators' switches.
#define HB_PW_COMPUTE_OPS(X)                                                                        \
  X(Add) X(Sub) X(Mul) X(Div) X(Maximum) X(Minimum) X(Neg) X(Relu) X(Sigmoid) X(Tanh) X(Exp) X(Log)   \
  X(Sqrt) X(Rsqrt) X(Abs) X(Reciprocal) X(Sin) X(Cos) X(Log1p) X(Expm1) X(Erf) X(Silu) X(Gelu)       \
  X(GeluTanh) X(LeakyRelu) X(PowScalar) X(ThresholdBackward) X(SigmoidBackward) X(TanhBackward)      \
  X(SiluBackward)

template <PwOp OP, typename T>
HB_HD inline T pw_apply(T x, T y, T k) {
  const T one = T(1), zero = T(0), half = T(0.5);
  if constexpr (OP == PwOp::Add) return x + y;
  else if constexpr (OP == PwOp::Sub) return x - y;
  else if constexpr (OP == PwOp::Mul) return x * y;
  else if constexpr (OP == PwOp::Div) return x / y;
  else if constexpr (OP == PwOp::Maximum) return (pw::isnan(x) || pw::isnan(y)) ? x + y : (x > y ? x : y);
  else if constexpr (OP == PwOp::Minimum) return (pw::isnan(x) || pw::isnan(y)) ? x + y : (x < y ? x : y);
  else if constexpr (OP == PwOp::Neg) return -x;
  else if constexpr (OP == PwOp::Relu) return x < zero ? zero : x;  // NaN stays NaN; a select, no branch
  else if constexpr (OP == PwOp::Sigmoid) return one / (one + pw::exp(-x));
  else if constexpr (OP == PwOp::Tanh) return pw::tanh(x);
  else if constexpr (OP == PwOp::Exp) return pw::exp(x);
  else if constexpr (OP == PwOp::Log) return pw::log(x);
  else if constexpr (OP == PwOp::Sqrt) return pw::sqrt(x);
  else if constexpr (OP == PwOp::Rsqrt) return one / pw::sqrt(x);
  else if constexpr (OP == PwOp::Abs) return pw::fabs(x);
  else if constexpr (OP == PwOp::Reciprocal) return one / x;
  else if constexpr (OP == PwOp::Sin) return pw::sin(x);
  else if constexpr (OP == PwOp::Cos) return pw::cos(x);
  else if constexpr (OP == PwOp::Log1p) return pw::log1p(x);
  else if constexpr (OP == PwOp::Expm1) return pw::expm1(x);
  else if constexpr (OP == PwOp::Erf) return pw::erf(x);
  else if constexpr (OP == PwOp::Silu) return x / (one + pw::exp(-x));
  else if constexpr (OP == PwOp::Gelu) return x * half * (one + pw::erf(x * T(0.70710678118654752440)));
  else if constexpr (OP == PwOp::GeluTanh)
    return half * x * (one + pw::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
  else if constexpr (OP == PwOp::LeakyRelu) {
    const T m = x * k;  // both sides computed first: a select the compiler vectorizes, not a branch
    return x > zero ? x : m;
  }
  else if constexpr (OP == PwOp::PowScalar) return pw::pow(x, k);
  else if constexpr (OP == PwOp::ThresholdBackward) return y <= k ? zero : x;  // x: grad, y: self
  else if constexpr (OP == PwOp::SigmoidBackward) return x * (one - y) * y;    // y: sigmoid's output
  else if constexpr (OP == PwOp::TanhBackward) return x * (one - y * y);       // y: tanh's output
  else if constexpr (OP == PwOp::SiluBackward) {                               // y: silu's input
    const T s = one / (one + pw::exp(-y));
    return x * s * (one + y * (one - s));
  } else {
    return zero;  // Load, Const: not computing ops
  }
}

// Evaluates p on n elements: inputs[j] points at n contiguous values of input j; out receives n
// values. scratch holds p.code.size() * n values. One op at a time over the whole chunk, so each op is
// a tight loop the compiler can vectorize; chunks of a few hundred elements keep registers in L1.
template <typename T>
void eval_pointwise(const PointwiseProgram& p, const T* const* inputs, T* out, int64_t n, T* scratch) {
  const size_t nr = p.code.size();
  const T* reg_stack[64];
  std::vector<const T*> reg_heap;
  const T** reg = reg_stack;
  if (nr > 64) {
    reg_heap.resize(nr);
    reg = reg_heap.data();
  }
  for (size_t r = 0; r < nr; ++r) {
    const PwInstr& in = p.code[r];
    T* d = (r + 1 == nr) ? out : scratch + r * n;
    if (in.op == PwOp::Load) {
      if (r + 1 < nr) {
        reg[r] = inputs[in.a];  // no copy: later ops read the input where it is
        continue;
      }
      for (int64_t e = 0; e < n; ++e) d[e] = inputs[in.a][e];
      reg[r] = d;
      continue;
    }
    // d never overlaps an operand (registers are distinct, the output is a fresh or arena buffer no
    // input shares): __restrict lets the compiler vectorize the loops.
    T* __restrict dd = d;
    const T* __restrict x = in.a >= 0 ? reg[in.a] : nullptr;
    const T* __restrict y = in.b >= 0 ? reg[in.b] : x;  // unary ops ignore y
    const T k = static_cast<T>(in.k);
    switch (in.op) {
      case PwOp::Const:
        for (int64_t e = 0; e < n; ++e) dd[e] = k;
        break;
#define HB_PW_CPU_CASE(N)                                                      \
  case PwOp::N:                                                              \
    for (int64_t e = 0; e < n; ++e) dd[e] = pw_apply<PwOp::N, T>(x[e], y[e], k); \
    break;
        HB_PW_COMPUTE_OPS(HB_PW_CPU_CASE)
#undef HB_PW_CPU_CASE
      default:
        break;
    }
    reg[r] = d;
  }
}

}  // namespace hb

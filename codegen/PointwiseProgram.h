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
// Evaluates p on n elements: inputs[j] points at n contiguous values of input j; out receives n
// values. scratch holds p.code.size() * n values. Chunk sizes are the caller's (a few dozen to a few
// hundred elements keep the registers in L1).
template <typename T>
void eval_pointwise(const PointwiseProgram& p, const T* const* inputs, T* out, int64_t n, T* scratch) {
  const size_t nr = p.code.size();
  // reg[r]: where register r's n values are; loads point straight at the input.
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
    const T* x = in.a >= 0 && in.op != PwOp::Load ? reg[in.a] : nullptr;
    const T* y = in.b >= 0 ? reg[in.b] : nullptr;
    const T k = static_cast<T>(in.k);
    const T one = T(1), zero = T(0), half = T(0.5);
    switch (in.op) {
      case PwOp::Load:
        if (r + 1 == nr) {
          for (int64_t e = 0; e < n; ++e) d[e] = inputs[in.a][e];
        } else {
          reg[r] = inputs[in.a];
          continue;
        }
        break;
      case PwOp::Const: for (int64_t e = 0; e < n; ++e) d[e] = k; break;
      case PwOp::Add: for (int64_t e = 0; e < n; ++e) d[e] = x[e] + y[e]; break;
      case PwOp::Sub: for (int64_t e = 0; e < n; ++e) d[e] = x[e] - y[e]; break;
      case PwOp::Mul: for (int64_t e = 0; e < n; ++e) d[e] = x[e] * y[e]; break;
      case PwOp::Div: for (int64_t e = 0; e < n; ++e) d[e] = x[e] / y[e]; break;
      case PwOp::Maximum:
        for (int64_t e = 0; e < n; ++e)
          d[e] = (std::isnan(x[e]) || std::isnan(y[e])) ? x[e] + y[e] : (x[e] > y[e] ? x[e] : y[e]);
        break;
      case PwOp::Minimum:
        for (int64_t e = 0; e < n; ++e)
          d[e] = (std::isnan(x[e]) || std::isnan(y[e])) ? x[e] + y[e] : (x[e] < y[e] ? x[e] : y[e]);
        break;
      case PwOp::Neg: for (int64_t e = 0; e < n; ++e) d[e] = -x[e]; break;
      case PwOp::Relu: for (int64_t e = 0; e < n; ++e) d[e] = x[e] < zero ? zero : x[e]; break;
      case PwOp::Sigmoid: for (int64_t e = 0; e < n; ++e) d[e] = one / (one + std::exp(-x[e])); break;
      case PwOp::Tanh: for (int64_t e = 0; e < n; ++e) d[e] = std::tanh(x[e]); break;
      case PwOp::Exp: for (int64_t e = 0; e < n; ++e) d[e] = std::exp(x[e]); break;
      case PwOp::Log: for (int64_t e = 0; e < n; ++e) d[e] = std::log(x[e]); break;
      case PwOp::Sqrt: for (int64_t e = 0; e < n; ++e) d[e] = std::sqrt(x[e]); break;
      case PwOp::Rsqrt: for (int64_t e = 0; e < n; ++e) d[e] = one / std::sqrt(x[e]); break;
      case PwOp::Abs: for (int64_t e = 0; e < n; ++e) d[e] = std::abs(x[e]); break;
      case PwOp::Reciprocal: for (int64_t e = 0; e < n; ++e) d[e] = one / x[e]; break;
      case PwOp::Sin: for (int64_t e = 0; e < n; ++e) d[e] = std::sin(x[e]); break;
      case PwOp::Cos: for (int64_t e = 0; e < n; ++e) d[e] = std::cos(x[e]); break;
      case PwOp::Log1p: for (int64_t e = 0; e < n; ++e) d[e] = std::log1p(x[e]); break;
      case PwOp::Expm1: for (int64_t e = 0; e < n; ++e) d[e] = std::expm1(x[e]); break;
      case PwOp::Erf: for (int64_t e = 0; e < n; ++e) d[e] = std::erf(x[e]); break;
      case PwOp::Silu: for (int64_t e = 0; e < n; ++e) d[e] = x[e] / (one + std::exp(-x[e])); break;
      case PwOp::Gelu: {
        const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
        for (int64_t e = 0; e < n; ++e) d[e] = x[e] * half * (one + std::erf(x[e] * inv_sqrt2));
        break;
      }
      case PwOp::GeluTanh: {
        const T c = static_cast<T>(0.79788456080286535588), c3 = static_cast<T>(0.044715);
        for (int64_t e = 0; e < n; ++e) {
          const T v = x[e];
          d[e] = half * v * (one + std::tanh(c * (v + c3 * v * v * v)));
        }
        break;
      }
      case PwOp::LeakyRelu: for (int64_t e = 0; e < n; ++e) d[e] = x[e] > zero ? x[e] : x[e] * k; break;
      case PwOp::PowScalar: for (int64_t e = 0; e < n; ++e) d[e] = std::pow(x[e], k); break;
      case PwOp::ThresholdBackward: for (int64_t e = 0; e < n; ++e) d[e] = y[e] <= k ? zero : x[e]; break;
      case PwOp::SigmoidBackward: for (int64_t e = 0; e < n; ++e) d[e] = x[e] * (one - y[e]) * y[e]; break;
      case PwOp::TanhBackward: for (int64_t e = 0; e < n; ++e) d[e] = x[e] * (one - y[e] * y[e]); break;
      case PwOp::SiluBackward:
        for (int64_t e = 0; e < n; ++e) {
          const T s = one / (one + std::exp(-y[e]));
          d[e] = x[e] * s * (one + y[e] * (one - s));
        }
        break;
    }
    reg[r] = d;
  }
}

}  // namespace hb

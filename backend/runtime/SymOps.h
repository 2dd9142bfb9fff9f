// Sym ops: the Python operators and sym functions on int/float/bool values that Dynamo's symbolic
// shapes leave in a graph (operator::mul, torch::sym_max, math::ceil ...), evaluated natively; and
// getitem on tuple and list values. Templates over `where` (called only on failure, so the hot path
// builds no node description).
#pragma once
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "backend/ir/Error.h"
#include "backend/ir/SymOp.h"

namespace hb::rt {

using hb::SymCode;  // backend/ir/SymOp.h: the sym ops' names and codes

// Resolved from the target when the executor is built.
SymCode sym_code(const std::string& target, const std::string& where);

inline bool sym_unary_code(SymCode c) { return c >= SymCode::Neg; }

// What ints and floats share; nullopt for what they do differently (division, modulo, bit ops).
template <typename T>
std::optional<c10::IValue> sym_common(SymCode op, T x, T y) {
  switch (op) {
    case SymCode::Add: return c10::IValue(x + y);
    case SymCode::Sub: return c10::IValue(x - y);
    case SymCode::Mul: return c10::IValue(x * y);
    case SymCode::Pow: return c10::IValue(std::pow(static_cast<double>(x), static_cast<double>(y)));
    case SymCode::TrueDiv: return c10::IValue(static_cast<double>(x) / static_cast<double>(y));
    case SymCode::Eq: return c10::IValue(x == y);
    case SymCode::Ne: return c10::IValue(x != y);
    case SymCode::Lt: return c10::IValue(x < y);
    case SymCode::Le: return c10::IValue(x <= y);
    case SymCode::Gt: return c10::IValue(x > y);
    case SymCode::Ge: return c10::IValue(x >= y);
    case SymCode::Max: return c10::IValue(std::max(x, y));
    case SymCode::Min: return c10::IValue(std::min(x, y));
    default: return std::nullopt;
  }
}

template <typename Where>
c10::IValue sym_binary(SymCode op, const c10::IValue& a, const c10::IValue& b, Where where) {
  if ((a.isInt() || a.isBool()) && (b.isInt() || b.isBool())) {
    const int64_t x = a.isBool() ? a.toBool() : a.toInt();
    const int64_t y = b.isBool() ? b.toBool() : b.toInt();
    if (auto r = sym_common<int64_t>(op, x, y)) return *r;
    if (op == SymCode::FloorDiv || op == SymCode::Mod) {
      HB_USER_CHECK(y != 0) << where() << ": integer division by zero";
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
      return op == SymCode::FloorDiv ? c10::IValue(q) : c10::IValue(x - q * y);
    }
    if (op == SymCode::And) return static_cast<int64_t>(x & y);
    if (op == SymCode::Or) return static_cast<int64_t>(x | y);
  } else {
    const double x = a.toScalar().toDouble(), y = b.toScalar().toDouble();
    if (auto r = sym_common<double>(op, x, y)) return *r;
    if (op == SymCode::FloorDiv) return std::floor(x / y);
    if (op == SymCode::Mod) return x - std::floor(x / y) * y;
  }
  HB_USER_FAIL() << where() << ": this operator is not defined for these operand types";
}

template <typename Where>
c10::IValue sym_unary(SymCode op, const c10::IValue& a, Where where) {
  switch (op) {
    case SymCode::Neg: return a.isInt() ? c10::IValue(-a.toInt()) : c10::IValue(-a.toScalar().toDouble());
    case SymCode::Not: return !(a.isBool() ? a.toBool() : a.toScalar().toDouble() != 0);
    case SymCode::Float: return a.toScalar().toDouble();
    case SymCode::Int: return a.isInt() ? a.toInt() : static_cast<int64_t>(a.toScalar().toDouble());
    case SymCode::Ceil: return static_cast<int64_t>(std::ceil(a.toScalar().toDouble()));
    case SymCode::Floor: return static_cast<int64_t>(std::floor(a.toScalar().toDouble()));
    case SymCode::Sqrt: {  // Python's math.sqrt: a float; a negative operand is a domain error
      const double x = a.toScalar().toDouble();
      HB_USER_CHECK(!(x < 0)) << where() << ": math domain error (sqrt of " << x << ")";
      return std::sqrt(x);
    }
    default: break;
  }
  HB_USER_FAIL() << where() << ": this operator takes two operands";
}

// `where` is only called on failure: building a node description per call would cost on the hot path.
template <typename Where>
c10::IValue get_item(const c10::IValue& container, int64_t idx, Where where) {
  HB_USER_CHECK(container.isTuple() || container.isList())
      << where() << ": getitem on a value that is neither a tuple nor a list (" << container.tagKind() << ")";
  const auto elems = container.isTuple() ? c10::ArrayRef<c10::IValue>(container.toTupleRef().elements())
                                         : container.toListRef();
  const int64_t n = static_cast<int64_t>(elems.size());
  if (idx < 0) idx += n;
  HB_USER_CHECK(idx >= 0 && idx < n) << where() << ": index " << idx << " out of range";
  return elems[idx];
}

}  // namespace hb::rt

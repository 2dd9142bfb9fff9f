// The sym ops of the IR: the Python operators and sym functions on int/float/bool values that Dynamo's
// symbolic shapes leave in a graph (operator::mul, torch::sym_max, math::ceil, torch::sym_sqrt ...). One
// table names them: kernel selection runs a node natively when its target is here (codegen/KernelSelect),
// and the runtime evaluates it by its code (backend/runtime/SymOps.h).
#pragma once
#include <optional>
#include <string>

namespace hb {

enum class SymCode {
  Add, Sub, Mul, FloorDiv, Mod, TrueDiv, Pow, Eq, Ne, Lt, Le, Gt, Ge, And, Or, Max, Min,  // binary
  Neg, Not, Float, Int, Ceil, Floor, Sqrt,                                                // unary
};

// The code of a sym op's target, or nullopt where the target is no sym op.
std::optional<SymCode> sym_op_code(const std::string& target);

}  // namespace hb

// How the runtime builds the arguments of a call: each IR argument becomes an ArgSpec once, when the
// executor is built (constants converted against the op's schema, lists folded), and build_arg makes
// the IValue from it and the slots of the values computed so far on every call.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/ir/Graph.h"

namespace hb::rt {

// How to build one IValue of a call from constants and slots.
struct ArgSpec {
  enum class K { Const, Slot, NumberSlot, TensorList, OptTensorList, IntList, DoubleList, Tuple };
  K k = K::Const;
  c10::IValue value;            // Const
  int slot = -1;                // Slot, NumberSlot (a SymInt/SymFloat value where a Tensor is expected)
  std::vector<ArgSpec> items;   // lists and tuples
};

c10::IValue build_arg(const ArgSpec& s, const std::vector<c10::IValue>& slots);

ArgSpec constant(c10::IValue v);
ArgSpec slot(int i);
// An IR argument as a spec for one schema argument of type `type` (`where` names it in errors).
ArgSpec convert(const Graph& g, const Arg& a, const c10::TypePtr& type, const std::string& where);
// A dispatcher op node's operator and its arguments against the schema (positional and keyword, the
// schema's defaults where the node leaves one out); a user error naming the node when the operator is
// not registered or the arguments do not fit. The executor's ATen steps and the Calls that fall back to
// the node's own op (LayerNormCall.cpp) both build theirs here.
struct AtenArgs {
  c10::OperatorHandle op;
  std::vector<ArgSpec> args;
};
AtenArgs aten_args(const Graph& g, int node, const std::string& where);
// Untyped conversion (higher-order op arguments, sym ops, outputs): tuples and lists of values.
ArgSpec convert_untyped(const Arg& a, const std::string& where);
// A constant float (a scale), from a Float or Int argument.
double float_arg(const Arg& a, const std::string& where);
// A float argument that is a constant or a number computed at run time: flex's scale, which with a
// symbolic head dim is 1 / sqrt(D) of Dynamo's sym ops (a SymFloat). Read per call with at(slots).
struct FloatArg {
  double value = 1.0;
  int slot = -1;  // >= 0: the value computed in this slot
  double at(const std::vector<c10::IValue>& slots) const {
    return slot < 0 ? value : slots[slot].toScalar().toDouble();
  }
};
FloatArg float_or_value_arg(const Arg& a, const std::string& where);

// A Python number passed where a schema wants a Tensor: a 0-dim "wrapped number" tensor, which
// type promotion treats as a scalar (what eager does for x + 1).
at::Tensor wrapped_number(const c10::IValue& v);
c10::ScalarType to_scalar_type(DType d);
c10::Device device_of(const TensorType& t);  // "cuda" -> cuda:0
// Sizes and strides of a static IR type (strides empty when the type has none).
std::vector<int64_t> sizes_of(const TensorType& t);
std::vector<int64_t> strides_of(const TensorType& t);
// "aten::addmm.default" -> ("aten::addmm", ""); "aten::add.Tensor" -> ("aten::add", "Tensor")
std::pair<std::string, std::string> split_target(const std::string& target);

}  // namespace hb::rt

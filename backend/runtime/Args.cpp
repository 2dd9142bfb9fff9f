#include "backend/runtime/Args.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/function_schema.h>

#include "backend/ir/Error.h"

namespace hb::rt {

// A Python number passed where a schema wants a Tensor: a 0-dim "wrapped number" tensor, which
// type promotion treats as a scalar (what eager does for x + 1).
at::Tensor wrapped_number(const c10::IValue& v) {
  at::Tensor t = at::scalar_to_tensor(v.toScalar());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

c10::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::Bool: return c10::ScalarType::Bool;
    case DType::UInt8: return c10::ScalarType::Byte;
    case DType::Int8: return c10::ScalarType::Char;
    case DType::Int16: return c10::ScalarType::Short;
    case DType::Int32: return c10::ScalarType::Int;
    case DType::Int64: return c10::ScalarType::Long;
    case DType::Float16: return c10::ScalarType::Half;
    case DType::BFloat16: return c10::ScalarType::BFloat16;
    case DType::Float32: return c10::ScalarType::Float;
    case DType::Float64: return c10::ScalarType::Double;
    case DType::Complex64: return c10::ScalarType::ComplexFloat;
    case DType::Complex128: return c10::ScalarType::ComplexDouble;
    case DType::Float8_e4m3fn: return c10::ScalarType::Float8_e4m3fn;
    case DType::Float8_e5m2: return c10::ScalarType::Float8_e5m2;
  }
  return c10::ScalarType::Undefined;
}

ArgSpec constant(c10::IValue v) {
  ArgSpec s;
  s.k = ArgSpec::K::Const;
  s.value = std::move(v);
  return s;
}
ArgSpec slot(int i) {
  ArgSpec s;
  s.k = ArgSpec::K::Slot;
  s.slot = i;
  return s;
}

c10::Device device_of(const TensorType& t) {
  c10::Device d(t.device);
  if (d.is_cuda() && !d.has_index()) d.set_index(0);
  return d;
}

std::vector<int64_t> sizes_of(const TensorType& t) {
  std::vector<int64_t> v;
  for (const Dim& d : t.shape) v.push_back(d.value);
  return v;
}
std::vector<int64_t> strides_of(const TensorType& t) {
  std::vector<int64_t> v;
  for (const Dim& d : t.stride) v.push_back(d.value);
  return v;
}

namespace {

c10::Layout to_layout(const std::string& s, const std::string& where) {
  if (s == "strided") return c10::kStrided;
  if (s == "sparse_coo") return c10::kSparse;
  if (s == "sparse_csr") return c10::kSparseCsr;
  if (s == "sparse_csc") return c10::kSparseCsc;
  if (s == "sparse_bsr") return c10::kSparseBsr;
  if (s == "sparse_bsc") return c10::kSparseBsc;
  if (s == "_mkldnn") return c10::kMkldnn;
  if (s == "jagged") return c10::kJagged;
  HB_USER_FAIL() << where << ": unknown layout '" << s << "'";
}

c10::MemoryFormat to_memory_format(const std::string& s, const std::string& where) {
  if (s == "contiguous_format") return c10::MemoryFormat::Contiguous;
  if (s == "preserve_format") return c10::MemoryFormat::Preserve;
  if (s == "channels_last") return c10::MemoryFormat::ChannelsLast;
  if (s == "channels_last_3d") return c10::MemoryFormat::ChannelsLast3d;
  HB_USER_FAIL() << where << ": unknown memory format '" << s << "'";
}


bool has_ref(const Arg& a) {
  bool found = false;
  a.for_each_ref([&](const Arg&) { found = true; });
  return found;
}

// A constant scalar argument as an IValue, guided by the schema type when there is one.
c10::IValue scalar_value(const Arg& a, const c10::TypePtr& type, const std::string& where) {
  using K = Arg::Kind;
  const c10::TypeKind tk = type ? type->kind() : c10::TypeKind::AnyType;
  switch (a.kind) {
    case K::None: return c10::IValue();
    case K::Bool: return c10::IValue(a.b);
    case K::Int:
      if (tk == c10::TypeKind::FloatType) return c10::IValue(static_cast<double>(a.i));
      return c10::IValue(a.i);
    case K::Float: return c10::IValue(a.f);
    case K::Str: return c10::IValue(a.s);
    case K::DType: return c10::IValue(static_cast<int64_t>(to_scalar_type(a.dtype)));
    case K::Layout: return c10::IValue(static_cast<int64_t>(to_layout(a.s, where)));
    case K::MemoryFormat: return c10::IValue(static_cast<int64_t>(to_memory_format(a.s, where)));
    case K::Device: return c10::IValue(c10::Device(a.s));
    default: break;
  }
  HB_INTERNAL_CHECK(false) << where << ": cannot convert argument of kind " << static_cast<int>(a.kind);
}

c10::TypePtr unwrap_optional(const c10::TypePtr& t) {
  if (t && t->kind() == c10::TypeKind::OptionalType) return t->expectRef<c10::OptionalType>().getElementType();
  return t;
}

bool is_number(const ValueType& t) {
  return t.kind == ValueType::Kind::Int || t.kind == ValueType::Kind::SymInt ||
         t.kind == ValueType::Kind::Float || t.kind == ValueType::Kind::Bool;
}

}  // namespace

ArgSpec convert(const Graph& g, const Arg& a, const c10::TypePtr& type_in, const std::string& where) {
  if (a.kind == Arg::Kind::Ref) {
    const c10::TypePtr t = unwrap_optional(type_in);
    ArgSpec s = slot(a.ref);
    // x * n with n a SymInt traces as mul.Tensor(x, n): wrap the number at run time, like eager.
    if (t && t->kind() == c10::TypeKind::TensorType && is_number(g.nodes[a.ref].type)) s.k = ArgSpec::K::NumberSlot;
    return s;
  }
  // None for a non-optional Tensor (e.g. attn_bias of the SDPA backward ops): an undefined tensor, as in eager.
  if (a.kind == Arg::Kind::None)
    return constant(type_in && type_in->kind() == c10::TypeKind::TensorType ? c10::IValue(at::Tensor()) : c10::IValue());
  const c10::TypePtr type = unwrap_optional(type_in);
  if (a.kind == Arg::Kind::List || a.kind == Arg::Kind::Tuple) {
    HB_USER_CHECK(type && type->kind() == c10::TypeKind::ListType)
        << where << ": got a list where the schema expects " << (type ? type->str() : "?");
    const c10::TypePtr elem = type->expectRef<c10::ListType>().getElementType();
    const c10::TypeKind ek = elem->kind();
    ArgSpec s;
    if (ek == c10::TypeKind::TensorType) s.k = ArgSpec::K::TensorList;
    else if (ek == c10::TypeKind::OptionalType) s.k = ArgSpec::K::OptTensorList;
    else if (ek == c10::TypeKind::IntType || ek == c10::TypeKind::SymIntType) s.k = ArgSpec::K::IntList;
    else if (ek == c10::TypeKind::FloatType) s.k = ArgSpec::K::DoubleList;
    else if (!has_ref(a)) {
      // Bool lists and other constant lists: let the schema's own parser-free path build them.
      if (ek == c10::TypeKind::BoolType) {
        c10::List<bool> l;
        for (const Arg& x : a.items) l.push_back(x.b);
        return constant(c10::IValue(l));
      }
      HB_USER_FAIL() << where << ": unsupported list element type " << elem->str();
    } else {
      HB_USER_FAIL() << where << ": unsupported list element type " << elem->str() << " with graph values";
    }
    for (const Arg& x : a.items) s.items.push_back(convert(g, x, elem, where));
    if (!has_ref(a)) {
      // Fold constant lists into one IValue at plan time.
      std::vector<c10::IValue> no_slots;
      ArgSpec folded;
      folded.k = ArgSpec::K::Const;
      folded.value = build_arg(s, no_slots);
      return folded;
    }
    return s;
  }
  if (type && type->kind() == c10::TypeKind::TensorType &&
      (a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float || a.kind == Arg::Kind::Bool)) {
    // A Python number where the schema wants a Tensor (x + 1 traced as add.Tensor): like eager,
    // pass a 0-dim "wrapped number" tensor so type promotion treats it as a scalar.
    return constant(c10::IValue(wrapped_number(scalar_value(a, nullptr, where))));
  }
  return constant(scalar_value(a, type, where));
}

c10::IValue build_arg(const ArgSpec& s, const std::vector<c10::IValue>& slots) {
  switch (s.k) {
    case ArgSpec::K::Const: return s.value;
    case ArgSpec::K::Slot: return slots[s.slot];
    case ArgSpec::K::NumberSlot: {
      const c10::IValue& v = slots[s.slot];
      return v.isTensor() ? v : c10::IValue(wrapped_number(v));
    }
    case ArgSpec::K::TensorList: {
      c10::List<at::Tensor> l;
      l.reserve(s.items.size());
      for (const ArgSpec& x : s.items) l.push_back(build_arg(x, slots).toTensor());
      return c10::IValue(std::move(l));
    }
    case ArgSpec::K::OptTensorList: {
      c10::List<std::optional<at::Tensor>> l;
      l.reserve(s.items.size());
      for (const ArgSpec& x : s.items) {
        c10::IValue v = build_arg(x, slots);
        l.push_back(v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor()));
      }
      return c10::IValue(std::move(l));
    }
    case ArgSpec::K::IntList: {
      c10::List<int64_t> l;
      l.reserve(s.items.size());
      for (const ArgSpec& x : s.items) l.push_back(build_arg(x, slots).toInt());
      return c10::IValue(std::move(l));
    }
    case ArgSpec::K::DoubleList: {
      c10::List<double> l;
      for (const ArgSpec& x : s.items) l.push_back(build_arg(x, slots).toScalar().toDouble());
      return c10::IValue(std::move(l));
    }
    case ArgSpec::K::Tuple: {
      std::vector<c10::IValue> v;
      for (const ArgSpec& x : s.items) v.push_back(build_arg(x, slots));
      return c10::ivalue::Tuple::create(std::move(v));
    }
  }
  return c10::IValue();
}

ArgSpec convert_untyped(const Arg& a, const std::string& where) {
  if (a.kind == Arg::Kind::Ref) return slot(a.ref);
  if (a.kind == Arg::Kind::List || a.kind == Arg::Kind::Tuple) {
    ArgSpec s;
    s.k = ArgSpec::K::Tuple;
    for (const Arg& x : a.items) s.items.push_back(convert_untyped(x, where));
    return s;
  }
  HB_USER_CHECK(a.kind != Arg::Kind::Graph && a.kind != Arg::Kind::Dict)
      << where << ": a subgraph or dict cannot be used as a value here";
  return constant(scalar_value(a, nullptr, where));
}

std::pair<std::string, std::string> split_target(const std::string& target) {
  // "aten::addmm.default" -> ("aten::addmm", ""); "aten::add.Tensor" -> ("aten::add", "Tensor")
  const size_t ns = target.find("::");
  const size_t dot = target.find('.', ns == std::string::npos ? 0 : ns + 2);
  if (dot == std::string::npos) return {target, ""};
  std::string overload = target.substr(dot + 1);
  if (overload == "default") overload.clear();
  return {target.substr(0, dot), overload};
}


double float_arg(const Arg& a, const std::string& where) {
  if (a.kind == Arg::Kind::Float) return a.f;
  if (a.kind == Arg::Kind::Int) return static_cast<double>(a.i);
  HB_USER_FAIL() << where << ": expected a constant float scale";
}

FloatArg float_or_value_arg(const Arg& a, const std::string& where) {
  FloatArg f;
  if (a.kind == Arg::Kind::Ref) f.slot = a.ref;
  else f.value = float_arg(a, where);
  return f;
}

AtenArgs aten_args(const Graph& g, int node, const std::string& where) {
  const Node& n = g.nodes[node];
  auto [name, overload] = split_target(n.target);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  HB_USER_CHECK(handle.has_value())
      << where << ": operator '" << n.target
      << "' is not registered in this process's dispatcher (is the library that defines it loaded?)";
  const c10::FunctionSchema& schema = handle->schema();
  const auto& formals = schema.arguments();
  size_t positional = 0;
  for (const auto& f : formals) positional += f.kwarg_only() ? 0 : 1;
  HB_USER_CHECK(n.args.size() <= positional)
      << where << ": " << n.args.size() << " positional arguments, but the schema '" << schema
      << "' takes " << positional;
  std::vector<ArgSpec> args;
  for (size_t k = 0; k < formals.size(); ++k) {
    const c10::Argument& f = formals[k];
    const Arg* src = nullptr;
    if (!f.kwarg_only() && k < n.args.size()) src = &n.args[k];
    else src = n.kwarg(f.name());
    if (src) {
      args.push_back(convert(g, *src, f.type(), where + ", argument '" + f.name() + "'"));
    } else {
      HB_USER_CHECK(f.default_value().has_value())
          << where << ": missing argument '" << f.name() << "' of schema '" << schema << "'";
      args.push_back(constant(*f.default_value()));
    }
  }
  for (const auto& kv : n.kwargs) {
    bool known = false;
    for (const auto& f : formals) known |= f.name() == kv.first;
    HB_USER_CHECK(known) << where << ": keyword argument '" << kv.first << "' is not in the schema '" << schema << "'";
  }
  return {*handle, std::move(args)};
}

}  // namespace hb::rt

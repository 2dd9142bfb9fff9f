#include "backend/runtime/Executor.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/function_schema.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/runtime/FlexAttention.h"
#include "backend/runtime/FusedPointwise.h"
#include "backend/runtime/RowSoftmax.h"
#include "passes/Liveness.h"
#include "passes/MemoryPlan.h"
#include "passes/SliceLegality.h"
#include "passes/SliceSchedule.h"

namespace hb::rt {

// ---- argument specs: how to build one IValue of a call from constants and slots ---------------
struct ArgSpec {
  enum class K { Const, Slot, NumberSlot, TensorList, OptTensorList, IntList, DoubleList, Tuple };
  K k = K::Const;
  c10::IValue value;            // Const
  int slot = -1;                // Slot, NumberSlot (a SymInt/SymFloat value where a Tensor is expected)
  std::vector<ArgSpec> items;   // lists and tuples
};

// A result the runtime writes into the call's arena: an ATen op runs through its out= overload (a
// fused pointwise group's kernel writes directly) into a view of the arena with the IR type's layout.
struct Placement {
  std::optional<c10::OperatorHandle> out_op;  // ATen ops; none for fused pointwise groups
  int64_t offset = 0;  // elements of `dtype` from the arena's start
  int segment = 0;     // the plan's busy period: in a call, the arena allocated for that period
  std::vector<int64_t> sizes, strides;
  caffe2::TypeMeta dtype;
};

// A node whose result the graph returns (directly, or through reshaping views only): given the
// caller's destination for that output (a slice loop's slice of its full result), the node writes
// there through its out= overload or fused kernel, and the loop needs no copy.
struct OutputWrite {
  int output = -1;                            // index among the graph's outputs
  std::optional<c10::OperatorHandle> out_op;  // ATen ops; none for fused pointwise groups
  std::vector<int64_t> sizes;                 // the node's IR shape (static, contiguous)
  int64_t numel = 0;                          // product of sizes
};

struct FlexCall {
  bool backward = false;
  std::vector<ArgSpec> tensors;  // fw: q k v; bw: q k v out lse grad_out grad_lse
  std::shared_ptr<Executor> score_mod, joint, mask_mod;
  double scale = 1.0;
  ArgSpec score_buffers, mask_buffers;
};

// A DFS region (passes/SliceSchedule.h has the contract): the body runs once per slice on views of
// the inputs and its results are copied into slice i of preallocated full results.
struct SliceLoopCall {
  std::shared_ptr<Executor> body;
  std::vector<int> inputs;
  std::vector<int64_t> in_dims, in_ndims, out_dims, out_ndims;
  int64_t slices = 1;
  std::vector<TensorType> results;  // full result types
};

// A fused pointwise group: its kernel (CPU, or CUDA in a CUDA build) when it accepts the inputs,
// else the body op by op.
struct FusedCall {
  std::unique_ptr<FusedPointwiseKernel> kernel;
  std::shared_ptr<Executor> body;
  std::vector<ArgSpec> inputs;
};

// A sym op (Python operators on int/float/bool values), resolved from its target at plan time.
enum class SymCode {
  Add, Sub, Mul, FloorDiv, Mod, TrueDiv, Pow, Eq, Ne, Lt, Le, Gt, Ge, And, Or, Max, Min,  // binary
  Neg, Not, Float, Int, Ceil, Floor,                                                      // unary
};

struct Step {
  KernelKind kind = KernelKind::Aten;
  int node = -1;
  std::optional<c10::OperatorHandle> op;
  std::vector<ArgSpec> args;
  size_t num_returns = 1;
  SymCode sym = SymCode::Add;       // SymOp: resolved from the target at plan time
  std::shared_ptr<FlexCall> flex;
  std::shared_ptr<SliceLoopCall> loop;
  std::shared_ptr<FusedCall> fused;
  std::vector<int> release;         // slots to drop after this step
  std::shared_ptr<const Placement> place;  // set: the result goes into the arena (plan_arena)
  std::shared_ptr<const OutputWrite> write;  // set: may write straight into a caller's result (plan_output_writes)
  bool fresh_result = false;        // a result that must not alias the arena (see keep_out_of_arena)
};

c10::IValue build_arg(const ArgSpec& s, const std::vector<c10::IValue>& slots);

// A Python number passed where a schema wants a Tensor: a 0-dim "wrapped number" tensor, which
// type promotion treats as a scalar (what eager does for x + 1).
at::Tensor wrapped_number(const c10::IValue& v) {
  at::Tensor t = at::scalar_to_tensor(v.toScalar());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

namespace {

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

// Converts an IR argument into a spec for one schema argument of type `type`.
bool is_number(const ValueType& t) {
  return t.kind == ValueType::Kind::Int || t.kind == ValueType::Kind::SymInt ||
         t.kind == ValueType::Kind::Float || t.kind == ValueType::Kind::Bool;
}

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

}  // namespace

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

namespace {

// Untyped conversion (higher-order op arguments, sym ops, outputs): tuples and lists of values.
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

Step plan_aten(const Graph& g, int i) {
  const Node& n = g.nodes[i];
  const std::string where = describe(g, i);
  auto [name, overload] = split_target(n.target);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  HB_USER_CHECK(handle.has_value())
      << where << ": operator '" << n.target
      << "' is not registered in this process's dispatcher (is the library that defines it loaded?)";
  Step s;
  s.kind = KernelKind::Aten;
  s.node = i;
  s.op = *handle;
  const c10::FunctionSchema& schema = handle->schema();
  s.num_returns = schema.returns().size();
  const auto& formals = schema.arguments();
  size_t positional = 0;
  for (const auto& f : formals) positional += f.kwarg_only() ? 0 : 1;
  HB_USER_CHECK(n.args.size() <= positional)
      << where << ": " << n.args.size() << " positional arguments, but the schema '" << schema
      << "' takes " << positional;
  for (size_t k = 0; k < formals.size(); ++k) {
    const c10::Argument& f = formals[k];
    const Arg* src = nullptr;
    if (!f.kwarg_only() && k < n.args.size()) src = &n.args[k];
    else src = n.kwarg(f.name());
    if (src) {
      s.args.push_back(convert(g, *src, f.type(), where + ", argument '" + f.name() + "'"));
    } else {
      HB_USER_CHECK(f.default_value().has_value())
          << where << ": missing argument '" << f.name() << "' of schema '" << schema << "'";
      s.args.push_back(constant(*f.default_value()));
    }
  }
  for (const auto& kv : n.kwargs) {
    bool known = false;
    for (const auto& f : formals) known |= f.name() == kv.first;
    HB_USER_CHECK(known) << where << ": keyword argument '" << kv.first << "' is not in the schema '" << schema << "'";
  }
  return s;
}

// `arena`: whether the subgraph's executor places values in an arena of its own; only for subgraphs
// whose IR types are the shapes they run on (slice_loop bodies).
std::shared_ptr<Executor> subgraph_executor(const Graph& g, const Arg& a, const std::string& where,
                                            const std::shared_ptr<const std::vector<at::Tensor>>& constants,
                                            bool arena = false) {
  HB_USER_CHECK(a.kind == Arg::Kind::Graph) << where << ": expected a subgraph argument, got " << static_cast<int>(a.kind);
  auto it = g.subgraphs.find(a.s);
  HB_USER_CHECK(it != g.subgraphs.end()) << where << ": unknown subgraph '" << a.s << "'";
  const KernelPlan kp = select_kernels(*it->second);
  HB_USER_CHECK(kp.unsupported_descriptions.empty())
      << where << ": subgraph '" << a.s << "' uses an unsupported op: " << kp.unsupported_descriptions.front();
  return std::make_shared<Executor>(it->second, kp, constants, arena);
}

double float_arg(const Arg& a, const std::string& where) {
  if (a.kind == Arg::Kind::Float) return a.f;
  if (a.kind == Arg::Kind::Int) return static_cast<double>(a.i);
  HB_USER_FAIL() << where << ": expected a constant float scale";
}

Step plan_flex(const Graph& g, int i, bool backward,
               const std::shared_ptr<const std::vector<at::Tensor>>& constants) {
  const Node& n = g.nodes[i];
  const std::string where = describe(g, i);
  // fw: (q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs)
  // bw: (q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
  //      kernel_options, score_bufs, mask_bufs)
  const size_t want = backward ? 14 : 9;
  HB_USER_CHECK(n.args.size() == want) << where << ": expected " << want << " arguments, got " << n.args.size();
  auto call = std::make_shared<FlexCall>();
  call->backward = backward;
  const size_t ntensors = backward ? 7 : 3;
  for (size_t k = 0; k < ntensors; ++k) call->tensors.push_back(convert_untyped(n.args[k], where));
  const size_t base = backward ? 7 : 3;
  // No arena for the mods: they are traced on 0-dim values but run on whole broadcast score grids,
  // so their IR shapes are not the shapes they compute.
  call->score_mod = subgraph_executor(g, n.args[base], where, constants);
  if (backward) call->joint = subgraph_executor(g, n.args[base + 1], where, constants);
  const Arg& block_mask = n.args[backward ? 9 : 4];
  HB_USER_CHECK((block_mask.kind == Arg::Kind::Tuple || block_mask.kind == Arg::Kind::List) && !block_mask.items.empty())
      << where << ": the block mask must be a tuple ending in the mask_mod graph";
  // torch 2.11 has 13 entries, 2.5 had 11, newer main 17: the mask graph is always the last one.
  call->mask_mod = subgraph_executor(g, block_mask.items.back(), where, constants);
  call->scale = float_arg(n.args[backward ? 10 : 5], where);
  call->score_buffers = convert_untyped(n.args[backward ? 12 : 7], where);
  call->mask_buffers = convert_untyped(n.args[backward ? 13 : 8], where);
  Step s;
  s.kind = backward ? KernelKind::FlexBackward : KernelKind::FlexForward;
  s.node = i;
  s.flex = call;
  return s;
}

Step plan_slice_loop(const Graph& g, int i, const std::shared_ptr<const std::vector<at::Tensor>>& constants,
                     bool arena) {
  const Node& n = g.nodes[i];
  const std::string where = describe(g, i);
  const SliceLoopArgs a = slice_loop_args(n);
  auto call = std::make_shared<SliceLoopCall>();
  // The body is an ordinary graph with the per-slice types, so its executor plans its own arena.
  call->body = subgraph_executor(g, n.args.at(0), where, constants, arena);
  call->inputs = a.inputs;
  call->in_dims = a.in_dims;
  call->in_ndims = a.in_ndims;
  call->out_dims = a.out_dims;
  call->out_ndims = a.out_ndims;
  call->slices = a.slices;
  HB_INTERNAL_CHECK(n.type.kind == ValueType::Kind::Tuple) << where << ": a slice loop's type must be a tuple";
  for (const ValueType& t : n.type.elems) {
    HB_INTERNAL_CHECK(t.kind == ValueType::Kind::Tensor && t.tensor.numel().has_value())
        << where << ": slice loop results must be tensors of static shape";
    call->results.push_back(t.tensor);
  }
  Step s;
  s.kind = KernelKind::SliceLoop;
  s.node = i;
  s.loop = call;
  return s;
}

Step plan_fused(const Graph& g, int i, const std::shared_ptr<const std::vector<at::Tensor>>& constants) {
  const Node& n = g.nodes[i];
  const std::string where = describe(g, i);
  HB_USER_CHECK(n.args.size() == 2 && n.args[1].kind == Arg::Kind::List)
      << where << ": fused_pointwise takes (@body, [inputs])";
  auto call = std::make_shared<FusedCall>();
  call->body = subgraph_executor(g, n.args[0], where, constants);
  HB_USER_CHECK(n.type.kind == ValueType::Kind::Tensor) << where << ": a fused pointwise result must be a tensor";
  call->kernel = std::make_unique<FusedPointwiseKernel>(compile_pointwise(call->body->graph()), n.type.tensor);
  for (const Arg& a : n.args[1].items) call->inputs.push_back(convert_untyped(a, where));
  Step s;
  s.kind = KernelKind::FusedPointwise;
  s.node = i;
  s.fused = call;
  return s;
}

// `out`: where the result goes (an arena view), or undefined to allocate it.
c10::IValue run_fused(const FusedCall& c, const std::vector<c10::IValue>& slots, const at::Tensor& out) {
  std::vector<at::Tensor> in;
  in.reserve(c.inputs.size());
  for (const ArgSpec& a : c.inputs) in.push_back(build_arg(a, slots).toTensor());
  if (c.kernel->accepts(in)) return c.kernel->run(in, out);
  std::vector<c10::IValue> args(in.begin(), in.end());
  std::vector<c10::IValue> r = c.body->run(std::move(args));
  HB_INTERNAL_CHECK(r.size() == 1) << "fused body returned " << r.size() << " values";
  if (!out.defined()) return r[0];
  out.copy_(r[0].toTensor());
  return out;
}

// slice_view(t, d, k, N, i) of the contract: narrow dims d..d+k-1 to slice i's box.
at::Tensor slice_view(const at::Tensor& t, int64_t d, int64_t k, int64_t slices, int64_t i) {
  std::vector<int64_t> group(t.sizes().begin() + d, t.sizes().begin() + d + k);
  auto box = slice_box(group, slices, i);
  HB_INTERNAL_CHECK(box.has_value()) << "slice " << i << " of " << slices << " is not a box";
  at::Tensor v = t;
  for (int64_t j = 0; j < k; ++j) v = v.narrow(d + j, (*box)[j].start, (*box)[j].length);
  return v;
}

// `arenas`: counts the body arenas allocated (one per loop, reused by every slice); `written`: the
// body outputs written straight into slices of the results, over all slices.
c10::IValue run_slice_loop(const SliceLoopCall& c, const std::vector<c10::IValue>& slots, int64_t& arenas,
                           int64_t& written) {
  std::vector<at::Tensor> results;
  for (size_t k = 0; k < c.results.size(); ++k) {
    const TensorType& t = c.results[k];
    if (c.out_dims[k] < 0) {  // replicated: taken from slice 0 below
      results.emplace_back();
      continue;
    }
    // The traced strides, not contiguous ones: a later view (flex's output transposed and viewed, say)
    // relies on the layout eager gave the value.
    std::vector<int64_t> shape, stride;
    for (const Dim& d : t.shape) shape.push_back(d.value);
    for (const Dim& d : t.stride) stride.push_back(d.value);
    const auto opts = at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(c10::Device(t.device));
    results.push_back(stride.size() == shape.size() ? at::empty_strided(shape, stride, opts) : at::empty(shape, opts));
  }
  // The body's arena, once for all slices: nothing placed in slice i outlives its body call (the
  // body's outputs are never in its arena, and they are copied out before slice i + 1 runs).
  at::Tensor arena;
  bool direct = false;  // the body writes its outputs straight into the results (decided on slice 0)
  for (int64_t i = 0; i < c.slices; ++i) {
    std::vector<c10::IValue> in;
    in.reserve(c.inputs.size());
    for (size_t j = 0; j < c.inputs.size(); ++j) {
      const c10::IValue& x = slots[c.inputs[j]];
      in.push_back(c.in_dims[j] < 0 ? x : c10::IValue(slice_view(x.toTensor(), c.in_dims[j], c.in_ndims[j], c.slices, i)));
    }
    if (i == 0) {  // every slice's inputs are views of the same tensors: decide once
      if (c.body->places(in)) {
        arena = c.body->new_arena();
        ++arenas;
      }
      direct = c.body->writes_out(in);
    }
    // Slice i of each result: the body writes there directly where it can (Executor::OutputWrite).
    std::vector<at::Tensor> dests(results.size());
    for (size_t k = 0; k < results.size(); ++k)
      if (c.out_dims[k] >= 0) dests[k] = slice_view(results[k], c.out_dims[k], c.out_ndims[k], c.slices, i);
    std::vector<c10::IValue> out = c.body->run(std::move(in), arena, false, direct ? &dests : nullptr);
    HB_INTERNAL_CHECK(out.size() == results.size()) << "slice body returned " << out.size() << " values";
    written += c.body->arena_stats().written;
    for (size_t k = 0; k < out.size(); ++k) {
      if (c.out_dims[k] < 0) {  // replicated (slice-legality): slice 0's value is the loop's
        if (i == 0) results[k] = out[k].toTensor();
        continue;
      }
      const at::Tensor& t = out[k].toTensor();
      // Written there already: the same elements at the same addresses (strides of size-1 dims aside).
      const bool same = t.data_ptr() == dests[k].data_ptr() && t.sizes().equals(dests[k].sizes()) &&
                        t.is_contiguous() && dests[k].is_contiguous();
      if (same) continue;
      dests[k].copy_(t);
    }
  }
  std::vector<c10::IValue> r(results.begin(), results.end());
  return c10::ivalue::Tuple::create(std::move(r));
}

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isNone()) return out;
  for (const c10::IValue& x : v.toTupleRef().elements()) out.push_back(x.toTensor());
  return out;
}

SubgraphFn as_fn(const std::shared_ptr<Executor>& e) {
  return [e](std::vector<c10::IValue> in) { return e->run(std::move(in)); };
}

c10::IValue run_flex(const FlexCall& c, const std::vector<c10::IValue>& slots) {
  std::vector<at::Tensor> t;
  for (const ArgSpec& a : c.tensors) {
    c10::IValue v = build_arg(a, slots);
    t.push_back(v.isNone() ? at::Tensor() : v.toTensor());
  }
  FlexMask mask{as_fn(c.mask_mod), tensors_of(build_arg(c.mask_buffers, slots))};
  const std::vector<at::Tensor> score_bufs = tensors_of(build_arg(c.score_buffers, slots));
  if (!c.backward) {
    std::vector<at::Tensor> r = flex_attention_forward(t[0], t[1], t[2], as_fn(c.score_mod), mask, c.scale, score_bufs);
    return c10::ivalue::Tuple::create({r[0], r[1], r[2]});
  }
  c10::optional<at::Tensor> grad_lse;
  if (t[6].defined()) grad_lse = t[6];
  FlexBackwardResult r = flex_attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], grad_lse,
                                                 as_fn(c.score_mod), as_fn(c.joint), mask, c.scale, score_bufs);
  std::vector<c10::IValue> grads;
  for (const at::Tensor& x : r.buffer_grads) grads.push_back(x.defined() ? c10::IValue(x) : c10::IValue());
  return c10::ivalue::Tuple::create({r.dq, r.dk, r.dv, c10::ivalue::Tuple::create(std::move(grads))});
}

// ---- sym ops: Python operators on int/float/bool values ----------------------------------------

SymCode sym_code(const std::string& t, const std::string& where) {
  static const std::map<std::string, SymCode> kCodes = {
      {"operator::add", SymCode::Add}, {"operator::sub", SymCode::Sub}, {"operator::mul", SymCode::Mul},
      {"operator::floordiv", SymCode::FloorDiv}, {"operator::mod", SymCode::Mod},
      {"operator::truediv", SymCode::TrueDiv}, {"operator::pow", SymCode::Pow}, {"operator::eq", SymCode::Eq},
      {"operator::ne", SymCode::Ne}, {"operator::lt", SymCode::Lt}, {"operator::le", SymCode::Le},
      {"operator::gt", SymCode::Gt}, {"operator::ge", SymCode::Ge}, {"operator::and_", SymCode::And},
      {"operator::or_", SymCode::Or}, {"torch::sym_max", SymCode::Max}, {"torch.sym_max", SymCode::Max},
      {"torch::sym_min", SymCode::Min}, {"torch.sym_min", SymCode::Min}, {"operator::neg", SymCode::Neg},
      {"operator::not_", SymCode::Not}, {"torch::sym_not", SymCode::Not}, {"torch::sym_float", SymCode::Float},
      {"torch::sym_int", SymCode::Int}, {"math::ceil", SymCode::Ceil}, {"math::floor", SymCode::Floor}};
  auto it = kCodes.find(t);
  HB_INTERNAL_CHECK(it != kCodes.end()) << where << ": sym op '" << t << "' has no runtime opcode";
  return it->second;
}

bool sym_unary_code(SymCode c) { return c >= SymCode::Neg; }

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

// ---- arena placement --------------------------------------------------------------------------

bool same_argument(const c10::Argument& a, const c10::Argument& b) {
  if (a.name() != b.name() || !(*a.type() == *b.type())) return false;
  const c10::AliasInfo* x = a.alias_info();
  const c10::AliasInfo* y = b.alias_info();
  return (!x && !y) || (x && y && *x == *y);
}

// `o` is the out= form of `f`: f's arguments (same names, types, order), then one Tensor(a!)
// argument, and it returns that one tensor.
bool is_out_overload_of(const c10::FunctionSchema& f, const c10::FunctionSchema& o) {
  const auto& fa = f.arguments();
  const auto& oa = o.arguments();
  if (oa.size() != fa.size() + 1 || o.returns().size() != 1) return false;
  for (size_t k = 0; k < fa.size(); ++k)
    if (!same_argument(fa[k], oa[k])) return false;
  const c10::Argument& out = oa.back();
  return out.type()->kind() == c10::TypeKind::TensorType && out.alias_info() && out.alias_info()->isWrite() &&
         o.returns()[0].type()->kind() == c10::TypeKind::TensorType;
}

// Overload names registered for an operator name ("aten::sum" -> "", "dim_IntList", "IntList_out", ...).
std::vector<std::string> overloads_of(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::vector<std::string>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it == cache.end()) {  // (re)build: libraries may have registered operators since the last time
    cache.clear();
    for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames())
      cache[op.name].push_back(op.overload_name);
    it = cache.find(name);
    if (it == cache.end()) return {};
  }
  return it->second;
}

// The out= overload of a functional op: by the usual names first ("<overload>_out", "out"), then any
// overload of the same name with the out= shape (sum.dim_IntList -> sum.IntList_out,
// threshold_backward -> threshold_backward.grad_input).
std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& f = op.schema();
  const std::string& overload = f.overload_name();
  std::vector<std::string> names;
  if (!overload.empty()) names.push_back(overload + "_out");
  names.push_back("out");
  for (std::string& n : overloads_of(f.name())) names.push_back(std::move(n));
  for (const std::string& n : names) {
    if (n == overload) continue;
    auto h = c10::Dispatcher::singleton().findSchema({f.name(), n});
    if (h && is_out_overload_of(f, h->schema())) return h;
  }
  return std::nullopt;
}

// Static shape and the plain contiguous layout (a size-1 dim's stride does not matter).
bool contiguous_static(const TensorType& t) {
  if (t.stride.size() != t.shape.size()) return false;
  int64_t expect = 1;
  for (size_t k = t.shape.size(); k-- > 0;) {
    if (!t.shape[k].is_static() || !t.stride[k].is_static()) return false;
    if (t.shape[k].value != 1 && t.stride[k].value != expect) return false;
    expect *= t.shape[k].value;
  }
  return true;
}

// Why step `s`'s result cannot be written into the arena; "" when it can, and then *out_op is the
// out= overload to call. Only an ATen op with an out= overload and one tensor result of static,
// contiguous layout on a CPU or CUDA device is placeable; every other kind of node (FlexAttention,
// slice loops, fused kernels ...) allocates its own result.
std::string aten_unplaceable_why(const Node& n, const c10::OperatorHandle& op,
                                 std::optional<c10::OperatorHandle>* out_op);

std::string unplaceable_why(const Graph& g, const Step& s, std::optional<c10::OperatorHandle>* out_op) {
  const Node& n = g.nodes[s.node];
  if (s.kind == KernelKind::FusedPointwise) {  // its kernels write into any preallocated result
    if (n.type.kind != ValueType::Kind::Tensor || !contiguous_static(n.type.tensor)) return "not static contiguous";
    return "";
  }
  if (s.kind != KernelKind::Aten || !s.op) return std::string(kernel_kind_name(s.kind));
  return aten_unplaceable_why(n, *s.op, out_op);
}

// The same decision from the node alone (the simulator's placement model, before any kernel plan):
// fused groups and ATen ops the dispatcher knows, as unplaceable_why decides for their steps.
std::string node_unplaceable_why(const Graph& g, int node) {
  const Node& n = g.nodes[node];
  if (n.target == "hintbackend::fused_pointwise")
    return n.type.kind == ValueType::Kind::Tensor && contiguous_static(n.type.tensor) ? "" : "not static contiguous";
  if (n.op != OpKind::CallFunction || n.target.rfind("aten::", 0) != 0) return "not an ATen op";
  auto [name, overload] = split_target(n.target);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) return "not registered";
  std::optional<c10::OperatorHandle> out_op;
  return aten_unplaceable_why(n, *handle, &out_op);
}

std::string aten_unplaceable_why(const Node& n, const c10::OperatorHandle& op,
                                 std::optional<c10::OperatorHandle>* out_op) {
  if (n.effects.is_view || n.effects.mutates || aliases_without_annotation(n)) return "alias";
  if (n.effects.nondeterministic_seeded) return "random";  // its out= overload may draw differently
  if (n.type.kind == ValueType::Kind::Tuple) return "multi-output op";
  if (n.type.kind != ValueType::Kind::Tensor) return "not a tensor";
  const c10::FunctionSchema& f = op.schema();
  if (f.is_mutable() || f.returns().size() != 1 || f.returns()[0].type()->kind() != c10::TypeKind::TensorType ||
      f.returns()[0].alias_info())
    return "schema is not one fresh tensor";
  const TensorType& t = n.type.tensor;
  if (!contiguous_static(t)) return "not static contiguous";
  if (to_scalar_type(t.dtype) == c10::ScalarType::Undefined) return "unknown dtype";
  try {
    const c10::Device d(t.device);
    if (!d.is_cpu() && !d.is_cuda()) return "on " + t.device;
  } catch (const c10::Error&) {
    return "unknown device";
  }
  *out_op = find_out_overload(op);
  if (!*out_op) return "no matching out= overload";
  // An out= overload without a kernel of its own for the device is torch's generated wrapper: it runs
  // the functional op and copies the result into `out`, a transient second result (convolution.out).
  const c10::DispatchKey key = c10::Device(t.device).is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  if (!(*out_op)->hasKernelForDispatchKey(key)) return "out= overload copies (no " + t.device + " kernel)";
  return "";
}

c10::Device device_of(const TensorType& t) {
  c10::Device d(t.device);
  if (d.is_cuda() && !d.has_index()) d.set_index(0);
  return d;
}

// A value's place in the arena: a tensor sharing the arena's storage (which keeps it alive) with the
// planned layout. Built directly, without a dispatcher call per value.
at::Tensor arena_view(const at::Tensor& arena, const Placement& p) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(arena.storage()), arena.key_set(), p.dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(p.sizes, p.strides, p.offset);
  return t;
}

bool in_arena(const at::Tensor& t, const c10::StorageImpl* arena) {
  return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == arena;
}

// A result the plan treats as fresh memory must not point into the arena: the arena's bytes are
// reused once the plan's buffers die, and outputs outlive the call. An op whose schema hides that it
// returns an alias of an arena value would break both, so such a result is copied out (never seen
// with ATen's own ops: aten::_unsafe_view, the one known case, is planned as a view).
void keep_out_of_arena(c10::IValue& v, const c10::StorageImpl* arena) {
  if (v.isTensor()) {
    if (in_arena(v.toTensor(), arena)) v = v.toTensor().clone();
  } else if (v.isTuple()) {
    bool hit = false;
    for (const c10::IValue& x : v.toTupleRef().elements()) hit |= x.isTensor() && in_arena(x.toTensor(), arena);
    if (!hit) return;
    std::vector<c10::IValue> e(v.toTupleRef().elements().begin(), v.toTupleRef().elements().end());
    for (c10::IValue& x : e) keep_out_of_arena(x, arena);
    v = c10::ivalue::Tuple::create(std::move(e));
  } else if (v.isTensorList()) {
    bool hit = false;
    for (const at::Tensor& x : v.toTensorVector()) hit |= in_arena(x, arena);
    if (!hit) return;
    std::vector<at::Tensor> e = v.toTensorVector();
    for (at::Tensor& x : e)
      if (in_arena(x, arena)) x = x.clone();
    v = c10::IValue(std::move(e));
  }
}

bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "0";
}

}  // namespace

Executor::Executor(std::shared_ptr<const Graph> graph, const KernelPlan& kernels,
                   std::shared_ptr<const std::vector<at::Tensor>> constants, bool arena)
    : graph_(std::move(graph)), constants_(std::move(constants)) {
  const Graph& g = *graph_;
  HB_INTERNAL_CHECK(kernels.nodes.size() == g.nodes.size()) << "kernel plan does not match the graph";
  HB_INTERNAL_CHECK(kernels.unsupported.empty()) << "executor built for a graph with unsupported nodes";
  arena_enabled_ = arena && !env_off("HINTBACKEND_ARENA");
  link_row_softmax_ops();  // the ops row-softmax-fusion writes must be registered with the dispatcher
  placeholders_ = g.placeholders();
  const Liveness live = liveness(g);
  std::vector<int> step_of(g.nodes.size(), -1);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    const std::string where = describe(g, i);
    Step s;
    s.node = i;
    s.kind = kernels.nodes[i].kind;
    switch (s.kind) {
      case KernelKind::Input:
        if (live.last_use[i] == i) release_inputs_.push_back(i);
        continue;
      case KernelKind::Output:
        for (const Arg& a : n.args) s.args.push_back(convert_untyped(a, where));
        break;
      case KernelKind::Constant:
        HB_USER_CHECK(constants_ && n.constant_index < static_cast<int>(constants_->size()))
            << where << ": constant #" << n.constant_index << " was not handed over";
        break;
      case KernelKind::Aten:
        s = plan_aten(g, i);
        break;
      case KernelKind::GetItem:
        HB_USER_CHECK(n.args.size() == 2 && n.args[1].kind == Arg::Kind::Int)
            << where << ": getitem takes a value and a constant integer index";
        s.args.push_back(convert_untyped(n.args[0], where));
        s.args.push_back(constant(c10::IValue(n.args[1].i)));
        break;
      case KernelKind::SymOp:
        s.sym = sym_code(n.target, where);
        HB_USER_CHECK(n.args.size() == (sym_unary_code(s.sym) ? 1u : 2u))
            << where << ": '" << n.target << "' takes " << (sym_unary_code(s.sym) ? "one operand" : "two operands")
            << ", got " << n.args.size();
        for (const Arg& a : n.args) s.args.push_back(convert_untyped(a, where));
        break;
      case KernelKind::FlexForward:
      case KernelKind::FlexBackward:
        s = plan_flex(g, i, s.kind == KernelKind::FlexBackward, constants_);
        break;
      case KernelKind::SliceLoop:
        s = plan_slice_loop(g, i, constants_, arena_enabled_);
        break;
      case KernelKind::FusedPointwise:
        s = plan_fused(g, i, constants_);
        break;
      case KernelKind::ZerosAndScatter:
        HB_USER_CHECK(n.args.size() == 3) << where << ": zeros_and_scatter takes (shape, indices, values)";
        for (const Arg& a : n.args) s.args.push_back(convert_untyped(a, where));
        break;
      case KernelKind::Unsupported:
        HB_INTERNAL_CHECK(false) << where << " is unsupported";
    }
    s.release = live.release_after[i];
    max_stack_ = std::max(max_stack_, s.args.size() + s.num_returns);
    // Results that are fresh memory by the plan's model (not a view): checked against the arena.
    s.fresh_result = (s.kind == KernelKind::Aten && !n.effects.is_view && !n.effects.mutates &&
                      !aliases_without_annotation(n)) ||
                     s.kind == KernelKind::FlexForward || s.kind == KernelKind::FlexBackward ||
                     s.kind == KernelKind::ZerosAndScatter;
    step_of[i] = static_cast<int>(steps_.size());
    steps_.push_back(std::move(s));
  }
  if (constants_)
    for (const at::Tensor& c : *constants_) constants_require_grad_ |= c.defined() && c.requires_grad();
  if (arena_enabled_) {  // HINTBACKEND_ARENA=0: every op allocates its own result, outputs included
    plan_arena(step_of);
    plan_output_writes(step_of);
  }
}

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs) const {
  // One arena per busy period of the plan (usually one per call), only when something is placed:
  // allocated at the period's first placed result and dropped after its last one dies, so it lives
  // no longer than the values it holds.
  const bool lazy = arena_pays_ && places(inputs);
  return run(std::move(inputs), at::Tensor(), lazy);
}

Executor::~Executor() = default;

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs, at::Tensor arena, bool lazy,
                                       const std::vector<at::Tensor>* dests) const {
  const Graph& g = *graph_;
  // AOT graphs are functional and run outside autograd (inside autograd.Function.forward/backward, or
  // as an inference graph whose outputs need no grad): skip the Autograd kernels, keep ADInplaceOrView so
  // in-place ops still bump version counters and views keep their base.
  at::AutoDispatchBelowAutograd below_autograd;
  HB_USER_CHECK(inputs.size() == placeholders_.size())
      << "graph '" << g.name << "' takes " << placeholders_.size() << " inputs, got " << inputs.size();
  std::vector<c10::IValue> slots(g.nodes.size());
  for (size_t k = 0; k < placeholders_.size(); ++k) slots[placeholders_[k]] = std::move(inputs[k]);
  for (int r : release_inputs_) slots[r] = c10::IValue();
  std::vector<c10::IValue> stack;
  stack.reserve(max_stack_);
  std::vector<c10::IValue> outputs;
  const c10::StorageImpl* arena_storage = arena.defined() ? arena.storage().unsafeGetStorageImpl() : nullptr;
  int64_t placed = 0, loop_arenas = 0, largest_arena = arena.defined() ? plan_.arena_bytes : 0, written = 0;
  // The caller's destination for a step's output, viewed with the step's IR shape; undefined if none fits.
  auto dest_of = [&](const Step& s) -> at::Tensor {
    if (!s.write || !dests || s.write->output >= static_cast<int>(dests->size())) return at::Tensor();
    const at::Tensor& d = (*dests)[s.write->output];
    if (!d.defined() || !d.is_contiguous() || d.numel() != s.write->numel) return at::Tensor();
    return d.view(s.write->sizes);
  };
  for (const Step& s : steps_) {
    if (lazy && s.place && !arena.defined()) {
      const int64_t bytes = plan_.segments.at(s.place->segment).bytes;
      arena = new_arena(bytes);
      arena_storage = arena.storage().unsafeGetStorageImpl();
      largest_arena = std::max(largest_arena, bytes);
      ++allocations_;
    }
    try {
      switch (s.kind) {
        case KernelKind::Aten:
          stack.clear();
          for (const ArgSpec& a : s.args) stack.push_back(build_arg(a, slots));
          if (s.write) {  // straight into the caller's result, through the out= overload
            at::Tensor out = dest_of(s);
            if (out.defined()) {
              stack.push_back(out);
              s.write->out_op->callBoxed(stack);
              slots[s.node] = std::move(out);
              ++written;
              break;
            }
          }
          if (s.place && arena_storage) {  // into the arena, through the out= overload
            at::Tensor out = arena_view(arena, *s.place);
            stack.push_back(out);
            s.place->out_op->callBoxed(stack);
            HB_INTERNAL_CHECK(out.sizes().equals(s.place->sizes))
                << describe(g, s.node) << ": result shape " << out.sizes() << " is not the IR type's; "
                << "rerun with HINTBACKEND_ARENA=0 and report it with a dump (dump_dir)";
            slots[s.node] = std::move(out);
            ++placed;
            break;
          }
          s.op->callBoxed(stack);
          if (s.num_returns == 1) slots[s.node] = std::move(stack[0]);
          else if (s.num_returns == 0) slots[s.node] = c10::IValue();
          else slots[s.node] = c10::ivalue::Tuple::create(std::move(stack));
          break;
        case KernelKind::Constant:
          slots[s.node] = (*constants_)[g.nodes[s.node].constant_index];
          break;
        case KernelKind::GetItem:
          slots[s.node] = get_item(build_arg(s.args[0], slots), s.args[1].value.toInt(), [&] { return describe(g, s.node); });
          break;
        case KernelKind::SymOp:
          slots[s.node] = s.args.size() == 1
                              ? sym_unary(s.sym, build_arg(s.args[0], slots), [&] { return describe(g, s.node); })
                              : sym_binary(s.sym, build_arg(s.args[0], slots), build_arg(s.args[1], slots),
                                           [&] { return describe(g, s.node); });
          break;
        case KernelKind::FlexForward:
        case KernelKind::FlexBackward:
          slots[s.node] = run_flex(*s.flex, slots);
          break;
        case KernelKind::SliceLoop:
          slots[s.node] = run_slice_loop(*s.loop, slots, loop_arenas, written);
          break;
        case KernelKind::FusedPointwise:
          if (at::Tensor out = dest_of(s); out.defined()) {
            slots[s.node] = run_fused(*s.fused, slots, out);
            ++written;
          } else if (s.place && arena_storage) {
            slots[s.node] = run_fused(*s.fused, slots, arena_view(arena, *s.place));
            ++placed;
          } else {
            slots[s.node] = run_fused(*s.fused, slots, at::Tensor());
          }
          break;
        case KernelKind::ZerosAndScatter: {
          // Bind every IValue to a local: iterating over a temporary's tuple would dangle.
          const c10::IValue shape = build_arg(s.args[0], slots);
          const c10::IValue indices = build_arg(s.args[1], slots);
          std::vector<int64_t> dims;
          for (const c10::IValue& d : shape.toTupleRef().elements()) dims.push_back(d.toInt());
          std::vector<at::Tensor> idx;
          for (const c10::IValue& t : indices.toTupleRef().elements()) idx.push_back(t.toTensor());
          slots[s.node] = zeros_and_scatter(dims, idx, build_arg(s.args[2], slots).toTensor());
          break;
        }
        case KernelKind::Output: {
          const c10::IValue v = build_arg(s.args.at(0), slots);
          if (v.isTuple()) {
            for (const c10::IValue& x : v.toTupleRef().elements()) outputs.push_back(x);
          } else {
            outputs.push_back(v);
          }
          if (arena_storage)  // never: the plan does not place what is returned (but outputs outlive the arena)
            for (c10::IValue& x : outputs) keep_out_of_arena(x, arena_storage);
          break;
        }
        default:
          HB_INTERNAL_CHECK(false) << "unexpected step kind " << kernel_kind_name(s.kind);
      }
    } catch (const c10::Error& e) {
      throw std::runtime_error("hintbackend: while running " + describe(g, s.node) + ": " +
                               e.what_without_backtrace());
    }
    if (s.fresh_result && arena_storage) keep_out_of_arena(slots[s.node], arena_storage);
    for (int r : s.release) slots[r] = c10::IValue();
    if (lazy && arena.defined() && segment_ends_[s.node]) {
      // Every value placed in this period is dead: the storage goes back to the allocator with the
      // last view of it, and the next period (if any) allocates its own.
      arena.reset();
      arena_storage = nullptr;
    }
  }
  last_arena_bytes_ = largest_arena;
  last_written_ = written;
  last_placed_ = placed;
  allocations_ += loop_arenas;
  return outputs;
}

// ---- arena placement ----------------------------------------------------------------------------

void Executor::plan_arena(const std::vector<int>& step_of) {
  const Graph& g = *graph_;
  const int n = static_cast<int>(g.nodes.size());
  std::vector<std::string> why(n);
  std::vector<std::optional<c10::OperatorHandle>> out_ops(n);
  std::map<std::string, int64_t> bytes_on;  // device -> bytes of placeable results there
  for (int i = 0; i < n; ++i) {
    if (step_of[i] < 0) {
      why[i] = "input";
      continue;
    }
    why[i] = unplaceable_why(g, steps_[step_of[i]], &out_ops[i]);
    if (!why[i].empty()) continue;
    const TensorType& t = g.nodes[i].type.tensor;
    bytes_on[device_of(t).str()] += t.numel().value_or(0) * dtype_bytes(t.dtype);
  }
  // One arena per call, on one device: the one with the most placeable bytes.
  std::string device;
  int64_t most = -1;
  for (const auto& kv : bytes_on)
    if (kv.second > most) {
      most = kv.second;
      device = kv.first;
    }
  if (!device.empty()) arena_device_ = c10::Device(device);
  for (int i = 0; i < n; ++i)
    if (why[i].empty() && device_of(g.nodes[i].type.tensor).str() != device)
      why[i] = "on " + g.nodes[i].type.tensor.device + ", the arena is on " + device;
  MemoryPlanOptions opt;
  opt.in_place = !env_off("HINTBACKEND_MEMORY_PLAN_IN_PLACE");
  opt.bodies = false;  // each slice_loop body's executor plans its own
  opt.unplaceable = [&](const Graph& graph, int node) { return &graph == &g ? why[node] : std::string("subgraph"); };
  plan_ = hb::memory_plan(g, opt);
  segment_ends_.assign(n, false);
  for (const ArenaSegment& seg : plan_.segments) segment_ends_[seg.end] = true;
  if (plan_.arena_bytes > 0) {
    // The arena is held from its first placed value to its last while unplaced values (multi-output
    // ops, views' bases ...) come and go around it: keep it only if the simulated peak does not grow.
    const int64_t with = simulate_peak_with_arena(g, plan_), without = simulate_peak(g);
    std::ostringstream note;
    note << "simulated call peak " << with << " bytes (" << format_bytes(with) << ") with the arena, " << without
         << " bytes (" << format_bytes(without) << ") allocating per op";
    arena_pays_ = with <= without;
    arena_note_ = arena_pays_ ? note.str()
                              : "arena off for calls of this graph: " + note.str() +
                                    " (the results it cannot place live around the arena); a slice loop running "
                                    "it as its body still uses the arena, once for all slices";
  }
  for (const PlannedBuffer& b : plan_.buffers) {
    for (size_t k = 0; k < b.values.size(); ++k) {
      const ValueRef& v = b.values[k];
      const Node& node = g.nodes[v.node];
      HB_INTERNAL_CHECK(v.elem < 0 && why[v.node].empty() && step_of[v.node] >= 0)
          << describe(g, v.node) << ": the memory plan placed a value the runtime cannot place";
      const TensorType& t = node.type.tensor;
      if (k > 0) {
        // In place: the op writes over an input that dies here, through its out= overload. Only the
        // ops the planner allows (may_write_over_input: all safe with out == that input), same layout.
        const TensorType& first = g.nodes[b.values[0].node].type.tensor;
        bool same = may_write_over_input(node) && first.dtype == t.dtype && first.shape.size() == t.shape.size();
        for (size_t d = 0; same && d < t.shape.size(); ++d)
          same = first.shape[d].value == t.shape[d].value && first.stride[d].value == t.stride[d].value;
        HB_INTERNAL_CHECK(same) << describe(g, v.node) << ": in-place reuse of a buffer with another layout";
      }
      std::vector<int64_t> sizes, strides;
      for (const Dim& d : t.shape) sizes.push_back(d.value);
      for (const Dim& d : t.stride) strides.push_back(d.value);
      const int64_t elem = dtype_bytes(t.dtype);
      HB_INTERNAL_CHECK(b.offset % elem == 0) << describe(g, v.node) << ": arena offset not aligned to its dtype";
      Step& s = steps_[step_of[v.node]];
      s.place = std::make_shared<const Placement>(Placement{out_ops[v.node], b.offset / elem, b.segment, std::move(sizes),
                                                            std::move(strides),
                                                            caffe2::TypeMeta::fromScalarType(to_scalar_type(t.dtype))});
      s.fresh_result = false;
      max_stack_ = std::max(max_stack_, s.args.size() + 1);
    }
  }
}

void Executor::plan_output_writes(const std::vector<int>& step_of) {
  const Graph& g = *graph_;
  const Node& ret = g.nodes[g.output_node()];
  if (ret.args.empty()) return;
  std::vector<int> refs;
  const Arg& a = ret.args[0];
  if (a.kind == Arg::Kind::Ref) refs.push_back(a.ref);
  for (const Arg& x : a.items) refs.push_back(x.kind == Arg::Kind::Ref ? x.ref : -1);
  const auto users = g.users();
  std::set<int> taken;
  for (int k = 0; k < static_cast<int>(refs.size()); ++k) {
    // Back through reshaping views that nothing else reads: the destination, contiguous, reshapes alike.
    int r = refs[k];
    while (r >= 0 && (g.nodes[r].target == "aten::view.default" || g.nodes[r].target == "aten::_unsafe_view.default") &&
           !g.nodes[r].args.empty() && g.nodes[r].args[0].kind == Arg::Kind::Ref && users[g.nodes[r].args[0].ref].size() == 1)
      r = g.nodes[r].args[0].ref;
    if (r < 0 || step_of[r] < 0 || !taken.insert(r).second) continue;
    Step& s = steps_[step_of[r]];
    std::optional<c10::OperatorHandle> out_op;
    if (!unplaceable_why(g, s, &out_op).empty()) continue;  // what the arena can place, the caller can take
    std::vector<int64_t> sizes;
    for (const Dim& d : g.nodes[r].type.tensor.shape) sizes.push_back(d.value);
    const int64_t numel = c10::multiply_integers(sizes);
    s.write = std::make_shared<const OutputWrite>(OutputWrite{k, out_op, std::move(sizes), numel});
    s.place.reset();  // never both (outputs are never placed anyway)
    max_stack_ = std::max(max_stack_, s.args.size() + 1);
  }
}

bool Executor::places(const std::vector<c10::IValue>& inputs) const {
  return plan_.arena_bytes > 0 && writes_out(inputs);
}

bool Executor::writes_out(const std::vector<c10::IValue>& inputs) const {
  // out= overloads refuse arguments that require grad while autograd records: then run as before.
  if (!c10::GradMode::is_enabled() || c10::impl::tls_is_dispatch_keyset_excluded(c10::autograd_dispatch_keyset))
    return true;
  if (constants_require_grad_) return false;
  for (const c10::IValue& v : inputs)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) return false;
  return true;
}

at::Tensor Executor::new_arena(int64_t bytes) const {
  if (bytes < 0) bytes = plan_.arena_bytes;
  if (bytes == 0) return at::Tensor();
  at::Tensor arena = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(arena_device_));
  // A wrong IR shape must not grow the arena under the views already made of it: fail instead.
  arena.storage().unsafeGetStorageImpl()->set_resizable(false);
  return arena;
}

Executor::ArenaStats Executor::arena_stats() const {
  ArenaStats s;
  s.arena_bytes = last_arena_bytes_.load();
  s.placed = last_placed_.load();
  s.written = last_written_.load();
  s.allocations = allocations_.load();
  return s;
}

std::string Executor::memory_plan_text() const {
  const Graph& g = *graph_;
  std::ostringstream os;
  os << "memory-plan-runtime graph " << g.name << ": ";
  if (!arena_enabled_) {
    os << "arena off (HINTBACKEND_ARENA=0 or turned off for this graph): every op allocates its own result\n";
  } else {
    int placed = 0;
    for (const PlannedBuffer& b : plan_.buffers) placed += static_cast<int>(b.values.size());
    if (plan_.arena_bytes == 0) os << (arena_note_.empty() ? "nothing to place, no arena" : arena_note_);
    else
      os << placed << (placed == 1 ? " result" : " results") << " placed through out= overloads into "
         << (plan_.segments.size() == 1 ? std::string("one arena")
                                        : std::to_string(plan_.segments.size()) + " arenas (one per busy period)")
         << " of at most " << plan_.arena_bytes << " bytes per call on " << arena_device_.str() << "; " << arena_note_;
    os << "\n" << to_string(plan_, g) << "\n";
  }
  std::string writes;
  for (const Step& s : steps_)
    if (s.write) writes += (writes.empty() ? " %" : ", %") + g.nodes[s.node].name;
  if (!writes.empty())
    os << "  written straight into the caller's result when it passes one (a slice loop's slice i):" << writes << "\n";
  std::set<const Graph*> seen;
  for (const Step& s : steps_) {
    std::vector<const Executor*> subs;
    if (s.loop) subs.push_back(s.loop->body.get());
    if (s.flex)
      for (const auto& e : {s.flex->score_mod, s.flex->joint, s.flex->mask_mod})
        if (e) subs.push_back(e.get());
    if (s.loop)
      os << "slice_loop %" << g.nodes[s.node].name << ": " << s.loop->slices << " slices of graph "
         << s.loop->body->graph().name << ", one arena per loop (reused by every slice)\n";
    for (const Executor* e : subs)
      if (seen.insert(&e->graph()).second) os << e->memory_plan_text();
  }
  return os.str();
}

namespace {
// The simulator (passes/MemoryPlan.h) plans slice-loop bodies with this runtime's placement rules.
const bool kPlacementModelRegistered = (set_runtime_placement(node_unplaceable_why), true);
}  // namespace

}  // namespace hb::rt

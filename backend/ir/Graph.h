// hintbackend's IR: a graph of nodes in FX order (FX graphs are already topologically sorted),
// each producing at most one value (a tuple for multi-output ops, taken apart by getitem nodes).
// Plain C++: no libtorch here, so the IR, passes and planner build and test in seconds.
//
// One textual form (print_graph) is used by dumps, tests and error messages.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ir/Hints.h"

namespace hb {

enum class DType : uint8_t {
  Bool, UInt8, Int8, Int16, Int32, Int64,
  Float16, BFloat16, Float32, Float64, Complex64, Complex128,
  Float8_e4m3fn, Float8_e5m2,
};
// Names are torch's ("float32", "bfloat16", ...). parse_dtype returns nullopt for an unknown name.
std::optional<DType> parse_dtype(const std::string& name);
const char* dtype_name(DType d);
// Short form for the IR text: f32, bf16, i64, b8 ...
const char* dtype_short(DType d);
int64_t dtype_bytes(DType d);
// float16, bfloat16, float32, float64 (not the float8 storage types).
bool is_floating(DType d);

// A tensor dimension: a static size, or a symbolic one (Dynamo's dynamic shapes: "s0", "2*s1").
struct Dim {
  int64_t value = 0;
  std::string symbol;  // empty when static
  bool is_static() const { return symbol.empty(); }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
};

struct TensorType {
  std::vector<Dim> shape;
  std::vector<Dim> stride;
  DType dtype = DType::Float32;
  std::string device = "cpu";  // "cpu", "cuda:0", "meta" ...
  bool requires_grad = false;
  // Elements, or nullopt when a dimension is symbolic.
  std::optional<int64_t> numel() const;
  // Static sizes and strides in the plain row-major layout (a size-1 dim's stride does not matter).
  bool contiguous_static() const;
  // The same elements in the same order as `o`: dtype, element count and both plain row-major (a
  // contiguous view of a whole contiguous buffer, such as mm's [2048, 2048] read as [4, 512, 2048]).
  bool same_dense_elements(const TensorType& o) const;
  // The same tensor as `o` reads it: shape, strides, dtype and device (a value a pass may put in its place).
  bool same_layout(const TensorType& o) const;
};

// The value a node produces, from FX's node.meta["val"].
struct ValueType {
  enum class Kind { Unknown, None, Tensor, Int, SymInt, Float, Bool, Tuple };
  Kind kind = Kind::Unknown;
  TensorType tensor;              // Kind::Tensor
  std::vector<ValueType> elems;   // Kind::Tuple
  std::string symbol;             // Kind::SymInt: its expression
  // Both tensors, of the same layout (TensorType::same_layout).
  bool same_tensor(const ValueType& o) const {
    return kind == Kind::Tensor && o.kind == Kind::Tensor && tensor.same_layout(o.tensor);
  }
};

// An argument of a node, as FX holds it: a constant, a reference to another node, a list or tuple,
// a dict (kernel_options), or a reference to a subgraph (score_mod, mask_mod, fw_graph, joint_graph).
struct Arg {
  enum class Kind { None, Bool, Int, Float, Str, Ref, List, Tuple, Dict, DType, Device, Layout, MemoryFormat, Graph };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;              // Str, Device, Layout, MemoryFormat, Graph (subgraph name), Ref (node name)
  DType dtype = DType::Float32;
  int ref = -1;               // Ref: index of the node in Graph::nodes (resolved on import)
  std::vector<Arg> items;     // List, Tuple, Dict (values)
  std::vector<std::string> keys;  // Dict (keys, parallel to items)

  static Arg none() { return Arg{}; }
  static Arg of_ref(int node, std::string name) {
    Arg a; a.kind = Kind::Ref; a.ref = node; a.s = std::move(name); return a;
  }
  static Arg of_int(int64_t v) { Arg a; a.kind = Kind::Int; a.i = v; return a; }
  static Arg of_float(double v) { Arg a; a.kind = Kind::Float; a.f = v; return a; }
  static Arg of_dtype(DType d) { Arg a; a.kind = Kind::DType; a.dtype = d; return a; }
  static Arg of_bool(bool v) { Arg a; a.kind = Kind::Bool; a.b = v; return a; }
  static Arg of_str(std::string v) { Arg a; a.kind = Kind::Str; a.s = std::move(v); return a; }
  // Calls f(const Arg&) on every Ref inside this argument, depth first.
  template <typename F>
  void for_each_ref(F&& f) const {
    if (kind == Kind::Ref) f(*this);
    for (const Arg& x : items) x.for_each_ref(f);
  }
  template <typename F>
  void for_each_ref_mut(F&& f) {
    if (kind == Kind::Ref) f(*this);
    for (Arg& x : items) x.for_each_ref_mut(f);
  }
};

enum class OpKind { Placeholder, CallFunction, GetAttr, Output };
const char* op_kind_name(OpKind k);

// How the target's schema treats its arguments (filled by the serializer from the op's schema, so
// passes know about mutation and aliasing without libtorch).
struct OpEffects {
  bool mutates = false;        // writes into at least one argument (in-place, out=)
  bool is_view = false;        // its result aliases an argument
  bool nondeterministic_seeded = false;  // draws random numbers: never removed or duplicated
};

struct Node {
  std::string name;            // FX node name, unique in its graph; printed as %name
  OpKind op = OpKind::CallFunction;
  std::string target;          // "aten::addmm.default", "higher_order::flex_attention", "operator::getitem"
  std::vector<Arg> args;
  std::vector<std::pair<std::string, Arg>> kwargs;
  ValueType type;
  OpEffects effects;
  Hints hints;                 // typed hints from hinted_context (meta["custom"]["hintbackend"])
  std::string custom_json;     // all of meta["custom"], verbatim, for dumps
  std::string source;          // user source location "file:line in fn", when FX knows it
  int constant_index = -1;     // GetAttr of a tensor constant: index into the graph's constants

  // Calls f(const Arg&) on every Ref in args and kwargs.
  template <typename F>
  void for_each_input(F&& f) const {
    for (const Arg& a : args) a.for_each_ref(f);
    for (const auto& kv : kwargs) kv.second.for_each_ref(f);
  }
  const Arg* kwarg(const std::string& key) const {
    for (const auto& kv : kwargs)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  // Nested graphs referenced by Arg::Kind::Graph (FlexAttention's score_mod, mask_mod, joint ...).
  std::map<std::string, std::shared_ptr<Graph>> subgraphs;
  int num_constants = 0;
  // The caller hands its inputs over: each is freed after its last use (AOT backward graphs, whose
  // saved activations and tangents the caller passes boxed and clears). False: the caller keeps them
  // (parameters, user tensors), so they live for the whole call.
  bool inputs_owned = false;
  // Placeholders the caller keeps even when inputs_owned (AOT backward: saved parameters and views of
  // them, which the module holds; tangents, which AOTAutograd's backward frame holds to the end).
  std::set<std::string> inputs_kept;
  // Whether the memory of placeholder/get_attr `n` lives for the whole call (not freed at its last use).
  bool caller_keeps(const Node& n) const {
    return n.op == OpKind::GetAttr || (n.op == OpKind::Placeholder && (!inputs_owned || inputs_kept.count(n.name)));
  }

  std::vector<int> placeholders() const;
  int output_node() const;  // index of the single output node (-1 if missing)
  int find(const std::string& name) const;  // -1 if none
  // The tensor type of the value `a` refers to; null when `a` is no reference or its value no tensor.
  const TensorType* tensor_type(const Arg& a) const;
  // For each node, the nodes that use its value, in order.
  std::vector<std::vector<int>> users() const;
};

// "describe the node for an error": `%addmm (aten::addmm.default) at model.py:12 in forward`.
std::string describe(const Graph& g, int node);

}  // namespace hb

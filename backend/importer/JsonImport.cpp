#include "backend/importer/JsonImport.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "backend/ir/Error.h"
#include "backend/ir/Verifier.h"

namespace hb {

using json = nlohmann::json;

namespace {

// Where we are in the document, for error messages: "graph 'forward', node 3 ('addmm'), args[1]".
struct Ctx {
  std::string graph;
  int index = -1;
  std::string node;
  std::string field;
  std::string str() const {
    std::string s = "graph '" + graph + "'";
    if (index >= 0) s += ", node " + std::to_string(index) + " ('" + node + "')";
    if (!field.empty()) s += ", " + field;
    return s;
  }
};

const char* json_type(const json& j) { return j.type_name(); }

// Names (graphs, nodes, subgraphs) and targets appear in the textual IR as bare words, which the IR
// parser reads back: letters, digits, _ and . (targets also ':'), as FX names and op names are ('/'
// separates the graph paths of subgraphs in the textual IR).
bool is_word(const std::string& s, bool target = false) {
  if (s.empty()) return false;
  for (unsigned char ch : s)
    if (!std::isalnum(ch) && ch != '_' && ch != '.' && !(target && ch == ':')) return false;
  return true;
}

// Arguments and 'val' types nest (lists of lists, tuples of tuples); real graphs stay within a few
// levels. A document nesting deeper is refused before anything recurses into it (the parse below, the
// printer, the verifier and the runtime all recurse), naming where.
constexpr int kMaxNesting = 64;

// Sizes: a static dim must be in [0, 2^40), and a tensor must hold under 2^46 bytes (64 TiB): anything
// larger is no tensor a device can hold, and byte counts in the planner must not overflow int64.
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxTensorBytes = int64_t{1} << 46;

const json& need(const json& obj, const char* key, const Ctx& c) {
  HB_USER_CHECK(obj.is_object()) << c.str() << ": expected an object, got " << json_type(obj);
  auto it = obj.find(key);
  HB_USER_CHECK(it != obj.end()) << c.str() << ": missing field '" << key << "'";
  return *it;
}

std::string need_string(const json& obj, const char* key, const Ctx& c) {
  const json& v = need(obj, key, c);
  HB_USER_CHECK(v.is_string()) << c.str() << ": field '" << key << "' must be a string, got "
                               << json_type(v);
  return v.get<std::string>();
}

DType parse_dtype_or_throw(const json& v, const Ctx& c) {
  HB_USER_CHECK(v.is_string()) << c.str() << ": dtype must be a string, got " << json_type(v);
  auto d = parse_dtype(v.get<std::string>());
  HB_USER_CHECK(d.has_value()) << c.str() << ": unknown dtype '" << v.get<std::string>()
                               << "' (known: bool, uint8, int8, int16, int32, int64, float16, "
                                  "bfloat16, float32, float64, complex64, complex128, "
                                  "float8_e4m3fn, float8_e5m2)";
  return *d;
}

double parse_float(const json& v, const Ctx& c) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  HB_USER_FAIL() << c.str() << ": a float must be a number or one of \"inf\", \"-inf\", \"nan\", got "
                 << v.dump();
}

// A symbolic size is a sympy expression over symbols (s0, (s0 + 1)//2, 2*s1): the textual IR prints it
// inside [ ... , ... ], so it may hold letters, digits, _, spaces, + - * / % . and balanced parentheses
// (with commas inside them: Max(1, s0)).
bool is_size_expression(const std::string& e) {
  if (e.empty() || e.front() == ' ' || e.back() == ' ') return false;
  int depth = 0;
  bool letter = false;
  for (unsigned char ch : e) {
    if (ch == '(') {
      ++depth;
    } else if (ch == ')') {
      if (--depth < 0) return false;
    } else if (ch == ',') {
      if (depth == 0) return false;  // Max(1, s0): a comma inside parentheses only
    } else if (!std::isalnum(ch) && std::string("_ +-*/%.").find(static_cast<char>(ch)) == std::string::npos) {
      return false;
    }
    letter |= std::isalpha(ch) != 0;
  }
  return depth == 0 && letter;  // a number is no symbol: give it as an integer
}

Dim parse_dim(const json& v, const Ctx& c) {
  Dim d;
  if (v.is_number_integer()) d.value = v.get<int64_t>();
  else if (v.is_string() && is_size_expression(v.get<std::string>())) d.symbol = v.get<std::string>();
  else HB_USER_FAIL() << c.str() << ": a dimension must be an integer or a symbolic size expression (s0, 2*s1), got "
                      << v.dump();
  return d;
}

ValueType parse_val(const json& v, const Ctx& c, int depth = 0) {
  ValueType t;
  if (v.is_null()) return t;  // unknown
  HB_USER_CHECK(depth < kMaxNesting) << c.str() << ": 'val' nests deeper than " << kMaxNesting << " levels";
  HB_USER_CHECK(v.is_object() && v.size() == 1)
      << c.str() << ": 'val' must be null or an object with one key, got " << v.dump();
  const std::string kind = v.begin().key();
  const json& body = v.begin().value();
  if (kind == "tensor") {
    t.kind = ValueType::Kind::Tensor;
    const json& shape = need(body, "shape", c);
    const json& stride = need(body, "stride", c);
    HB_USER_CHECK(shape.is_array() && stride.is_array() && shape.size() == stride.size())
        << c.str() << ": tensor 'shape' and 'stride' must be lists of equal length";
    HB_USER_CHECK(shape.size() <= kMaxNesting) << c.str() << ": a tensor of rank " << shape.size()
                                               << " (at most " << kMaxNesting << ")";
    for (const json& d : shape) t.tensor.shape.push_back(parse_dim(d, c));
    for (const json& d : stride) t.tensor.stride.push_back(parse_dim(d, c));
    t.tensor.dtype = parse_dtype_or_throw(need(body, "dtype", c), c);
    int64_t bytes = dtype_bytes(t.tensor.dtype);
    for (size_t k = 0; k < t.tensor.shape.size(); ++k) {
      const Dim& d = t.tensor.shape[k];
      const Dim& st = t.tensor.stride[k];
      HB_USER_CHECK(!d.is_static() || (d.value >= 0 && d.value < kMaxDim))
          << c.str() << ": size " << d.value << " of dim " << k << " is out of range [0, 2^40)";
      HB_USER_CHECK(!st.is_static() || (st.value >= 0 && st.value < kMaxDim))
          << c.str() << ": stride " << st.value << " of dim " << k << " is out of range [0, 2^40)";
      if (d.is_static() && d.value > 0 && bytes > 0) {
        HB_USER_CHECK(bytes <= kMaxTensorBytes / d.value)
            << c.str() << ": a tensor of shape " << shape.dump() << " holds more than 2^46 bytes";
        bytes *= d.value;
      }
    }
    t.tensor.device = need_string(body, "device", c);
    HB_USER_CHECK(is_word(t.tensor.device, /*target=*/true))
        << c.str() << ": device " << json(t.tensor.device).dump() << " is not a device name (cpu, cuda:0)";
    if (body.contains("requires_grad")) t.tensor.requires_grad = body["requires_grad"].get<bool>();
  } else if (kind == "tuple") {
    t.kind = ValueType::Kind::Tuple;
    HB_USER_CHECK(body.is_array()) << c.str() << ": a tuple 'val' must hold a list";
    for (const json& e : body) t.elems.push_back(parse_val(e, c, depth + 1));
  } else if (kind == "int") {
    t.kind = ValueType::Kind::Int;
  } else if (kind == "symint") {
    t.kind = ValueType::Kind::SymInt;
    t.symbol = body.is_string() ? body.get<std::string>() : body.dump();
  } else if (kind == "float") {
    t.kind = ValueType::Kind::Float;
  } else if (kind == "bool") {
    t.kind = ValueType::Kind::Bool;
  } else if (kind == "none") {
    t.kind = ValueType::Kind::None;
  } else if (kind == "opaque") {
    t.kind = ValueType::Kind::Unknown;
  } else {
    HB_USER_FAIL() << c.str() << ": unknown 'val' kind '" << kind
                   << "' (known: tensor, tuple, int, symint, float, bool, none, opaque)";
  }
  return t;
}

Arg parse_arg(const json& v, const Ctx& c, int depth = 0) {
  Arg a;
  if (v.is_null()) return a;
  HB_USER_CHECK(depth < kMaxNesting) << c.str() << ": the argument nests deeper than " << kMaxNesting << " levels";
  HB_USER_CHECK(v.is_object() && v.size() == 1)
      << c.str() << ": an argument must be null or an object with one key such as {\"ref\": \"x\"}, got "
      << v.dump();
  const std::string kind = v.begin().key();
  const json& b = v.begin().value();
  auto want = [&](bool ok, const char* what) {
    HB_USER_CHECK(ok) << c.str() << ": argument {\"" << kind << "\": ...} must hold " << what
                      << ", got " << b.dump();
  };
  if (kind == "ref") {
    want(b.is_string(), "a node name");
    a.kind = Arg::Kind::Ref;
    a.s = b.get<std::string>();
  } else if (kind == "int") {
    want(b.is_number_integer(), "an integer");
    a.kind = Arg::Kind::Int;
    a.i = b.get<int64_t>();
  } else if (kind == "float") {
    a.kind = Arg::Kind::Float;
    a.f = parse_float(b, c);
  } else if (kind == "bool") {
    want(b.is_boolean(), "true or false");
    a.kind = Arg::Kind::Bool;
    a.b = b.get<bool>();
  } else if (kind == "str") {
    want(b.is_string(), "a string");
    a.kind = Arg::Kind::Str;
    a.s = b.get<std::string>();
  } else if (kind == "list" || kind == "tuple") {
    want(b.is_array(), "a list");
    a.kind = kind == "list" ? Arg::Kind::List : Arg::Kind::Tuple;
    for (const json& e : b) a.items.push_back(parse_arg(e, c, depth + 1));
  } else if (kind == "dict") {
    want(b.is_object(), "an object");
    a.kind = Arg::Kind::Dict;
    for (auto it = b.begin(); it != b.end(); ++it) {
      want(is_word(it.key()), "keys that are words (letters, digits, _ .)");
      a.keys.push_back(it.key());
      a.items.push_back(parse_arg(it.value(), c, depth + 1));
    }
  } else if (kind == "dtype") {
    a.kind = Arg::Kind::DType;
    a.dtype = parse_dtype_or_throw(b, c);
  } else if (kind == "device" || kind == "layout" || kind == "memory_format" || kind == "graph") {
    want(b.is_string(), "a string");
    a.kind = kind == "device"   ? Arg::Kind::Device
             : kind == "layout" ? Arg::Kind::Layout
             : kind == "graph"  ? Arg::Kind::Graph
                                : Arg::Kind::MemoryFormat;
    a.s = b.get<std::string>();
    want(is_word(a.s, /*target=*/true), "a name (letters, digits, _ . :)");
  } else {
    HB_USER_FAIL() << c.str() << ": unknown argument kind '" << kind
                   << "' (known: ref, int, float, bool, str, list, tuple, dict, dtype, device, layout, "
                      "memory_format, graph; null is None)";
  }
  return a;
}

std::optional<int64_t> opt_int(const json& h, const char* key, const Ctx& c) {
  auto it = h.find(key);
  if (it == h.end() || it->is_null()) return std::nullopt;
  HB_USER_CHECK(it->is_number_integer()) << c.str() << ": hint '" << key << "' must be an integer, got "
                                         << it->dump();
  return it->get<int64_t>();
}

// meta["custom"]["hintbackend"] -> Hints. Reading only: the JSON types, the known keys and the
// spellings of the enums, so a malformed document gets an error naming the node and field. The rules for
// hint values and their combinations are hoo/hints.py's (checked where the user wrote them); the one
// value rule kept here, slices and slice_size >= 1, guards the passes' arithmetic (they divide by them).
Hints parse_hints(const json& h, const Ctx& c) {
  Hints out;
  HB_USER_CHECK(h.is_object()) << c.str() << ": custom.hintbackend must be an object, got " << h.dump();
  static const char* kKnown[] = {"region", "path", "schedule", "slice_dims", "slices", "slice_size",
                                 "memory_budget", "kernel", "deterministic"};
  for (auto it = h.begin(); it != h.end(); ++it) {
    bool known = false;
    for (const char* k : kKnown) known |= it.key() == k;
    HB_USER_CHECK(known) << c.str() << ": unknown hint '" << it.key()
                         << "' (known: region, path, schedule, slice_dims, slices, slice_size, "
                            "memory_budget, kernel, deterministic)";
  }
  out.region = static_cast<int>(opt_int(h, "region", c).value_or(-1));
  HB_USER_CHECK(out.region >= 0) << c.str() << ": custom.hintbackend needs a non-negative 'region' id";
  if (h.contains("path")) {
    HB_USER_CHECK(h["path"].is_array()) << c.str() << ": hint 'path' must be a list of region ids";
    for (const json& p : h["path"]) {
      HB_USER_CHECK(p.is_number_integer()) << c.str() << ": hint 'path' must be a list of region ids";
      out.path.push_back(p.get<int>());
    }
  }
  if (out.path.empty()) out.path.push_back(out.region);
  if (h.contains("schedule") && !h["schedule"].is_null()) {
    const std::string s = h["schedule"].is_string() ? h["schedule"].get<std::string>() : h["schedule"].dump();
    if (s == "bfs") out.schedule = Schedule::BFS;
    else if (s == "dfs") out.schedule = Schedule::DFS;
    else if (s == "auto") out.schedule = Schedule::Auto;
    else HB_USER_FAIL() << c.str() << ": hint schedule='" << s << "' is not one of \"bfs\", \"dfs\", \"auto\"";
  }
  if (h.contains("slice_dims") && !h["slice_dims"].is_null()) {
    HB_USER_CHECK(h["slice_dims"].is_array()) << c.str() << ": hint 'slice_dims' must be a list of ints";
    for (const json& d : h["slice_dims"]) {
      HB_USER_CHECK(d.is_number_integer()) << c.str() << ": hint 'slice_dims' must be a list of ints";
      out.slice_dims.push_back(d.get<int64_t>());
    }
  }
  out.slices = opt_int(h, "slices", c);
  out.slice_size = opt_int(h, "slice_size", c);
  out.memory_budget = opt_int(h, "memory_budget", c);
  for (const auto* v : {&out.slices, &out.slice_size})  // the passes divide by them
    HB_USER_CHECK(!*v || **v >= 1) << c.str() << ": hint " << (v == &out.slices ? "slices" : "slice_size") << "="
                                    << **v << " must be >= 1";
  if (h.contains("kernel") && !h["kernel"].is_null()) {
    const std::string k = h["kernel"].is_string() ? h["kernel"].get<std::string>() : h["kernel"].dump();
    if (k == "auto") out.kernel = KernelPref::Auto;
    else if (k == "cudnn") out.kernel = KernelPref::Cudnn;
    else if (k == "fused" || k == "custom") out.kernel = KernelPref::Fused;
    else if (k == "aten") out.kernel = KernelPref::Aten;
    else HB_USER_FAIL() << c.str() << ": hint kernel='" << k << "' is not one of \"auto\", \"cudnn\", \"fused\", \"aten\"";
  }
  if (h.contains("deterministic") && !h["deterministic"].is_null()) {
    HB_USER_CHECK(h["deterministic"].is_boolean()) << c.str() << ": hint 'deterministic' must be true or false";
    out.deterministic = h["deterministic"].get<bool>();
  }
  return out;
}

OpKind parse_op(const std::string& op, const Ctx& c) {
  if (op == "placeholder") return OpKind::Placeholder;
  if (op == "call_function") return OpKind::CallFunction;
  if (op == "get_attr") return OpKind::GetAttr;
  if (op == "output") return OpKind::Output;
  HB_USER_FAIL() << c.str() << ": unknown op kind '" << op
                 << "' (known: placeholder, call_function, get_attr, output; call_module and "
                    "call_method do not occur in AOT graphs)";
}

std::shared_ptr<Graph> parse_graph(const json& g, const std::string& where) {
  Ctx c;
  c.graph = where;
  HB_USER_CHECK(g.is_object()) << c.str() << ": a graph must be an object, got " << json_type(g);
  auto out = std::make_shared<Graph>();
  out->name = g.contains("name") && g["name"].is_string() ? g["name"].get<std::string>() : where;
  HB_USER_CHECK(is_word(out->name)) << "graph '" << where << "': name " << json(out->name).dump()
                                    << " is not a word (letters, digits, _ .)";
  c.graph = out->name;
  if (g.contains("num_constants")) {
    HB_USER_CHECK(g["num_constants"].is_number_integer()) << c.str() << ": 'num_constants' must be an integer";
    out->num_constants = g["num_constants"].get<int>();
  }
  if (g.contains("inputs_owned")) {
    HB_USER_CHECK(g["inputs_owned"].is_boolean())
        << c.str() << ": 'inputs_owned' must be a bool, got " << json_type(g["inputs_owned"]);
    out->inputs_owned = g["inputs_owned"].get<bool>();
  }
  if (g.contains("inputs_kept")) {
    HB_USER_CHECK(g["inputs_kept"].is_array()) << c.str() << ": 'inputs_kept' must be a list of placeholder names, got "
                                               << json_type(g["inputs_kept"]);
    for (const json& k : g["inputs_kept"]) {
      HB_USER_CHECK(k.is_string()) << c.str() << ": 'inputs_kept' must hold placeholder names, got " << json_type(k);
      out->inputs_kept.insert(k.get<std::string>());
    }
  }
  if (g.contains("subgraphs")) {
    const json& subs = g["subgraphs"];
    HB_USER_CHECK(subs.is_object()) << c.str() << ": 'subgraphs' must be an object of name -> graph";
    for (auto it = subs.begin(); it != subs.end(); ++it) {
      HB_USER_CHECK(is_word(it.key())) << c.str() << ": subgraph name " << json(it.key()).dump()
                                       << " is not a word (letters, digits, _ .)";
      out->subgraphs[it.key()] = parse_graph(it.value(), it.key());
    }
  }
  const json& nodes = need(g, "nodes", c);
  HB_USER_CHECK(nodes.is_array()) << c.str() << ": 'nodes' must be a list, got " << json_type(nodes);
  std::unordered_map<std::string, int> index;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const json& jn = nodes[i];
    c.index = static_cast<int>(i);
    c.node = jn.is_object() && jn.contains("name") && jn["name"].is_string() ? jn["name"].get<std::string>() : "?";
    c.field.clear();
    Node n;
    n.name = need_string(jn, "name", c);
    HB_USER_CHECK(is_word(n.name)) << c.str() << ": node name " << json(n.name).dump()
                                   << " is not a word (letters, digits, _ .)";
    n.op = parse_op(need_string(jn, "op", c), c);
    if (n.op != OpKind::Output) n.target = jn.contains("target") ? need_string(jn, "target", c) : "";
    HB_USER_CHECK(n.target.empty() || is_word(n.target, /*target=*/true))
        << c.str() << ": target " << json(n.target).dump() << " is not a word (letters, digits, _ . :)";
    if (n.op == OpKind::CallFunction || n.op == OpKind::GetAttr) {
      HB_USER_CHECK(!n.target.empty()) << c.str() << ": a " << op_kind_name(n.op) << " node needs a 'target'";
    }
    if (jn.contains("args")) {
      const json& args = jn["args"];
      HB_USER_CHECK(args.is_array()) << c.str() << ": 'args' must be a list, got " << json_type(args);
      for (size_t k = 0; k < args.size(); ++k) {
        c.field = "args[" + std::to_string(k) + "]";
        n.args.push_back(parse_arg(args[k], c));
      }
    }
    if (jn.contains("kwargs")) {
      const json& kw = jn["kwargs"];
      HB_USER_CHECK(kw.is_object()) << c.str() << ": 'kwargs' must be an object, got " << json_type(kw);
      for (auto it = kw.begin(); it != kw.end(); ++it) {
        HB_USER_CHECK(is_word(it.key())) << c.str() << ": keyword " << json(it.key()).dump()
                                         << " is not a word (letters, digits, _ .)";
        c.field = "kwargs['" + it.key() + "']";
        n.kwargs.emplace_back(it.key(), parse_arg(it.value(), c));
      }
    }
    c.field = "val";
    if (jn.contains("val")) n.type = parse_val(jn["val"], c);
    c.field.clear();
    if (jn.contains("effects")) {
      const json& e = jn["effects"];
      HB_USER_CHECK(e.is_object()) << c.str() << ": 'effects' must be an object";
      n.effects.mutates = e.value("mutates", false);
      n.effects.is_view = e.value("is_view", false);
      n.effects.nondeterministic_seeded = e.value("random", false);
    }
    if (jn.contains("custom") && !jn["custom"].is_null()) {
      const json& cu = jn["custom"];
      HB_USER_CHECK(cu.is_object()) << c.str() << ": 'custom' must be an object (node.meta[\"custom\"])";
      n.custom_json = cu.dump();
      if (cu.contains("hintbackend")) {
        c.field = "custom.hintbackend";
        n.hints = parse_hints(cu["hintbackend"], c);
        c.field.clear();
      }
    }
    if (jn.contains("source") && jn["source"].is_string()) n.source = jn["source"].get<std::string>();
    if (jn.contains("constant")) {
      HB_USER_CHECK(jn["constant"].is_number_integer()) << c.str() << ": 'constant' must be an integer index";
      n.constant_index = jn["constant"].get<int>();
    }
    HB_USER_CHECK(index.emplace(n.name, static_cast<int>(i)).second)
        << c.str() << ": duplicate node name '" << n.name << "'";
    out->nodes.push_back(std::move(n));
  }
  // Resolve references by name. A reference to a later node or to itself is a cycle: FX graphs
  // are topologically ordered, so every input is defined before its user.
  for (size_t i = 0; i < out->nodes.size(); ++i) {
    Node& n = out->nodes[i];
    auto resolve = [&](Arg& a) {
      auto it = index.find(a.s);
      HB_USER_CHECK(it != index.end()) << "graph '" << out->name << "', node " << i << " ('" << n.name
                                       << "'): dangling reference to '" << a.s
                                       << "', which no node defines";
      HB_USER_CHECK(it->second < static_cast<int>(i))
          << "graph '" << out->name << "', node " << i << " ('" << n.name << "'): uses '" << a.s
          << "' before it is defined (node " << it->second
          << "): the graph has a cycle or is not in topological order";
      a.ref = it->second;
    };
    for (Arg& a : n.args) a.for_each_ref_mut(resolve);
    for (auto& kv : n.kwargs) kv.second.for_each_ref_mut(resolve);
  }
  return out;
}

}  // namespace

std::shared_ptr<Graph> import_json(const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers out of range (1e400)
    HB_USER_FAIL() << "the graph document is not valid JSON: " << e.what();
  }
  try {
    Ctx c;
    c.graph = "<document>";
    HB_USER_CHECK(doc.is_object()) << "the graph document must be a JSON object, got " << json_type(doc);
    const std::string format = need_string(doc, "format", c);
    HB_USER_CHECK(format == kSchemaFormat)
        << "the document's format is '" << format << "', expected '" << kSchemaFormat << "'";
    const json& ver = need(doc, "version", c);
    HB_USER_CHECK(ver.is_number_integer() && ver.get<int>() == kSchemaVersion)
        << "schema version " << ver.dump() << " is not supported: this build reads version "
        << kSchemaVersion << ". Serialize with the hintbackend Python package of the same build.";
    auto g = parse_graph(need(doc, "graph", c), "graph");
    verify(*g);
    return g;
  } catch (const json::exception& e) {
    // Type errors inside nlohmann (e.g. a bool field holding a string) still get a user message.
    HB_USER_FAIL() << "malformed graph document: " << e.what();
  }
}

}  // namespace hb

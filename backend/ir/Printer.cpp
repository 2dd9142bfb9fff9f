#include "backend/ir/Printer.h"

#include <cmath>
#include <sstream>

namespace hb {

namespace {
void print_dim(std::ostream& os, const Dim& d) {
  if (d.is_static()) os << d.value; else os << d.symbol;
}
void print_float(std::ostream& os, double v) {
  if (std::isnan(v)) { os << "nan"; return; }
  if (std::isinf(v)) { os << (v > 0 ? "inf" : "-inf"); return; }
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string str = s.str();
  if (str.find_first_of(".e") == std::string::npos) str += ".0";
  os << str;
}

bool has_default_strides(const TensorType& t) {
  if (t.stride.empty()) return true;  // none recorded: the parser gives contiguous ones (none when symbolic)
  if (t.stride.size() != t.shape.size()) return false;
  int64_t expect = 1;
  for (size_t k = t.shape.size(); k-- > 0;) {
    if (!t.shape[k].is_static() || !t.stride[k].is_static() || t.stride[k].value != expect) return false;
    expect *= t.shape[k].value;
  }
  return true;
}
}  // namespace

std::string to_string(const TensorType& t) {
  std::ostringstream os;
  auto dims = [&](const std::vector<Dim>& v) {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) os << ", ";
      print_dim(os, v[i]);
    }
    os << "]";
  };
  os << dtype_short(t.dtype);
  dims(t.shape);
  if (!has_default_strides(t)) dims(t.stride);
  if (t.device != "cpu") os << "@" << t.device;
  return os.str();
}

std::string to_string(const ValueType& t) {
  switch (t.kind) {
    case ValueType::Kind::Unknown: return "?";
    case ValueType::Kind::None: return "none";
    case ValueType::Kind::Tensor: return to_string(t.tensor);
    case ValueType::Kind::Int: return "int";
    case ValueType::Kind::SymInt: return "symint(" + t.symbol + ")";
    case ValueType::Kind::Float: return "float";
    case ValueType::Kind::Bool: return "bool";
    case ValueType::Kind::Tuple: {
      std::string s = "(";
      for (size_t i = 0; i < t.elems.size(); ++i) s += (i ? ", " : "") + to_string(t.elems[i]);
      return s + ")";
    }
  }
  return "?";
}

std::string to_string(const Arg& a) {
  std::ostringstream os;
  switch (a.kind) {
    case Arg::Kind::None: os << "none"; break;
    case Arg::Kind::Bool: os << (a.b ? "true" : "false"); break;
    case Arg::Kind::Int: os << a.i; break;
    case Arg::Kind::Float: print_float(os, a.f); break;
    case Arg::Kind::Str: os << '"' << a.s << '"'; break;
    case Arg::Kind::Ref: os << "%" << a.s; break;
    case Arg::Kind::List:
    case Arg::Kind::Tuple: {
      os << (a.kind == Arg::Kind::List ? "[" : "(");
      for (size_t i = 0; i < a.items.size(); ++i) os << (i ? ", " : "") << to_string(a.items[i]);
      if (a.kind == Arg::Kind::Tuple && a.items.size() == 1) os << ",";
      os << (a.kind == Arg::Kind::List ? "]" : ")");
      break;
    }
    case Arg::Kind::Dict: {
      os << "{";
      for (size_t i = 0; i < a.items.size(); ++i)
        os << (i ? ", " : "") << a.keys[i] << ": " << to_string(a.items[i]);
      os << "}";
      break;
    }
    case Arg::Kind::DType: os << "dtype." << dtype_name(a.dtype); break;
    case Arg::Kind::Device: os << "device(" << a.s << ")"; break;
    case Arg::Kind::Layout: os << "layout." << a.s; break;
    case Arg::Kind::MemoryFormat: os << "memory_format." << a.s; break;
    case Arg::Kind::Graph: os << "@" << a.s; break;
  }
  return os.str();
}

std::string print_node(const Graph& g, int idx) {
  const Node& n = g.nodes[idx];
  std::ostringstream os;
  if (n.op == OpKind::Output) {
    os << "return ";
    if (n.args.size() == 1) os << to_string(n.args[0]);
    return os.str();
  }
  os << "%" << n.name << ": " << to_string(n.type) << " = ";
  switch (n.op) {
    case OpKind::Placeholder: os << "placeholder"; break;
    case OpKind::GetAttr:
      os << "get_attr " << n.target;
      if (n.constant_index >= 0) os << " constant#" << n.constant_index;
      break;
    default: {
      os << n.target << "(";
      bool first = true;
      for (const Arg& a : n.args) { os << (first ? "" : ", ") << to_string(a); first = false; }
      for (const auto& kv : n.kwargs) { os << (first ? "" : ", ") << kv.first << "=" << to_string(kv.second); first = false; }
      os << ")";
    }
  }
  if (n.effects.mutates) os << " !mutates";
  if (n.effects.is_view) os << " !view";
  if (n.effects.nondeterministic_seeded) os << " !random";
  if (!n.hints.empty()) os << "  {" << to_string(n.hints) << "}";
  return os.str();
}

namespace {
// `path`: the graph's name as printed: its own name at the top and for the top graph's subgraphs,
// "<parent path>/<name>" deeper down, so the text says which graph holds which subgraph.
void print_graph_at(std::ostream& os, const Graph& g, const std::string& path, int depth) {
  os << "graph " << path;
  if (g.inputs_owned) {
    os << " (inputs owned";
    const char* sep = " except ";
    for (const std::string& k : g.inputs_kept) {
      os << sep << "%" << k;
      sep = ", ";
    }
    os << ")";
  }
  os << " {\n";
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) os << "  " << print_node(g, i) << "\n";
  os << "}\n";
  for (const auto& kv : g.subgraphs)
    print_graph_at(os, *kv.second, depth == 0 ? kv.first : path + "/" + kv.first, depth + 1);
}
}  // namespace

std::string print_graph(const Graph& g) {
  std::ostringstream os;
  print_graph_at(os, g, g.name, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Graph& g) { return os << print_graph(g); }

}  // namespace hb

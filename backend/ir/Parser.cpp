#include "backend/ir/Parser.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "backend/ir/Error.h"
#include "backend/ir/Verifier.h"

namespace hb {

namespace {

// The whole of s as an integer, or nullopt.
std::optional<int64_t> to_int(const std::string& s) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// Integers separated by `sep` ("1/3", "0,1"), or nullopt unless every part is one.
std::optional<std::vector<int64_t>> to_ints(const std::string& s, char sep) {
  std::vector<int64_t> v;
  for (size_t start = 0;;) {
    const size_t end = s.find(sep, start);
    const auto x = to_int(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (!x) return std::nullopt;
    v.push_back(*x);
    if (end == std::string::npos) return v;
    start = end + 1;
  }
}

// A cursor over one line of the text. Errors name the line and column, show the line and point at
// the column.
class Line {
 public:
  Line(std::string text, int number) : s_(std::move(text)), line_(number) {}

  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    HB_USER_FAIL() << "IR text line " << line_ << ", column " << (at + 1) << ": expected " << what << ", got '"
                   << s_.substr(at, 24) << "'\n  " << s_ << "\n  " << std::string(at, ' ') << "^";
  }
  int number() const { return line_; }
  // The position of the next token.
  size_t here() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    return pos_;
  }
  bool at_end() { return here() >= s_.size(); }
  char peek() { return here() < s_.size() ? s_[pos_] : '\0'; }
  bool accept(const std::string& tok) {
    if (s_.compare(here(), tok.size(), tok) != 0) return false;
    pos_ += tok.size();
    return true;
  }
  // tok as a whole word: followed by a space or the end of the line, so that a call's target that begins
  // with a keyword (`get_attrx::op(...)`, which the importer accepts) stays a call.
  bool accept_word(const std::string& tok) {
    if (s_.compare(here(), tok.size(), tok) != 0) return false;
    const size_t after = here() + tok.size();
    if (after < s_.size() && s_[after] != ' ') return false;
    pos_ = after;
    return true;
  }
  void expect(const std::string& tok) {
    if (!accept(tok)) fail("'" + tok + "'");
  }
  // Characters up to (not including) any of `stops` or the end.
  std::string until(const std::string& stops) {
    const size_t start = here();
    while (pos_ < s_.size() && stops.find(s_[pos_]) == std::string::npos) ++pos_;
    return s_.substr(start, pos_ - start);
  }
  // The same, but stops inside parentheses do not count: a symbolic size such as "Max(1, s0)".
  std::string expression(const std::string& stops) {
    const size_t start = here();
    for (int depth = 0; pos_ < s_.size(); ++pos_) {
      const char c = s_[pos_];
      if (depth == 0 && stops.find(c) != std::string::npos) break;
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    }
    return s_.substr(start, pos_ - start);
  }
  // A name: letters, digits and _ . - / (node names, graph paths, integers).
  std::string word() {
    const size_t start = here();
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                std::string("_.-/").find(s_[pos_]) != std::string::npos))
      ++pos_;
    if (pos_ == start) fail("a name");
    return s_.substr(start, pos_ - start);
  }
  int64_t integer() {
    const size_t at = here();
    const auto v = to_int(word());
    if (!v) fail_at(at, "an integer");
    return *v;
  }
  void rewind(size_t p) { pos_ = p; }

 private:
  std::string s_;
  size_t pos_ = 0;
  int line_ = 0;
};

// The nodes parsed so far in the graph being read, by name: a reference names one of them (FX order
// is topological; the verifier requires it).
using Names = std::map<std::string, int>;

Dim parse_dim(Line& l) {
  Dim d;
  const std::string w = l.expression(",]");
  if (w.empty()) l.fail("a dimension");
  if (const auto v = to_int(w)) d.value = *v;
  else d.symbol = w;
  return d;
}

std::vector<Dim> parse_dims(Line& l) {
  std::vector<Dim> v;
  l.expect("[");
  if (l.accept("]")) return v;
  do v.push_back(parse_dim(l));
  while (l.accept(","));
  l.expect("]");
  return v;
}

std::optional<DType> dtype_of_short(const std::string& s) {
  for (int d = 0; d <= static_cast<int>(DType::Float8_e5m2); ++d)
    if (s == dtype_short(static_cast<DType>(d))) return static_cast<DType>(d);
  return std::nullopt;
}

// dtype[shape], [strides] when not the contiguous ones, @device when not the CPU (Printer.h).
TensorType parse_tensor_type(Line& l, DType dtype) {
  TensorType t;
  t.dtype = dtype;
  t.shape = parse_dims(l);
  const size_t at = l.here();
  if (l.peek() == '[') {
    t.stride = parse_dims(l);
    if (t.stride.size() != t.shape.size()) l.fail_at(at, "as many strides as dims");
  } else {
    // The contiguous strides, which the printer leaves out. A symbolic shape has them printed unless
    // none were recorded, so none are made up for it.
    bool is_static = true;
    for (const Dim& d : t.shape) is_static = is_static && d.is_static();
    if (is_static) {
      t.stride.resize(t.shape.size());
      int64_t s = 1;
      for (size_t k = t.shape.size(); k-- > 0;) {
        t.stride[k].value = s;
        s *= t.shape[k].value;
      }
    }
  }
  if (l.accept("@")) t.device = l.until(" =,)");
  return t;
}

ValueType parse_type(Line& l) {
  ValueType t;
  if (l.accept("(")) {
    t.kind = ValueType::Kind::Tuple;
    if (!l.accept(")")) {
      do t.elems.push_back(parse_type(l));
      while (l.accept(","));
      l.expect(")");
    }
    return t;
  }
  if (l.accept("?")) return t;
  if (l.accept("symint(")) {
    t.kind = ValueType::Kind::SymInt;
    t.symbol = l.expression(")");
    l.expect(")");
    return t;
  }
  const size_t at = l.here();
  const std::string w = l.until("[ =,)");
  if (w == "none") t.kind = ValueType::Kind::None;
  else if (w == "int") t.kind = ValueType::Kind::Int;
  else if (w == "float") t.kind = ValueType::Kind::Float;
  else if (w == "bool") t.kind = ValueType::Kind::Bool;
  else if (const auto d = dtype_of_short(w)) {
    t.kind = ValueType::Kind::Tensor;
    t.tensor = parse_tensor_type(l, *d);
  } else {
    l.fail_at(at, "a type (f32[...], int, float, bool, none, symint(...), (...) or ?)");
  }
  return t;
}

// A number as the printer writes it: a float has '.' or 'e', or is nan or inf.
Arg parse_number(Line& l) {
  const size_t at = l.here();
  const std::string w = l.until(",)]} ");
  if (w == "nan") return Arg::of_float(std::nan(""));
  if (w == "inf" || w == "-inf")
    return Arg::of_float((w[0] == '-' ? -1.0 : 1.0) * std::numeric_limits<double>::infinity());
  if (w.find_first_of(".eE") == std::string::npos) {
    if (const auto v = to_int(w)) return Arg::of_int(*v);
  } else {
    try {
      size_t used = 0;
      const double v = std::stod(w, &used);
      if (used == w.size()) return Arg::of_float(v);
    } catch (const std::exception&) {
    }
  }
  l.fail_at(at, "an argument (%value, @graph, a number, a string, none, true, false, dtype.*, device(...), "
                "layout.*, memory_format.*, [...], (...) or {...})");
}

Arg parse_arg(Line& l, const Names& names) {
  Arg a;
  const size_t at = l.here();
  const char c = l.peek();
  if (c == '%') {
    l.expect("%");
    const std::string name = l.word();
    const auto it = names.find(name);
    if (it == names.end()) l.fail_at(at, "a value defined on an earlier line of this graph");
    return Arg::of_ref(it->second, name);
  }
  if (c == '@') {
    l.expect("@");
    a.kind = Arg::Kind::Graph;
    a.s = l.word();
    return a;
  }
  if (c == '"') {
    l.expect("\"");
    a.kind = Arg::Kind::Str;
    a.s = l.until("\"");
    l.expect("\"");
    return a;
  }
  if (c == '[' || c == '(') {
    const bool list = c == '[';
    l.expect(list ? "[" : "(");
    a.kind = list ? Arg::Kind::List : Arg::Kind::Tuple;
    const std::string close = list ? "]" : ")";
    while (!l.accept(close)) {
      a.items.push_back(parse_arg(l, names));
      if (!l.accept(",") && l.peek() != close[0]) l.fail("',' or '" + close + "'");
    }
    return a;
  }
  if (c == '{') {
    l.expect("{");
    a.kind = Arg::Kind::Dict;
    while (!l.accept("}")) {
      a.keys.push_back(l.until(":"));
      l.expect(":");
      a.items.push_back(parse_arg(l, names));
      if (!l.accept(",") && l.peek() != '}') l.fail("',' or '}'");
    }
    return a;
  }
  if (l.accept("none")) return a;
  for (const bool b : {true, false})
    if (l.accept(b ? "true" : "false")) {
      a.kind = Arg::Kind::Bool;
      a.b = b;
      return a;
    }
  if (l.accept("dtype.")) {
    const size_t name_at = l.here();
    const auto d = parse_dtype(l.until(",)]} "));
    if (!d) l.fail_at(name_at, "a dtype name (float32, bfloat16, ...)");
    return Arg::of_dtype(*d);
  }
  if (l.accept("device(")) {
    a.kind = Arg::Kind::Device;
    a.s = l.until(")");
    l.expect(")");
    return a;
  }
  for (const auto& [prefix, kind] :
       {std::pair{"layout.", Arg::Kind::Layout}, std::pair{"memory_format.", Arg::Kind::MemoryFormat}})
    if (l.accept(prefix)) {
      a.kind = kind;
      a.s = l.until(",)]} ");
      return a;
    }
  return parse_number(l);
}

// `{region=1 path=0/1 schedule=dfs slice_dims=[0,1] slices=4 ...}` (to_string(Hints)), after the '{'.
Hints parse_hints(Line& l) {
  Hints h;
  while (!l.accept("}")) {
    const size_t key_at = l.here();
    const std::string key = l.until("= }");
    l.expect("=");
    const size_t at = l.here();
    const std::string v = l.until(" }");
    auto bad = [&](const std::string& what) { l.fail_at(at, what + " for hint '" + key + "'"); };
    auto num = [&] {
      const auto x = to_int(v);
      if (!x) bad("an integer");
      return *x;
    };
    if (key == "region") {
      h.region = static_cast<int>(num());
    } else if (key == "path") {
      const auto p = to_ints(v, '/');
      if (!p) bad("region ids separated by '/'");
      h.path.assign(p->begin(), p->end());
    } else if (key == "schedule") {
      for (Schedule s : {Schedule::BFS, Schedule::DFS, Schedule::Auto})
        if (v == schedule_name(s)) h.schedule = s;
      if (!h.schedule) bad("bfs, dfs or auto");
    } else if (key == "slice_dims") {
      std::optional<std::vector<int64_t>> dims;
      if (v.size() > 2 && v.front() == '[' && v.back() == ']') dims = to_ints(v.substr(1, v.size() - 2), ',');
      if (!dims) bad("[dim,dim,...]");
      h.slice_dims = *dims;
    } else if (key == "slices") {
      h.slices = num();
    } else if (key == "slice_size") {
      h.slice_size = num();
    } else if (key == "memory_budget") {
      h.memory_budget = num();
    } else if (key == "kernel") {
      for (KernelPref k : {KernelPref::Auto, KernelPref::Cudnn, KernelPref::Fused, KernelPref::Aten})
        if (v == kernel_pref_name(k)) h.kernel = k;
      if (!h.kernel) bad("auto, cudnn, fused or aten");
    } else if (key == "deterministic") {
      if (v != "true" && v != "false") bad("true or false");
      h.deterministic = v == "true";
    } else {
      l.fail_at(key_at, "a hint (region, path, schedule, slice_dims, slices, slice_size, memory_budget, kernel, "
                        "deterministic)");
    }
  }
  return h;
}

// One `%name: TYPE = ...` or `return ...` line (print_node).
Node parse_node(Line& l, const Names& names) {
  Node n;
  if (l.accept_word("return")) {
    n.op = OpKind::Output;
    n.name = "output";
    if (!l.at_end()) n.args.push_back(parse_arg(l, names));
    return n;
  }
  const size_t name_at = l.here();
  l.expect("%");
  n.name = l.word();
  if (names.count(n.name)) l.fail_at(name_at, "a new name (%" + n.name + " is defined above)");
  l.expect(":");
  n.type = parse_type(l);
  l.expect("=");
  if (l.accept_word("placeholder")) {
    n.op = OpKind::Placeholder;
    n.target = n.name;
  } else if (l.accept_word("get_attr")) {
    n.op = OpKind::GetAttr;
    n.target = l.until(" ");
    if (l.accept("constant#")) n.constant_index = static_cast<int>(l.integer());
  } else {
    n.op = OpKind::CallFunction;
    n.target = l.until("(");
    l.expect("(");
    while (!l.accept(")")) {
      // A keyword argument is `name=value`; anything else is positional.
      const size_t at = l.here();
      const std::string key = l.until("=,()[]{}%@\" ");
      if (!key.empty() && l.accept("=")) {
        n.kwargs.emplace_back(key, parse_arg(l, names));
      } else {
        l.rewind(at);
        if (!n.kwargs.empty()) l.fail("a keyword argument (positional ones come first)");
        n.args.push_back(parse_arg(l, names));
      }
      if (!l.accept(",") && l.peek() != ')') l.fail("',' or ')'");
    }
  }
  for (;;) {
    if (l.accept("!mutates")) n.effects.mutates = true;
    else if (l.accept("!view")) n.effects.is_view = true;
    else if (l.accept("!random")) n.effects.nondeterministic_seeded = true;
    else break;
  }
  if (l.accept("{")) n.hints = parse_hints(l);
  if (!l.at_end()) l.fail("the end of the line (effects are !mutates, !view, !random; hints are in {...})");
  return n;
}

// One `graph PATH { ... }` block as printed: "forward", "slice_body_0", "slice_body_0/fused_1".
struct Block {
  std::string path;
  std::shared_ptr<Graph> graph;
  int line = 0;  // of its `graph` line
};

// `graph PATH [(inputs owned[ except %a, %b])] {`
Block parse_graph_line(Line& l) {
  l.expect("graph");
  Block b{l.word(), std::make_shared<Graph>(), l.number()};
  const size_t slash = b.path.rfind('/');
  b.graph->name = slash == std::string::npos ? b.path : b.path.substr(slash + 1);
  if (l.accept("(inputs owned")) {
    b.graph->inputs_owned = true;
    if (l.accept("except")) {
      do {
        l.expect("%");
        b.graph->inputs_kept.insert(l.word());
      } while (l.accept(","));
    }
    l.expect(")");
  }
  l.expect("{");
  if (!l.at_end()) l.fail("the end of the line");
  return b;
}

}  // namespace

std::shared_ptr<Graph> parse_graph(const std::string& text) {
  std::vector<Block> blocks;
  Graph* current = nullptr;  // the graph whose block is open
  Names names;               // its nodes so far
  int number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    Line l(text.substr(start, end - start), ++number);
    start = end + 1;
    if (l.at_end() || l.accept("//")) continue;
    if (!current) {
      blocks.push_back(parse_graph_line(l));
      current = blocks.back().graph.get();
      names.clear();
    } else if (l.accept("}")) {
      if (!l.at_end()) l.fail("the end of the line");
      current = nullptr;
    } else {
      Node n = parse_node(l, names);
      if (n.constant_index >= 0) current->num_constants = std::max(current->num_constants, n.constant_index + 1);
      names.emplace(n.name, static_cast<int>(current->nodes.size()));
      current->nodes.push_back(std::move(n));
    }
  }
  HB_USER_CHECK(!blocks.empty()) << "IR text: no graph (expected 'graph NAME {')";
  HB_USER_CHECK(!current) << "IR text line " << blocks.back().line << ": graph " << blocks.back().path
                          << " has no closing '}'";
  // Nesting from the printed paths: "a/b" is subgraph b of the graph printed as "a"; the top graph's
  // own subgraphs are printed with their bare names.
  std::map<std::string, Graph*> by_path;
  for (const Block& b : blocks)
    HB_USER_CHECK(by_path.emplace(b.path, b.graph.get()).second)
        << "IR text line " << b.line << ": graph " << b.path << " is printed twice";
  for (size_t i = 1; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const size_t slash = b.path.rfind('/');
    const std::string parent = slash == std::string::npos ? blocks[0].path : b.path.substr(0, slash);
    const auto it = by_path.find(parent);
    HB_USER_CHECK(it != by_path.end()) << "IR text line " << b.line << ": graph " << b.path
                                       << " belongs to graph " << parent << ", which is not printed";
    it->second->subgraphs[b.graph->name] = b.graph;
  }
  verify(*blocks[0].graph);
  return blocks[0].graph;
}

}  // namespace hb

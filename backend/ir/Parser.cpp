#include "backend/ir/Parser.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "backend/ir/Error.h"
#include "backend/ir/Verifier.h"

namespace hb {

namespace {

// A cursor over one line of the text, with the line's number for errors.
class Line {
 public:
  Line(std::string text, int number) : s_(std::move(text)), line_(number) {}

  [[noreturn]] void fail(const std::string& what) const {
    HB_USER_FAIL() << "IR text line " << line_ << ", column " << (pos_ + 1) << ": expected " << what << ", got '"
                   << s_.substr(pos_, 24) << "'\n  " << s_;
  }
  void skip_spaces() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool at_end() {
    skip_spaces();
    return pos_ >= s_.size();
  }
  char peek() {
    skip_spaces();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool accept(const std::string& tok) {
    skip_spaces();
    if (s_.compare(pos_, tok.size(), tok) != 0) return false;
    pos_ += tok.size();
    return true;
  }
  void expect(const std::string& tok) {
    if (!accept(tok)) fail("'" + tok + "'");
  }
  // Characters up to (not including) any of `stops` or the end.
  std::string until(const std::string& stops) {
    skip_spaces();
    const size_t start = pos_;
    while (pos_ < s_.size() && stops.find(s_[pos_]) == std::string::npos) ++pos_;
    return s_.substr(start, pos_ - start);
  }
  // A name: letters, digits and _ . - / (node names, graph paths, integers).
  std::string word() {
    skip_spaces();
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                std::string("_.-/").find(s_[pos_]) != std::string::npos))
      ++pos_;
    if (pos_ == start) fail("a name");
    return s_.substr(start, pos_ - start);
  }
  int64_t integer() {
    const std::string w = word();
    try {
      size_t used = 0;
      const int64_t v = std::stoll(w, &used);
      if (used == w.size()) return v;
    } catch (const std::exception&) {
    }
    pos_ -= w.size();
    fail("an integer");
  }
  size_t pos() const { return pos_; }
  void rewind(size_t p) { pos_ = p; }
  const std::string& text() const { return s_; }

 private:
  std::string s_;
  size_t pos_ = 0;
  int line_ = 0;
};

Dim parse_dim(Line& l) {
  Dim d;
  const std::string w = l.until(",]");
  if (w.empty()) l.fail("a dimension");
  size_t used = 0;
  try {
    d.value = std::stoll(w, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != w.size()) {
    d.value = 0;
    d.symbol = w;
  }
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
    t.symbol = l.until(")");
    l.expect(")");
    return t;
  }
  const size_t at = l.pos();
  const std::string w = l.until("[ =,)");
  if (w == "none") t.kind = ValueType::Kind::None;
  else if (w == "int") t.kind = ValueType::Kind::Int;
  else if (w == "float") t.kind = ValueType::Kind::Float;
  else if (w == "bool") t.kind = ValueType::Kind::Bool;
  else {
    const auto d = dtype_of_short(w);
    if (!d) {
      l.rewind(at);
      l.fail("a type (f32[...], int, float, bool, none, symint(...), (...) or ?)");
    }
    t.kind = ValueType::Kind::Tensor;
    t.tensor.dtype = *d;
    t.tensor.shape = parse_dims(l);
    if (l.peek() == '[') {
      t.tensor.stride = parse_dims(l);
      if (t.tensor.stride.size() != t.tensor.shape.size()) l.fail("as many strides as dims");
    } else {  // the contiguous ones (the printer leaves them out)
      t.tensor.stride.resize(t.tensor.shape.size());
      int64_t s = 1;
      for (size_t k = t.tensor.shape.size(); k-- > 0;) {
        if (!t.tensor.shape[k].is_static()) l.fail("strides for a symbolic shape");
        t.tensor.stride[k].value = s;
        s *= t.tensor.shape[k].value;
      }
    }
    if (l.accept("@")) t.tensor.device = l.until(" =,)");
  }
  return t;
}

// A number as the printer writes it: a float has '.', 'e', or is nan/inf.
Arg parse_number(Line& l) {
  const std::string w = l.until(",)]} ");
  if (w == "nan" || w == "inf" || w == "-inf")
    return Arg::of_float(w == "nan" ? std::nan("") : (w[0] == '-' ? -1.0 : 1.0) * std::numeric_limits<double>::infinity());
  try {
    size_t used = 0;
    if (w.find_first_of(".eE") != std::string::npos) {
      const double v = std::stod(w, &used);
      if (used == w.size()) return Arg::of_float(v);
    } else {
      const int64_t v = std::stoll(w, &used);
      if (used == w.size()) return Arg::of_int(v);
    }
  } catch (const std::exception&) {
  }
  l.fail("a number");
}

Arg parse_arg(Line& l) {
  Arg a;
  const char c = l.peek();
  if (c == '%') {
    l.expect("%");
    a.kind = Arg::Kind::Ref;
    a.s = l.word();
    return a;
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
      a.items.push_back(parse_arg(l));
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
      a.items.push_back(parse_arg(l));
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
  auto suffixed = [&](const char* prefix, Arg::Kind k) {
    if (!l.accept(prefix)) return false;
    a.kind = k;
    a.s = l.until(",)]} ");
    return true;
  };
  if (l.accept("dtype.")) {
    const auto d = parse_dtype(l.until(",)]} "));
    if (!d) l.fail("a dtype name");
    return Arg::of_dtype(*d);
  }
  if (l.accept("device(")) {
    a.kind = Arg::Kind::Device;
    a.s = l.until(")");
    l.expect(")");
    return a;
  }
  if (suffixed("layout.", Arg::Kind::Layout) || suffixed("memory_format.", Arg::Kind::MemoryFormat)) return a;
  return parse_number(l);
}

std::optional<Schedule> schedule_of(const std::string& s) {
  for (Schedule x : {Schedule::BFS, Schedule::DFS, Schedule::Auto})
    if (s == schedule_name(x)) return x;
  return std::nullopt;
}
std::optional<KernelPref> kernel_of(const std::string& s) {
  for (KernelPref x : {KernelPref::Auto, KernelPref::Cudnn, KernelPref::Custom, KernelPref::Aten})
    if (s == kernel_pref_name(x)) return x;
  return std::nullopt;
}

// `{region=1 path=0/1 schedule=dfs slice_dims=[0,1] slices=4 ...}` (to_string(Hints)).
Hints parse_hints(Line& l) {
  Hints h;
  while (!l.accept("}")) {
    const std::string key = l.until("=");
    l.expect("=");
    const std::string v = l.until(" }");
    auto num = [&]() -> int64_t {
      try {
        size_t used = 0;
        const int64_t x = std::stoll(v, &used);
        if (used == v.size()) return x;
      } catch (const std::exception&) {
      }
      l.fail("an integer for hint '" + key + "'");
    };
    if (key == "region") h.region = static_cast<int>(num());
    else if (key == "path") {
      size_t start = 0;
      while (start <= v.size()) {
        const size_t slash = v.find('/', start);
        const std::string part = v.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        try {
          h.path.push_back(std::stoi(part));
        } catch (const std::exception&) {
          l.fail("a path of region ids");
        }
        if (slash == std::string::npos) break;
        start = slash + 1;
      }
    } else if (key == "schedule") {
      const auto s = schedule_of(v);
      if (!s) l.fail("a schedule");
      h.schedule = s;
    } else if (key == "slice_dims") {
      if (v.size() < 2 || v.front() != '[' || v.back() != ']') l.fail("slice_dims=[...]");
      std::string inner = v.substr(1, v.size() - 2);
      size_t start = 0;
      while (start < inner.size()) {
        const size_t comma = inner.find(',', start);
        h.slice_dims.push_back(std::stoll(inner.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (key == "slices") h.slices = num();
    else if (key == "slice_size") h.slice_size = num();
    else if (key == "memory_budget") h.memory_budget = num();
    else if (key == "kernel") {
      const auto k = kernel_of(v);
      if (!k) l.fail("a kernel preference");
      h.kernel = k;
    } else if (key == "deterministic") h.deterministic = v == "true";
    else l.fail("a hint name");
  }
  return h;
}

// One `%name: TYPE = ...` or `return ...` line into n (refs by name; resolved per graph afterwards).
Node parse_node(Line& l) {
  Node n;
  if (l.accept("return")) {
    n.op = OpKind::Output;
    n.name = "output";
    if (!l.at_end()) n.args.push_back(parse_arg(l));
    return n;
  }
  l.expect("%");
  n.name = l.word();
  l.expect(":");
  n.type = parse_type(l);
  l.expect("=");
  if (l.accept("placeholder")) {
    n.op = OpKind::Placeholder;
    n.target = n.name;
  } else if (l.accept("get_attr")) {
    n.op = OpKind::GetAttr;
    n.target = l.until(" ");
    if (l.accept("constant#")) n.constant_index = static_cast<int>(l.integer());
  } else {
    n.op = OpKind::CallFunction;
    n.target = l.until("(");
    l.expect("(");
    while (!l.accept(")")) {
      // A keyword argument is `name=value`; anything else is positional.
      const size_t at = l.pos();
      const std::string key = l.until("=,()[]{}%@\" ");
      if (!key.empty() && l.accept("=")) {
        n.kwargs.emplace_back(key, parse_arg(l));
      } else {
        l.rewind(at);
        if (!n.kwargs.empty()) l.fail("a keyword argument (positional ones come first)");
        n.args.push_back(parse_arg(l));
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
  if (!l.at_end()) l.fail("the end of the line");
  return n;
}

struct Block {
  std::string path;  // as printed: "forward", "slice_body_0", "slice_body_0/fused_1"
  std::shared_ptr<Graph> graph;
};

void resolve_refs(Graph& g, int line) {
  std::map<std::string, int> index;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    HB_USER_CHECK(index.emplace(g.nodes[i].name, i).second)
        << "IR text (graph " << g.name << ", before line " << line << "): node %" << g.nodes[i].name
        << " is defined twice";
    if (g.nodes[i].constant_index >= 0) g.num_constants = std::max(g.num_constants, g.nodes[i].constant_index + 1);
  }
  for (Node& n : g.nodes) {
    auto fix = [&](Arg& a) {
      auto it = index.find(a.s);
      HB_USER_CHECK(it != index.end())
          << "IR text (graph " << g.name << "): %" << n.name << " reads %" << a.s << ", which is not defined";
      a.ref = it->second;
    };
    for (Arg& a : n.args) a.for_each_ref_mut(fix);
    for (auto& kv : n.kwargs) kv.second.for_each_ref_mut(fix);
  }
}

}  // namespace

std::shared_ptr<Graph> parse_graph(const std::string& text) {
  std::vector<Block> blocks;
  std::shared_ptr<Graph> current;
  int number = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    Line l(text.substr(start, end - start), ++number);
    start = end + 1;
    if (l.at_end() || l.accept("//")) continue;
    if (!current) {
      // `graph NAME [(inputs owned[ except %a, %b])] {`
      l.expect("graph");
      Block b{l.word(), std::make_shared<Graph>()};
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
      current = b.graph;
      blocks.push_back(std::move(b));
      continue;
    }
    if (l.accept("}")) {
      if (!l.at_end()) l.fail("the end of the line");
      resolve_refs(*current, number);
      current.reset();
      continue;
    }
    current->nodes.push_back(parse_node(l));
  }
  HB_USER_CHECK(!blocks.empty()) << "IR text: no graph (expected 'graph NAME {')";
  HB_USER_CHECK(!current) << "IR text: graph " << blocks.back().path << " has no closing '}'";
  // Nesting from the printed paths: "a/b" is subgraph b of the graph printed as "a"; the top graph's
  // own subgraphs are printed with their bare names.
  std::map<std::string, std::shared_ptr<Graph>> by_path;
  for (const Block& b : blocks) {
    HB_USER_CHECK(by_path.emplace(b.path, b.graph).second) << "IR text: graph " << b.path << " is printed twice";
  }
  for (size_t i = 1; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const size_t slash = b.path.rfind('/');
    const std::string parent = slash == std::string::npos ? blocks[0].path : b.path.substr(0, slash);
    auto it = by_path.find(parent);
    HB_USER_CHECK(it != by_path.end()) << "IR text: graph " << b.path << " belongs to graph " << parent
                                       << ", which is not printed";
    it->second->subgraphs[b.graph->name] = b.graph;
  }
  verify(*blocks[0].graph);
  return blocks[0].graph;
}

}  // namespace hb

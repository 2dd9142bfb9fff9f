#include "backend/ir/Verifier.h"

#include <set>

#include "backend/ir/Error.h"

namespace hb {

namespace {

void check_arg(const Graph& g, int i, const Arg& a) {
  const int n = static_cast<int>(g.nodes.size());
  switch (a.kind) {
    case Arg::Kind::Ref:
      HB_USER_CHECK(a.ref >= 0 && a.ref < i)
          << describe(g, i) << ": reference to '" << a.s << "' is dangling or not defined before use";
      HB_USER_CHECK(g.nodes[a.ref].op != OpKind::Output)
          << describe(g, i) << ": uses the output node '" << a.s << "' as a value";
      HB_USER_CHECK(a.ref < n && g.nodes[a.ref].name == a.s)
          << describe(g, i) << ": reference '" << a.s << "' resolves to the wrong node";
      break;
    case Arg::Kind::Graph:
      HB_USER_CHECK(g.subgraphs.count(a.s))
          << describe(g, i) << ": refers to subgraph '" << a.s
          << "', which the document's 'subgraphs' does not define";
      break;
    case Arg::Kind::Dict:
      HB_USER_CHECK(a.keys.size() == a.items.size()) << describe(g, i) << ": malformed dict argument";
      break;
    default:
      break;
  }
  for (const Arg& x : a.items) check_arg(g, i, x);
}

bool valid_target(const std::string& t) {
  // namespace::name or namespace::name.overload, e.g. aten::add.Tensor, higher_order::flex_attention
  auto p = t.find("::");
  return p != std::string::npos && p > 0 && p + 2 < t.size();
}

}  // namespace

void verify(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  HB_USER_CHECK(n > 0) << "graph '" << g.name << "' has no nodes";
  for (const std::string& k : g.inputs_kept) {
    const int i = g.find(k);
    HB_USER_CHECK(i >= 0 && g.nodes[i].op == OpKind::Placeholder)
        << "graph '" << g.name << "': inputs_kept names '" << k << "', which is not one of its placeholders";
  }
  int outputs = 0;
  std::set<std::string> names;
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    HB_USER_CHECK(!node.name.empty()) << "graph '" << g.name << "', node " << i << ": empty name";
    HB_USER_CHECK(names.insert(node.name).second) << describe(g, i) << ": duplicate node name";
    switch (node.op) {
      case OpKind::Output:
        ++outputs;
        HB_USER_CHECK(i == n - 1) << describe(g, i) << ": the output node must be the last node";
        HB_USER_CHECK(node.args.size() == 1)
            << describe(g, i) << ": the output node takes exactly one argument (a tuple or list of results)";
        break;
      case OpKind::CallFunction:
        HB_USER_CHECK(valid_target(node.target))
            << describe(g, i) << ": target '" << node.target
            << "' is not of the form namespace::name[.overload] (e.g. aten::add.Tensor)";
        break;
      case OpKind::GetAttr:
        HB_USER_CHECK(node.constant_index >= 0 && node.constant_index < g.num_constants)
            << describe(g, i) << ": get_attr must name a constant in [0, num_constants="
            << g.num_constants << "), got " << node.constant_index
            << " (subgraphs are referenced with {\"graph\": name} arguments instead)";
        break;
      case OpKind::Placeholder:
        HB_USER_CHECK(node.args.empty() && node.kwargs.empty())
            << describe(g, i) << ": a placeholder takes no arguments";
        break;
    }
    for (const Arg& a : node.args) check_arg(g, i, a);
    for (const auto& kv : node.kwargs) check_arg(g, i, kv.second);
  }
  HB_USER_CHECK(outputs == 1) << "graph '" << g.name << "' must have exactly one output node, has " << outputs;
  for (const auto& kv : g.subgraphs) verify(*kv.second);
}

}  // namespace hb

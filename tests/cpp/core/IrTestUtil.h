// Helpers for the IR-text tests of tests/cpp/core: load a fixture document, check lines in order.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Printer.h"
#include "passes/Pipeline.h"

namespace hb::test {

// tests/fixtures/ir/<name>, written by tests/fixtures/ir/make_fixtures.py.
inline std::shared_ptr<Graph> load_fixture(const std::string& name) {
  std::ifstream in(std::string(HB_SOURCE_DIR) + "/tests/fixtures/ir/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name << " (run tests/fixtures/ir/make_fixtures.py)";
  std::stringstream ss;
  ss << in.rdbuf();
  return import_json(ss.str());
}

// Runs `passes` by name (verifying the IR after each) and returns the IR text followed by the notes
// they left, one "// note: ..." line each: what the IR-text tests check.
inline std::string run_and_print(Graph& g, const std::vector<std::string>& passes, PassContext& ctx) {
  ctx.verify_each = true;
  run_passes(g, passes, ctx);
  std::string out = print_graph(g);
  for (const std::string& n : ctx.notes) out += "// note: " + n + "\n";
  return out;
}

// CHECK-style: each expected line must occur, in order, as part of a line of `text`.
inline void check_lines(const std::string& text, const std::vector<std::string>& expected) {
  std::istringstream in(text);
  std::string line;
  size_t k = 0;
  while (k < expected.size() && std::getline(in, line))
    if (line.find(expected[k]) != std::string::npos) ++k;
  EXPECT_EQ(k, expected.size()) << "CHECK not found (in order): '" << (k < expected.size() ? expected[k] : "")
                                << "'\n--- in ---\n" << text;
}

// The common part of the random-graph generators of the property tests: a seeded RNG and the graph
// being built. add() names an unnamed node "n<index>".
struct RandomGraphBase {
  std::mt19937 rng;
  Graph g;
  explicit RandomGraphBase(uint32_t seed) : rng(seed) { g.name = "random"; }

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  Arg ref(int i) const { return Arg::of_ref(i, g.nodes[i].name); }
  int add(Node n) {
    if (n.name.empty()) n.name = "n" + std::to_string(g.nodes.size());
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  }
  // A random earlier node with a single tensor value.
  int tensor_node() {
    std::vector<int> c;
    for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
      if (g.nodes[i].type.kind == ValueType::Kind::Tensor) c.push_back(i);
    return c[pick(static_cast<int>(c.size()))];
  }
  static Node call(const std::string& target, std::vector<Arg> args, ValueType t) {
    Node n;
    n.target = target;
    n.args = std::move(args);
    n.type = std::move(t);
    return n;
  }
};

}  // namespace hb::test

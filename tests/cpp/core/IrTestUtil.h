// Helpers for the IR-text tests of tests/cpp/core: load a fixture document, check lines in order.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Parser.h"
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
// they left, each line of each marked "// note: ": what the IR-text tests check.
inline std::string run_and_print(Graph& g, const std::vector<std::string>& passes, PassContext& ctx) {
  ctx.verify_each = true;
  run_passes(g, passes, ctx);
  std::string out = print_graph(g);
  for (const std::string& n : ctx.notes) {  // every line of a note marked, as hb-opt prints them
    std::istringstream lines(n);
    for (std::string l; std::getline(lines, l);) out += "// note: " + l + "\n";
  }
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

// FileCheck-style IR-text tests (XLA's and MLIR's): one text holding
//   // RUN: pass-a,pass-b            the passes to run, in order (verified after each)
//   graph g { ... }                   the input IR, as the dumps print it
//   // CHECK: text                    a later output line contains text
//   // CHECK-NEXT: text               the very next output line contains text
//   // CHECK-NOT: text                no output line between the neighbouring matches contains text
// The output is the IR after the passes, then their notes as `// note: ...` lines. A failure prints the
// whole output, so it reads like a dump. `ctx` may carry settings (memory options, a target).
inline void file_check(const std::string& test, PassContext ctx = {}) {
  std::istringstream in(test);
  std::string line, input;
  std::vector<std::string> passes;
  struct Check {
    enum Kind { Plain, Next, Not } kind;
    std::string text;
  };
  std::vector<Check> checks;
  auto after = [](const std::string& l, const std::string& tag) -> std::optional<std::string> {
    const size_t at = l.find(tag);
    if (at == std::string::npos || l.find_first_not_of(' ') != at) return std::nullopt;
    size_t start = at + tag.size();
    while (start < l.size() && l[start] == ' ') ++start;
    return l.substr(start);
  };
  while (std::getline(in, line)) {
    if (auto r = after(line, "// RUN:")) {
      std::string cur;
      for (char c : *r + ",")
        if (c == ',') {
          if (!cur.empty()) passes.push_back(cur);
          cur.clear();
        } else if (c != ' ') {
          cur += c;
        }
    } else if (auto c = after(line, "// CHECK-NEXT:")) {
      checks.push_back({Check::Next, *c});
    } else if (auto c2 = after(line, "// CHECK-NOT:")) {
      checks.push_back({Check::Not, *c2});
    } else if (auto c3 = after(line, "// CHECK:")) {
      checks.push_back({Check::Plain, *c3});
    } else if (after(line, "// CHECK") || after(line, "// RUN")) {  // a misspelt directive would check nothing
      FAIL() << "unknown directive (CHECK:, CHECK-NEXT:, CHECK-NOT:, RUN:): " << line;
    } else {
      input += line + "\n";
    }
  }
  ASSERT_FALSE(checks.empty()) << "an IR-text test without CHECK lines checks nothing";
  auto g = parse_graph(input);
  const std::string out = run_and_print(*g, passes, ctx);
  std::vector<std::string> lines;
  std::istringstream os(out);
  for (std::string l; std::getline(os, l);) lines.push_back(l);
  size_t pos = 0;                  // the next line a CHECK may match
  std::vector<std::string> nots;   // CHECK-NOTs waiting for the next match to bound them
  size_t not_from = 0;
  auto fail = [&](const std::string& why) { ADD_FAILURE() << why << "\n--- output ---\n" << out; };
  auto settle_nots = [&](size_t until) {
    for (const std::string& n : nots)
      for (size_t i = not_from; i < until && i < lines.size(); ++i)
        if (lines[i].find(n) != std::string::npos) fail("CHECK-NOT: '" + n + "' found: " + lines[i]);
    nots.clear();
  };
  for (const Check& c : checks) {
    if (c.kind == Check::Not) {
      if (nots.empty()) not_from = pos;
      nots.push_back(c.text);
      continue;
    }
    size_t found = lines.size();
    if (c.kind == Check::Next) {
      if (pos < lines.size() && lines[pos].find(c.text) != std::string::npos) found = pos;
    } else {
      for (size_t i = pos; i < lines.size() && found == lines.size(); ++i)
        if (lines[i].find(c.text) != std::string::npos) found = i;
    }
    if (found == lines.size()) {
      fail(std::string(c.kind == Check::Next ? "CHECK-NEXT" : "CHECK") + ": '" + c.text + "' not found" +
           (pos > 0 && pos <= lines.size() ? " after: " + lines[pos - 1] : ""));
      return;
    }
    settle_nots(found);
    pos = found + 1;
  }
  settle_nots(lines.size());
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

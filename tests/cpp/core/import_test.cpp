// JSON import and verifier: well-formed documents round-trip to IR text; every malformed case is a
// UserError whose message names the node and the problem (never a crash or abort).
#include <gtest/gtest.h>

#include <string>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Printer.h"

namespace hb {
namespace {

// A small training-like graph: two placeholders, a matmul, a getitem of a multi-output op, output.
std::string doc(const std::string& nodes, const std::string& extra = "", int version = 1) {
  return R"({"format": "hintbackend.graph", "version": )" + std::to_string(version) +
         R"(, "graph": {"name": "g", )" + extra + R"("nodes": [)" + nodes + "]}}";
}

const char* kTensor = R"({"tensor": {"shape": [4, 8], "stride": [8, 1], "dtype": "float32", "device": "cpu"}})";

std::string placeholder(const std::string& name) {
  return R"({"name": ")" + name + R"(", "op": "placeholder", "target": ")" + name + R"(", "val": )" + kTensor + "}";
}

std::string good_nodes() {
  return placeholder("x") + "," + placeholder("w") + "," +
         R"({"name": "mm", "op": "call_function", "target": "aten::mm.default",
             "args": [{"ref": "x"}, {"ref": "w"}], "val": )" + kTensor + R"(, "source": "model.py:3 in forward"},
            {"name": "mx", "op": "call_function", "target": "aten::max.dim",
             "args": [{"ref": "mm"}, {"int": 1}], "kwargs": {"keepdim": {"bool": false}},
             "val": {"tuple": [{"tensor": {"shape": [4], "stride": [1], "dtype": "float32", "device": "cpu"}},
                               {"tensor": {"shape": [4], "stride": [1], "dtype": "int64", "device": "cpu"}}]}},
            {"name": "getitem", "op": "call_function", "target": "operator::getitem",
             "args": [{"ref": "mx"}, {"int": 0}]},
            {"name": "mul", "op": "call_function", "target": "aten::mul.Scalar",
             "args": [{"ref": "getitem"}, {"float": "inf"}]},
            {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "mul"}, null]}]})";
}

std::string error_of(const std::string& text) {
  try {
    import_json(text);
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_ERROR(text, ...)                                          \
  do {                                                                   \
    const std::string msg = error_of(text);                              \
    for (const char* want : {__VA_ARGS__})                               \
      EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg \
                                                    << "\nwanted: " << want; \
  } while (0)

TEST(Import, WellFormedGraphPrints) {
  auto g = import_json(doc(good_nodes()));
  ASSERT_EQ(g->nodes.size(), 7u);
  EXPECT_EQ(g->nodes[2].args[0].ref, 0);
  EXPECT_EQ(g->nodes[2].source, "model.py:3 in forward");
  const std::string text = print_graph(*g);
  EXPECT_NE(text.find("%mm: f32[4, 8] = aten::mm.default(%x, %w)"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::max.dim(%mm, 1, keepdim=false)"), std::string::npos) << text;
  EXPECT_NE(text.find("%mx: (f32[4], i64[4])"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::mul.Scalar(%getitem, inf)"), std::string::npos) << text;
  EXPECT_NE(text.find("return (%mul, none)"), std::string::npos) << text;
}

TEST(Import, HintsBecomeTypedStructs) {
  auto g = import_json(doc(placeholder("x") + R"(,
      {"name": "relu", "op": "call_function", "target": "aten::relu.default", "args": [{"ref": "x"}],
       "custom": {"hintbackend": {"region": 3, "path": [1, 3], "schedule": "dfs", "slices": 16,
                                  "memory_budget": 2000000000, "kernel": "cudnn", "deterministic": true}}},
      {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "relu"}]}]})"));
  const Hints& h = g->nodes[1].hints;
  EXPECT_EQ(h.region, 3);
  EXPECT_EQ(h.path, (std::vector<int>{1, 3}));
  ASSERT_TRUE(h.schedule.has_value());
  EXPECT_EQ(*h.schedule, Schedule::DFS);
  EXPECT_EQ(h.slices.value_or(0), 16);
  EXPECT_EQ(h.memory_budget.value_or(0), 2000000000);
  EXPECT_EQ(h.kernel.value_or(KernelPref::Auto), KernelPref::Cudnn);
  EXPECT_TRUE(h.deterministic.value_or(false));
  EXPECT_NE(print_graph(*g).find("{region=3 path=1/3 schedule=dfs slices=16"), std::string::npos);
}

TEST(Verifier, NotJson) { EXPECT_ERROR("{not json", "not valid JSON"); }

TEST(Verifier, WrongSchemaVersion) {
  EXPECT_ERROR(doc(good_nodes(), "", 99), "schema version 99", "reads version 1");
}

TEST(Verifier, WrongFormat) {
  EXPECT_ERROR(R"({"format": "other", "version": 1, "graph": {}})", "format is 'other'");
}

TEST(Verifier, MissingField) {
  EXPECT_ERROR(doc(R"({"name": "x", "target": "x"})"), "node 0 ('x')", "missing field 'op'");
  EXPECT_ERROR(R"({"format": "hintbackend.graph", "version": 1})", "missing field 'graph'");
}

TEST(Verifier, WrongTypes) {
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x", "args": 3})"), "'args' must be a list");
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "r", "op": "call_function", "target": "aten::relu.default",
                                            "args": [{"int": "three"}]})"),
               "node 1 ('r')", "args[0]", "must hold an integer");
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "r", "op": "call_function", "target": "aten::relu.default",
                                            "args": [[1, 2]]})"),
               "args[0]", "an argument must be null or an object");
}

TEST(Verifier, DanglingReference) {
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "r", "op": "call_function", "target": "aten::relu.default",
                                            "args": [{"ref": "nope"}]}, {"name": "output", "op": "output", "args": [null]})"),
               "node 1 ('r')", "dangling reference to 'nope'");
}

TEST(Verifier, Cycle) {
  EXPECT_ERROR(doc(placeholder("x") + R"(,
      {"name": "a", "op": "call_function", "target": "aten::add.Tensor", "args": [{"ref": "x"}, {"ref": "b"}]},
      {"name": "b", "op": "call_function", "target": "aten::relu.default", "args": [{"ref": "a"}]},
      {"name": "output", "op": "output", "args": [null]})"),
               "node 1 ('a')", "uses 'b' before it is defined", "cycle");
  EXPECT_ERROR(doc(placeholder("x") + R"(,
      {"name": "a", "op": "call_function", "target": "aten::relu.default", "args": [{"ref": "a"}]},
      {"name": "output", "op": "output", "args": [null]})"),
               "uses 'a' before it is defined");
}

TEST(Verifier, UnknownDtype) {
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x",
                       "val": {"tensor": {"shape": [1], "stride": [1], "dtype": "float7", "device": "cpu"}}})"),
               "node 0 ('x')", "unknown dtype 'float7'");
}

TEST(Verifier, UnknownOpKindAndTarget) {
  EXPECT_ERROR(doc(R"({"name": "x", "op": "call_module", "target": "m"})"), "unknown op kind 'call_module'");
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "r", "op": "call_function", "target": "relu", "args": [{"ref": "x"}]},
                                          {"name": "output", "op": "output", "args": [null]})"),
               "%r (relu)", "not of the form namespace::name");
}

TEST(Verifier, OutputRules) {
  EXPECT_ERROR(doc(placeholder("x")), "exactly one output node, has 0");
  EXPECT_ERROR(doc(R"({"name": "output", "op": "output", "args": [null]},)" + placeholder("x")),
               "the output node must be the last node");
}

TEST(Verifier, DuplicateNames) {
  EXPECT_ERROR(doc(placeholder("x") + "," + placeholder("x")), "duplicate node name 'x'");
}

TEST(Verifier, MissingSubgraph) {
  EXPECT_ERROR(doc(placeholder("q") + R"(, {"name": "f", "op": "call_function", "target": "higher_order::flex_attention",
                                            "args": [{"ref": "q"}, {"graph": "sdpa_score0"}]},
                                           {"name": "output", "op": "output", "args": [null]})"),
               "%f (higher_order::flex_attention)", "subgraph 'sdpa_score0'");
}

TEST(Verifier, BadHints) {
  auto with_hint = [](const std::string& h) {
    return doc(placeholder("x") + R"(, {"name": "r", "op": "call_function", "target": "aten::relu.default",
              "args": [{"ref": "x"}], "custom": {"hintbackend": )" + h + R"(}},
              {"name": "output", "op": "output", "args": [null]})");
  };
  EXPECT_ERROR(with_hint(R"({"region": 0, "schedule": "fast"})"), "node 1 ('r')", "schedule='fast'", "\"bfs\"");
  EXPECT_ERROR(with_hint(R"({"region": 0, "colour": 1})"), "unknown hint 'colour'");
  EXPECT_ERROR(with_hint(R"({"region": 0, "slices": 0})"), "slices=0 must be >= 1");
  EXPECT_ERROR(with_hint(R"({"schedule": "dfs"})"), "needs a non-negative 'region'");
}

}  // namespace
}  // namespace hb

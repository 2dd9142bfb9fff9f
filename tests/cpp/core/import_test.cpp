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

// Inputs that crashed or slipped through before (issue 15): each is now an error naming where.
TEST(Verifier, DeepNestingIsRefusedNotAStackOverflow) {
  auto nest = [](const std::string& open, const std::string& core, const std::string& close) {
    std::string r;
    for (int i = 0; i < 100000; ++i) r += open;
    r += core;
    for (int i = 0; i < 100000; ++i) r += close;
    return r;
  };
  const std::string deep = nest(R"({"list": [)", R"({"int": 1})", "]}");
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "y", "op": "call_function", "target": "aten::add.Tensor",
                                            "args": [{"ref": "x"}, )" + deep + R"(]},
                                           {"name": "output", "op": "output", "args": [null]})"),
               "node 1 ('y'), args[1]", "nests deeper than 64 levels");
  const std::string val = nest(R"({"tuple": [)", R"({"int": null})", "]}");
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x", "val": )" + val + "}"),
               "node 0 ('x'), val", "nests deeper than 64 levels");
}

TEST(Verifier, FloatOutOfRangeIsAJsonError) {
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "y", "op": "call_function", "target": "aten::mul.Scalar",
                                            "args": [{"ref": "x"}, {"float": 1e400}]},
                                           {"name": "output", "op": "output", "args": [null]})"),
               "not valid JSON", "1e400");
}

TEST(Verifier, SizesOutOfRange) {
  auto with_shape = [](const std::string& shape, const std::string& stride, const char* dtype = "float32") {
    return doc(R"({"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {"shape": )" + shape +
               R"(, "stride": )" + stride + R"(, "dtype": ")" + dtype + R"(", "device": "cpu"}}},
               {"name": "output", "op": "output", "args": [null]})");
  };
  EXPECT_ERROR(with_shape("[-4]", "[1]"), "node 0 ('x'), val", "size -4 of dim 0 is out of range [0, 2^40)");
  EXPECT_ERROR(with_shape("[1099511627776]", "[1]"), "size 1099511627776 of dim 0 is out of range");
  EXPECT_ERROR(with_shape("[4, 4]", "[-4, 1]"), "stride -4 of dim 0 is out of range");
  // 2^23 x 2^23 float32 elements = 2^48 bytes: each dim is fine, the tensor is not.
  EXPECT_ERROR(with_shape("[8388608, 8388608]", "[8388608, 1]"), "holds more than 2^46 bytes");
  // Symbolic sizes are not bounded here; 0 is a size.
  EXPECT_EQ(error_of(with_shape(R"(["s0", 0])", "[1, 1]")), "<no error>");
}

// What the fuzzer found the textual IR could not read back: names, devices and symbolic sizes are
// words the IR parser reads, or the document is refused.
TEST(Verifier, NamesDevicesAndSymbolsAreWordsTheIrCanRead) {
  EXPECT_ERROR(R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "for/ward", "nodes": []}})",
               "name \"for/ward\" is not a word");
  EXPECT_ERROR(doc(R"({"name": "x y", "op": "placeholder", "target": "x"})"), "node name \"x y\" is not a word");
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {"shape": [4], "stride": [1],
                    "dtype": "float32", "device": "cp)u"}}})"),
               "device \"cp)u\" is not a device name");
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {"shape": [",0"], "stride": [1],
                    "dtype": "float32", "device": "cpu"}}})"),
               "a symbolic size expression", "\",0\"");
  EXPECT_ERROR(doc(R"({"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {"shape": ["(s0"], "stride": [1],
                    "dtype": "float32", "device": "cpu"}}})"),
               "a symbolic size expression");
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "y", "op": "call_function", "target": "aten::add.Tensor",
                   "args": [{"ref": "x"}], "kwargs": {" other": {"ref": "x"}}})"),
               "keyword \" other\" is not a word");
  // What FX writes is accepted.
  const std::string fx = R"J({"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {
      "shape": ["(s0 + 1)//2", "Max(1, s1)"], "stride": [4, 1], "dtype": "float32", "device": "cuda:0"}}},
      {"name": "output", "op": "output", "args": [null]})J";
  EXPECT_EQ(error_of(doc(fx)), "<no error>");
}

TEST(Verifier, SubgraphsCannotReferToThemselves) {
  // Subgraph names resolve among the referring graph's own subgraphs: the document is a tree, so a
  // score_mod naming itself (or its parent) names nothing.
  const std::string self = R"({"s": {"name": "s", "nodes": [
      {"name": "a", "op": "placeholder", "target": "a"},
      {"name": "c", "op": "call_function", "target": "higher_order::flex_attention", "args": [{"graph": "s"}, {"ref": "a"}]},
      {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "c"}]}]}]}},)";
  EXPECT_ERROR(doc(placeholder("x") + R"(, {"name": "y", "op": "call_function", "target": "higher_order::flex_attention",
                                            "args": [{"graph": "s"}, {"ref": "x"}]},
                                           {"name": "output", "op": "output", "args": [null]})",
                   R"("subgraphs": )" + self),
               "%c (higher_order::flex_attention) in graph 's'", "refers to subgraph 's'");
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

// The IR-text parser: every fixture round-trips (print(parse(print(g))) == print(g)), as imported and
// after the whole pipeline (slice loops, fused groups, row kernels, nested subgraphs); the pipeline gives
// the same IR on a parsed graph as on the imported one; malformed text names the line and column.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Parser.h"
#include "backend/ir/Printer.h"
#include "passes/Pipeline.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

std::vector<std::string> fixtures() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(std::string(HB_SOURCE_DIR) + "/tests/fixtures/ir"))
    if (e.path().extension() == ".json") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The IR after the whole pipeline, then the notes the passes left (their decisions: slice counts,
// the memory plan).
std::string compiled_text(Graph& g) {
  PassContext ctx;
  run_pipeline(g, ctx);
  std::string out = print_graph(g);
  for (const std::string& n : ctx.notes) out += "// note: " + n + "\n";
  return out;
}

TEST(parser, every_fixture_round_trips_imported_and_compiled) {
  const auto names = fixtures();
  ASSERT_GT(names.size(), 10u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto g = test::load_fixture(name);
    const std::string imported = print_graph(*g);
    EXPECT_EQ(print_graph(*parse_graph(imported)), imported);
    // The pipeline on the parsed graph decides what it decides on the imported one.
    auto parsed = parse_graph(imported);
    EXPECT_EQ(compiled_text(*parsed), compiled_text(*g));
    const std::string compiled = print_graph(*g);
    EXPECT_EQ(print_graph(*parse_graph(compiled)), compiled);
  }
}

TEST(parser, reads_every_argument_kind_and_annotation) {
  const std::string text =
      "graph g (inputs owned except %x) {\n"
      "  %x: f32[4, 8] = placeholder\n"
      "  %c: f32[8] = get_attr _tensor_constant0 constant#0\n"
      "  %t: f32[8, 4][1, 8] = aten::t.default(%x) !view  {region=3 path=1/3 schedule=dfs slice_dims=[0,1] "
      "slices=2 kernel=cudnn deterministic=true}\n"
      "  %d: bf16[s0, 8][8, 1]@cuda:0 = aten::_to_copy.default(%x, dtype=dtype.bfloat16, layout=layout.strided, "
      "device=device(cuda:0), memory_format=memory_format.contiguous_format)\n"
      "  %r: f32[4, 8] = aten::native_dropout.default(%x, 0.10000000000000001, true) !random\n"
      "  %f: f32[4, 8] = some::op.default(%x, [1, -2], (3,), {a: 1.0, b: \"s\"}, none, inf, -inf, nan, @sub)\n"
      "  return (%t, none)\n"
      "}\n"
      "graph sub {\n"
      "  %a: f32[] = placeholder\n"
      "  return (%a,)\n"
      "}\n";
  auto g = parse_graph(text);
  EXPECT_EQ(print_graph(*g), text);
  const Node& t = g->nodes[g->find("t")];
  EXPECT_TRUE(t.effects.is_view);
  EXPECT_EQ(t.type.tensor.stride[0].value, 1);
  EXPECT_EQ(t.hints.region, 3);
  EXPECT_EQ(t.hints.slice_dims, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(g->nodes[g->find("d")].type.tensor.shape[0].symbol, "s0");
  EXPECT_TRUE(g->nodes[g->find("r")].effects.nondeterministic_seeded);
  EXPECT_EQ(g->num_constants, 1);
  EXPECT_TRUE(g->inputs_owned && g->inputs_kept.count("x"));
  ASSERT_TRUE(g->subgraphs.count("sub"));
  EXPECT_EQ(g->nodes[g->find("f")].args[0].ref, g->find("x"));
}

// A call whose target begins with a keyword of the text (the importer takes any `ns::op` name) stays a call:
// the keywords are whole words. Found by the fuzzer: `get_attraten::view.default(%x)` came back as a get_attr.
TEST(parser, keywords_are_whole_words_not_prefixes_of_a_target) {
  const std::string text =
      "graph g {\n"
      "  %x: f32[4] = placeholder\n"
      "  %a: f32[4] = get_attraten::view.default(%x)\n"
      "  %b: f32[4] = placeholders::op.default(%a)\n"
      "  %c: f32[4] = returns::op.default(%b)\n"
      "  return (%c,)\n"
      "}\n";
  auto g = parse_graph(text);
  EXPECT_EQ(print_graph(*g), text);
  for (const char* name : {"a", "b", "c"}) {
    const Node& n = g->nodes[g->find(name)];
    EXPECT_EQ(n.op, OpKind::CallFunction) << name;
    ASSERT_EQ(n.args.size(), 1u) << name;
  }
  EXPECT_EQ(g->nodes[g->find("a")].target, "get_attraten::view.default");
}

TEST(parser, reads_symbolic_sizes_as_written) {
  // Sizes are expressions (commas and parentheses inside them are theirs); a symbolic shape printed
  // without strides has none recorded, and parses to none.
  const std::string text =
      "graph g {\n"
      "  %x: f32[s0, 4] = placeholder\n"
      "  %n: symint(Max(1, (s0//2))) = aten::sym_size.int(%x, 0)\n"
      "  %y: f32[Max(1, s0), 4][4, 1] = aten::relu.default(%x)\n"
      "  return (%y, %n)\n"
      "}\n";
  auto g = parse_graph(text);
  EXPECT_EQ(print_graph(*g), text);
  EXPECT_EQ(g->nodes[g->find("n")].type.symbol, "Max(1, (s0//2))");
  EXPECT_EQ(g->nodes[g->find("y")].type.tensor.shape[0].symbol, "Max(1, s0)");
  EXPECT_TRUE(g->nodes[g->find("x")].type.tensor.stride.empty());
}

TEST(parser, errors_name_the_line_and_column) {
  auto error_of = [](const std::string& text) {
    try {
      parse_graph(text);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect_error = [&](const std::string& text, const std::string& message) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find(message), std::string::npos) << "expected '" << message << "' in:\n" << e;
  };
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %y: q32[4] = aten::relu.default(%x)\n}\n",
               "line 3, column 7: expected a type");
  // A reference to a node not defined above, and a later one (FX order is topological).
  expect_error("graph g {\n  %y: f32[4] = aten::relu.default(%ghost)\n  return (%y,)\n}\n",
               "line 2, column 35: expected a value defined on an earlier line of this graph, got '%ghost)");
  expect_error("graph g {\n  %y: f32[4] = aten::relu.default(%z)\n  %z: f32[4] = placeholder\n}\n",
               "line 2, column 35: expected a value defined on an earlier line");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %x: f32[4] = placeholder\n}\n",
               "line 3, column 3: expected a new name (%x is defined above)");
  expect_error("graph g {\n  %x: f32[4, 2][1] = placeholder\n}\n", "line 2, column 16: expected as many strides");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %y: f32[4] = aten::relu.default(%x)  {region=0 path=0 "
               "schedule=dfz}\n}\n",
               "line 3, column 66: expected bfs, dfs or auto for hint 'schedule', got 'dfz}'");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %y: f32[4] = aten::relu.default(%x)  {region=0 path=0 "
               "slice_dims=[0,b]}\n}\n",
               "line 3, column 68: expected [dim,dim,...] for hint 'slice_dims'");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %y: f32[4] = aten::relu.default(%x)  {region=0 colour=red}\n}\n",
               "line 3, column 50: expected a hint (region, path");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n  %y: f32[4] = aten::to.dtype(%x, dtype.float33)\n}\n",
               "line 3, column 41: expected a dtype name");
  expect_error("graph g {\n  %x: f32[4] = placeholder extra\n}\n", "line 2, column 28: expected the end of the line");
  expect_error("  // only a comment\n%x: f32[4] = placeholder\n", "line 2, column 1: expected 'graph'");
  expect_error("graph g {\n  %x: f32[4] = placeholder\n", "line 1: graph g has no closing '}'");
  expect_error("graph g {\n  return ()\n}\ngraph a/b {\n  return ()\n}\n",
               "line 4: graph a/b belongs to graph a, which is not printed");
}

}  // namespace
}  // namespace hb

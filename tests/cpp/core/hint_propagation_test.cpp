// hint_propagation.*: hints from hinted_context regions go JSON -> hb::Hints -> IR text, and the
// hint-propagation pass checks them against the graph (docs/hints.md).
#include <gtest/gtest.h>

#include <string>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/GraphEdit.h"
#include "backend/ir/Printer.h"
#include "passes/HintPropagation.h"
#include "passes/Pipeline.h"

namespace hb {
namespace {

// A tensor 'val' of the given shape (contiguous strides, f32, cpu).
std::string tensor(const std::vector<int>& shape) {
  std::string s = "{\"tensor\": {\"shape\": [", st = "[";
  int stride = 1;
  std::vector<int> strides(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) strides[i] = stride, stride *= shape[i];
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
    st += (i ? ", " : "") + std::to_string(strides[i]);
  }
  return s + "], \"stride\": " + st + "], \"dtype\": \"float32\", \"device\": \"cpu\"}}";
}

std::string doc(const std::string& nodes) {
  return R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "forward", "nodes": [)" + nodes + "]}}";
}

std::string placeholder(const std::string& name, const std::vector<int>& shape) {
  return R"({"name": ")" + name + R"(", "op": "placeholder", "val": )" + tensor(shape) + "}";
}

std::string call(const std::string& name, const std::string& target, const std::vector<std::string>& inputs,
                 const std::string& val, const std::string& hints = "") {
  std::string args;
  for (size_t i = 0; i < inputs.size(); ++i) args += std::string(i ? ", " : "") + R"({"ref": ")" + inputs[i] + "\"}";
  std::string s = R"({"name": ")" + name + R"(", "op": "call_function", "target": ")" + target + R"(", "args": [)" +
                  args + R"(], "val": )" + val;
  if (!hints.empty()) s += R"(, "custom": {"hintbackend": )" + hints + "}";
  return s + "}";
}

std::string output(const std::vector<std::string>& results) {
  std::string items;
  for (size_t i = 0; i < results.size(); ++i) items += std::string(i ? ", " : "") + R"({"ref": ")" + results[i] + "\"}";
  return R"({"name": "output", "op": "output", "args": [{"tuple": [)" + items + "]}]}";
}

std::string run(Graph& g) {
  PassContext ctx;
  ctx.verify_each = true;
  run_passes(g, {"hint-propagation"}, ctx);
  return print_graph(g);
}

// The message of the UserError the pass raises.
std::string error_of(Graph& g) {
  try {
    run(g);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr const char* kOuter = R"({"region": 0, "path": [0], "schedule": "dfs", "slices": 4, "slice_dims": [0, 1]})";
constexpr const char* kInner =
    R"({"region": 1, "path": [0, 1], "schedule": "bfs", "slices": 4, "slice_dims": [0, 1], "kernel": "cudnn", "deterministic": true})";

// q, k: [2, 4, 16, 8]; region 0 = {mm, softmax}, region 1 nested inside it = {mul}; cos outside.
std::string nested_doc() {
  return doc(placeholder("q", {2, 4, 16, 8}) + ", " + placeholder("k", {2, 4, 16, 8}) + ", " +
             call("mm", "aten::matmul.default", {"q", "k"}, tensor({2, 4, 16, 16}), kOuter) + ", " +
             call("mul", "aten::mul.Tensor", {"mm", "mm"}, tensor({2, 4, 16, 16}), kInner) + ", " +
             call("softmax", "aten::_softmax.default", {"mul"}, tensor({2, 4, 16, 16}), kOuter) + ", " +
             call("cos", "aten::cos.default", {"softmax"}, tensor({2, 4, 16, 16})) + ", " + output({"cos"}));
}

TEST(hint_propagation, json_import_gives_typed_hints) {
  auto g = import_json(nested_doc());
  const Hints& outer = g->nodes[g->find("mm")].hints;
  EXPECT_EQ(outer.region, 0);
  EXPECT_EQ(outer.path, std::vector<int>({0}));
  EXPECT_EQ(outer.schedule, Schedule::DFS);
  EXPECT_EQ(outer.slices, 4);
  EXPECT_EQ(outer.slice_dims, std::vector<int64_t>({0, 1}));
  EXPECT_FALSE(outer.kernel.has_value());
  const Hints& inner = g->nodes[g->find("mul")].hints;
  EXPECT_EQ(inner.region, 1);
  EXPECT_EQ(inner.path, std::vector<int>({0, 1}));
  EXPECT_EQ(inner.schedule, Schedule::BFS);
  EXPECT_EQ(inner.kernel, KernelPref::Cudnn);
  EXPECT_EQ(inner.deterministic, true);
  EXPECT_TRUE(g->nodes[g->find("cos")].hints.empty());
  EXPECT_TRUE(g->nodes[g->find("q")].hints.empty());
}

TEST(hint_propagation, printer_shows_regions_and_pass_keeps_them) {
  auto g = import_json(nested_doc());
  const std::string before = print_graph(*g);
  EXPECT_NE(before.find("%mm: f32[2, 4, 16, 16] = aten::matmul.default(%q, %k)  {region=0 path=0 schedule=dfs "
                        "slice_dims=[0,1] slices=4}"),
            std::string::npos)
      << before;
  EXPECT_NE(before.find("= aten::mul.Tensor(%mm, %mm)  {region=1 path=0/1 schedule=bfs slice_dims=[0,1] slices=4 "
                        "kernel=cudnn deterministic=true}"),
            std::string::npos)
      << before;
  EXPECT_NE(before.find("%cos: f32[2, 4, 16, 16] = aten::cos.default(%softmax)\n"), std::string::npos) << before;
  // Valid hints: the pass checks them and changes nothing.
  EXPECT_EQ(run(*g), before);
}

TEST(hint_propagation, memory_budget_round_trips) {
  auto g = import_json(doc(placeholder("x", {4, 8}) + ", " +
                           call("relu", "aten::relu.default", {"x"}, tensor({4, 8}),
                                R"({"region": 5, "path": [5], "schedule": "auto", "memory_budget": 4000000000})") +
                           ", " + output({"relu"})));
  EXPECT_EQ(g->nodes[1].hints.memory_budget, 4000000000LL);
  EXPECT_NE(run(*g).find("{region=5 path=5 schedule=auto memory_budget=4000000000}"), std::string::npos);
}

TEST(hint_propagation, getitem_of_hinted_tuple_inherits_hints) {
  const std::string tuple_val = R"({"tuple": [)" + tensor({2, 4, 16, 8}) + ", " + tensor({2, 4, 16}) + "]}";
  std::string nodes = placeholder("q", {2, 4, 16, 8}) + ", " +
                      call("attn", "higher_order::flex_attention", {"q", "q", "q"}, tuple_val, kOuter) + ", " +
                      R"({"name": "getitem", "op": "call_function", "target": "operator::getitem", "args": [{"ref": "attn"}, {"int": 0}], "val": )" +
                      tensor({2, 4, 16, 8}) + "}, " + output({"getitem"});
  auto g = import_json(doc(nodes));
  EXPECT_TRUE(g->nodes[g->find("getitem")].hints.empty());
  PassContext ctx;
  EXPECT_TRUE(hint_propagation(*g, ctx));  // changed: it filled the getitem
  EXPECT_EQ(g->nodes[g->find("getitem")].hints, g->nodes[g->find("attn")].hints);
  EXPECT_NE(print_graph(*g).find("operator::getitem(%attn, 0)  {region=0 path=0"), std::string::npos);
  EXPECT_FALSE(hint_propagation(*g, ctx));  // nothing left to fill
}

TEST(hint_propagation, nodes_a_pass_inserts_keep_their_region) {
  auto g = import_json(nested_doc());
  Node copy;
  copy.name = "mul_clone";
  copy.target = "aten::clone.default";
  copy.args.push_back(Arg::of_ref(g->find("mul"), "mul"));
  copy.type = g->nodes[g->find("mul")].type;
  const int like = g->find("mul");
  const int at = insert_node_like(*g, like + 1, copy, like);
  EXPECT_EQ(g->nodes[at].hints, g->nodes[like].hints);
  EXPECT_NE(run(*g).find("aten::clone.default(%mul)  {region=1 path=0/1"), std::string::npos);
  // A node that already has hints keeps its own.
  Node own = g->nodes[g->find("cos")];
  own.name = "cos2";
  own.hints.region = 9;
  own.hints.path = {9};
  inherit_hints(own, g->nodes[g->find("mm")]);
  EXPECT_EQ(own.hints.region, 9);
}

TEST(hint_propagation, lower_rank_inputs_and_size_one_broadcast_are_not_slice_errors) {
  const char* hints = R"({"region": 2, "path": [2], "slice_dims": [0]})";
  auto g = import_json(doc(placeholder("x", {8, 16, 32}) + ", " + placeholder("w", {32, 32}) + ", " +
                           placeholder("bias", {1, 16, 32}) + ", " +
                           call("mm", "aten::matmul.default", {"x", "w"}, tensor({8, 16, 32}), hints) + ", " +
                           call("add", "aten::add.Tensor", {"mm", "bias"}, tensor({8, 16, 32}), hints) + ", " +
                           output({"add"})));
  EXPECT_NO_THROW(run(*g));
}

TEST(hint_propagation, lower_rank_results_are_shared_not_slice_errors) {
  // A backward region: the per-slice gradient leaves it with the slice dims, and so does the gradient
  // of a buffer every slice reads (FlexAttention's learned bias lb[q - kv + S - 1, h]: f32[63, 2]),
  // summed over the slices. The buffer's gradient is not a sliced value: no error.
  const char* hints = R"({"region": 5, "path": [5], "slice_dims": [0, 1], "schedule": "dfs"})";
  auto g = import_json(doc(placeholder("dout", {2, 2, 32, 16}) + ", " + placeholder("lb", {63, 2}) + ", " +
                           call("dq", "aten::mul.Tensor", {"dout", "dout"}, tensor({2, 2, 32, 16}), hints) + ", " +
                           call("dlb", "aten::mul.Tensor", {"lb", "lb"}, tensor({63, 2}), hints) + ", " +
                           output({"dq", "dlb"})));
  EXPECT_NO_THROW(run(*g));
}

TEST(hint_propagation, error_slice_dim_missing_names_region_and_node) {
  const char* hints = R"({"region": 3, "path": [0, 3], "slice_dims": [0, 2]})";
  auto g = import_json(doc(placeholder("x", {8, 16, 4}) + ", " +
                           call("sum", "aten::sum.dim_IntList", {"x"}, tensor({8, 16}), hints) + ", " +
                           output({"sum"})));
  const std::string e = error_of(*g);
  EXPECT_NE(e.find("region 3 (path 0/3): slice_dims=[0,2] but %sum (aten::sum.dim_IntList) in graph 'forward', a "
                   "tensor leaving the region, is f32[8, 16] and has no dim 2"),
            std::string::npos)
      << e;
}

TEST(hint_propagation, error_slice_sizes_differ) {
  const char* hints = R"({"region": 4, "path": [4], "slice_dims": [0]})";
  auto g = import_json(doc(placeholder("a", {8, 16}) + ", " + placeholder("b", {4, 16}) + ", " +
                           call("ra", "aten::relu.default", {"a"}, tensor({8, 16}), hints) + ", " +
                           call("rb", "aten::relu.default", {"b"}, tensor({4, 16}), hints) + ", " +
                           output({"ra", "rb"})));
  const std::string e = error_of(*g);
  EXPECT_NE(e.find("region 4 (path 4): slice dim 0 has size 8 on %ra (aten::relu.default) in graph 'forward' but 4 "
                   "on %rb (aten::relu.default)"),
            std::string::npos)
      << e;
}

TEST(hint_propagation, error_region_nodes_disagree) {
  auto g = import_json(doc(placeholder("x", {4}) + ", " +
                           call("a", "aten::relu.default", {"x"}, tensor({4}), R"({"region": 6, "path": [6], "schedule": "dfs"})") +
                           ", " +
                           call("b", "aten::relu.default", {"a"}, tensor({4}), R"({"region": 6, "path": [6], "schedule": "bfs"})") +
                           ", " + output({"b"})));
  const std::string e = error_of(*g);
  EXPECT_NE(e.find("conflicting hints for region 6: %a (aten::relu.default) in graph 'forward' has {region=6 path=6 "
                   "schedule=dfs} but %b (aten::relu.default) in graph 'forward' has {region=6 path=6 schedule=bfs}"),
            std::string::npos)
      << e;
}

TEST(hint_propagation, error_path_not_ending_in_region) {
  auto one = [](const std::string& hints) {
    return import_json(doc(placeholder("x", {4}) + ", " + call("a", "aten::relu.default", {"x"}, tensor({4}), hints) +
                           ", " + output({"a"})));
  };
  // (Not both slices and slice_size, memory_budget only with auto: hoo/hints.py's rules, checked at the
  // hinted_context call, tests/python/test_hinted_validation.py; not this pass's.)
  auto g = one(R"({"region": 9, "path": [2, 3]})");
  const std::string e = error_of(*g);
  EXPECT_NE(e.find("region 9 (path 2/3) on %a (aten::relu.default) in graph 'forward': the path must end in the "
                   "region's own id 9"),
            std::string::npos)
      << e;
}

TEST(hint_propagation, sits_in_the_pipeline_after_dce) {
  const auto& p = pipeline();
  int dce = -1, hints = -1;
  for (int i = 0; i < static_cast<int>(p.size()); ++i) {
    if (std::string(p[i].name) == "dead-code-elimination") dce = i;
    if (std::string(p[i].name) == "hint-propagation") hints = i;
  }
  ASSERT_GE(hints, 0);
  EXPECT_LT(dce, hints);
  EXPECT_EQ(find_pass("hint-propagation")->run, &hint_propagation);
}

}  // namespace
}  // namespace hb

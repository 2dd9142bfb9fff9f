// row-softmax-fusion: IR-text tests on the attention fixtures (tests/fixtures/ir/make_fixtures.py), and
// the chains it must leave alone.
#include <gtest/gtest.h>

#include <string>

#include "passes/RowSoftmaxFusion.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

std::string fuse(const std::string& fixture, PassContext& ctx) {
  auto g = test::load_fixture(fixture);
  return test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
}

bool has(const std::string& text, const std::string& s) { return text.find(s) != std::string::npos; }

// A BFS training forward saves the float32 softmax and reads its bf16 copy: one call for both.
TEST(row_softmax_fusion, forward_that_saves_the_softmax_gets_both_results) {
  PassContext ctx;
  const std::string ir = fuse("attention_bf16_saves.json", ctx);
  test::check_lines(ir, {
      "%_unsafe_view_1: bf16[2, 4, 8, 8] = aten::_unsafe_view.default(%bmm, [2, 4, 8, 8])",
      "%_softmax_rows: (f32[2, 4, 8, 8], bf16[2, 4, 8, 8]) = "
      "hintbackend::row_softmax2.default(%_unsafe_view_1, 0.35355339059327379)  {region=0",
      "%_softmax: f32[2, 4, 8, 8] = operator::getitem(%_softmax_rows, 0)",
      "%convert_element_type_1: bf16[2, 4, 8, 8] = operator::getitem(%_softmax_rows, 1)",
      "%bmm_1: bf16[8, 8, 8] = aten::bmm.default(%view_2, %view_3)",
      "%detach: f32[2, 4, 8, 8] = aten::detach.default(%_softmax)",
      "return (%_unsafe_view_2, %detach)",
      "// note: row-softmax-fusion graph forward: %_softmax_rows = row_softmax2(%_unsafe_view_1) from %mul "
      "%convert_element_type %_softmax %convert_element_type_1",
  });
  EXPECT_FALSE(has(ir, "aten::mul.Tensor")) << ir;
  EXPECT_FALSE(has(ir, "%convert_element_type:")) << ir;
}

// The backward reading a saved softmax: upcast, gradient, downcast and the scale's mul in one call.
TEST(row_softmax_fusion, backward_reads_the_saved_softmax) {
  PassContext ctx;
  const std::string ir = fuse("attention_bf16_backward.json", ctx);
  test::check_lines(ir, {
      "%_softmax: f32[2, 4, 8, 8] = placeholder",
      "%view_5: bf16[2, 4, 8, 8] = aten::view.default(%bmm_3, [2, 4, 8, 8])",
      "%mul_1: bf16[2, 4, 8, 8] = hintbackend::row_softmax_backward.default(%view_5, %_softmax, "
      "0.35355339059327379, dtype.bfloat16)",
      "%view_6: bf16[8, 8, 8] = aten::view.default(%mul_1, [8, 8, 8])",
  });
  EXPECT_FALSE(has(ir, "prims::convert_element_type")) << ir;
  EXPECT_FALSE(has(ir, "_softmax_backward_data.default")) << ir;
}

// A backward that recomputes the softmax (a DFS body): the gradient's kernel recomputes it from the
// scores, so the float32 softmax and its detach go. Nothing else reads the scores or the gradient, so
// the kernel overwrites them with ds and the bf16 probabilities, which become an alias of the scores
// read after it (dv's bmm_2, and here the forward's bmm_1).
TEST(row_softmax_fusion, recomputed_softmax_is_recomputed_in_the_gradient_kernel) {
  PassContext ctx;
  const std::string ir = fuse("attention_bf16_recompute.json", ctx);
  test::check_lines(ir, {
      "%bmm_3: bf16[8, 8, 8] = aten::bmm.default(%view_4, %transpose_2)",
      "%mul_1: bf16[2, 4, 8, 8] = hintbackend::row_softmax_recompute_backward_.default(%view_5, %_unsafe_view_1, "
      "0.35355339059327379, 0.35355339059327379) !mutates",
      "%convert_element_type_1: bf16[2, 4, 8, 8] = aten::alias.default(%_unsafe_view_1) !view",
      "%bmm_1: bf16[8, 8, 8] = aten::bmm.default(%view_2, %view_3)",
      "%bmm_2: bf16[8, 8, 8] = aten::bmm.default(%transpose_1, %view_4)",
      "// note: row-softmax-fusion graph backward: %mul_1 = row_softmax_recompute_backward(%view_5, "
      "%_unsafe_view_1) from %convert_element_type_2 %_softmax_backward_data %convert_element_type_3 %mul_1",
      "// note: row-softmax-fusion graph backward: %convert_element_type_1 = row_softmax(%_unsafe_view_1) from "
      "%mul %convert_element_type %_softmax %convert_element_type_1",
      "// note: row-softmax-fusion graph backward: %mul_1 = row_softmax_recompute_backward_(%view_5, "
      "%_unsafe_view_1) overwrites them with ds and %convert_element_type_1 (P, now an alias of %_unsafe_view_1)",
  });
  for (const char* gone : {"%_softmax:", "%detach:", "aten::mul.Tensor", "_softmax_backward_data.default",
                           "hintbackend::row_softmax.default"})
    EXPECT_FALSE(has(ir, gone)) << gone << "\n" << ir;
}

// Scores another node reads later (here: the graph returns them) must not be overwritten.
TEST(row_softmax_fusion, scores_read_elsewhere_are_not_overwritten) {
  auto g = test::load_fixture("attention_bf16_recompute.json");
  Node& out = g->nodes[g->output_node()];
  out.args[0].items.push_back(Arg::of_ref(g->find("_unsafe_view_1"), "_unsafe_view_1"));
  PassContext ctx;
  const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
  EXPECT_TRUE(has(ir, "hintbackend::row_softmax.default")) << ir;
  EXPECT_TRUE(has(ir, "hintbackend::row_softmax_recompute_backward.default")) << ir;
  EXPECT_FALSE(has(ir, "!mutates")) << ir;
}

// The probabilities feed the gradient (here: the grad is computed from them), so the kernels stay apart.
TEST(row_softmax_fusion, probabilities_that_feed_the_gradient_are_not_merged) {
  auto g = test::load_fixture("attention_bf16_recompute.json");
  // bmm_3 (dP) reads the probabilities' view instead of dO: dP now depends on P.
  Node& dp = g->nodes[g->find("bmm_3")];
  dp.args[0] = Arg::of_ref(g->find("view_2"), "view_2");
  dp.args[1] = Arg::of_ref(g->find("view_2"), "view_2");
  PassContext ctx;
  const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
  EXPECT_TRUE(has(ir, "hintbackend::row_softmax.default")) << ir;
  EXPECT_TRUE(has(ir, "hintbackend::row_softmax_recompute_backward.default")) << ir;
  EXPECT_FALSE(has(ir, "row_softmax_recompute_backward_")) << ir;
}

// float32 attention: the float32-to-float32 casts are absorbed; no low-precision result.
TEST(row_softmax_fusion, float32_chains_and_slice_bodies) {
  PassContext ctx;
  auto g = test::load_fixture("attention_backward_dfs.json");
  const std::string ir = test::run_and_print(*g, {"slice-legality", "slice-schedule", "row-softmax-fusion"}, ctx);
  test::check_lines(ir, {
      "graph slice_body_0 {",
      "%mul_1: f32[1, 2, 8, 8] = hintbackend::row_softmax_backward.default(%view_5, %_softmax, 0.5, dtype.float32)",
  });
  EXPECT_FALSE(has(ir, "prims::convert_element_type")) << ir;
  PassContext fw;
  const std::string ir2 = fuse("attention_bfs.json", fw);
  test::check_lines(ir2, {"%_softmax: f32[2, 4, 8, 8] = hintbackend::row_softmax.default(%_unsafe_view_1, 0.5, "
                          "dtype.float32)",
                          "prims::convert_element_type.default(%_softmax, dtype.float32)"});
}

// Editing one node of the recompute fixture each time: what must stop the chain (or part of it).
TEST(row_softmax_fusion, leaves_what_it_cannot_fuse) {
  {  // a softmax over another dim
    auto g = test::load_fixture("attention_bf16_saves.json");
    g->nodes[g->find("_softmax")].args[1].i = 2;
    PassContext ctx;
    const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
    EXPECT_TRUE(ctx.notes.empty()) << ir;
  }
  {  // the scaled scores are read elsewhere too: the mul stays, the chain starts after it
    auto g = test::load_fixture("attention_bf16_saves.json");
    Node& out = g->nodes[g->output_node()];
    out.args[0].items.push_back(Arg::of_ref(g->find("mul"), "mul"));
    PassContext ctx;
    const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
    test::check_lines(ir, {"%mul: bf16[2, 4, 8, 8] = aten::mul.Tensor(%_unsafe_view_1, 0.35355339059327379)",
                           "hintbackend::row_softmax2.default(%mul, none)"});
  }
  {  // a bf16 gradient whose float32 result is not cast back: the kernel's one dtype does not hold
    auto g = test::load_fixture("attention_bf16_backward.json");
    const int sbd = g->find("_softmax_backward_data");
    Node& down = g->nodes[g->find("convert_element_type_3")];
    down.target = "aten::neg.default";  // no longer a cast
    down.args.resize(1);
    down.type = g->nodes[sbd].type;
    PassContext ctx;
    const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
    EXPECT_TRUE(has(ir, "aten::_softmax_backward_data.default")) << ir;
  }
  {  // another region's cast does not join
    auto g = test::load_fixture("attention_bf16_backward.json");
    g->nodes[g->find("mul_1")].hints.region = 7;
    PassContext ctx;
    const std::string ir = test::run_and_print(*g, {"row-softmax-fusion"}, ctx);
    test::check_lines(ir, {"%convert_element_type_3: bf16[2, 4, 8, 8] = hintbackend::row_softmax_backward.default("
                           "%view_5, %_softmax, none, dtype.bfloat16)",
                           "%mul_1: bf16[2, 4, 8, 8] = aten::mul.Tensor(%convert_element_type_3, 0.35355339059327379)"});
  }
}

}  // namespace
}  // namespace hb

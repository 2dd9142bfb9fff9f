// slice-schedule: IR-text tests (input document, pass by name, CHECK lines in order), the slice_loop
// contract, the slice-count hints, and the auto chooser (fits a budget; errors on an impossible one).
#include <gtest/gtest.h>

#include "tests/cpp/core/IrTestUtil.h"

#include <fstream>
#include <sstream>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Printer.h"
#include "backend/ir/Verifier.h"
#include "codegen/TargetModel.h"
#include "passes/ArenaAllocator.h"
#include "passes/HeapSimulator.h"
#include "passes/MemoryPlan.h"
#include "passes/SliceSchedule.h"

namespace hb {

// The planner with every value placeable and no workspaces: the target is part of the input.
const MemoryPlanOptions kEveryValue{};
namespace {

std::shared_ptr<Graph> load(const std::string& name) { return test::load_fixture(name); }

void set_hints(Graph& g, const std::function<void(Hints&)>& f) {
  for (Node& n : g.nodes)
    if (!n.hints.empty()) f(n.hints);
}

using test::check_lines;

std::string run(Graph& g, const std::vector<std::string>& passes, PassContext& ctx) {
  return test::run_and_print(g, passes, ctx);
}

TEST(slice_schedule, efficient_attention_seed_and_offset_leave_the_loop_replicated) {
  auto g = load("sdpa_efficient_dfs.json");
  PassContext ctx;
  const std::string ir = run(*g, {"slice-schedule"}, ctx);
  check_lines(ir, {
      "hintbackend::slice_loop(@slice_body_0, [%q, %k, %v], in_dims=[0, 0, 0], in_ndims=[2, 2, 2], slices=4, "
      "extent=8, out_dims=[0, -1, -1, 0], out_ndims=[2, 0, 0, 2])",
      "%getitem_1: f32[2, 4, 32] = operator::getitem(%slice_loop_0, 0)",
      "%getitem_2: i64[] = operator::getitem(%slice_loop_0, 1)",
      "%getitem_3: i64[] = operator::getitem(%slice_loop_0, 2)",
      "%relu: f32[2, 4, 8, 4] = operator::getitem(%slice_loop_0, 3)",
      "graph slice_body_0 {",
      "aten::_scaled_dot_product_efficient_attention.default(%q, %k, %v, none, true, 0.0, false)",
  });
}

TEST(slice_schedule, dfs_attention_becomes_one_loop) {
  auto g = load("attention_dfs.json");
  PassContext ctx;
  const std::string ir = run(*g, {"slice-schedule"}, ctx);
  check_lines(ir, {
      "graph forward {",
      "%slice_loop_0: (f32[2, 4, 8, 4]) = hintbackend::slice_loop(@slice_body_0, [%k, %q, %v], in_dims=[0, 0, 0], "
      "in_ndims=[2, 2, 2], slices=4, extent=8, out_dims=[0], out_ndims=[2])",
      "%_unsafe_view_2: f32[2, 4, 8, 4] = operator::getitem(%slice_loop_0, 0)",
      "%sum_1: f32[2, 8, 4] = aten::sum.dim_IntList(%_unsafe_view_2, [1])",
      "return (%_unsafe_view_2, %sum_1)",
      "graph slice_body_0 {",
      "%k: f32[1, 2, 8, 4][128, 32, 4, 1] = placeholder",  // a view of slice i: the full tensor's strides
      "%view: f32[2, 8, 4] = aten::view.default(%expand, [2, 8, 4]) !view",
      "%bmm: f32[2, 8, 8] = aten::bmm.default(%view, %_unsafe_view)",
      "%_softmax: f32[1, 2, 8, 8] = aten::_softmax.default(%convert_element_type, -1, false)",
      "%_unsafe_view_2: f32[1, 2, 8, 4] = aten::_unsafe_view.default(%bmm_1, [1, 2, 8, 4])",
      "return (%_unsafe_view_2,)",
      "// note: slice-schedule region 0: dfs with slices=4 of extent 8 (slices hint)",
  });
  EXPECT_EQ(ir.find("%bmm: f32[8, 8, 8]"), std::string::npos) << "the full-size scores must be gone";
}

TEST(slice_schedule, bfs_leaves_the_region_alone) {
  auto g = load("attention_bfs.json");
  const std::string before = print_graph(*g);
  PassContext ctx;
  ctx.verify_each = true;
  run_passes(*g, {"slice-schedule"}, ctx);
  EXPECT_EQ(print_graph(*g), before);
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_EQ(ctx.notes[0], "slice-schedule region 0: bfs, left as is");
}

TEST(slice_schedule, backward_region_is_sliced_the_same_way) {
  auto g = load("attention_backward_dfs.json");
  PassContext ctx;
  const std::string ir = run(*g, {"slice-schedule"}, ctx);
  check_lines(ir, {
      "hintbackend::slice_loop(@slice_body_0, [%tangents_1, %view_2, %view_3, %_softmax, %view, %_unsafe_view], "
      "in_dims=[0, 0, 0, 0, 0, 0], in_ndims=[2, 1, 1, 2, 1, 1], slices=4, extent=8, out_dims=[0, 0, 0], "
      "out_ndims=[2, 2, 2])",
      "%view_7: f32[2, 4, 8, 4] = operator::getitem(%slice_loop_0, 0)",
      "graph slice_body_0 {",
      "%view_2: f32[2, 8, 8] = placeholder",
      "%_softmax_backward_data: f32[1, 2, 8, 8] = aten::_softmax_backward_data.default",
      "return (%view_7, %transpose_5, %view_9)",
  });
}

// The contract the runtime implements (SliceSchedule.h), checked on every fixture that slices.
TEST(slice_schedule, loop_node_contract) {
  for (const char* f : {"attention_dfs.json", "attention_backward_dfs.json", "sdpa_dfs.json", "sdpa_efficient_dfs.json",
                        "flex_dfs.json"}) {
    SCOPED_TRACE(f);
    auto g = load(f);
    PassContext ctx;
    ASSERT_TRUE(slice_schedule(*g, ctx));
    verify(*g);
    int loops = 0;
    for (int i = 0; i < static_cast<int>(g->nodes.size()); ++i) {
      const Node& n = g->nodes[i];
      if (n.target != kSliceLoopTarget) continue;
      ++loops;
      const SliceLoopArgs a = slice_loop_args(n);
      ASSERT_TRUE(g->subgraphs.count(a.body));
      const Graph& body = *g->subgraphs.at(a.body);
      ASSERT_EQ(a.in_dims.size(), a.inputs.size());
      ASSERT_EQ(a.in_ndims.size(), a.inputs.size());
      EXPECT_GE(a.slices, 2);
      EXPECT_EQ(a.extent % a.slices, 0);
      // Placeholders: one per input, in order; sliced ones have the box of slice 0 in their group dims.
      const auto ph = body.placeholders();
      ASSERT_EQ(ph.size(), a.inputs.size());
      for (size_t j = 0; j < a.inputs.size(); ++j) {
        const ValueType& full = g->nodes[a.inputs[j]].type;
        const ValueType& part = body.nodes[ph[j]].type;
        EXPECT_EQ(body.nodes[ph[j]].name, g->nodes[a.inputs[j]].name);
        if (a.in_dims[j] < 0) {
          EXPECT_EQ(a.in_ndims[j], 0);
          EXPECT_EQ(to_string(part), to_string(full));
          continue;
        }
        std::vector<int64_t> grp;
        int64_t e = 1;
        for (int64_t d = a.in_dims[j]; d < a.in_dims[j] + a.in_ndims[j]; ++d) {
          grp.push_back(full.tensor.shape[d].value);
          e *= grp.back();
        }
        EXPECT_EQ(e, a.extent);
        auto box = slice_box(grp, a.slices, 0);
        ASSERT_TRUE(box.has_value());
        for (size_t d = 0; d < full.tensor.shape.size(); ++d) {
          const int64_t k = static_cast<int64_t>(d) - a.in_dims[j];
          const int64_t want = (k >= 0 && k < a.in_ndims[j]) ? (*box)[k].length : full.tensor.shape[d].value;
          EXPECT_EQ(part.tensor.shape[d].value, want) << "input " << j << " dim " << d;
        }
      }
      // Results: one per getitem, full types on the loop, box types returned by the body.
      ASSERT_EQ(n.type.kind, ValueType::Kind::Tuple);
      ASSERT_EQ(a.out_dims.size(), n.type.elems.size());
      const Node& ret = body.nodes[body.output_node()];
      ASSERT_EQ(ret.args[0].items.size(), n.type.elems.size());
      for (size_t k = 0; k < n.type.elems.size(); ++k) {
        const Node& gi = g->nodes[i + 1 + k];
        if (a.out_dims[k] < 0) {  // replicated: a 0-dim value (attention's RNG seed/offset), taken from slice 0
          EXPECT_EQ(a.out_ndims[k], 0);
          EXPECT_TRUE(n.type.elems[k].tensor.shape.empty()) << "result " << k << " is whole but not 0-dim";
          continue;
        }
        EXPECT_EQ(gi.target, "operator::getitem");
        EXPECT_EQ(gi.args[1].i, static_cast<int64_t>(k));
        const TensorType& full = n.type.elems[k].tensor;
        const TensorType& part = body.nodes[ret.args[0].items[k].ref].type.tensor;
        int64_t full_n = 1, part_n = 1;
        for (const Dim& d : full.shape) full_n *= d.value;
        for (const Dim& d : part.shape) part_n *= d.value;
        EXPECT_EQ(part_n * a.slices, full_n) << "result " << k;
      }
    }
    EXPECT_EQ(loops, 1);
  }
}

TEST(slice_schedule, slice_count_hints) {
  {  // slice_size: extent / size slices
    auto g = load("attention_dfs.json");
    set_hints(*g, [](Hints& h) { h.slices.reset(); h.slice_size = 2; });
    PassContext ctx;
    slice_schedule(*g, ctx);
    EXPECT_EQ(slice_loop_args(g->nodes[g->find("slice_loop_0")]).slices, 4);
  }
  {  // plain dfs: one batch x head at a time
    auto g = load("attention_dfs.json");
    set_hints(*g, [](Hints& h) { h.slices.reset(); });
    PassContext ctx;
    slice_schedule(*g, ctx);
    EXPECT_EQ(slice_loop_args(g->nodes[g->find("slice_loop_0")]).slices, 8);
  }
  {  // a count that does not give equal boxes
    auto g = load("attention_dfs.json");
    set_hints(*g, [](Hints& h) { h.slices = 3; });
    PassContext ctx;
    try {
      slice_schedule(*g, ctx);
      FAIL() << "expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("slices=3 does not split the sliced dims (extent 8)"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("valid counts: 1, 2, 4, 8"), std::string::npos) << e.what();
    }
  }
  {  // slices=1 is BFS
    auto g = load("attention_dfs.json");
    set_hints(*g, [](Hints& h) { h.slices = 1; });
    PassContext ctx;
    EXPECT_FALSE(slice_schedule(*g, ctx));
  }
}

TEST(slice_schedule, auto_picks_the_fewest_slices_that_fit) {
  // B=4, H=16, S=4096, D=128 bf16 attention, memory_budget = 2 GiB (the goal).
  auto g = load("attention_auto.json");
  const SliceRegion R = slice_legality(*g).regions.at(0);
  const auto cands = simulate_slice_counts(*g, R, kEveryValue);
  ASSERT_EQ(cands.size(), 7u);  // 1, 2, 4, ..., 64
  for (size_t i = 1; i < cands.size(); ++i) EXPECT_LT(cands[i].peak_bytes, cands[i - 1].peak_bytes);
  // BFS materializes the fp32 scores (4 GiB) twice over: far above 2 GiB; 16 slices cut it ~12x+.
  EXPECT_GT(cands[0].peak_bytes, 8ll << 30);
  EXPECT_LE(cands[4].peak_bytes * 10, cands[0].peak_bytes);

  PassContext ctx;
  ctx.verify_each = true;
  run_passes(*g, {"slice-schedule"}, ctx);
  const SliceLoopArgs a = slice_loop_args(g->nodes[g->find("slice_loop_0")]);
  int64_t expect = -1;
  for (const auto& c : cands)
    if (c.peak_bytes <= (2ll << 30)) { expect = c.slices; break; }
  EXPECT_EQ(a.slices, expect);
  EXPECT_EQ(a.slices, 8);
  EXPECT_LE(simulate_peak(*g, kEveryValue), 2ll << 30);
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_NE(ctx.notes[0].find("auto chose slices=8: simulated peak " + std::to_string(cands[3].peak_bytes) +
                              " bytes (" + format_bytes(cands[3].peak_bytes) + ") fits memory_budget=2147483648 (2 GiB)"),
            std::string::npos)
      << ctx.notes[0];
  // While the loop runs, its body's arena (planned once, held for every slice) counts in full.
  const Graph& body = *g->subgraphs.at(a.body);
  EXPECT_GE(simulate_peak(*g, kEveryValue), memory_plan(body, kEveryValue).arena_bytes);
}

TEST(slice_schedule, auto_errors_on_an_impossible_budget) {
  auto g = load("attention_auto.json");
  set_hints(*g, [](Hints& h) { h.memory_budget = 100ll << 20; });
  const auto cands = simulate_slice_counts(*g, slice_legality(*g).regions.at(0), kEveryValue);
  const int64_t lowest = cands.back().peak_bytes;  // 64 slices
  PassContext ctx;
  try {
    slice_schedule(*g, ctx);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("memory_budget=104857600 bytes (100 MiB) cannot be met"), std::string::npos) << m;
    EXPECT_NE(m.find("smallest simulated peak is " + std::to_string(lowest) + " bytes (" + format_bytes(lowest) +
                     ") with slices=64; a memory_budget of at least " + std::to_string(lowest) + " bytes would fit"),
              std::string::npos) << m;
    EXPECT_NE(m.find("region 0 (%transpose"), std::string::npos) << m;
  }
}

TEST(slice_schedule, chooser_strategy_alone) {
  const std::vector<SliceCandidate> c = {{1, 1000}, {2, 600}, {4, 400}, {8, 300}};
  EXPECT_EQ(choose_slice_count(c, 1000, "r").slices, 1);
  EXPECT_EQ(choose_slice_count(c, 599, "r").slices, 4);
  EXPECT_EQ(choose_slice_count(c, 300, "r").slices, 8);
  EXPECT_THROW(choose_slice_count(c, 299, "r"), UserError);
}

TEST(slice_schedule, auto_without_budget_stays_bfs) {
  auto g = load("attention_auto.json");
  set_hints(*g, [](Hints& h) { h.memory_budget.reset(); });
  PassContext ctx;
  EXPECT_FALSE(slice_schedule(*g, ctx));
  EXPECT_NE(ctx.notes.at(0).find("auto without memory_budget keeps 1 slice"), std::string::npos) << ctx.notes[0];
}

TEST(slice_schedule, nothing_to_slice_is_a_note_and_a_warning) {
  auto g = load("sdpa_gqa.json");
  PassContext ctx;
  EXPECT_FALSE(slice_schedule(*g, ctx));
  EXPECT_NE(ctx.notes.at(0).find("dfs but nothing to slice (ends at %sdpa"), std::string::npos) << ctx.notes[0];
  // The user asked for dfs and gets none: a warning for them, naming the region and the node at fault.
  ASSERT_EQ(ctx.warnings.size(), 1u);
  EXPECT_NE(ctx.warnings[0].find("schedule='dfs' but nothing can be sliced: %sdpa "), std::string::npos) << ctx.warnings[0];
  EXPECT_EQ(ctx.warnings[0].rfind("region ", 0), 0u) << ctx.warnings[0];
}

TEST(slice_schedule, pipeline_order_puts_slicing_between_hints_and_memory_plan) {
  std::vector<std::string> names;
  for (const PassInfo& p : pipeline()) names.push_back(p.name);
  auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  ASSERT_LT(pos("slice-schedule"), static_cast<long>(names.size()));
  EXPECT_LT(pos("slice-legality"), pos("slice-schedule"));
  EXPECT_LT(pos("slice-schedule"), pos("memory-plan"));
  // memory-plan is the last pass that changes the graph; only call-invariance, an analysis, follows it.
  EXPECT_EQ(names.back(), "call-invariance");
  EXPECT_EQ(names[names.size() - 2], "memory-plan");
  if (pos("hint-propagation") < static_cast<long>(names.size())) EXPECT_LT(pos("hint-propagation"), pos("slice-legality"));
}

}  // namespace
}  // namespace hb

// slice-legality: per-op rules (which node ends a region and why), the maps of inputs and outputs,
// and the slice geometry (slice_box) the loop contract relies on. Inputs: tests/fixtures/ir/*.json
// (written by make_fixtures.py).
#include <gtest/gtest.h>

#include "tests/cpp/core/IrTestUtil.h"

#include <fstream>
#include <set>
#include <sstream>

#include "backend/importer/JsonImport.h"
#include "passes/SliceLegality.h"

namespace hb {
namespace {

std::shared_ptr<Graph> load(const std::string& name) { return test::load_fixture(name); }

std::string name_of(const Graph& g, int node) { return node < 0 ? "" : g.nodes[node].name; }

TEST(slice_legality, slice_box_is_a_box_and_slices_tile_the_group) {
  auto b = slice_box({2, 4}, 4, 3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)[0].start, 1);
  EXPECT_EQ((*b)[0].length, 1);
  EXPECT_EQ((*b)[1].start, 2);
  EXPECT_EQ((*b)[1].length, 2);
  EXPECT_FALSE(slice_box({4, 3}, 6, 0).has_value());  // 2 of 3 heads would straddle a batch
  EXPECT_FALSE(slice_box({2, 4}, 3, 0).has_value());  // 3 does not divide 8
  EXPECT_FALSE(slice_box({2, 4}, 4, 4).has_value());  // no slice 4 of 4
  // Property: for each valid count, the boxes cover every flattened index exactly once, in order.
  const std::vector<std::vector<int64_t>> groups = {{4, 16}, {64}, {2, 3, 4}, {1, 8}, {6, 1, 5}, {3, 4}};
  for (const auto& grp : groups) {
    int64_t E = 1;
    for (int64_t s : grp) E *= s;
    for (int64_t n = 1; n <= E; ++n) {
      if (E % n || !slice_box(grp, n, 0)) continue;
      std::vector<int> hits(E, 0);
      for (int64_t i = 0; i < n; ++i) {
        auto box = slice_box(grp, n, i);
        ASSERT_TRUE(box.has_value());
        // Enumerate the box's flattened indices.
        std::vector<int64_t> idx(grp.size());
        for (size_t d = 0; d < grp.size(); ++d) idx[d] = (*box)[d].start;
        int64_t count = 0, lo = E, hi = -1;
        for (;;) {
          int64_t flat = 0;
          for (size_t d = 0; d < grp.size(); ++d) flat = flat * grp[d] + idx[d];
          ++hits[flat];
          ++count;
          lo = std::min(lo, flat);
          hi = std::max(hi, flat);
          int d = static_cast<int>(grp.size()) - 1;
          while (d >= 0 && ++idx[d] == (*box)[d].start + (*box)[d].length) idx[d] = (*box)[d].start, --d;
          if (d < 0) break;
        }
        EXPECT_EQ(count, E / n);
        EXPECT_EQ(lo, i * (E / n));  // slice i is the contiguous flattened range [i*c, (i+1)*c)
        EXPECT_EQ(hi, (i + 1) * (E / n) - 1);
      }
      for (int h : hits) EXPECT_EQ(h, 1);
    }
  }
}

TEST(slice_legality, attention_is_sliceable_up_to_the_head_sum) {
  auto g = load("attention_dfs.json");
  SliceLegality L = slice_legality(*g);
  ASSERT_EQ(L.regions.size(), 1u);
  const SliceRegion& R = L.regions[0];
  EXPECT_EQ(R.extent, 8);  // B=2 x H=4
  EXPECT_EQ(R.sliceable.size(), 18u);
  EXPECT_EQ(name_of(*g, R.end_node), "sum_1");
  EXPECT_EQ(R.end_reason, "reduces over dim 1, a sliced dim");
  ASSERT_EQ(R.inputs.size(), 3u);
  for (const SliceInput& in : R.inputs) EXPECT_EQ(in.map, (SliceMap{0, 2})) << g->nodes[in.node].name;
  ASSERT_EQ(R.outputs.size(), 1u);
  EXPECT_EQ(name_of(*g, R.outputs[0]), "_unsafe_view_2");
  // The merged [B*H, S, S] scores carry the slice index in dim 0 alone.
  EXPECT_EQ(R.maps.at(g->find("bmm"))[0], (SliceMap{0, 1}));
  EXPECT_EQ(R.maps.at(g->find("transpose"))[0], (SliceMap{0, 2}));
  EXPECT_EQ(R.slice_counts(), (std::vector<int64_t>{1, 2, 4, 8}));
}

TEST(slice_legality, backward_ops_are_sliceable) {
  auto g = load("attention_backward_dfs.json");
  const SliceRegion R = slice_legality(*g).regions.at(0);
  EXPECT_EQ(R.end_node, -1) << R.end_reason;
  EXPECT_EQ(R.sliceable.size(), 19u);
  EXPECT_EQ(R.outputs.size(), 3u);
  for (const SliceInput& in : R.inputs) {
    const int rank = static_cast<int>(g->nodes[in.node].type.tensor.shape.size());
    EXPECT_EQ(in.map, (SliceMap{0, rank == 4 ? 2 : 1})) << g->nodes[in.node].name;
  }
  // dk leaves through a transpose of the last two dims: the slice dims stay in front.
  EXPECT_EQ(R.maps.at(g->find("transpose_5"))[0], (SliceMap{0, 2}));
}

TEST(slice_legality, attention_ops_slice_along_batch_and_heads) {
  {
    auto g = load("sdpa_dfs.json");
    const SliceRegion R = slice_legality(*g).regions.at(0);
    EXPECT_EQ(R.end_node, -1) << R.end_reason;
    std::map<std::string, SliceMap> in;
    for (const SliceInput& x : R.inputs) in[g->nodes[x.node].name] = x.map;
    EXPECT_EQ(in["q"], (SliceMap{0, 2}));
    EXPECT_EQ(in["bias"], SliceMap{});  // [1, 1, S, S] broadcasts: every slice reads it whole
    const auto& m = R.maps.at(g->find("sdpa"));
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[1], (SliceMap{0, 2}));  // logsumexp [B, H, S]
  }
  {
    // CUDA's efficient attention also returns its RNG seed and offset (0-dim), which AOT saves for the
    // backward: without dropout they are replicated (slice 0's leaves the loop), so they do not end it.
    auto g = load("sdpa_efficient_dfs.json");
    const SliceRegion R = slice_legality(*g).regions.at(0);
    EXPECT_EQ(R.end_node, -1) << R.end_reason;
    EXPECT_EQ(R.sliceable.size(), 6u);
    EXPECT_EQ(R.replicated, (std::set<int>{g->find("getitem_2"), g->find("getitem_3")}));
    EXPECT_EQ(R.maps.at(g->find("getitem_1"))[0], (SliceMap{0, 2}));  // logsumexp [B, H, 32]: padded S
    std::vector<std::string> outs;
    for (int o : R.outputs) outs.push_back(g->nodes[o].name);
    EXPECT_EQ(outs, (std::vector<std::string>{"getitem_1", "getitem_2", "getitem_3", "relu"}));
  }
  {
    // The score_mod reads h while heads are sliced: the region still slices, and the node is marked
    // for slice-schedule to give its body global head indices.
    auto g = load("flex_head_bias.json");
    const SliceRegion R = slice_legality(*g).regions.at(0);
    EXPECT_EQ(R.end_node, -1) << R.end_reason;
    EXPECT_EQ(R.global_index, (std::map<int, std::vector<int>>{{g->find("flex_attention"), {1}}}));
  }
  {
    auto g = load("flex_dfs.json");
    const SliceRegion R = slice_legality(*g).regions.at(0);
    EXPECT_EQ(R.end_node, -1) << R.end_reason;
    EXPECT_TRUE(R.global_index.empty());
    for (const SliceInput& x : R.inputs)
      if (g->nodes[x.node].name == "kv_num_blocks") EXPECT_FALSE(x.map.sliced());  // [1, 1, n] block mask
  }
}

// Which node ends each region, and why.
TEST(slice_legality, rules_name_the_node_that_ends_the_region) {
  struct Case {
    const char* fixture;
    const char* end;      // "" = nothing ends it
    const char* because;  // substring of the reason
    size_t sliceable;
  };
  const Case cases[] = {
      {"rule_softmax_heads.json", "sm", "normalizes over dim 1, a sliced dim", 1},
      {"rule_sum_seq.json", "", "", 3},
      {"rule_view_merge.json", "vw", "reshapes the sliced dims", 1},
      {"rule_permute_swap.json", "pm", "reorders the sliced dims", 1},
      {"rule_random.json", "rnd", "draws random numbers", 1},
      {"rule_mutates.json", "add_", "mutates one of its inputs", 1},
      {"rule_unknown.json", "cs", "has no slicing rule", 1},
      {"rule_broadcast.json", "add_1", "%pad is broadcast along some but not all of the sliced dims", 1},
      {"rule_outside_reader.json", "peek", "outside the region and reads %exp", 1},
      {"rule_symbolic.json", "exp", "symbolic shape", 0},
      {"sdpa_gqa.json", "sdpa", "grouped-query heads", 0},
      {"sdpa_dropout.json", "sdpa", "dropout", 0},
      {"attention_bfs.json", "", "", 18},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    auto g = load(c.fixture);
    const SliceRegion R = slice_legality(*g).regions.at(0);
    EXPECT_EQ(name_of(*g, R.end_node), c.end);
    EXPECT_NE(R.end_reason.find(c.because), std::string::npos) << R.end_reason;
    EXPECT_EQ(R.sliceable.size(), c.sliceable);
    // Every value leaving the sliceable part is a tensor split by slice.
    for (int o : R.outputs) EXPECT_TRUE(R.maps.at(o)[0].sliced()) << g->nodes[o].name;
  }
}

TEST(slice_legality, heads_only_slice_dims) {
  auto g = load("attention_dfs.json");
  for (Node& n : g->nodes)
    if (!n.hints.empty()) n.hints.slice_dims = {1};
  const SliceRegion R = slice_legality(*g).regions.at(0);
  EXPECT_EQ(R.extent, 4);  // H alone
  // [B, H, S, D] -> [B*H, S, D] moves heads behind batch: the view ends it.
  EXPECT_EQ(name_of(*g, R.end_node), "view");
  EXPECT_NE(R.end_reason.find("not leading"), std::string::npos) << R.end_reason;
}

TEST(slice_legality, pass_writes_a_note_and_changes_nothing) {
  auto g = load("attention_dfs.json");
  PassContext ctx;
  run_passes(*g, {"slice-legality"}, ctx);
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_NE(ctx.notes[0].find("slice-legality region 0 (schedule=dfs): 18 of 19 nodes sliceable"), std::string::npos)
      << ctx.notes[0];
  EXPECT_NE(ctx.notes[0].find("ends at %sum_1 (aten::sum.dim_IntList)"), std::string::npos) << ctx.notes[0];
}

}  // namespace
}  // namespace hb

// memory-plan: invariants over hundreds of random graphs (no two live buffers overlap, every buffer
// inside the arena, inputs/outputs and their aliases never planned, every read sees a live buffer,
// planned peak <= no-reuse peak), for each strategy; plus small exact cases and the dump format.
#include <gtest/gtest.h>

#include "tests/cpp/core/IrTestUtil.h"

#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "backend/importer/JsonImport.h"
#include "codegen/TargetModel.h"
#include "passes/ArenaAllocator.h"
#include "passes/HeapSimulator.h"
#include "passes/MemoryPlan.h"
#include "passes/SliceSchedule.h"

namespace hb {

// The planner with every value placeable and no workspaces: the target is part of the input.
const MemoryPlanOptions kEveryValue{};
namespace {

// ---- a random graph generator ------------------------------------------------------------------
struct Gen : test::RandomGraphBase {
  explicit Gen(uint32_t seed) : RandomGraphBase(seed) {}

  TensorType tensor(bool symbolic = false) {
    TensorType t;
    const int64_t sizes[] = {1, 3, 16, 64, 100, 1000, 4096};
    t.shape = {Dim{sizes[pick(7)], ""}, Dim{sizes[pick(4)], ""}};
    if (symbolic) t.shape[0] = Dim{0, "s0"};
    t.stride = {Dim{t.shape[1].value, ""}, Dim{1, ""}};
    t.dtype = pick(2) ? DType::Float32 : DType::BFloat16;
    return t;
  }
  ValueType tv(const TensorType& t) {
    ValueType v;
    v.kind = ValueType::Kind::Tensor;
    v.tensor = t;
    return v;
  }
  // f32[16, 16], contiguous: the hand-written tests' one type.
  static TensorType matrix16() {
    TensorType t;
    t.shape = {Dim{16, ""}, Dim{16, ""}};
    t.stride = {Dim{16, ""}, Dim{1, ""}};
    return t;
  }
  int input(const std::string& name, const TensorType& t) {
    Node x;
    x.name = name;
    x.op = OpKind::Placeholder;
    x.type = tv(t);
    return add(x);
  }
  // The graph returns (node,).
  void output(int node) {
    Node out;
    out.name = "output";
    out.op = OpKind::Output;
    Arg tup;
    tup.kind = Arg::Kind::Tuple;
    tup.items = {ref(node)};
    out.args = {tup};
    add(out);
  }

  Graph build() {
    const int inputs = 1 + pick(3);
    for (int i = 0; i < inputs; ++i) {
      Node p;
      p.name = "in" + std::to_string(i);
      p.op = OpKind::Placeholder;
      p.type = tv(tensor());
      add(p);
    }
    const int ops = 3 + pick(40);
    for (int k = 0; k < ops; ++k) {
      const int kind = pick(10);
      if (kind <= 2) {  // elementwise, same type as its first input (in-place candidates)
        const int a = tensor_node();
        std::vector<Arg> args = {ref(a)};
        if (pick(2)) args.push_back(ref(tensor_node()));
        add(call(pick(2) ? "aten::add.Tensor" : "aten::mul.Tensor", args, g.nodes[a].type));
      } else if (kind == 3) {  // a view (and sometimes a view of a view)
        const int a = tensor_node();
        Node v = call("aten::view.default", {ref(a)}, g.nodes[a].type);
        v.effects.is_view = true;
        add(v);
      } else if (kind == 4) {  // an in-place op: aliases its first argument
        const int a = tensor_node();
        Node v = call("aten::add_.Tensor", {ref(a), ref(tensor_node())}, g.nodes[a].type);
        v.effects.mutates = true;
        add(v);
      } else if (kind == 5) {  // a tuple result taken apart by getitems
        ValueType t;
        t.kind = ValueType::Kind::Tuple;
        t.elems = {tv(tensor()), tv(tensor())};
        const int tup = add(call("aten::_fake_pair.default", {ref(tensor_node())}, t));
        for (int e = 0; e < 2; ++e)
          if (pick(3)) add(call("operator::getitem", {ref(tup), Arg::of_int(e)}, t.elems[e]));
      } else if (kind == 6) {  // a symbolic shape
        add(call("aten::nonzero.default", {ref(tensor_node())}, tv(tensor(true))));
      } else {  // a fresh value from several inputs
        std::vector<Arg> args;
        for (int j = 0, m = 1 + pick(3); j < m; ++j) args.push_back(ref(tensor_node()));
        add(call("aten::cat.default", args, tv(tensor())));
      }
    }
    // Return a random subset (views and getitems included).
    Node out;
    out.name = "output";
    out.op = OpKind::Output;
    Arg tuple;
    tuple.kind = Arg::Kind::Tuple;
    const int n = static_cast<int>(g.nodes.size());
    for (int i = 0; i < n; ++i)
      if (g.nodes[i].type.kind != ValueType::Kind::Unknown && pick(6) == 0) tuple.items.push_back(ref(i));
    if (tuple.items.empty()) tuple.items.push_back(ref(n - 1));
    out.args = {tuple};
    add(out);
    return g;
  }
};

// ---- an independent oracle: alias roots and what the graph returns -------------------------------
struct Oracle {
  std::map<ValueRef, ValueRef> root;
  std::set<ValueRef> returned_roots;
  ValueRef root_of(ValueRef v) const {
    auto it = root.find(v);
    return it == root.end() ? v : it->second;
  }
  explicit Oracle(const Graph& g) {
    for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
      const Node& n = g.nodes[i];
      if (n.target == "operator::getitem") root[{i, -1}] = root_of({n.args[0].ref, static_cast<int>(n.args[1].i)});
      else if (n.effects.is_view || n.effects.mutates || n.target == "aten::_unsafe_view.default")
        root[{i, -1}] = root_of({n.args[0].ref, -1});  // _unsafe_view: a view its schema does not declare
    }
    const Node& out = g.nodes[g.output_node()];
    out.for_each_input([&](const Arg& a) {
      const ValueType& t = g.nodes[a.ref].type;
      if (t.kind == ValueType::Kind::Tuple)
        for (size_t e = 0; e < t.elems.size(); ++e) returned_roots.insert(root_of({a.ref, static_cast<int>(e)}));
      else returned_roots.insert(root_of({a.ref, -1}));
    });
  }
};

void check_invariants(const Graph& g, const MemoryPlan& p) {
  const Oracle o(g);
  std::map<ValueRef, int> where;  // planned value -> buffer
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const PlannedBuffer& B = p.buffers[b];
    // Every buffer lies inside its busy period's arena (and so inside the largest one), aligned, and
    // lives within the period.
    ASSERT_GE(B.segment, 0);
    ASSERT_LT(B.segment, static_cast<int>(p.segments.size()));
    const ArenaSegment& S = p.segments[B.segment];
    EXPECT_GE(B.offset, 0);
    EXPECT_LE(B.offset + B.size, S.bytes);
    EXPECT_LE(S.bytes, p.arena_bytes);
    EXPECT_TRUE(S.start <= B.start && B.end <= S.end);
    EXPECT_EQ(B.offset % kArenaAlignment, 0);
    EXPECT_LE(B.start, B.end);
    for (const ValueRef& v : B.values) {
      where[v] = static_cast<int>(b);
      const Node& n = g.nodes[v.node];
      // Inputs, constants, and anything returned or aliased by a returned value are never planned.
      EXPECT_NE(n.op, OpKind::Placeholder) << n.name;
      EXPECT_NE(n.op, OpKind::GetAttr) << n.name;
      EXPECT_EQ(o.returned_roots.count(o.root_of(v)), 0u) << n.name << " is returned (or aliased) but planned";
      // Views are not buffers of their own.
      EXPECT_TRUE(o.root_of(v) == v) << n.name << " is a view but planned";
      // Symbolic shapes are unplanned.
      const ValueType& t = v.elem < 0 ? n.type : n.type.elems[v.elem];
      EXPECT_TRUE(t.tensor.numel().has_value()) << n.name;
    }
  }
  // Busy periods are in order and disjoint in time, and each one's arena is as large as its biggest
  // buffer end; the largest is the plan's arena.
  int64_t largest = 0;
  for (size_t k = 0; k < p.segments.size(); ++k) {
    EXPECT_LE(p.segments[k].start, p.segments[k].end);
    if (k) EXPECT_LT(p.segments[k - 1].end, p.segments[k].start);
    largest = std::max(largest, p.segments[k].bytes);
  }
  EXPECT_EQ(largest, p.arena_bytes);
  // A period is busy throughout: at every node inside it some buffer of it is live (else it would
  // have been split there).
  for (size_t k = 0; k < p.segments.size(); ++k)
    for (int j = p.segments[k].start; j <= p.segments[k].end; ++j) {
      bool busy = false;
      for (const PlannedBuffer& B : p.buffers) busy = busy || (B.segment == static_cast<int>(k) && B.start <= j && j <= B.end);
      EXPECT_TRUE(busy) << "period " << k << " is idle at node " << j;
    }
  // No two buffers live at the same node overlap in the arena.
  for (size_t a = 0; a < p.buffers.size(); ++a)
    for (size_t b = a + 1; b < p.buffers.size(); ++b) {
      const PlannedBuffer& A = p.buffers[a];
      const PlannedBuffer& B = p.buffers[b];
      const bool live_together = A.start <= B.end && B.start <= A.end;
      const bool overlap = A.offset < B.offset + B.size && B.offset < A.offset + A.size;
      EXPECT_FALSE(live_together && overlap && A.size > 0 && B.size > 0)
          << "%" << g.nodes[A.values[0].node].name << " [" << A.offset << "+" << A.size << ", live " << A.start << ".."
          << A.end << "] overlaps %" << g.nodes[B.values[0].node].name << " [" << B.offset << "+" << B.size
          << ", live " << B.start << ".." << B.end << "]";
    }
  // Every read (through any alias) happens while the storage's buffer is live.
  for (int j = 0; j < static_cast<int>(g.nodes.size()); ++j) {
    if (g.nodes[j].op == OpKind::Output) continue;
    g.nodes[j].for_each_input([&](const Arg& a) {
      const ValueType& t = g.nodes[a.ref].type;
      std::vector<ValueRef> vs;
      if (g.nodes[j].target == "operator::getitem")  // reads only the element it takes
        vs.push_back({a.ref, static_cast<int>(g.nodes[j].args[1].i)});
      else if (t.kind == ValueType::Kind::Tuple)
        for (size_t e = 0; e < t.elems.size(); ++e) vs.push_back({a.ref, static_cast<int>(e)});
      else vs.push_back({a.ref, -1});
      for (ValueRef v : vs) {
        auto it = where.find(o.root_of(v));
        if (it == where.end()) continue;
        const PlannedBuffer& B = p.buffers[it->second];
        EXPECT_TRUE(B.start <= j && j <= B.end) << "%" << g.nodes[j].name << " reads %" << g.nodes[a.ref].name
                                                << " outside its buffer's life [" << B.start << ", " << B.end << "]";
      }
    });
  }
  // In-place chains: each value starts where the previous one is last read.
  for (const PlannedBuffer& B : p.buffers)
    for (size_t k = 1; k < B.values.size(); ++k) EXPECT_GT(B.values[k].node, B.values[k - 1].node);
  // Peaks: live peak <= planned peak <= no reuse.
  EXPECT_LE(p.live_peak_bytes, p.arena_bytes);
  EXPECT_LE(p.arena_bytes, p.no_reuse_bytes);
}

TEST(memory_plan, invariants_hold_on_random_graphs) {
  int planned = 0, reused = 0, in_place = 0, rejected_planned = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    Gen gen(seed);
    const Graph g = gen.build();
    for (const char* strategy : {"greedy-by-size", "best-fit", ""}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " strategy '" + strategy + "'");
      MemoryPlanOptions opt;
      opt.strategy = strategy;
      opt.in_place = seed % 2 == 0;
      const MemoryPlan p = memory_plan(g, opt);
      check_invariants(g, p);
      if (::testing::Test::HasFailure()) return;
      planned += static_cast<int>(p.buffers.size());
      reused += p.arena_bytes < p.no_reuse_bytes;
      for (const PlannedBuffer& b : p.buffers) in_place += b.values.size() > 1;
    }
    {  // What the runtime cannot place gets no buffer, says why, and the rest still holds.
      SCOPED_TRACE("seed " + std::to_string(seed) + " with unplaceable nodes");
      MemoryPlanOptions opt;
      opt.in_place = seed % 2 == 1;
      const uint32_t salt = seed * 2654435761u;
      auto rejected = [&](int node) { return ((static_cast<uint32_t>(node) * 40503u) ^ salt) % 3 == 0; };
      opt.target.unplaceable = [&](const Graph&, int node) { return rejected(node) ? std::string("test says no") : ""; };
      const MemoryPlan p = memory_plan(g, opt);
      check_invariants(g, p);
      for (const PlannedBuffer& b : p.buffers)
        for (const ValueRef& v : b.values) EXPECT_FALSE(rejected(v.node)) << g.nodes[v.node].name;
      for (const UnplannedValue& u : p.unplanned)
        if (u.why == "test says no") EXPECT_TRUE(rejected(u.value.node)) << g.nodes[u.value.node].name;
      if (::testing::Test::HasFailure()) return;
      rejected_planned += static_cast<int>(p.buffers.size());
    }
    // The chooser keeps the smaller of the two.
    const int64_t both = memory_plan(g, kEveryValue).arena_bytes;
    MemoryPlanOptions a, b;
    a.strategy = "greedy-by-size";
    b.strategy = "best-fit";
    EXPECT_EQ(both, std::min(memory_plan(g, a).arena_bytes, memory_plan(g, b).arena_bytes));
  }
  // The generator must exercise the planner, not just pass vacuously.
  EXPECT_GT(planned, 1000);
  EXPECT_GT(reused, 300);
  EXPECT_GT(in_place, 20);
  EXPECT_GT(rejected_planned, 300);
}

TEST(memory_plan, allocators_alone_never_overlap_live_requests) {
  std::mt19937 rng(7);
  GreedyBySizeAllocator greedy;
  BestFitAllocator best_fit;
  for (int round = 0; round < 300; ++round) {
    std::vector<BufferRequest> reqs;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      const int s = static_cast<int>(rng() % 50), len = static_cast<int>(rng() % 10);
      reqs.push_back({static_cast<int64_t>(rng() % 20) * kArenaAlignment, s, s + len});
    }
    for (const ArenaAllocator* a : {static_cast<const ArenaAllocator*>(&greedy), static_cast<const ArenaAllocator*>(&best_fit)}) {
      const auto off = a->place(reqs);
      for (int i = 0; i < n; ++i)
        for (int j = i + 1; j < n; ++j) {
          const bool live = reqs[i].start <= reqs[j].end && reqs[j].start <= reqs[i].end;
          const bool overlap = off[i] < off[j] + reqs[j].size && off[j] < off[i] + reqs[i].size;
          ASSERT_FALSE(live && overlap && reqs[i].size && reqs[j].size) << a->name() << " round " << round;
        }
    }
  }
}

// x -> exp -> mul -> neg (returned): exp dies at mul, so mul writes over it; the result is unplanned.
TEST(memory_plan, elementwise_chain_reuses_in_place_and_skips_inputs_outputs_views) {
  Gen gen(0);
  Graph& g = gen.g;
  const TensorType t = Gen::matrix16();
  gen.input("x", t);
  gen.add(gen.call("aten::exp.default", {gen.ref(0)}, gen.tv(t)));                    // 1
  Node v = gen.call("aten::view.default", {gen.ref(1)}, gen.tv(t));                   // 2
  v.effects.is_view = true;
  gen.add(v);
  gen.add(gen.call("aten::mul.Tensor", {gen.ref(1), Arg::of_int(2)}, gen.tv(t)));     // 3
  gen.add(gen.call("aten::sum.default", {gen.ref(2), gen.ref(3)}, gen.tv(t)));        // 4: last read of the view
  gen.add(gen.call("aten::neg.default", {gen.ref(4)}, gen.tv(t)));                     // 5
  gen.output(5);
  const MemoryPlan p = memory_plan(g, kEveryValue);
  check_invariants(g, p);
  // exp is read through its view until node 4, so mul (node 3) cannot take it over.
  EXPECT_EQ(p.offset_of(2), -1);
  EXPECT_EQ(p.offset_of(5), -1);
  EXPECT_EQ(p.offset_of(0), -1);
  ASSERT_EQ(p.buffers.size(), 3u);
  EXPECT_EQ(p.no_reuse_bytes, 3 * 1024);
  // With the view gone, mul reuses exp's buffer in place.
  g.nodes[4].args = {gen.ref(3)};
  const MemoryPlan q = memory_plan(g, kEveryValue);
  check_invariants(g, q);
  ASSERT_EQ(q.buffers.size(), 2u);
  EXPECT_EQ(q.buffers[0].values.size(), 2u);
  EXPECT_EQ(q.offset_of(1), q.offset_of(3));
  MemoryPlanOptions off;
  off.in_place = false;
  EXPECT_EQ(memory_plan(g, off).buffers.size(), 3u);
}

// The runtime's view of the plan: x -> exp -> _unsafe_view -> mul -> max (tuple) -> getitem -> neg (returned).
// _unsafe_view is a view of exp (its schema hides it); the rejected tuple op gets no buffers and says why.
TEST(memory_plan, unplaceable_values_and_unsafe_view) {
  Gen gen(0);
  Graph& g = gen.g;
  const TensorType t = Gen::matrix16();
  gen.input("x", t);
  gen.add(gen.call("aten::exp.default", {gen.ref(0)}, gen.tv(t)));                          // 1
  gen.add(gen.call("aten::_unsafe_view.default", {gen.ref(1)}, gen.tv(t)));                 // 2
  gen.add(gen.call("aten::mul.Tensor", {gen.ref(2), Arg::of_int(2)}, gen.tv(t)));           // 3
  ValueType pair;
  pair.kind = ValueType::Kind::Tuple;
  pair.elems = {gen.tv(t), gen.tv(t)};
  gen.add(gen.call("aten::_fake_pair.default", {gen.ref(3)}, pair));                       // 4
  gen.add(gen.call("operator::getitem", {gen.ref(4), Arg::of_int(0)}, gen.tv(t)));          // 5
  gen.add(gen.call("aten::neg.default", {gen.ref(5)}, gen.tv(t)));                           // 6
  gen.output(6);
  const MemoryPlan all = memory_plan(g, kEveryValue);
  check_invariants(g, all);
  EXPECT_EQ(all.offset_of(2), -1) << "_unsafe_view must not get a buffer of its own";
  ASSERT_GE(all.offset_of(1), 0);
  ASSERT_GE(all.offset_of(3), 0);
  // mul reads exp through the view, whose elements are exp's in exp's order: it takes exp's buffer.
  EXPECT_EQ(all.offset_of(1), all.offset_of(3)) << "mul reads exp through a reshape: in-place reuse";
  EXPECT_GE(all.offset_of(4, 0), 0);
  MemoryPlanOptions opt;
  opt.target.unplaceable = [](const Graph& graph, int node) {
    return graph.nodes[node].type.kind == ValueType::Kind::Tuple ? std::string("multi-output op") : std::string();
  };
  const MemoryPlan p = memory_plan(g, opt);
  check_invariants(g, p);
  EXPECT_EQ(p.offset_of(4, 0), -1);
  EXPECT_EQ(p.offset_of(4, 1), -1);
  EXPECT_GE(p.offset_of(3), 0);
  ASSERT_EQ(p.buffers.size(), 1u);
  const std::string d = to_string(p, g);
  EXPECT_NE(d.find("%n2 (view of %n1)"), std::string::npos) << d;
  EXPECT_NE(d.find("    %n4.0 (multi-output op)\n    %n4.1 (multi-output op)\n"), std::string::npos) << d;
}

std::shared_ptr<Graph> load(const std::string& name) { return test::load_fixture(name); }

TEST(memory_plan, dump_reports_peaks_buffers_and_bodies) {
  auto g = load("attention_dfs.json");
  PassContext ctx;
  run_passes(*g, {"slice-schedule", "memory-plan"}, ctx);
  ASSERT_EQ(ctx.notes.size(), 2u);
  const std::string& d = ctx.notes[1];
  std::istringstream in(d);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const std::vector<std::string> expect = {
      "memory-plan graph forward: arena 0 bytes (0 bytes) by greedy-by-size for target all-placeable, no reuse 0, "
      "live peak 0, 0 buffers",
      "  unplanned:",
      "    %q (input)",
      "    %k (input)",
      "    %v (input)",
      "    %slice_loop_0.0 (output)",
      "    %_unsafe_view_2 (view of %slice_loop_0.0)",
      "    %sum_1 (output)",
      "memory-plan graph slice_body_0: arena 1024 bytes (1 KiB) by greedy-by-size on cpu for target all-placeable, no "
      "reuse 2304, live peak 1024, 5 buffers",
      // _unsafe_view is a view at run time: bmm lives until mul reads it through %_unsafe_view_1, whose
      // elements are bmm's in bmm's order (a reshape), so mul takes bmm's buffer in place.
      "  %bmm: offset 0 size 512 live [9, 12] then %mul in place",
      // The body's result goes straight into slice i of the loop's result (no copy).
      "  written straight into the caller's result when it passes one (a slice loop's slice i):",
      "    %bmm_1",
  };
  size_t k = 0;
  for (const std::string& l : lines)
    if (k < expect.size() && l == expect[k]) ++k;
  EXPECT_EQ(k, expect.size()) << "missing: " << (k < expect.size() ? expect[k] : "") << "\n" << d;
  // The plan is a pure function of the graph: the runtime's call gives the same offsets.
  const MemoryPlan body = *memory_plan(*g, kEveryValue).bodies.at("slice_body_0");
  EXPECT_EQ(body.arena_bytes, 1024);
  check_invariants(*g->subgraphs.at("slice_body_0"), body);
}

TEST(memory_plan, slicing_lowers_the_simulated_peak_and_the_body_arena) {
  auto bfs = load("attention_auto.json");
  const int64_t bfs_peak = simulate_peak(*bfs, kEveryValue);
  const MemoryPlan bfs_plan = memory_plan(*bfs, kEveryValue);
  check_invariants(*bfs, bfs_plan);
  auto g = load("attention_auto.json");
  const SliceRegion R = slice_legality(*g).regions.at(0);
  make_slice_loop(*g, R, 16);
  const MemoryPlan p = memory_plan(*g, kEveryValue);
  const int64_t body_arena = p.bodies.at("slice_body_0")->arena_bytes;
  EXPECT_LE(body_arena * 16, bfs_plan.arena_bytes);
  EXPECT_LE(simulate_peak(*g, kEveryValue) * 10, bfs_peak);
}

}  // namespace
}  // namespace hb

namespace hb {
namespace {

// The FlexAttention reference's float32 scores are a workspace no value shows: the simulator adds it
// while the node runs (B2 H4 S8: 512 scores), so a dfs slice loop's simulated peak shrinks with it.
TEST(memory_plan, flex_attention_workspace_counts_while_it_runs) {
  auto g = test::load_fixture("flex_dfs.json");
  int flex = -1;
  for (int i = 0; i < static_cast<int>(g->nodes.size()); ++i)
    if (g->nodes[i].target == "higher_order::flex_attention") flex = i;
  ASSERT_GE(flex, 0);
  EXPECT_EQ(kernel_workspace_bytes(*g, g->nodes[flex]), 2 * 4 * 8 * 8 * kFlexForwardWorkspace);
  for (const Node& n : g->nodes)
    if (static_cast<const void*>(&n) != &g->nodes[flex]) EXPECT_EQ(kernel_workspace_bytes(*g, n), 0) << n.name;
  MemoryPlanOptions opt;
  opt.target = structural_target();  // with the kernels' workspaces
  const int64_t bfs = simulate_peak(*g, opt);
  EXPECT_GE(bfs, 2 * 4 * 8 * 8 * kFlexForwardWorkspace);
  PassContext ctx;
  ctx.memory = opt;
  test::run_and_print(*g, {"slice-legality", "slice-schedule"}, ctx);
  const int64_t dfs = simulate_peak(*g, opt);
  // Four slices: a quarter of the workspace while each runs (less the body's arena rounding).
  EXPECT_LE(dfs, bfs - 2 * 2 * 8 * 8 * kFlexForwardWorkspace) << "bfs " << bfs << ", dfs " << dfs;
}

}  // namespace
}  // namespace hb

// The executor's arena (one allocation per call, placed results are views into it): on hand-written
// documents with types, results with the arena are bitwise those without it (and those of ATen called
// directly), one arena per call, in-place reuse, ops without an out= overload and multi-output ops
// mixed in, outputs that never live in the arena, slice loops, autograd, the kill switch, and random
// chains.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/importer/JsonImport.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/Placement.h"
#include "codegen/KernelSelect.h"
#include "passes/MemoryPlan.h"
#include "passes/Pipeline.h"

namespace hb {
namespace {

std::string doc(const std::string& nodes) {
  return R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [)" + nodes + "]}}";
}
std::string tensor(std::vector<int64_t> shape, const std::string& dtype = "float32") {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) stride[k - 1] = stride[k] * shape[k];
  auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
    return s + "]";
  };
  return R"({"tensor": {"shape": )" + list(shape) + R"(, "stride": )" + list(stride) + R"(, "dtype": ")" + dtype +
         R"(", "device": "cpu"}})";
}
std::string tuple(const std::string& a, const std::string& b) { return R"({"tuple": [)" + a + ", " + b + "]}"; }
std::string ph(const std::string& n, const std::string& val) {
  return R"({"name": ")" + n + R"(", "op": "placeholder", "target": ")" + n + R"(", "val": )" + val + "}";
}
std::string call(const std::string& n, const std::string& target, const std::string& args, const std::string& val,
                 const std::string& extra = "") {
  return R"({"name": ")" + n + R"(", "op": "call_function", "target": ")" + target + R"(", "args": [)" + args +
         R"(], "val": )" + val + extra + "}";
}
const std::string kView = R"(, "effects": {"is_view": true})";
std::string out(const std::string& items) {
  return R"({"name": "output", "op": "output", "args": [{"tuple": [)" + items + "]}]}";
}
std::string refto(const std::string& n) { return R"({"ref": ")" + n + R"("})"; }
std::string ints(std::vector<int64_t> v) {
  std::string s = R"({"list": [)";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::string(R"({"int": )") + std::to_string(v[k]) + "}";
  return s + "]}";
}

// The graph as it is, planned for the runtime's target (arena: the planner's setting).
std::unique_ptr<rt::Executor> build(std::shared_ptr<Graph> g, bool arena) {
  MemoryPlanOptions opt;
  opt.arena = arena;
  return std::make_unique<rt::Executor>(rt::program_of(std::move(g), opt),
                                        std::make_shared<const std::vector<at::Tensor>>());
}
std::string plan_text(const rt::Executor& e) { return to_string(e.plan(), e.graph()); }
std::unique_ptr<rt::Executor> build(const std::string& text, bool arena) { return build(import_json(text), arena); }

std::vector<at::Tensor> tensors(const std::vector<c10::IValue>& v) {
  std::vector<at::Tensor> t;
  for (const c10::IValue& x : v) t.push_back(x.toTensor());
  return t;
}
std::vector<at::Tensor> clones(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> t;
  for (const at::Tensor& x : v) t.push_back(x.clone());
  return t;
}
void expect_bitwise(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].sizes(), b[k].sizes()) << what << " output " << k;
    EXPECT_EQ(a[k].strides(), b[k].strides()) << what << " output " << k;
    EXPECT_EQ(a[k].scalar_type(), b[k].scalar_type()) << what << " output " << k;
    EXPECT_TRUE(at::equal(a[k], b[k])) << what << " output " << k;
  }
}
int in_place_buffers(const MemoryPlan& p) {
  int n = 0;
  for (const PlannedBuffer& b : p.buffers) n += b.values.size() > 1;
  return n;
}

// x[32,64] @ w[64,48] + b -> relu -> * 2 -> exp(-.) -> sum over dim 1; mm, add, relu, mul, neg, exp are
// intermediates, the sum and relu are returned.
std::string mlp() {
  const std::string t = tensor({32, 48});
  return doc(ph("x", tensor({32, 64})) + "," + ph("w", tensor({64, 48})) + "," + ph("b", tensor({48})) + "," +
             call("mm", "aten::mm.default", refto("x") + "," + refto("w"), t) + "," +
             call("add", "aten::add.Tensor", refto("mm") + "," + refto("b"), t) + "," +
             call("relu", "aten::relu.default", refto("add"), t) + "," +
             call("mul", "aten::mul.Tensor", refto("relu") + R"(, {"float": 2.0})", t) + "," +
             call("neg", "aten::neg.default", refto("mul"), t) + "," +
             call("exp", "aten::exp.default", refto("neg"), t) + "," +
             call("sum", "aten::sum.dim_IntList", refto("exp") + "," + ints({1}), tensor({32})) + "," +
             out(refto("sum") + "," + refto("relu")));
}

TEST(Arena, MatchesNoArenaBitwiseAndAtenDirectly) {
  at::manual_seed(0);
  at::Tensor x = at::randn({32, 64}), w = at::randn({64, 48}), b = at::randn({48});
  auto on = build(mlp(), true);
  auto off = build(mlp(), false);
  const auto r_on = tensors(on->run({x, w, b}));
  const auto r_off = tensors(off->run({x, w, b}));
  expect_bitwise(r_on, r_off, "arena vs none");
  at::Tensor relu = at::relu(at::mm(x, w) + b);
  expect_bitwise(r_on, {at::exp(-(relu * 2.0)).sum({1}), relu}, "arena vs ATen");
  // mm, add, mul, neg, exp are placed (relu is returned, sum is returned); neg and exp can each take the
  // buffer of the value they consume in place.
  const auto s = on->arena_stats();
  EXPECT_EQ(s.placed, 5);
  EXPECT_GT(s.arena_bytes, 0);
  EXPECT_EQ(s.arena_bytes, on->arena_bytes());
  EXPECT_LT(on->arena_bytes(), 5 * 32 * 48 * 4) << "lifetimes must let buffers share bytes";
  EXPECT_GE(in_place_buffers(on->plan()), 1);
  // relu is returned, so mm and add die before mul is computed: two busy periods, an arena each.
  const int64_t periods = static_cast<int64_t>(on->plan().segments.size());
  EXPECT_EQ(periods, 2) << plan_text(*on);
  EXPECT_EQ(s.allocations, periods);
  on->run({x, w, b});
  EXPECT_EQ(on->arena_stats().allocations, 2 * periods) << "one arena per busy period per call";
  EXPECT_EQ(off->arena_stats().allocations, 0);
  EXPECT_EQ(off->arena_stats().placed, 0);
  EXPECT_EQ(off->arena_bytes(), 0);
}

// The runtime's target (what the bindings hand the pipeline, so the simulator and the planner see what
// this runtime places): exp has its own out= kernel; _to_copy's out= is torch's "functional, then copy"
// wrapper; a view is never placed.
TEST(Arena, RuntimeTargetPlacesWhatTheRuntimeCan) {
  const Target t = rt::runtime_target();
  auto g = import_json(R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [
    {"name": "x", "op": "placeholder", "target": "x", "val": {"tensor": {"shape": [4, 8], "stride": [8, 1], "dtype": "float32", "device": "cpu"}}},
    {"name": "e", "op": "call_function", "target": "aten::exp.default", "args": [{"ref": "x"}], "val": {"tensor": {"shape": [4, 8], "stride": [8, 1], "dtype": "float32", "device": "cpu"}}},
    {"name": "c", "op": "call_function", "target": "aten::_to_copy.default", "args": [{"ref": "e"}], "kwargs": {"dtype": {"dtype": "float64"}}, "val": {"tensor": {"shape": [4, 8], "stride": [8, 1], "dtype": "float64", "device": "cpu"}}},
    {"name": "v", "op": "call_function", "target": "aten::view.default", "args": [{"ref": "c"}, {"list": [{"int": 32}]}], "val": {"tensor": {"shape": [32], "stride": [1], "dtype": "float64", "device": "cpu"}}, "effects": {"is_view": true}},
    {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "v"}]}]}]}})");
  EXPECT_EQ(t.why_unplaceable(*g, g->find("e")), "");
  EXPECT_NE(t.why_unplaceable(*g, g->find("c")), "");
  EXPECT_EQ(t.why_unplaceable(*g, g->find("v")), "alias");
  // The plan the pipeline makes with this target is the plan the executor runs: %e placed, %c not.
  MemoryPlanOptions opt;
  opt.target = t;
  const MemoryPlan p = memory_plan(*g, opt);
  EXPECT_GE(p.offset_of(g->find("e")), 0) << to_string(p, *g);
  EXPECT_EQ(p.offset_of(g->find("c")), -1) << to_string(p, *g);
  EXPECT_EQ(rt::program_of(g).memory->offset_of(g->find("e")), p.offset_of(g->find("e")));
}

// The arena setting (options.py's arena, HINTBACKEND_ARENA=0) is a value the planner takes: off, the
// plan places nothing and says so, and results are bitwise the same.
TEST(Arena, ArenaOffPlacesNothing) {
  auto off = build(mlp(), false);
  auto on = build(mlp(), true);
  at::Tensor x = at::randn({32, 64}), w = at::randn({64, 48}), b = at::randn({48});
  expect_bitwise(tensors(off->run({x, w, b})), tensors(on->run({x, w, b})), "arena off vs on");
  EXPECT_EQ(off->arena_stats().placed, 0);
  EXPECT_EQ(off->arena_stats().allocations, 0);
  EXPECT_NE(plan_text(*off).find("arena off"), std::string::npos) << plan_text(*off);
  EXPECT_GT(on->arena_stats().placed, 0);
}

// exp(x) dies at the mul, which writes its product over it (out= aliasing the input); then sigmoid,
// threshold_backward (out overload named grad_input) and where.self chain in place as well.
TEST(Arena, InPlaceReuseIsCorrect) {
  const std::string t = tensor({16, 33});
  const std::string text =
      doc(ph("x", t) + "," + ph("y", t) + "," + ph("c", tensor({16, 33}, "bool")) + "," +
          call("e", "aten::exp.default", refto("x"), t) + "," +
          call("m", "aten::mul.Tensor", refto("e") + "," + refto("y"), t) + "," +
          call("s", "aten::sigmoid.default", refto("m"), t) + "," +
          call("tb", "aten::threshold_backward.default", refto("y") + "," + refto("s") + R"(, {"float": 0.6})", t) + "," +
          call("wh", "aten::where.self", refto("c") + "," + refto("tb") + "," + refto("x"), t) + "," +
          call("r", "aten::sum.default", refto("wh"), tensor({})) + "," + out(refto("r") + "," + refto("x")));
  at::manual_seed(1);
  at::Tensor x = at::randn({16, 33}), y = at::randn({16, 33}), c = at::rand({16, 33}) > 0.5;
  auto on = build(text, true);
  const MemoryPlan& p = on->plan();
  ASSERT_EQ(p.buffers.size(), 1u) << to_string(p, on->graph());
  EXPECT_EQ(p.buffers[0].values.size(), 5u) << to_string(p, on->graph());
  const auto r_on = tensors(on->run({x, y, c}));
  EXPECT_EQ(on->arena_stats().placed, 5);
  expect_bitwise(r_on, tensors(build(text, false)->run({x, y, c})), "arena vs none");
  at::Tensor s = at::sigmoid(at::exp(x) * y);
  expect_bitwise(r_on, {at::where(c, at::threshold_backward(y, s, 0.6), x).sum(), x}, "arena vs ATen");
}

// _prelu_kernel has no out= overload and max.dim returns two tensors: both allocate their own results
// between placed values, and the dump says why.
TEST(Arena, UnplaceableOpsMixIn) {
  const std::string t = tensor({8, 40});
  const std::string text =
      doc(ph("x", t) + "," + ph("a", tensor({1})) + "," + call("e", "aten::exp.default", refto("x"), t) + "," +
          call("p", "aten::_prelu_kernel.default", refto("e") + "," + refto("a"), t) + "," +
          call("m", "aten::mul.Tensor", refto("p") + "," + refto("x"), t) + "," +
          call("mx", "aten::max.dim", refto("m") + R"(, {"int": 1}, {"bool": true})",
               tuple(tensor({8, 1}), tensor({8, 1}, "int64"))) + "," +
          call("vals", "operator::getitem", refto("mx") + R"(, {"int": 0})", tensor({8, 1})) + "," +
          call("idx", "operator::getitem", refto("mx") + R"(, {"int": 1})", tensor({8, 1}, "int64")) + "," +
          call("sub", "aten::sub.Tensor", refto("m") + "," + refto("vals"), t) + "," +
          call("th", "aten::tanh.default", refto("sub"), t) + "," + out(refto("th") + "," + refto("idx")));
  at::manual_seed(2);
  at::Tensor x = at::randn({8, 40}), a = at::full({1}, 0.25);
  auto on = build(text, true);
  const auto r_on = tensors(on->run({x, a}));
  expect_bitwise(r_on, tensors(build(text, false)->run({x, a})), "arena vs none");
  at::Tensor m = at::_prelu_kernel(at::exp(x), a) * x;
  auto [vals, idx] = at::max(m, 1, true);
  expect_bitwise(r_on, {at::tanh(m - vals), idx}, "arena vs ATen");
  EXPECT_EQ(on->arena_stats().placed, 3);  // e, m, sub
  EXPECT_EQ(on->plan().offset_of(on->graph().find("p")), -1);
  const std::string d = plan_text(*on);
  EXPECT_NE(d.find("%p (no matching out= overload)"), std::string::npos) << d;
  EXPECT_NE(d.find("%mx.0 (multi-output op)"), std::string::npos) << d;
  EXPECT_NE(d.find("memory-plan graph g: arena "), std::string::npos) << d;
}

// The caller keeps outputs across calls: a second call with other inputs must not touch the first
// call's outputs (they are never views of an arena). Includes an output that is a view of an
// intermediate, and an _unsafe_view of one.
TEST(Arena, OutputsNeverLiveInTheArena) {
  const std::string t = tensor({12, 20});
  const std::string text =
      doc(ph("x", t) + "," + call("e", "aten::exp.default", refto("x"), t) + "," +
          call("t", "aten::tanh.default", refto("e"), t) + "," +
          call("v", "aten::view.default", refto("t") + "," + ints({240}), tensor({240}), kView) + "," +
          call("n", "aten::neg.default", refto("e"), t) + "," +
          call("u", "aten::_unsafe_view.default", refto("n") + "," + ints({20, 12}), tensor({20, 12})) + "," +
          call("m", "aten::mul.Tensor", refto("e") + "," + refto("x"), t) + "," +
          call("s", "aten::sin.default", refto("m"), t) + "," + out(refto("v") + "," + refto("u") + "," + refto("s")));
  auto on = build(text, true);
  at::Tensor x1 = at::randn({12, 20}), x2 = at::randn({12, 20});
  const auto first = tensors(on->run({x1}));
  const auto kept = clones(first);
  EXPECT_GT(on->arena_stats().placed, 0) << plan_text(*on);
  const auto second = tensors(on->run({x2}));
  expect_bitwise(first, kept, "first call's outputs after a second call");
  expect_bitwise(second, tensors(build(text, false)->run({x2})), "second call vs no arena");
  for (const at::Tensor& a : first)
    for (const at::Tensor& b : second) EXPECT_FALSE(a.storage().is_alias_of(b.storage()));
}

// Autograd recording refuses out= overloads on inputs that require grad: then nothing is placed.
TEST(Arena, InputsThatRequireGradRunWithoutPlacement) {
  auto on = build(mlp(), true);
  at::Tensor x = at::randn({32, 64}), w = at::randn({64, 48}).requires_grad_(), b = at::randn({48});
  const auto with_grad = tensors(on->run({x, w, b}));
  EXPECT_EQ(on->arena_stats().placed, 0);
  EXPECT_EQ(on->arena_stats().arena_bytes, 0);
  {
    c10::NoGradGuard no_grad;
    expect_bitwise(tensors(on->run({x, w, b})), clones(with_grad), "no_grad with the arena vs grad without");
    EXPECT_EQ(on->arena_stats().placed, 5);
  }
}

std::shared_ptr<Graph> load_fixture(const std::string& name) {
  std::ifstream in(std::string(HB_SOURCE_DIR) + "/tests/fixtures/ir/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return import_json(ss.str());
}

// A DFS region: the slice_loop body's executor places its own values, in one arena per loop.
TEST(Arena, SliceLoopBodyUsesOneArenaForAllSlices) {
  auto g = load_fixture("attention_dfs.json");
  // prims ops are registered by Python (torch._prims); here, the ATen op with the same result.
  for (Node& n : g->nodes)
    if (n.target == "prims::convert_element_type.default") {
      n.target = "aten::_to_copy.default";
      n.kwargs = {{"dtype", n.args.at(1)}};
      n.args.resize(1);
    }
  PassContext ctx;
  ctx.memory.target = rt::runtime_target();
  run_pipeline(*g, ctx);
  int loops = 0;
  for (const Node& n : g->nodes) loops += n.target == "hintbackend::slice_loop";
  ASSERT_EQ(loops, 1) << "the fixture should slice";
  auto on = build(g, true);
  auto off = build(g, false);
  at::manual_seed(3);
  std::vector<c10::IValue> in;
  for (int p : g->placeholders()) {
    std::vector<int64_t> shape;
    for (const Dim& d : g->nodes[p].type.tensor.shape) shape.push_back(d.value);
    in.push_back(at::randn(shape));
  }
  const auto r_on = tensors(on->run(in));
  expect_bitwise(r_on, tensors(off->run(in)), "arena vs none");
  const std::string d = plan_text(*on);
  EXPECT_NE(d.find("memory-plan graph slice_body_0: "), std::string::npos) << d;
  // The outer graph has nothing to place (the loop's results are returned); the body has an arena,
  // allocated once for all its slices.
  EXPECT_EQ(on->arena_bytes(), 0);
  EXPECT_EQ(on->arena_stats().allocations, 1) << d;
  // The body's last bmm writes slice i of the loop's result through bmm.out (no copy after), in every
  // slice. The kill switch turns it off with the arena.
  EXPECT_NE(d.find("written straight into the caller's result when it passes one (a slice loop's slice i):\n    %bmm_1"),
            std::string::npos) << d;
  EXPECT_EQ(on->arena_stats().written, 4) << d;
  EXPECT_EQ(off->arena_stats().written, 0);
  on->run(in);
  EXPECT_EQ(on->arena_stats().allocations, 2) << d;
}

// ---- random chains -----------------------------------------------------------------------------
// Values of shape [R, C] (and reductions [R, 1], flat views [R*C]) through unary, binary (with
// broadcasting), matmul, reductions, views, _unsafe_view, an op without out=, a multi-output op.
struct Chain {
  std::mt19937 rng;
  int64_t R, C;
  std::vector<std::string> full, col, any_tensor;  // names by shape: [R, C], [R, 1]
  std::string nodes;
  int k = 0;
  explicit Chain(uint32_t seed) : rng(seed) {
    const int64_t sizes[] = {1, 3, 8, 17, 32};
    R = sizes[pick(5)];
    C = sizes[1 + pick(4)];
  }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  const std::string& from(const std::vector<std::string>& v) { return v[pick(static_cast<int>(v.size()))]; }
  std::string fresh() { return "n" + std::to_string(k++); }
  void add(const std::string& node) { nodes += (nodes.empty() ? "" : ",") + node; }

  std::string build() {
    const std::string t = tensor({R, C}), tc = tensor({R, 1}), tw = tensor({C, C});
    add(ph("x", t));
    add(ph("y", t));
    add(ph("w", tw));
    add(ph("a", tensor({1})));
    full = {"x", "y"};
    const int ops = 4 + pick(20);
    for (int i = 0; i < ops; ++i) {
      const std::string n = fresh();
      switch (pick(9)) {
        case 0: case 1: {
          static const char* unary[] = {"aten::exp.default", "aten::tanh.default", "aten::neg.default",
                                        "aten::relu.default", "aten::sigmoid.default", "aten::abs.default"};
          add(call(n, unary[pick(6)], refto(from(full)), t));
          full.push_back(n);
          break;
        }
        case 2: case 3: {
          static const char* binary[] = {"aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor",
                                         "aten::maximum.default"};
          const std::string other = !col.empty() && pick(3) == 0 ? from(col) : from(full);
          add(call(n, binary[pick(4)], refto(from(full)) + "," + refto(other), t));
          full.push_back(n);
          break;
        }
        case 4:
          add(call(n, "aten::mm.default", refto(from(full)) + "," + refto("w"), t));
          full.push_back(n);
          break;
        case 5:
          add(call(n, "aten::sum.dim_IntList", refto(from(full)) + "," + ints({1}) + R"(, {"bool": true})", tc));
          col.push_back(n);
          break;
        case 6: {  // a view, then back through _unsafe_view
          const std::string v = n, u = fresh();
          add(call(v, "aten::view.default", refto(from(full)) + "," + ints({R * C}), tensor({R * C}), kView));
          add(call(u, "aten::_unsafe_view.default", refto(v) + "," + ints({R, C}), t));
          full.push_back(u);
          break;
        }
        case 7:
          add(call(n, "aten::_prelu_kernel.default", refto(from(full)) + "," + refto("a"), t));
          full.push_back(n);
          break;
        case 8: {
          const std::string v = fresh();
          add(call(n, "aten::max.dim", refto(from(full)) + R"(, {"int": 1}, {"bool": true})",
                   tuple(tc, tensor({R, 1}, "int64"))));
          add(call(v, "operator::getitem", refto(n) + R"(, {"int": 0})", tc));
          col.push_back(v);
          break;
        }
      }
    }
    std::string outs = refto(full.back());
    for (const std::string& n : full)
      if (n != full.back() && pick(5) == 0) outs += "," + refto(n);
    for (const std::string& n : col)
      if (pick(4) == 0) outs += "," + refto(n);
    add(out(outs));
    return doc(nodes);
  }
};

TEST(Arena, RandomChainsMatchNoArenaBitwise) {
  int placed = 0, in_place = 0, skipped = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    Chain c(seed);
    const std::string text = c.build();
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + text);
    auto on = build(text, true);
    auto off = build(text, false);
    auto inputs = [&](int s) {
      at::manual_seed(s);
      return std::vector<c10::IValue>{at::randn({c.R, c.C}), at::randn({c.R, c.C}), at::randn({c.C, c.C}) * 0.2,
                                      at::full({1}, 0.1)};
    };
    const auto first = tensors(on->run(inputs(seed)));
    const auto kept = clones(first);
    expect_bitwise(first, tensors(off->run(inputs(seed))), "arena vs none");
    placed += static_cast<int>(on->arena_stats().placed);
    in_place += in_place_buffers(on->plan());
    // A second call reuses nothing of the first call's outputs.
    expect_bitwise(tensors(on->run(inputs(seed + 1000))), tensors(off->run(inputs(seed + 1000))), "second call");
    expect_bitwise(first, kept, "first outputs after a second call");
    const int64_t periods = static_cast<int64_t>(on->plan().segments.size());
    EXPECT_EQ(on->arena_stats().allocations, on->arena_for_calls() ? 2 * periods : 0);
    if (on->arena_bytes() > 0 && !on->arena_for_calls()) {
      ++skipped;  // the arena would raise the simulated peak: calls allocate per op, and the dump says why
      EXPECT_NE(plan_text(*on).find("arena off for calls: simulated call peak"),
                std::string::npos) << plan_text(*on);
    }
    if (::testing::Test::HasFailure()) return;
  }
  // Not vacuous: values were placed and some in place, and the peak rule kept some arenas and not others.
  EXPECT_GT(placed, 60);
  EXPECT_GT(in_place, 5);
  EXPECT_GT(skipped, 0);
  EXPECT_LT(skipped, 60);
}

}  // namespace
}  // namespace hb

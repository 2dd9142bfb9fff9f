// The executor on small hand-written documents: results against ATen called directly, multi-output
// ops with getitem, in-place ops and views with correct aliasing, None and constant outputs, inputs
// returned as outputs, sym arithmetic, constants, errors that name the node, and a slice loop summing
// its slices.
#include <ATen/ATen.h>
#include <cmath>
#include <gtest/gtest.h>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Parser.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/Placement.h"
#include "codegen/KernelSelect.h"
#include "passes/MemoryPlan.h"

namespace hb {
namespace {

std::string doc(const std::string& nodes, int num_constants = 0) {
  return R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "num_constants": )" +
         std::to_string(num_constants) + R"(, "nodes": [)" + nodes + "]}}";
}
std::string ph(const std::string& n) { return R"({"name": ")" + n + R"(", "op": "placeholder", "target": ")" + n + R"("})"; }
std::string call(const std::string& n, const std::string& target, const std::string& args, const std::string& extra = "") {
  return R"({"name": ")" + n + R"(", "op": "call_function", "target": ")" + target + R"(", "args": [)" + args + "]" +
         extra + "}";
}
std::string out(const std::string& items) { return R"({"name": "output", "op": "output", "args": [{"tuple": [)" + items + "]}]}"; }

std::vector<c10::IValue> run(const std::string& text, std::vector<c10::IValue> in, std::vector<at::Tensor> consts = {}) {
  rt::Executor ex(rt::program_of(import_json(text)), std::make_shared<const std::vector<at::Tensor>>(std::move(consts)));
  return ex.run(std::move(in));
}

TEST(Executor, MatchesAtenDirectly) {
  at::manual_seed(0);
  at::Tensor x = at::randn({4, 8}, at::kDouble), w = at::randn({8, 3}, at::kDouble), b = at::randn({3}, at::kDouble);
  auto r = run(doc(ph("x") + "," + ph("w") + "," + ph("b") + "," +
                   call("addmm", "aten::addmm.default", R"({"ref": "b"}, {"ref": "x"}, {"ref": "w"})", R"(, "kwargs": {"beta": {"float": 0.5}})") + "," +
                   call("relu", "aten::relu.default", R"({"ref": "addmm"})") + "," +
                   call("sum", "aten::sum.dim_IntList", R"({"ref": "relu"}, {"list": [{"int": 1}]})", R"(, "kwargs": {"keepdim": {"bool": true}})") + "," +
                   out(R"({"ref": "relu"}, {"ref": "sum"})")),
               {x, w, b});
  ASSERT_EQ(r.size(), 2u);
  at::Tensor want = at::relu(at::addmm(b, x, w, 0.5));
  EXPECT_TRUE(at::allclose(r[0].toTensor(), want));
  EXPECT_TRUE(at::allclose(r[1].toTensor(), want.sum({1}, true)));
}

TEST(Executor, MultiOutputGetItemNoneConstantAndInputOutputs) {
  at::Tensor x = at::rand({5, 7}) + 0.1;
  auto r = run(doc(ph("x") + "," + ph("n") + "," +
                   call("mx", "aten::max.dim", R"({"ref": "x"}, {"int": 1})") + "," +
                   call("vals", "operator::getitem", R"({"ref": "mx"}, {"int": 0})") + "," +
                   call("idx", "operator::getitem", R"({"ref": "mx"}, {"int": 1})") + "," +
                   call("two_n", "operator::mul", R"({"ref": "n"}, {"int": 2})") + "," +
                   call("split", "aten::split.Tensor", R"({"ref": "x"}, {"int": 3}, {"int": 1})") + "," +
                   call("last", "operator::getitem", R"({"ref": "split"}, {"int": -1})") + "," +
                   out(R"({"ref": "vals"}, {"ref": "idx"}, null, {"int": 3}, {"ref": "x"}, {"ref": "two_n"}, {"ref": "last"})")),
               {x, c10::IValue(int64_t{21})});
  ASSERT_EQ(r.size(), 7u);
  auto [vals, idx] = at::max(x, 1);
  EXPECT_TRUE(at::equal(r[0].toTensor(), vals));
  EXPECT_TRUE(at::equal(r[1].toTensor(), idx));
  EXPECT_TRUE(r[2].isNone());
  EXPECT_EQ(r[3].toInt(), 3);
  EXPECT_TRUE(r[4].toTensor().is_same(x)) << "an input returned as an output must be the same tensor";
  EXPECT_EQ(r[5].toInt(), 42);
  EXPECT_TRUE(at::equal(r[6].toTensor(), x.narrow(1, 6, 1)));
}

TEST(Executor, InPlaceAndViewsAlias) {
  at::Tensor x = at::randn({2, 6});
  at::Tensor x0 = x.clone();
  // v = x.view(3, 4); v.add_(1); return (v, x): both see the in-place update, v aliases x.
  auto r = run(doc(ph("x") + "," + call("v", "aten::view.default", R"({"ref": "x"}, {"list": [{"int": 3}, {"int": 4}]})", R"(, "effects": {"is_view": true})") + "," +
                   call("add_", "aten::add_.Scalar", R"({"ref": "v"}, {"int": 1})", R"(, "effects": {"mutates": true})") + "," +
                   out(R"({"ref": "v"}, {"ref": "x"})")),
               {x});
  EXPECT_TRUE(at::allclose(x, x0 + 1)) << "the in-place op must write into the caller's tensor";
  EXPECT_EQ(r[0].toTensor().data_ptr(), x.data_ptr());
  EXPECT_TRUE(r[1].toTensor().is_same(x));
}

TEST(Executor, ViewsWithoutTheDispatcherAliasTheirInputAndShareItsVersion) {
  // Views of static layouts read inside the graph are made by ViewCall.cpp: a slice written in place
  // writes the caller's tensor and bumps its version; select, t and as_strided read it at their offsets.
  const std::string text = R"(
graph g {
  %x: f32[4, 6] = placeholder
  %a: f32[4, 3][6, 1] = aten::slice.Tensor(%x, 1, 2, 5) !view
  %i: f32[4, 3][6, 1] = aten::add_.Scalar(%a, 1) !mutates
  %b: f32[6] = aten::select.int(%x, 0, -1) !view
  %t: f32[6, 4][1, 6] = aten::t.default(%x) !view
  %e: f32[2, 2][1, 3] = aten::as_strided.default(%x, [2, 2], [1, 3], 5) !view
  %s: f32[6] = aten::mul.Tensor(%b, 2)
  %m: f32[6, 4] = aten::mul.Tensor(%t, 1)
  %q: f32[2, 2] = aten::mul.Tensor(%e, 1)
  return (%s, %m, %q)
}
)";
  const Program program = rt::program_of(parse_graph(text));
  const std::string kernels = print_kernel_plan(*program.graph, *program.kernels);
  for (const char* v : {"%a: view", "%b: view", "%t: view", "%e: view"}) EXPECT_NE(kernels.find(v), std::string::npos) << kernels;
  rt::Executor ex(program, nullptr);
  // The traced layout, and another one (strides [1, 4]): that input takes the ops' own kernels.
  for (bool traced : {true, false}) {
    at::manual_seed(0);
    at::Tensor x = traced ? at::randn({4, 6}) : at::randn({6, 4}).t();
    const at::Tensor want = x.clone();
    want.slice(1, 2, 5).add_(1);
    const int64_t version = x._version();
    auto r = ex.run({x});
    EXPECT_TRUE(at::equal(x, want)) << "the slice's add_ must write into the caller's tensor";
    EXPECT_EQ(x._version(), version + 1) << "the in-place op through the view bumps the input's version";
    EXPECT_TRUE(at::equal(r[0].toTensor(), want.select(0, -1) * 2));
    EXPECT_TRUE(at::equal(r[1].toTensor(), want.t()));
    EXPECT_TRUE(at::equal(r[2].toTensor(), x.as_strided({2, 2}, {1, 3}, 5)));
  }
}

TEST(Executor, AViewsLayoutIsAtensNotTheIrTypes) {
  // A size-1 dimension's stride is arbitrary, and a sliced body's IR keeps the whole tensor's (999 here).
  // The alias takes ATen's ([32, 16, 1]), so that mul writing over its dying input through the arena
  // passes ATen's overlap check, which compares strides (a partial overlap is an error).
  const std::string text = R"(
graph g {
  %x: f32[2, 16] = placeholder
  %b: f32[2, 16] = aten::mul.Tensor(%x, 3)
  %v: f32[1, 2, 16][999, 16, 1] = aten::view.default(%b, [1, 2, 16]) !view
  %m: f32[1, 2, 16] = aten::mul.Tensor(%v, 2)
  %s: f32[1, 2, 16] = aten::add.Tensor(%m, %x)
  return (%s,)
}
)";
  MemoryPlanOptions opt;
  opt.arena = true;
  const Program program = rt::program_of(parse_graph(text), opt);
  ASSERT_NE(print_kernel_plan(*program.graph, *program.kernels).find("%v: view"), std::string::npos);
  rt::Executor ex(program, nullptr);
  at::Tensor x = at::randn({2, 16});
  auto r = ex.run({x});
  EXPECT_TRUE(at::allclose(r[0].toTensor(), (x * 6 + x).view({1, 2, 16})));
  EXPECT_GT(ex.arena_stats().placed, 0) << to_string(ex.plan(), ex.graph());
}

TEST(Executor, ConstantsAndOptionalTensorLists) {
  at::Tensor table = at::randn({10, 3});
  at::Tensor i = at::tensor({3, 1, 4}, at::kLong);
  auto r = run(doc(ph("i") + R"(, {"name": "c", "op": "get_attr", "target": "_tensor_constant0", "constant": 0},)" +
                       call("idx", "aten::index.Tensor", R"({"ref": "c"}, {"list": [{"ref": "i"}, null]})") + "," +
                       out(R"({"ref": "idx"})"),
                   1),
               {i}, {table});
  EXPECT_TRUE(at::equal(r[0].toTensor(), table.index_select(0, i)));
}

// Steps that read only constants (the default BlockMask flex_attention builds every call) run once: the
// first run keeps what the other steps read, later runs skip them. A returned invariant value is a fresh
// copy each call (the caller may write into it); a mutating op on such a value turns the caching off.
// s = x + exp(c * c) for a constant c, returning (s, exp(c * c)): the exp and mul steps read only the
// constant.
std::string invariant_graph() {
  return doc(ph("x") + R"(, {"name": "c", "op": "get_attr", "target": "_tensor_constant0", "constant": 0},)" +
                 call("t", "aten::mul.Tensor", R"({"ref": "c"}, {"ref": "c"})") + "," +
                 call("e", "aten::exp.default", R"({"ref": "t"})") + "," +
                 call("s", "aten::add.Tensor", R"({"ref": "x"}, {"ref": "e"})") + "," + out(R"({"ref": "s"}, {"ref": "e"})"),
             1);
}

TEST(Executor, InvariantStepsRunOnceAndReturnedValuesAreCopies) {
  at::Tensor c = at::randn({3}, at::kDouble), x = at::randn({3}, at::kDouble);
  const std::string text = invariant_graph();
  rt::Executor ex(rt::program_of(import_json(text)), std::make_shared<const std::vector<at::Tensor>>(std::vector<at::Tensor>{c}));
  EXPECT_EQ(ex.kept_values(), 0u);
  auto first = ex.run({x});
  EXPECT_EQ(ex.kept_values(), 1u);  // e: read by s and returned
  const at::Tensor want = (c * c).exp();
  first[1].toTensor().fill_(-1);  // the caller owns what it got
  for (int call = 0; call < 2; ++call) {
    auto r = ex.run({x});
    EXPECT_TRUE(at::allclose(r[0].toTensor(), x + want));
    EXPECT_TRUE(at::allclose(r[1].toTensor(), want));
    EXPECT_NE(r[1].toTensor().data_ptr(), first[1].toTensor().data_ptr());
  }
  // z = zeros(3); z.add_(1): the in-place op writes into an invariant value, so nothing is kept (a kept z
  // would gain 1 per call).
  const std::string mut =
      doc(ph("x") + "," +
          call("z", "aten::zeros.default", R"({"list": [{"int": 3}]})", R"(, "kwargs": {"dtype": {"dtype": "float64"}})") + "," +
          call("a", "aten::add_.Scalar", R"({"ref": "z"}, {"int": 1})", R"(, "effects": {"mutates": true})") + "," +
          call("s", "aten::add.Tensor", R"({"ref": "x"}, {"ref": "z"})") + "," + out(R"({"ref": "s"})"));
  rt::Executor ex2(rt::program_of(import_json(mut)), nullptr);
  for (int call = 0; call < 3; ++call) EXPECT_TRUE(at::allclose(ex2.run({x})[0].toTensor(), x + 1));
  EXPECT_EQ(ex2.kept_values(), 0u);
  // A graph returning one invariant tuple (sort of a constant): each element is a fresh copy too.
  const std::string tup = doc(ph("x") + R"(, {"name": "c", "op": "get_attr", "target": "_tensor_constant0", "constant": 0},)" +
                                  call("srt", "aten::sort.default", R"({"ref": "c"})") + "," +
                                  R"({"name": "output", "op": "output", "args": [{"ref": "srt"}]})",
                              1);
  rt::Executor ex3(rt::program_of(import_json(tup)), std::make_shared<const std::vector<at::Tensor>>(std::vector<at::Tensor>{c}));
  auto a = ex3.run({x}), b = ex3.run({x});
  ASSERT_EQ(a.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(at::equal(a[k].toTensor(), b[k].toTensor()));
    EXPECT_NE(a[k].toTensor().data_ptr(), b[k].toTensor().data_ptr()) << "output " << k;
  }
}

// Under CUDA graphs (Program::keep_across_calls off) every step runs on every call: nothing is kept,
// the results are the same, and a returned invariant value is the step's own fresh result.
TEST(Executor, InvariantStepsCanRunEveryCall) {
  at::Tensor c = at::randn({3}, at::kDouble), x = at::randn({3}, at::kDouble);
  Program p = rt::program_of(import_json(invariant_graph()));
  p.keep_across_calls = false;
  rt::Executor ex(p, std::make_shared<const std::vector<at::Tensor>>(std::vector<at::Tensor>{c}));
  const at::Tensor want = (c * c).exp();
  at::Tensor previous;
  for (int call = 0; call < 3; ++call) {
    auto r = ex.run({x});
    EXPECT_EQ(ex.kept_values(), 0u);
    EXPECT_TRUE(at::allclose(r[0].toTensor(), x + want));
    EXPECT_TRUE(at::allclose(r[1].toTensor(), want));
    if (previous.defined()) EXPECT_NE(r[1].toTensor().data_ptr(), previous.data_ptr());
    previous = r[1].toTensor();
  }
}

TEST(Executor, RuntimeErrorsNameTheNode) {
  at::Tensor a = at::randn({2, 3}), b = at::randn({4, 5});
  try {
    run(doc(ph("a") + "," + ph("b") + "," +
            call("mm", "aten::mm.default", R"({"ref": "a"}, {"ref": "b"})", R"(, "source": "model.py:7 in forward")") + "," +
            out(R"({"ref": "mm"})")),
        {a, b});
    FAIL() << "a shape mismatch must raise";
  } catch (const c10::Error& e) {  // ATen's own error (its Python type survives), the node added as context
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("hintbackend: while running %mm (aten::mm.default) at model.py:7 in forward"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << msg;
  }
}

// flex's default scale with a symbolic head dim: 1 / sqrt(float(D)) as Dynamo's sym ops, run natively;
// the square root of a negative number is Python's math domain error, naming the node.
TEST(Executor, SymSqrtIsPythonsMathSqrt) {
  const std::string g = doc(ph("d") + "," + call("f", "torch::sym_float", R"({"ref": "d"})") + "," +
                            call("root", "torch::sym_sqrt", R"({"ref": "f"})") + "," +
                            call("scale", "operator::truediv", R"({"float": 1.0}, {"ref": "root"})") + "," +
                            out(R"({"ref": "scale"})"));
  auto r = run(g, {c10::IValue(static_cast<int64_t>(128))});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].toDouble(), 1.0 / std::sqrt(128.0));
  try {
    run(g, {c10::IValue(static_cast<int64_t>(-4))});
    FAIL() << "sqrt of a negative number must raise";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("%root (torch::sym_sqrt)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("math domain error (sqrt of -4)"), std::string::npos) << msg;
  }
}

TEST(Executor, PlanErrorsNameTheNode) {
  try {
    run(doc(ph("a") + "," + call("r", "aten::relu.default", R"({"ref": "a"}, {"int": 1})") + "," + out(R"({"ref": "r"})")),
        {at::randn({2})});
    FAIL() << "too many arguments must raise";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("%r (aten::relu.default)"), std::string::npos) << e.what();
  }
  try {
    run(doc(ph("a") + "," + call("r", "aten::no_such_op.default", R"({"ref": "a"})") + "," + out(R"({"ref": "r"})")),
        {at::randn({2})});
    FAIL() << "an unknown operator must raise";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not registered"), std::string::npos) << e.what();
  }
}

// The slice loop's summed results (out_dims -2, backend/ir/SliceLoop.h): the sum of every slice's value,
// added in float32 for bf16 parts. Row 0 is 1 and rows 1..8 are 2^-8: one at a time in bf16 each add
// rounds back to 1 (half the spacing at 1, ties to even), while the float32 sum is 1 + 2^-5, exact in bf16.
TEST(SliceLoop, SummedResultsAddTheSlicesInFloat32) {
  for (const char* dtype : {"bf16", "f32"}) {
    SCOPED_TRACE(dtype);
    std::string text = R"(graph g {
  %x: T[9, 4] = placeholder
  %slice_loop_0: (T[4]) = hintbackend::slice_loop(@body, [%x], in_dims=[0], in_ndims=[1], slices=9, extent=9, out_dims=[-2], out_ndims=[0])
  %y: T[4] = operator::getitem(%slice_loop_0, 0)
  return (%y,)
}
graph body {
  %x: T[1, 4] = placeholder
  %r: T[4] = aten::view.default(%x, [4]) !view
  return (%r,)
}
)";
    for (size_t at; (at = text.find("T[")) != std::string::npos;) text.replace(at, 1, dtype);
    const auto type = std::string(dtype) == "bf16" ? at::kBFloat16 : at::kFloat;
    at::Tensor x = at::full({9, 4}, 1.0 / 256, at::TensorOptions().dtype(type));
    x[0].fill_(1.0);
    rt::Executor ex(rt::program_of(parse_graph(text)), std::make_shared<const std::vector<at::Tensor>>());
    auto r = ex.run({x});
    ASSERT_EQ(r.size(), 1u);
    const at::Tensor y = r[0].toTensor();
    EXPECT_EQ(y.scalar_type(), type);
    EXPECT_EQ(y.sizes(), at::IntArrayRef({4}));
    EXPECT_TRUE(at::equal(y.to(at::kFloat), at::full({4}, 1.0 + 1.0 / 32))) << y;
  }
}

TEST(KernelSelect, UnsupportedNodesAreListed) {
  auto g = import_json(doc(ph("a") + "," + call("f", "higher_order::auto_functionalized", R"({"ref": "a"})") + "," +
                           call("p", "python::my_module.fn", R"({"ref": "a"})") + "," + out(R"({"ref": "a"})")));
  KernelPlan kp = select_kernels(*g);
  ASSERT_EQ(kp.unsupported.size(), 2u);
  EXPECT_NE(kp.unsupported_descriptions[0].find("%f (higher_order::auto_functionalized)"), std::string::npos);
  EXPECT_NE(kp.unsupported_descriptions[1].find("%p (python::my_module.fn)"), std::string::npos);
}

}  // namespace
}  // namespace hb

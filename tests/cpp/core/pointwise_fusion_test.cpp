// pointwise-fusion: IR-text tests (which ops group and why others do not), the fused node contract,
// the compiled program, and its evaluation against float64 formulas written out here.
#include <gtest/gtest.h>

#include "tests/cpp/core/IrTestUtil.h"

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Printer.h"
#include "codegen/KernelSelect.h"
#include "codegen/PointwiseProgram.h"
#include "passes/PointwiseFusion.h"

namespace hb {
namespace {

std::shared_ptr<Graph> load(const std::string& name) { return test::load_fixture(name); }

using test::check_lines;

std::string fused(Graph& g, PassContext& ctx) { return test::run_and_print(g, {"pointwise-fusion"}, ctx); }

TEST(pointwise_fusion, groups_chains_and_diamonds_only) {
  auto g = load("fusion_cases.json");
  PassContext ctx;
  const std::string ir = fused(*g, ctx);
  check_lines(ir, {
      "graph forward {",
      // the chain add -> relu -> mul -> sigmoid: one node named after its root, inputs x and b
      "%sigmoid: f32[8, 16] = hintbackend::fused_pointwise(@fused_sigmoid, [%x, %b])",
      // exp escapes (it is returned): it cannot join neg's group, and a group of one is not fused
      "%exp: f32[8, 16] = aten::exp.default(%x)",
      "%neg: f32[8, 16] = aten::neg.default(%exp)",
      // the diamond x*x -> sin, cos -> sub: x is read twice but is one input
      "%sub: f32[8, 16] = hintbackend::fused_pointwise(@fused_sub, [%x])",
      // a dtype change ends a group: exp64 stays, to32 is not pointwise in the table
      "%exp64: f64[8, 16] = aten::exp.default(%y)",
      "%to32: f32[8, 16] = aten::_to_copy.default(%exp64",
      "%tanh: f32[8, 16] = hintbackend::fused_pointwise(@fused_tanh, [%to32, %sub])",
      // different hinted regions do not fuse
      "%p: f32[8, 16] = aten::relu.default(%x)",
      "%q: f32[8, 16] = aten::neg.default(%p)",
      "return (%sigmoid, %neg, %exp, %tanh, %q, %sub)",
      "graph fused_sigmoid {",
      "%x: f32[8, 16] = placeholder",
      "%b: f32[16] = placeholder",
      "%add: f32[8, 16] = aten::add.Tensor(%x, %b)",
      "%relu: f32[8, 16] = aten::relu.default(%add)",
      "%mul: f32[8, 16] = aten::mul.Tensor(%relu, 0.5)",
      "%sigmoid: f32[8, 16] = aten::sigmoid.default(%mul)",
      "return %sigmoid",
      "// note: pointwise-fusion: graph forward: %tanh fuses 2 ops: %add_1 %tanh",
  });
  EXPECT_EQ(ir.find("fused_neg"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("fused_q"), std::string::npos) << ir;
}

TEST(pointwise_fusion, program_and_kernel_plan) {
  auto g = load("fusion_cases.json");
  PassContext ctx;
  fused(*g, ctx);
  const PointwiseProgram p = compile_pointwise(*g->subgraphs.at("fused_sub"));
  EXPECT_EQ(p.num_inputs, 1);
  // sub(sin, cos, alpha=2) is sin - 2 * cos
  EXPECT_EQ(p.to_string(), "r0 = load 0; r1 = mul r0 r0; r2 = sin r1; r3 = cos r1; r4 = const 2; "
                           "r5 = mul r3 r4; r6 = sub r2 r5");
  const std::string plan = print_kernel_plan(*g, select_kernels(*g));
  check_lines(plan, {"%sigmoid: fused-pointwise hintbackend::fused_pointwise  # program: r0 = load 0; r1 = load 1; "
                     "r2 = add r0 r1; r3 = relu r2; r4 = const 0.5; r5 = mul r3 r4; r6 = sigmoid r5"});
}

TEST(pointwise_fusion, evaluation_matches_float64_formulas) {
  auto g = load("fusion_cases.json");
  PassContext ctx;
  fused(*g, ctx);
  const PointwiseProgram chain = compile_pointwise(*g->subgraphs.at("fused_sigmoid"));
  const PointwiseProgram diamond = compile_pointwise(*g->subgraphs.at("fused_sub"));
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(0.0, 2.0);
  const int64_t n = 300;  // more than one chunk of any reasonable size
  std::vector<double> x(n), b(n), out(n), scratch(chain.code.size() * n + diamond.code.size() * n);
  for (int64_t e = 0; e < n; ++e) x[e] = dist(rng), b[e] = dist(rng);
  const double* in2[] = {x.data(), b.data()};
  eval_pointwise<double>(chain, in2, out.data(), n, scratch.data());
  for (int64_t e = 0; e < n; ++e) {
    const double v = std::max(x[e] + b[e], 0.0) * 0.5;
    EXPECT_NEAR(out[e], 1.0 / (1.0 + std::exp(-v)), 1e-15) << e;
  }
  const double* in1[] = {x.data()};
  eval_pointwise<double>(diamond, in1, out.data(), n, scratch.data());
  for (int64_t e = 0; e < n; ++e) EXPECT_NEAR(out[e], std::sin(x[e] * x[e]) - 2 * std::cos(x[e] * x[e]), 1e-12) << e;
}

TEST(pointwise_fusion, every_table_op_evaluates_like_its_formula) {
  // One-op bodies built by hand, evaluated on float64 against independent formulas.
  struct Case {
    const char* target;
    int tensors;  // operands
    std::vector<std::pair<std::string, Arg>> kwargs;
    std::function<double(double, double)> ref;
  };
  Arg slope;
  slope.kind = Arg::Kind::Float;
  slope.f = 0.2;
  Arg tanh_approx;
  tanh_approx.kind = Arg::Kind::Str;
  tanh_approx.s = "tanh";
  const double pi = std::acos(-1.0);
  const std::vector<Case> cases = {
      {"aten::div.Tensor", 2, {}, [](double a, double b) { return a / b; }},
      {"aten::maximum.default", 2, {}, [](double a, double b) { return std::fmax(a, b); }},
      {"aten::minimum.default", 2, {}, [](double a, double b) { return std::fmin(a, b); }},
      {"aten::rsub.Tensor", 2, {}, [](double a, double b) { return b - a; }},
      {"aten::tanh.default", 1, {}, [](double a, double) { return std::tanh(a); }},
      {"aten::rsqrt.default", 1, {}, [](double a, double) { return 1 / std::sqrt(std::fabs(a)); }},
      {"aten::silu.default", 1, {}, [](double a, double) { return a / (1 + std::exp(-a)); }},
      {"aten::gelu.default", 1, {}, [](double a, double) { return a * 0.5 * (1 + std::erf(a / std::sqrt(2.0))); }},
      {"aten::gelu.default", 1, {{"approximate", tanh_approx}},
       [pi](double a, double) { return 0.5 * a * (1 + std::tanh(std::sqrt(2 / pi) * (a + 0.044715 * a * a * a))); }},
      {"aten::leaky_relu.default", 1, {{"negative_slope", slope}}, [](double a, double) { return a > 0 ? a : 0.2 * a; }},
      {"aten::sigmoid_backward.default", 2, {}, [](double g, double y) { return g * y * (1 - y); }},
      {"aten::tanh_backward.default", 2, {}, [](double g, double y) { return g * (1 - y * y); }},
      {"aten::silu_backward.default", 2, {},
       [](double g, double x) {
         const double s = 1 / (1 + std::exp(-x));
         return g * (s + x * s * (1 - s));
       }},
  };
  std::mt19937 rng(11);
  std::normal_distribution<double> dist(0.0, 1.5);
  for (const Case& c : cases) {
    Graph body;
    body.name = "one";
    for (int j = 0; j < c.tensors; ++j) {
      Node p;
      p.op = OpKind::Placeholder;
      p.name = "in" + std::to_string(j);
      p.type.kind = ValueType::Kind::Tensor;
      p.type.tensor.dtype = DType::Float64;
      p.type.tensor.shape = {Dim{5}};
      body.nodes.push_back(p);
    }
    Node op;
    op.name = "op";
    op.target = c.target;
    op.type = body.nodes[0].type;
    for (int j = 0; j < c.tensors; ++j) op.args.push_back(Arg::of_ref(j, "in" + std::to_string(j)));
    op.kwargs = c.kwargs;
    body.nodes.push_back(op);
    Node ret;
    ret.op = OpKind::Output;
    ret.name = "output";
    ret.args.push_back(Arg::of_ref(c.tensors, "op"));
    body.nodes.push_back(ret);
    const PointwiseProgram p = compile_pointwise(body);
    std::vector<double> a(64), b(64), out(64), scratch(p.code.size() * 64);
    for (int e = 0; e < 64; ++e) a[e] = dist(rng), b[e] = dist(rng);
    if (std::string(c.target) == "aten::rsqrt.default")
      for (double& v : a) v = std::fabs(v);
    const double* in[] = {a.data(), b.data()};
    eval_pointwise<double>(p, in, out.data(), 64, scratch.data());
    for (int e = 0; e < 64; ++e) EXPECT_NEAR(out[e], c.ref(a[e], b[e]), 1e-12) << c.target << " element " << e;
  }
}

TEST(pointwise_fusion, malformed_fused_node_is_unsupported_not_a_crash) {
  auto g = load("fusion_cases.json");
  PassContext ctx;
  fused(*g, ctx);
  // A body with a non-pointwise op cannot compile: the kernel plan says so and the graph falls back.
  Graph& body = *g->subgraphs.at("fused_sigmoid");
  body.nodes[3].target = "aten::mm.default";
  const KernelPlan plan = select_kernels(*g);
  ASSERT_EQ(plan.unsupported_descriptions.size(), 1u);
  EXPECT_NE(plan.unsupported_descriptions[0].find("%sigmoid (hintbackend::fused_pointwise)"), std::string::npos)
      << plan.unsupported_descriptions[0];
  EXPECT_NE(plan.unsupported_descriptions[0].find("cannot be fused"), std::string::npos)
      << plan.unsupported_descriptions[0];
}

}  // namespace
}  // namespace hb

// LayerNormRows' selection rule (codegen/KernelSelect.h: layer_norm_rows_why_not): which layer norms the
// runtime's CUDA kernels take, and what the kernels dump says of those they leave to ATen. The graphs are
// IR text as AOTAutograd traces a LayerNorm's forward and backward; the kernels themselves run on a GPU
// only (tests/python/test_layer_norm_rows.py).
#include <gtest/gtest.h>

#include <string>

#include "backend/ir/Parser.h"
#include "codegen/KernelSelect.h"
#include "codegen/TargetModel.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

using test::check_lines;

// The corpus MLP's LayerNorm(32) on [rows, 32] activations, forward and backward, with `ty` the dtype
// and `dev` the device.
std::string layer_norm_graph(const std::string& ty, const std::string& dev, int cols) {
  const std::string c = std::to_string(cols), x = ty + "[4096, " + c + "]@" + dev, p = ty + "[" + c + "]@" + dev,
                    s = "f32[4096, 1]@" + dev;
  return "graph g {\n"
         "  %x: " + x + " = placeholder\n"
         "  %w: " + p + " = placeholder\n"
         "  %b: " + p + " = placeholder\n"
         "  %gy: " + x + " = placeholder\n"
         "  %ln: (" + x + ", " + s + ", " + s + ") = aten::native_layer_norm.default(%x, [" + c + "], %w, %b, 1e-05)\n"
         "  %y: " + x + " = operator::getitem(%ln, 0)\n"
         "  %mean: " + s + " = operator::getitem(%ln, 1)\n"
         "  %rstd: " + s + " = operator::getitem(%ln, 2)\n"
         "  %lnb: (" + x + ", " + p + ", " + p + ") = aten::native_layer_norm_backward.default(%gy, %x, [" + c +
         "], %mean, %rstd, %w, %b, [true, true, true])\n"
         "  return (%y, %lnb)\n"
         "}\n";
}

Target cuda_runtime() {
  Target t;
  t.cuda_kernels = true;
  return t;
}

std::string plan_of(const std::string& text, const Target& t = cuda_runtime()) {
  auto g = parse_graph(text);
  return print_kernel_plan(*g, select_kernels(*g, t));
}

TEST(layer_norm_rows, narrow_cuda_rows_take_the_kernels_forward_and_backward) {
  for (const char* ty : {"bf16", "f16", "f32"}) {
    const std::string plan = plan_of(layer_norm_graph(ty, "cuda:0", 32));
    check_lines(plan, {"%ln: layer-norm-rows aten::native_layer_norm.default",
                       "%lnb: layer-norm-rows aten::native_layer_norm_backward.default"});
  }
  // The widest row the kernels hold: 1024.
  check_lines(plan_of(layer_norm_graph("bf16", "cuda:0", 1024)), {"%ln: layer-norm-rows", "%lnb: layer-norm-rows"});
}

TEST(layer_norm_rows, what_the_kernels_do_not_take_stays_on_aten_and_the_dump_says_why) {
  check_lines(plan_of(layer_norm_graph("bf16", "cuda:0", 2048)),
              {"%ln: aten-dispatch aten::native_layer_norm.default  # ATen's kernel (not layer-norm-rows: rows of "
               "2048 (above 1024))",
               "%lnb: aten-dispatch aten::native_layer_norm_backward.default  # ATen's kernel (not layer-norm-rows: "
               "rows of 2048 (above 1024))"});
  check_lines(plan_of(layer_norm_graph("bf16", "cuda:0", 36)),
              {"%ln: aten-dispatch", "not layer-norm-rows: rows of 36 (not a multiple of 8)"});
  check_lines(plan_of(layer_norm_graph("f32", "cuda:0", 34)),
              {"%ln: aten-dispatch", "not layer-norm-rows: rows of 34 (not a multiple of 4)"});
  check_lines(plan_of(layer_norm_graph("f64", "cuda:0", 32)),
              {"%ln: aten-dispatch", "not layer-norm-rows: its input is float64"});
  // A build without the runtime's CUDA kernels.
  check_lines(plan_of(layer_norm_graph("bf16", "cuda:0", 32), Target{}),
              {"%ln: aten-dispatch", "not layer-norm-rows: no CUDA kernels in this build"});
}

TEST(layer_norm_rows, cpu_layer_norms_are_plain_aten_calls) {
  const std::string plan = plan_of(layer_norm_graph("f32", "cpu", 32));
  check_lines(plan, {"%ln: aten-dispatch aten::native_layer_norm.default", "%lnb: aten-dispatch"});
  EXPECT_EQ(plan.find("layer-norm-rows"), std::string::npos) << plan;
}

TEST(layer_norm_rows, a_weight_of_another_dtype_stays_on_aten) {
  std::string text = layer_norm_graph("bf16", "cuda:0", 64);
  const std::string bf_w = "%w: bf16[64]@cuda:0", f_w = "%w: f32[64]@cuda:0";
  text.replace(text.find(bf_w), bf_w.size(), f_w);
  check_lines(plan_of(text), {"%ln: aten-dispatch", "not layer-norm-rows: weight of another dtype"});
}

// The backward's workspace, as the memory plan counts it: the kernels' per-block float sums of the
// weight's and the bias's gradients, 2 x 32 floats for each of min(rows, 528) blocks (4 blocks an SM of a
// 132-SM GPU); nothing when neither gradient is asked, on the CPU, or where ATen's kernel runs.
TEST(layer_norm_rows, the_backward_counts_its_partial_sums_as_workspace) {
  auto bytes = [](const std::string& text) {
    auto g = parse_graph(text);
    for (const Node& n : g->nodes)
      if (n.target == kLayerNormBackwardTarget) return kernel_workspace_bytes(*g, n);
    return int64_t{-1};
  };
  EXPECT_EQ(bytes(layer_norm_graph("bf16", "cuda:0", 32)), 528 * 2 * 32 * 4);
  std::string input_only = layer_norm_graph("bf16", "cuda:0", 32);
  const std::string mask = "[true, true, true]";
  input_only.replace(input_only.find(mask), mask.size(), "[true, false, false]");
  EXPECT_EQ(bytes(input_only), 0);
  EXPECT_EQ(bytes(layer_norm_graph("f32", "cpu", 32)), 0);
  EXPECT_EQ(bytes(layer_norm_graph("bf16", "cuda:0", 2048)), 0);
}

// fold-layer-norm-activation (passes/FoldLayerNormActivation.h): the corpus MLP's Linear -> GELU ->
// LayerNorm, forward and backward as AOTAutograd traces them with the GELU recomputed in the backward.
std::string mlp_graphs(const std::string& act_fw, const std::string& act_bw, const std::string& dev = "cuda:0",
                       const std::string& extra_output = "") {
  const std::string x = "bf16[4096, 32]@" + dev, p = "bf16[32]@" + dev, s = "f32[4096, 1]@" + dev;
  return "graph g {\n"
         "  %h: " + x + " = placeholder\n"
         "  %w: " + p + " = placeholder\n"
         "  %b: " + p + " = placeholder\n"
         "  %gy: " + x + " = placeholder\n"
         "  %a: " + x + " = " + act_fw + "\n"
         "  %ln: (" + x + ", " + s + ", " + s + ") = aten::native_layer_norm.default(%a, [32], %w, %b, 1e-05)\n"
         "  %y: " + x + " = operator::getitem(%ln, 0)\n"
         "  %mean: " + s + " = operator::getitem(%ln, 1)\n"
         "  %rstd: " + s + " = operator::getitem(%ln, 2)\n"
         "  %a2: " + x + " = " + std::string(act_fw).replace(act_fw.find("%h"), 2, "%h") + "\n"
         "  %lnb: (" + x + ", " + p + ", " + p + ") = aten::native_layer_norm_backward.default(%gy, %a2, [32], "
         "%mean, %rstd, %w, %b, [true, true, true])\n"
         "  %dx: " + x + " = operator::getitem(%lnb, 0)\n"
         "  %dw: " + p + " = operator::getitem(%lnb, 1)\n"
         "  %db: " + p + " = operator::getitem(%lnb, 2)\n"
         "  %dh: " + x + " = " + act_bw + "\n"
         "  return (%y, %dh, %dw, %db" + extra_output + ")\n"
         "}\n";
}

PassContext cuda_pass_context(bool kernels = true) {
  PassContext ctx;
  ctx.memory.target.cuda_kernels = kernels;
  return ctx;
}

std::string fold(const std::string& text, PassContext ctx = cuda_pass_context()) {
  auto g = parse_graph(text);
  const std::string folded = test::run_and_print(*g, {"fold-layer-norm-activation"}, ctx);
  return folded + print_kernel_plan(*g, select_kernels(*g, ctx.memory.target));
}

TEST(layer_norm_rows, fold_layer_norm_activation_takes_gelu_into_the_forward_and_the_backward) {
  const std::string out = fold(mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)"));
  check_lines(out, {"%ln: (bf16[4096, 32]@cuda:0, f32[4096, 1]@cuda:0, f32[4096, 1]@cuda:0) = "
                    "hintbackend::layer_norm_act.default(%h, [32], %w, %b, 1.0000000000000001e-05, \"gelu\")",
                    "%lnb: (bf16[4096, 32]@cuda:0, bf16[32]@cuda:0, bf16[32]@cuda:0) = "
                    "hintbackend::layer_norm_act_backward.default(%gy, %h, [32], %mean, %rstd, %w, %b, "
                    "[true, true, true], \"gelu\")",
                    "%dx: bf16[4096, 32]@cuda:0 = operator::getitem(%lnb, 0)",
                    "return (%y, %dx, %dw, %db)",
                    "// note: fold-layer-norm-activation graph g: %a into %ln (gelu), %a2 into %lnb (gelu, and %dh)",
                    "%ln: layer-norm-rows hintbackend::layer_norm_act.default",
                    "%lnb: layer-norm-rows hintbackend::layer_norm_act_backward.default"});
  for (const char* gone : {"%a:", "%a2:", "%dh:", "aten::gelu"})
    EXPECT_EQ(out.find(gone), std::string::npos) << gone << " left in\n" << out;
  // The folded backward keeps the layer norm backward's workspace in the memory plan's count.
  auto g = parse_graph(mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)"));
  PassContext ctx = cuda_pass_context();
  run_passes(*g, {"fold-layer-norm-activation"}, ctx);
  const Node& lnb = g->nodes.at(g->find("lnb"));
  ASSERT_EQ(lnb.target, kLayerNormActBackwardTarget);
  EXPECT_EQ(kernel_workspace_bytes(*g, lnb), 528 * 2 * 32 * 4);
}

TEST(layer_norm_rows, fold_layer_norm_activation_takes_tanh_gelu_and_silu) {
  check_lines(fold(mlp_graphs("aten::gelu.default(%h, approximate=\"tanh\")",
                              "aten::gelu_backward.default(%dx, %h, approximate=\"tanh\")")),
              {"hintbackend::layer_norm_act.default(%h, [32], %w, %b, 1.0000000000000001e-05, \"gelu_tanh\")",
               "hintbackend::layer_norm_act_backward.default(%gy, %h, [32], %mean, %rstd, %w, %b, [true, true, "
               "true], \"gelu_tanh\")"});
  check_lines(fold(mlp_graphs("aten::silu.default(%h)", "aten::silu_backward.default(%dx, %h)")),
              {"hintbackend::layer_norm_act.default(%h, [32], %w, %b, 1.0000000000000001e-05, \"silu\")",
               "hintbackend::layer_norm_act_backward.default(%gy, %h, [32], %mean, %rstd, %w, %b, [true, true, "
               "true], \"silu\")"});
}

TEST(layer_norm_rows, fold_layer_norm_activation_leaves_what_it_cannot_fold) {
  // Nothing on the CPU, nor without the runtime's CUDA kernels.
  for (const auto& [text, ctx] :
       {std::make_pair(mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)", "cpu"),
                       cuda_pass_context()),
        std::make_pair(mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)"),
                       cuda_pass_context(false))}) {
    const std::string out = fold(text, ctx);
    EXPECT_EQ(out.find("layer_norm_act"), std::string::npos) << out;
    EXPECT_EQ(out.find("// note: fold-layer-norm-activation"), std::string::npos) << out;
  }
  // The activation's result read elsewhere too (saved for the backward): the forward keeps it.
  std::string saved = mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)", "cuda:0", ", %a");
  check_lines(fold(saved), {"%a: bf16[4096, 32]@cuda:0 = aten::gelu.default(%h)",
                            "aten::native_layer_norm.default(%a, [32]",
                            "hintbackend::layer_norm_act_backward.default(%gy, %h,"});
  // The input gradient read by something besides the activation's backward: the backward stays.
  std::string read = mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)", "cuda:0", ", %dx");
  check_lines(fold(read), {"hintbackend::layer_norm_act.default(%h,", "aten::native_layer_norm_backward.default(%gy, %a2,",
                           "%dh: bf16[4096, 32]@cuda:0 = aten::gelu_backward.default(%dx, %h)"});
  // A backward of another approximation than the recompute's: left.
  check_lines(fold(mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h, approximate=\"tanh\")")),
              {"aten::native_layer_norm_backward.default(%gy, %a2,"});
  // Rows LayerNormRows does not take (2048 wide): nothing folds.
  std::string wide = mlp_graphs("aten::gelu.default(%h)", "aten::gelu_backward.default(%dx, %h)");
  for (size_t at; (at = wide.find("32]")) != std::string::npos;) wide.replace(at, 3, "2048]");
  EXPECT_EQ(fold(wide).find("layer_norm_act"), std::string::npos) << fold(wide);
}

}  // namespace
}  // namespace hb

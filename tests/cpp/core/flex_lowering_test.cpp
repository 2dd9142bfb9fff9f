// flex-lowering's mask analysis: mask_mod graphs as bands on d = q_idx - kv_idx (what cuDNN expresses
// natively), and the reasons for masks that are not one. Expected bands follow from the masks'
// definitions (e.g. causal keeps kv_idx <= q_idx, i.e. d >= 0), not from the analyzer's output.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Parser.h"
#include "backend/ir/Printer.h"
#include "codegen/FlexKernelGen.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "codegen/TargetModel.h"
#include "tests/cpp/core/IrTestUtil.h"
#include "tests/cpp/core/TempDir.h"

namespace hb {
namespace {

const char* kI32 = R"({"tensor": {"shape": [], "stride": [], "dtype": "int32", "device": "cpu"}})";
const char* kBool = R"({"tensor": {"shape": [], "stride": [], "dtype": "bool", "device": "cpu"}})";

// A mask graph (b, h, q_idx, kv_idx[, buf]) with `body` nodes (JSON) returning `ret`.
std::shared_ptr<Graph> mask_graph(const std::string& body, const std::string& ret, bool buffer = false) {
  std::string nodes;
  for (const char* p : {"b", "h", "q_idx", "kv_idx"})
    nodes += std::string(R"({"name": ")") + p + R"(", "op": "placeholder", "target": ")" + p + R"(", "val": )" + kI32 + "},";
  if (buffer)
    nodes += R"({"name": "buf", "op": "placeholder", "target": "buf", "val": {"tensor": {"shape": [8], "stride": [1], "dtype": "int32", "device": "cpu"}}},)";
  nodes += body + R"({"name": "output", "op": "output", "args": [{"tuple": [{"ref": ")" + ret + R"("}]}]})";
  return import_json(R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "mask", "nodes": [)" + nodes + "]}}");
}
std::string call(const std::string& name, const std::string& target, const std::string& args, bool boolean = true) {
  return R"({"name": ")" + name + R"(", "op": "call_function", "target": ")" + target + R"(", "args": [)" + args +
         R"(], "val": )" + (boolean ? kBool : kI32) + "},";
}
std::string ref(const std::string& n) { return R"({"ref": ")" + n + R"("})"; }
std::string num(int64_t v) { return R"({"int": )" + std::to_string(v) + "}"; }

FlexBand band_of(const Graph& g) {
  FlexBand b;
  std::string why;
  EXPECT_TRUE(mask_band(g, &b, &why)) << why;
  return b;
}
std::string why_not(const Graph& g) {
  FlexBand b;
  std::string why;
  EXPECT_FALSE(mask_band(g, &b, &why)) << to_string(b);
  return why;
}

TEST(flex_lowering, noop_mask_is_no_band) {
  auto g = mask_graph(call("ones", "aten::new_ones.default", ref("b") + R"(, {"list": []})"), "ones");
  const FlexBand b = band_of(*g);
  EXPECT_TRUE(b.unbounded());
  EXPECT_EQ(to_string(b), "no mask");
}

TEST(flex_lowering, causal_is_d_at_least_zero) {
  // kv_idx <= q_idx, written three ways: q >= kv, kv <= q, q > kv - 1.
  const std::vector<std::string> forms = {
      call("m", "aten::ge.Tensor", ref("q_idx") + "," + ref("kv_idx")),
      call("m", "aten::le.Tensor", ref("kv_idx") + "," + ref("q_idx")),
      call("kv1", "aten::sub.Tensor", ref("kv_idx") + "," + num(1), false) +
          call("m", "aten::gt.Tensor", ref("q_idx") + "," + ref("kv1"))};
  for (const std::string& body : forms) {
    SCOPED_TRACE(body);
    const FlexBand b = band_of(*mask_graph(body, "m"));
    EXPECT_EQ(b.lo, 0);
    EXPECT_EQ(b.hi, FlexBand::kNoBound);
    EXPECT_EQ(to_string(b), "causal");
  }
}

TEST(flex_lowering, sliding_window_intersects_two_bounds) {
  // (q_idx >= kv_idx) & (q_idx - kv_idx < 1024): d in [0, 1023].
  auto g = mask_graph(call("c", "aten::ge.Tensor", ref("q_idx") + "," + ref("kv_idx")) +
                          call("d", "aten::sub.Tensor", ref("q_idx") + "," + ref("kv_idx"), false) +
                          call("w", "aten::lt.Scalar", ref("d") + "," + num(1024)) +
                          call("m", "aten::bitwise_and.Tensor", ref("c") + "," + ref("w")),
                      "m");
  const FlexBand b = band_of(*g);
  EXPECT_EQ(b.lo, 0);
  EXPECT_EQ(b.hi, 1023);
  EXPECT_EQ(to_string(b), "causal window 1024");
}

TEST(flex_lowering, what_is_not_a_band_says_why) {
  // A document mask reads a buffer; a per-head mask reads h; q_idx >= 2 * kv_idx is not a diagonal band.
  EXPECT_NE(why_not(*mask_graph(call("i", "aten::index.Tensor", ref("buf") + R"(, {"list": [)" + ref("q_idx") + "]}", false) +
                                    call("m", "aten::eq.Tensor", ref("i") + "," + ref("kv_idx")),
                                "m", true))
                .find("buffer"),
            std::string::npos);
  EXPECT_NE(why_not(*mask_graph(call("m", "aten::ge.Tensor", ref("h") + "," + num(2)), "m")).find("head"),
            std::string::npos);
  auto g = mask_graph(call("k2", "aten::mul.Tensor", ref("kv_idx") + "," + num(2), false) +
                          call("m", "aten::ge.Tensor", ref("q_idx") + "," + ref("k2")),
                      "m");
  EXPECT_NE(why_not(*g).find("q_idx - kv_idx"), std::string::npos);
  // Two bounds that exclude everything.
  auto empty = mask_graph(call("a", "aten::gt.Tensor", ref("q_idx") + "," + ref("kv_idx")) +
                              call("c", "aten::lt.Tensor", ref("q_idx") + "," + ref("kv_idx")) +
                              call("m", "aten::bitwise_and.Tensor", ref("a") + "," + ref("c")),
                          "m");
  EXPECT_EQ(why_not(*empty), "masks every score");
}

// On the fixtures the corpus traced: a causal flex_attention with an ALiBi-style score_mod.
TEST(flex_lowering, analyze_flex_on_a_traced_graph) {
  auto g = test::load_fixture("flex_head_bias.json");
  const int flex = g->find("flex_attention");
  ASSERT_GE(flex, 0);
  const FlexAnalysis a = analyze_flex(*g, flex);
  EXPECT_TRUE(a.band_ok) << a.mask_why;
  EXPECT_EQ(to_string(a.band), "causal");
  EXPECT_FALSE(a.score_identity);
  EXPECT_NE(a.score_why.find("aten::index.Tensor"), std::string::npos) << a.score_why;
  EXPECT_FALSE(a.uses_max_scores);
  // The kernels dump says what the reference runs: the band and the score_mod's ops.
  const KernelChoice c = select_kernel(*g, flex);
  EXPECT_EQ(c.kind, KernelKind::FlexForward);
  EXPECT_NE(c.why.find("mask_mod: causal; score_mod: computes aten::index.Tensor, aten::add.Tensor"), std::string::npos)
      << c.why;
}

}  // namespace
}  // namespace hb

namespace hb {
namespace {

// A causal flex_attention with the identity score_mod, as the IR text prints it; `dtype`, `device` and
// the region's hints vary.
// `score_body`: the score_mod's nodes after its placeholders (b, h, q_idx, kv_idx, and one captured f32[128]
// buffer %buf when `buffer`), returning %out; empty: the identity.
std::shared_ptr<Graph> flex_graph(const std::string& dtype, const std::string& device, const std::string& hints = "",
                                  const std::string& score_body = "", bool buffer = false,
                                  const std::string& buf_type = "f32[128]") {
  const std::string t = dtype + "[2, 4, 128, 64]" + device;
  const std::string h = hints.empty() ? "" : "  {region=0 path=0 " + hints + "}";
  return parse_graph(
      "graph forward {\n"
      "  %q: " + t + " = placeholder\n"
      "  %k: " + t + " = placeholder\n"
      "  %v: " + t + " = placeholder\n"
      "  %kv_num_blocks: i32[1, 1, 1]" + device + " = placeholder\n"
      "  %kv_indices: i32[1, 1, 1, 1]" + device + " = placeholder\n"
      + std::string(buffer ? "  %buf: " + buf_type + device + " = placeholder\n" : "") +
      "  %flex_attention: (" + t + ", f32[2, 4, 128]" + device + ", f32[2, 4, 128]" + device +
      ") = higher_order::flex_attention(%q, %k, %v, @score0, (128, 128, %kv_num_blocks, %kv_indices, none, none, "
      "none, none, none, none, 128, 128, @mask0), 0.125, {}, " + (buffer ? "(%buf,)" : "()") + ", ())" + h + "\n"
      "  %out: " + t + " = operator::getitem(%flex_attention, 0)" + h + "\n"
      "  return (%out,)\n"
      "}\n"
      "graph mask0 {\n"
      "  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n  %q_idx: i32[] = placeholder\n"
      "  %kv_idx: i32[] = placeholder\n"
      "  %ge: b8[] = aten::ge.Tensor(%q_idx, %kv_idx)\n"
      "  return (%ge,)\n"
      "}\n"
      "graph score0 {\n"
      "  %score: " + dtype + "[] = placeholder\n  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n"
      "  %q_idx: i32[] = placeholder\n  %kv_idx: i32[] = placeholder\n" +
      (buffer ? "  %buf: " + buf_type + " = placeholder\n" : "") + score_body +
      "  return (" + (score_body.empty() ? "%score" : "%out") + ",)\n"
      "}\n");
}

Target with_cudnn() {
  Target t;
  t.cudnn_attention = true;
  return t;
}

TEST(flex_lowering, selection_picks_cudnn_where_it_computes_flex_exactly) {
  auto g = flex_graph("bf16", "@cuda:0");
  const int flex = g->find("flex_attention");
  KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_EQ(c.why, "cudnn: causal band, identity score_mod");
  // Without cuDNN in the build, the reference, saying why.
  c = select_kernel(*g, flex, Target{});
  EXPECT_EQ(c.kind, KernelKind::FlexForward);
  EXPECT_NE(c.why.find("not cuDNN: this build has no cuDNN"), std::string::npos) << c.why;
  // float32 q/k/v: cuDNN's SDPA takes half types only.
  auto f32 = flex_graph("f32", "@cuda:0");
  c = select_kernel(*f32, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexForward);
  EXPECT_NE(c.why.find("float32 (cuDNN's SDPA takes float16 or bfloat16)"), std::string::npos) << c.why;
  // On the CPU: the reference.
  c = select_kernel(*flex_graph("bf16", ""), flex, with_cudnn());
  EXPECT_NE(c.why.find("on cpu (cuDNN runs on CUDA)"), std::string::npos) << c.why;
}

// A scale computed at run time (flex's default 1 / sqrt(D) where Dynamo made the head dim symbolic:
// torch::sym_sqrt and operator::truediv ahead of the node): cuDNN's graph takes a constant, so the node
// goes to the other kernels, saying why; the sym ops run natively.
TEST(flex_lowering, a_scale_computed_at_run_time_is_not_cudnns) {
  std::string text = print_graph(*flex_graph("bf16", "@cuda:0"));
  const std::string constant = "@mask0), 0.125, {}";
  ASSERT_NE(text.find(constant), std::string::npos) << text;
  text.replace(text.find(constant), constant.size(), "@mask0), %scale, {}");
  const std::string first = "  %q: ";
  text.insert(text.find(first), "  %d: int = placeholder\n  %root: float = torch::sym_sqrt(%d)\n"
                                "  %scale: float = operator::truediv(1.0, %root)\n");
  auto g = parse_graph(text);
  const int flex = g->find("flex_attention");
  const FlexAnalysis a = analyze_flex(*g, flex);
  EXPECT_EQ(cudnn_why_not(*g, flex, a),
            "the scale is computed at run time (1 / sqrt of a symbolic head dim); cuDNN's graph takes a constant");
  const KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_NE(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("not cuDNN: the scale is computed at run time"), std::string::npos) << c.why;
  EXPECT_EQ(select_kernel(*g, g->find("root"), with_cudnn()).kind, KernelKind::SymOp);
}

// Whether generated code can report an error at run time (the CUDA runtime reads the report back only
// then): a buffer read can be out of range; the identity with a causal mask cannot fail.
TEST(flex_lowering, generated_code_says_whether_it_can_fail) {
  std::string why;
  auto plain = flex_graph("bf16", "@cuda:0");
  std::optional<FlexKernelSource> s = generate_flex_kernel(*plain, plain->find("flex_attention"), &why);
  ASSERT_TRUE(s.has_value()) << why;
  EXPECT_FALSE(s->may_fail);
  // buf[q_idx] with buf as long as the sequence: the range analysis proves the read in range.
  const std::string read_q = "  %i: f32[] = aten::index.Tensor(%buf, [%q_idx])\n  %out: f32[] = aten::add.Tensor(%score, %i)\n";
  auto reads = flex_graph("bf16", "@cuda:0", "", read_q, true);
  s = generate_flex_kernel(*reads, reads->find("flex_attention"), &why);
  ASSERT_TRUE(s.has_value()) << why;
  EXPECT_FALSE(s->may_fail);
  // A shorter buf can be read out of range.
  auto short_buf = flex_graph("bf16", "@cuda:0", "", read_q, true, "f32[100]");
  s = generate_flex_kernel(*short_buf, short_buf->find("flex_attention"), &why);
  ASSERT_TRUE(s.has_value()) << why;
  EXPECT_TRUE(s->may_fail);
}

TEST(flex_lowering, a_kv_independent_bias_is_a_row_shift_cudnn_runs) {
  // score + buf[q_idx]: the softmax is shift-invariant per row, so cuDNN runs the identity.
  auto g = flex_graph("bf16", "@cuda:0", "",
                      "  %i: f32[] = aten::index.Tensor(%buf, [%q_idx])\n  %out: f32[] = aten::add.Tensor(%score, %i)\n",
                      true);
  const int flex = g->find("flex_attention");
  const FlexAnalysis a = analyze_flex(*g, flex);
  EXPECT_TRUE(a.score_row_shift);
  KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("shifts each row by a kv-independent term"), std::string::npos) << c.why;
  // score + buf[kv_idx] depends on the column: not a shift but an additive bias (next test).
  auto kv = flex_graph("bf16", "@cuda:0", "",
                       "  %i: f32[] = aten::index.Tensor(%buf, [%kv_idx])\n  %out: f32[] = aten::add.Tensor(%score, %i)\n",
                       true);
  EXPECT_FALSE(analyze_flex(*kv, flex).score_row_shift);
  EXPECT_TRUE(analyze_flex(*kv, flex).score_bias);
  // score * buf[q_idx] scales the row: neither a shift nor a bias; the reference runs it, saying what it computes.
  auto mul = flex_graph("bf16", "@cuda:0", "",
                        "  %i: f32[] = aten::index.Tensor(%buf, [%q_idx])\n  %out: f32[] = aten::mul.Tensor(%score, %i)\n",
                        true);
  const FlexAnalysis m = analyze_flex(*mul, flex);
  EXPECT_FALSE(m.score_row_shift || m.score_bias);
  // ... but it is pointwise (a per-query temperature): cuDNN runs it as such.
  EXPECT_TRUE(m.score_pointwise) << m.pointwise_why;
  const KernelChoice c_mul = select_kernel(*mul, flex, with_cudnn());
  EXPECT_EQ(c_mul.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c_mul.why.find("pointwise nodes (computes aten::index.Tensor, aten::mul.Tensor)"), std::string::npos) << c_mul.why;
}

// score + buf[q_idx - kv_idx + 127], buf f32[255]: a relative bias cuDNN takes materialized.
const char* kRelativeBias =
    "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
    "  %d1: i32[] = aten::add.Tensor(%d, 127)\n"
    "  %i: f32[] = aten::index.Tensor(%buf, [%d1])\n"
    "  %out: f32[] = aten::add.Tensor(%i, %score)\n";

// Lets *t build generated CUDA kernels where nvcc and CUTLASS's headers are found (HB_TEST_CUTLASS_INCLUDE,
// as CI sets it); false where they are not.
bool with_cuda_kernels(Target* t) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0) return false;
  t->cuda = {"nvcc", "90", cutlass, test::temp_dir()};
  return true;
}

// score + c * (kv_idx - q_idx), c reading neither the score nor the positions (ALiBi's slope[h], a
// relative position's constant): a ramp along each row, which the generated CUDA kernels add as such
// (HB_KV_RAMP) instead of calling score_mod per score. Anything else stays a plain bias.
TEST(flex_lowering, a_slope_times_the_distance_is_a_ramp) {
  auto ramp = [](const std::string& body, const std::string& buf = "f32[4]") {
    auto g = flex_graph("bf16", "@cuda:0", "", body, true, buf);
    const int flex = g->find("flex_attention");
    const FlexAnalysis a = analyze_flex(*g, flex);
    EXPECT_TRUE(a.score_bias) << body;
    std::string why;
    const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, flex, &why, FlexKernelDevice::Cuda);
    EXPECT_TRUE(s.has_value()) << why;
    const bool in_source = s && s->source.find("#define HB_KV_RAMP 1\n") != std::string::npos;
    EXPECT_EQ(in_source, a.score_kv_ramp) << body;
    if (s && in_source)
      EXPECT_NE(s->summary.find("a ramp in kv_idx - q_idx (its slope once a tile)"), std::string::npos) << s->summary;
    return a.score_kv_ramp;
  };
  const std::string kv_less_q = "  %d: i32[] = aten::sub.Tensor(%kv_idx, %q_idx)\n";
  const std::string q_less_kv = "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n";
  const std::string slope_h = "  %c: f32[] = aten::index.Tensor(%buf, [%h])\n";
  // ALiBi, either order of the product and of the sum.
  EXPECT_TRUE(ramp(kv_less_q + slope_h + "  %m: f32[] = aten::mul.Tensor(%c, %d)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n"));
  EXPECT_TRUE(ramp(kv_less_q + slope_h + "  %m: f32[] = aten::mul.Tensor(%d, %c)\n  %out: f32[] = aten::add.Tensor(%m, %score)\n"));
  // A relative position, (q - kv) * 0.01, and the bare distance.
  EXPECT_TRUE(ramp(q_less_kv + "  %m: f32[] = aten::mul.Tensor(%d, 0.01)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n"));
  EXPECT_TRUE(ramp(kv_less_q + "  %out: f32[] = aten::add.Tensor(%score, %d)\n"));
  // Not ramps: a slope read by q_idx, the distance squared, a distance to the head, a product rounded to bf16.
  EXPECT_FALSE(ramp(kv_less_q + "  %c: f32[] = aten::index.Tensor(%buf, [%q_idx])\n"
                    "  %m: f32[] = aten::mul.Tensor(%c, %d)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n", "f32[128]"));
  EXPECT_FALSE(ramp(kv_less_q + "  %m: i32[] = aten::mul.Tensor(%d, %d)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n"));
  EXPECT_FALSE(ramp("  %d: i32[] = aten::sub.Tensor(%kv_idx, %h)\n  %out: f32[] = aten::add.Tensor(%score, %d)\n"));
  EXPECT_FALSE(ramp(kv_less_q + "  %c: bf16[] = aten::index.Tensor(%buf, [%h])\n"
                    "  %m: bf16[] = aten::mul.Tensor(%c, %d)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n", "bf16[4]"));

  // nvcc builds ALiBi's forward where CUTLASS's headers are named (CI: HB_TEST_CUTLASS_INCLUDE).
  Target t;
  if (!with_cuda_kernels(&t)) GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  auto g = flex_graph("bf16", "@cuda:0", "kernel=fused",
                      kv_less_q + slope_h + "  %m: f32[] = aten::mul.Tensor(%c, %d)\n  %out: f32[] = aten::add.Tensor(%score, %m)\n",
                      true, "f32[4]");
  const KernelChoice c = select_kernel(*g, g->find("flex_attention"), t);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedForward) << c.why;
  EXPECT_NE(c.module, nullptr);
  EXPECT_NE(c.why.find("a ramp in kv_idx - q_idx"), std::string::npos) << c.why;
}

// A bias cuDNN would materialize past 8 GiB gives way to the generated kernel, which reads the table in
// place (at S 65536 over 4 heads, 64 GiB). Without CUTLASS the generated CUDA kernel cannot be built, so
// cuDNN runs and says why the rule did not apply; with nvcc and CUTLASS (HB_TEST_CUTLASS_INCLUDE, as CI
// sets it) the generated kernel is chosen.
TEST(flex_lowering, a_bias_too_big_for_memory_goes_to_the_generated_kernel) {
  auto g = flex_graph("bf16", "@cuda:0", "", kRelativeBias, true, "f32[255]");
  const int flex = g->find("flex_attention");
  EXPECT_EQ(select_kernel(*g, flex, with_cudnn()).kind, KernelKind::FlexCudnnForward);  // 256 KiB: cuDNN
  for (const char* name : {"q", "k", "v"}) g->nodes[g->find(name)].type.tensor.shape[2].value = 65536;
  KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("(it would materialize a 65536 MiB bias (above 8 GiB), but the generated kernel cannot "
                       "run: cannot build CUDA kernels"),
            std::string::npos) << c.why;
  Target target = with_cudnn();
  if (!with_cuda_kernels(&target)) GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  c = select_kernel(*g, flex, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedForward) << c.why;
  EXPECT_NE(c.why.find("(not cuDNN: it would materialize a 65536 MiB bias (above 8 GiB))"), std::string::npos)
      << c.why;
}

// A float32 table that gets a gradient (partition.py marks it requires_grad in the forward graph): its
// backward goes to the generated kernel, since cuDNN's dBias is bf16 only, and the forward goes with it,
// where the generated backward will take the node. Without CUTLASS both stay on cuDNN and say why; with no
// gradient, or deterministic=True (no generated backward), cuDNN, with no word of it.
TEST(flex_lowering, a_float_table_that_gets_a_gradient_takes_its_forward_to_the_generated_kernel) {
  auto g = flex_graph("bf16", "@cuda:0", "", kRelativeBias, true, "f32[255]");
  const int flex = g->find("flex_attention");
  KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_EQ(c.why.find("dBias"), std::string::npos) << c.why;
  g->nodes[g->find("buf")].type.tensor.requires_grad = true;
  c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("(its dBias is bfloat16 only: buffer 0's float gradient would carry that rounding (the "
                       "backward runs on the generated kernel), but the generated kernel cannot run: cannot build "
                       "CUDA kernels"),
            std::string::npos) << c.why;
  g->nodes[flex].hints.deterministic = true;
  c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_EQ(c.why.find("dBias"), std::string::npos) << c.why;
  g->nodes[flex].hints.deterministic.reset();
  Target target = with_cudnn();
  if (!with_cuda_kernels(&target)) GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  c = select_kernel(*g, flex, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedForward) << c.why;
  EXPECT_NE(c.why.find("(not cuDNN: its dBias is bfloat16 only: buffer 0's float gradient would carry that rounding "
                       "(the backward runs on the generated kernel))"),
            std::string::npos) << c.why;
}

TEST(flex_lowering, a_kv_dependent_additive_term_is_a_materialized_cudnn_bias) {
  // The learned relative bias the demo trains: score + buf[q_idx - kv_idx + 127] (a Toeplitz bias over
  // the heads here, since the fixture's buffer is 1-d). It reads q_idx and kv_idx, not b or h.
  auto rel = flex_graph("bf16", "@cuda:0", "",
                        "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                        "  %d1: i32[] = aten::add.Tensor(%d, 127)\n"
                        "  %i: f32[] = aten::index.Tensor(%buf, [%d1])\n"
                        "  %out: f32[] = aten::add.Tensor(%i, %score)\n",  // t + score: either side
                        true);
  const int flex = rel->find("flex_attention");
  const FlexAnalysis a = analyze_flex(*rel, flex);
  EXPECT_TRUE(a.score_bias);
  EXPECT_FALSE(a.score_row_shift);
  EXPECT_FALSE(a.bias_reads_b);
  EXPECT_FALSE(a.bias_reads_h);
  EXPECT_TRUE(a.bias_reads_q);
  KernelChoice c = select_kernel(*rel, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_EQ(c.why,
            "cudnn: causal band, score_mod adds a bias cuDNN takes materialized as [1, H, Sq, Skv] "
            "(toeplitz buf0[q_idx - kv_idx + 127])");
  EXPECT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Toeplitz);
  EXPECT_EQ(a.bias_layout.sign, 1);
  EXPECT_EQ(a.bias_layout.offset, 127);
  EXPECT_EQ(a.bias_layout.d_dim, 0);
  EXPECT_EQ(a.bias_layout.h_dim, -1);
  // A dense per-batch bias buf[b, ...] is materialized per batch.
  auto dense = flex_graph("bf16", "@cuda:0", "",
                          "  %bb: i32[] = aten::mul.Tensor(%b, 64)\n"
                          "  %j: i32[] = aten::add.Tensor(%bb, %kv_idx)\n"
                          "  %i: f32[] = aten::index.Tensor(%buf, [%j])\n"
                          "  %out: f32[] = aten::add.Tensor(%score, %i)\n",
                          true);
  EXPECT_TRUE(analyze_flex(*dense, flex).bias_reads_b);
  c = select_kernel(*dense, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("materialized as [B, H, Sq, Skv] (evaluated on the index grid)"), std::string::npos) << c.why;
  // score + score * t reads the score in its term: not additive.
  auto self = flex_graph("bf16", "@cuda:0", "",
                         "  %i: f32[] = aten::index.Tensor(%buf, [%kv_idx])\n"
                         "  %st: f32[] = aten::mul.Tensor(%score, %i)\n"
                         "  %out: f32[] = aten::add.Tensor(%score, %st)\n",
                         true);
  EXPECT_FALSE(analyze_flex(*self, flex).score_bias);
  // (It is pointwise, though, with a buffer cuDNN reads as a broadcast input.)
  EXPECT_NE(select_kernel(*self, flex, with_cudnn()).why.find("pointwise nodes"), std::string::npos);
  // score - t (sub, or add with alpha) is not matched as a bias, which would get the sign wrong; it is
  // pointwise, translated op by op.
  auto sub = flex_graph("bf16", "@cuda:0", "",
                        "  %i: f32[] = aten::index.Tensor(%buf, [%kv_idx])\n"
                        "  %out: f32[] = aten::sub.Tensor(%score, %i)\n",
                        true);
  EXPECT_FALSE(analyze_flex(*sub, flex).score_bias);
  EXPECT_NE(select_kernel(*sub, flex, with_cudnn()).why.find("pointwise nodes (computes aten::index.Tensor, aten::sub.Tensor)"),
            std::string::npos);
}

// Layouts of t from IR text: which indexings are a dense bias or a relative-position (Toeplitz) table.
FlexBiasLayout layout_of(const std::string& buf_type, const std::string& body) {
  auto g = flex_graph("bf16", "@cuda:0", "", body + "  %out: f32[] = aten::add.Tensor(%score, %t)\n", true, buf_type);
  const FlexAnalysis a = analyze_flex(*g, g->find("flex_attention"));
  EXPECT_TRUE(a.score_bias) << body;
  return a.bias_layout;
}

TEST(flex_lowering, bias_layouts_dense_and_toeplitz) {
  using K = FlexBiasLayout::Kind;
  // buf[h, q_idx, kv_idx] and buf[b, h, q_idx, kv_idx]: dense, through a cast.
  FlexBiasLayout l = layout_of("f32[4, 128, 128]", "  %t0: f32[] = aten::index.Tensor(%buf, [%h, %q_idx, %kv_idx])\n"
                                                   "  %t: f32[] = aten::_to_copy.default(%t0)\n");
  EXPECT_EQ(l.kind, K::Dense);
  EXPECT_EQ(to_string(l), "dense buf0[h, q_idx, kv_idx]");
  l = layout_of("f32[2, 4, 128, 128]", "  %t: f32[] = aten::index.Tensor(%buf, [%b, %h, %q_idx, %kv_idx])\n");
  EXPECT_EQ(l.kind, K::Dense);
  EXPECT_TRUE(l.has_batch);
  // bias[0, h, q_idx, kv_idx] of a [1, H, S, S] bias: select, then index.
  l = layout_of("f32[1, 4, 128, 128]", "  %s: f32[4, 128, 128] = aten::select.int(%buf, 0, 0)\n"
                                       "  %t: f32[] = aten::index.Tensor(%s, [%h, %q_idx, %kv_idx])\n");
  EXPECT_EQ(l.kind, K::Dense);
  EXPECT_EQ(to_string(l), "dense buf0[0, h, q_idx, kv_idx]");
  // The same as Dynamo traces it: an index by a lifted constant tensor.
  l = layout_of("f32[1, 4, 128, 128]", "  %c: i64[] = get_attr _tensor_constant0 constant#0\n"
                                       "  %lc: i64[] = aten::lift_fresh_copy.default(%c)\n"
                                       "  %d: i64[] = aten::detach.default(%lc) !view\n"
                                       "  %t: f32[] = aten::index.Tensor(%buf, [%d, %h, %q_idx, %kv_idx])\n");
  EXPECT_EQ(l.kind, K::Dense);
  EXPECT_EQ(to_string(l), "dense buf0[0, h, q_idx, kv_idx]");
  // ... but not select of a dim that is not 1.
  l = layout_of("f32[2, 4, 128, 128]", "  %s: f32[4, 128, 128] = aten::select.int(%buf, 0, 0)\n"
                                       "  %t: f32[] = aten::index.Tensor(%s, [%h, %q_idx, %kv_idx])\n");
  EXPECT_EQ(l.kind, K::Grid);
  // Transposed indices are not the dense layout: evaluated on the grid.
  l = layout_of("f32[4, 128, 128]", "  %t: f32[] = aten::index.Tensor(%buf, [%h, %kv_idx, %q_idx])\n");
  EXPECT_EQ(l.kind, K::Grid);
  // lb[h, kv_idx - q_idx + 127]: Toeplitz with the diagonal in dim 1, sign -1.
  l = layout_of("f32[4, 255]", "  %d: i32[] = aten::sub.Tensor(%kv_idx, %q_idx)\n"
                               "  %e: i32[] = aten::add.Tensor(%d, 127)\n"
                               "  %t: f32[] = aten::index.Tensor(%buf, [%h, %e])\n");
  EXPECT_EQ(l.kind, K::Toeplitz);
  EXPECT_EQ(l.sign, -1);
  EXPECT_EQ(l.offset, 127);
  EXPECT_EQ(l.d_dim, 1);
  EXPECT_EQ(l.h_dim, 0);
  EXPECT_EQ(to_string(l), "toeplitz buf0[h, kv_idx - q_idx + 127]");
  // 2 * (q_idx - kv_idx) is no diagonal; q_idx alone is no diagonal either (and a row shift besides).
  l = layout_of("f32[512, 4]", "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                               "  %e: i32[] = aten::mul.Tensor(%d, 2)\n"
                               "  %t: f32[] = aten::index.Tensor(%buf, [%e, %h])\n");
  EXPECT_EQ(l.kind, K::Grid);
  // Two indexings of the table (t = lb[d, h] * 2) are not one read of it: the grid.
  l = layout_of("f32[255, 4]", "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                               "  %e: i32[] = aten::add.Tensor(%d, 127)\n"
                               "  %i: f32[] = aten::index.Tensor(%buf, [%e, %h])\n"
                               "  %t: f32[] = aten::mul.Tensor(%i, 2)\n");
  EXPECT_EQ(l.kind, K::Grid);
}

// What cuDNN's path materializes, per buffer dtype (q bf16 [2, 4, 128, 64]): a Toeplitz table of q's dtype
// is gathered in that dtype (exact, half the bytes), any other in float32; a dense buffer of float32 or q's
// dtype is passed as it is, another is cast to a float32 copy. Backward adds dBias, counted in float32. The
// node's workspace adds cuDNN's own (cudnn_sdpa_workspace_bytes, tests/cpp/core/cudnn_workspace_test.cpp).
TEST(flex_lowering, the_materialized_bias_keeps_a_bf16_buffer_in_bf16) {
  const int64_t grid = int64_t{1} * 4 * 128 * 128;
  auto toeplitz = [](const std::string& table) {
    return flex_graph("bf16", "@cuda:0", "",
                      "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                      "  %e: i32[] = aten::add.Tensor(%d, 127)\n"
                      "  %i: f32[] = aten::index.Tensor(%buf, [%e])\n"
                      "  %out: f32[] = aten::add.Tensor(%score, %i)\n",
                      true, table);
  };
  for (const auto& [table, bytes] : {std::pair<std::string, int64_t>{"f32[255]", 4}, {"bf16[255]", 2}, {"f16[255]", 4}}) {
    auto g = toeplitz(table);
    const int flex = g->find("flex_attention");
    const FlexAnalysis a = analyze_flex(*g, flex);
    ASSERT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Toeplitz) << table;
    EXPECT_EQ(materialized_bias_bytes(*g, flex, a), grid * bytes) << table;
    EXPECT_EQ(cudnn_flex_workspace_bytes(*g, flex, a), grid * bytes + cudnn_sdpa_workspace_bytes(*g, flex, a)) << table;
  }
  for (const auto& [buf, copy] : {std::pair<std::string, int64_t>{"f32[4, 128, 128]", 0}, {"bf16[4, 128, 128]", 0},
                                  {"f16[4, 128, 128]", 4 * grid}}) {
    auto g = flex_graph("bf16", "@cuda:0", "",
                        "  %t: f32[] = aten::index.Tensor(%buf, [%h, %q_idx, %kv_idx])\n"
                        "  %out: f32[] = aten::add.Tensor(%score, %t)\n",
                        true, buf);
    const int flex = g->find("flex_attention");
    const FlexAnalysis a = analyze_flex(*g, flex);
    ASSERT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Dense) << buf;
    EXPECT_EQ(cudnn_flex_workspace_bytes(*g, flex, a), copy + cudnn_sdpa_workspace_bytes(*g, flex, a)) << buf;
  }
}

// A DFS slice's learned relative bias (slice-schedule's rewrite, docs/scheduling.md): the score_mod reads
// lb[q_idx - kv_idx + 127, map[b, h]], the slice's global head from an index table. Still a Toeplitz
// read, the head through the map, so cuDNN's path gathers the bias along diagonals in the slice; a map
// that is not an integer [b, h] / [h] read is the grid. The bias it builds counts as the node's
// workspace: [1, 2, 128, 128] float32 forward.
// The causal mask_mod and the head of a bf16 score_mod (its five index placeholders), as the hand-written
// flex graphs below spell them.
const std::string kCausalMaskAndScoreHead =
    "graph mask0 {\n"
    "  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n  %q_idx: i32[] = placeholder\n"
    "  %kv_idx: i32[] = placeholder\n  %ge: b8[] = aten::ge.Tensor(%q_idx, %kv_idx)\n  return (%ge,)\n"
    "}\n"
    "graph score0 {\n"
    "  %score: bf16[] = placeholder\n  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n"
    "  %q_idx: i32[] = placeholder\n  %kv_idx: i32[] = placeholder\n";

// A forward graph of one flex_attention node on CUDA, bf16 [B, H, 128, 64] q/k/v, one 128 x 128 block,
// reading the placeholders `inputs` (their declarations) as its score_mod's and mask_mod's buffers.
std::string flex_forward(int B, int H, const std::string& inputs, const std::string& score_bufs,
                         const std::string& mask_bufs) {
  const std::string t = "bf16[" + std::to_string(B) + ", " + std::to_string(H) + ", 128, 64]@cuda:0";
  const std::string stats = "f32[" + std::to_string(B) + ", " + std::to_string(H) + ", 128]@cuda:0";
  return "graph forward {\n"
         "  %q: " + t + " = placeholder\n  %k: " + t + " = placeholder\n  %v: " + t + " = placeholder\n"
         "  %kv_num_blocks: i32[1, 1, 1]@cuda:0 = placeholder\n  %kv_indices: i32[1, 1, 1, 1]@cuda:0 = placeholder\n" +
         inputs + "  %flex_attention: (" + t + ", " + stats + ", " + stats + ") = higher_order::flex_attention("
         "%q, %k, %v, @score0, (128, 128, %kv_num_blocks, %kv_indices, none, none, none, none, none, none, 128, 128, "
         "@mask0), 0.125, {}, (" + score_bufs + "), (" + mask_bufs + "))\n"
         "  %out: " + t + " = operator::getitem(%flex_attention, 0)\n"
         "  return (%out,)\n"
         "}\n";
}

std::shared_ptr<Graph> mapped_relbias(const std::string& map_type, const std::string& map_index) {
  return parse_graph(
      flex_forward(1, 2, "  %lb: f32[255, 4]@cuda:0 = placeholder\n  %map: " + map_type + "@cuda:0 = placeholder\n",
                   "%lb, %map", "") +
      kCausalMaskAndScoreHead +
      "  %lb: f32[255, 4] = placeholder\n"
      "  %map: " + map_type + " = placeholder\n"
      "  %gh: i64[] = aten::index.Tensor(%map, " + map_index + ")\n"
      "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n  %e: i32[] = aten::add.Tensor(%d, 127)\n"
      "  %t: f32[] = aten::index.Tensor(%lb, [%e, %gh])\n  %out: f32[] = aten::add.Tensor(%score, %t)\n"
      "  return (%out,)\n"
      "}\n");
}

TEST(flex_lowering, toeplitz_reads_the_head_through_a_slice_index_table) {
  auto g = mapped_relbias("i64[1, 2]", "[%b, %h]");
  const int flex = g->find("flex_attention");
  FlexAnalysis a = analyze_flex(*g, flex);
  ASSERT_TRUE(a.score_bias);
  EXPECT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Toeplitz);
  EXPECT_EQ(a.bias_layout.h_map, 1);
  EXPECT_TRUE(a.bias_layout.h_map_reads_b);
  EXPECT_EQ(to_string(a.bias_layout), "toeplitz buf0[q_idx - kv_idx + 127, buf1[b, h]]");
  const KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("(toeplitz buf0[q_idx - kv_idx + 127, buf1[b, h]])"), std::string::npos) << c.why;
  EXPECT_EQ(kernel_workspace_bytes(*g, g->nodes[flex], /*cudnn_attention=*/true),
            1 * 2 * 128 * 128 * 4 + cudnn_sdpa_workspace_bytes(*g, flex, a));
  // map[h] (an int32 table of one dim) too.
  a = analyze_flex(*mapped_relbias("i32[2]", "[%h]"), flex);
  EXPECT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Toeplitz);
  EXPECT_FALSE(a.bias_layout.h_map_reads_b);
  EXPECT_EQ(to_string(a.bias_layout), "toeplitz buf0[q_idx - kv_idx + 127, buf1[h]]");
  // Not a head map: a float table, indices in another order, a map read by q_idx.
  EXPECT_EQ(analyze_flex(*mapped_relbias("f32[1, 2]", "[%b, %h]"), flex).bias_layout.kind, FlexBiasLayout::Kind::Grid);
  EXPECT_EQ(analyze_flex(*mapped_relbias("i64[2, 1]", "[%h, %b]"), flex).bias_layout.kind, FlexBiasLayout::Kind::Grid);
  EXPECT_EQ(analyze_flex(*mapped_relbias("i64[128]", "[%q_idx]"), flex).bias_layout.kind, FlexBiasLayout::Kind::Grid);
}

// The issue's setting (B4 H16 S4096 D128 bf16 on CUDA) with a learned relative bias in an auto region
// sliced along batch and heads, forward: the [1, H_s, S, S] float32 bias cuDNN's path materializes (1 GiB
// whole, the same for every batch) counts while the flex node runs, so a 1 GiB memory_budget takes 8
// slices of 8 heads (their bias 512 MiB); with cuDNN's bias left out of the model, as before, the region
// looked like 0.33 GiB and stayed whole. The body reads its heads through the index table and stays a
// Toeplitz read (its kernel choice says so).
TEST(flex_lowering, auto_budget_counts_the_bias_cudnn_materializes) {
  const std::string t = "bf16[4, 16, 4096, 128]@cuda:0";
  const std::string h = "  {region=0 path=0 schedule=auto slice_dims=[0,1] memory_budget=1073741824}";
  const std::string text =
      "graph forward {\n"
      "  %q: " + t + " = placeholder\n  %k: " + t + " = placeholder\n  %v: " + t + " = placeholder\n"
      "  %kv_num_blocks: i32[1, 1, 32]@cuda:0 = placeholder\n  %kv_indices: i32[1, 1, 32, 32]@cuda:0 = placeholder\n"
      "  %lb: f32[8191, 16]@cuda:0 = placeholder\n"
      "  %flex_attention: (" + t + ", f32[4, 16, 4096]@cuda:0, f32[4, 16, 4096]@cuda:0) = "
      "higher_order::flex_attention(%q, %k, %v, @score0, (4096, 4096, %kv_num_blocks, %kv_indices, none, none, none, "
      "none, none, none, 128, 128, @mask0), 0.125, {}, (%lb,), ())" + h + "\n"
      "  %out: " + t + " = operator::getitem(%flex_attention, 0)" + h + "\n"
      "  return (%out,)\n"
      "}\n" +
      kCausalMaskAndScoreHead +
      "  %lb: f32[8191, 16] = placeholder\n"
      "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n  %e: i32[] = aten::add.Tensor(%d, 4095)\n"
      "  %t: f32[] = aten::index.Tensor(%lb, [%e, %h])\n  %out: f32[] = aten::add.Tensor(%score, %t)\n"
      "  return (%out,)\n"
      "}\n";
  auto chosen = [&](bool bias_counts) {
    auto g = parse_graph(text);
    PassContext ctx;
    ctx.memory.target = structural_target();
    ctx.memory.target.cudnn_attention = true;
    ctx.memory.target.workspace = [bias_counts](const Graph& gr, const Node& n) {
      return bias_counts ? kernel_workspace_bytes(gr, n, /*cudnn_attention=*/true) : int64_t{0};
    };
    test::run_and_print(*g, {"slice-legality", "slice-schedule"}, ctx);
    std::string notes;
    for (const std::string& n : ctx.notes) notes += n + "\n";
    return std::make_pair(g, notes);
  };
  auto [g, notes] = chosen(true);
  EXPECT_NE(notes.find("auto chose slices=8: simulated peak"), std::string::npos) << notes;
  const auto body = g->subgraphs.find("slice_body_0");
  ASSERT_NE(body, g->subgraphs.end()) << notes;
  const Graph& b = *body->second;
  const int flex = b.find("flex_attention");
  ASSERT_GE(flex, 0);
  const FlexAnalysis a = analyze_flex(b, flex);
  EXPECT_EQ(a.bias_layout.kind, FlexBiasLayout::Kind::Toeplitz);
  // The bias, and cuDNN's own workspace: a forward's is a constant few bytes (its backward's is not:
  // cudnn_workspace.auto_budget_counts_cudnn_s_own_workspace).
  EXPECT_EQ(kernel_workspace_bytes(b, b.nodes[flex], true),
            int64_t{1} * 8 * 4096 * 4096 * 4 + cudnn_sdpa_workspace_bytes(b, flex, a));
  EXPECT_NE(select_kernel(b, flex, with_cudnn()).why.find("toeplitz buf0[q_idx - kv_idx + 4095, buf1[b, h]]"),
            std::string::npos);
  EXPECT_NE(chosen(false).second.find("auto chose slices=1"), std::string::npos) << chosen(false).second;
}

// A key-padding mask (kv_idx < lengths[b], a captured per-batch length), alone or with causal: cuDNN's
// padding mask with those lengths. The other kernels' band analysis does not take it (it reads a buffer).
std::shared_ptr<Graph> padded(const std::string& mask_body, const std::string& len_type = "i32[2]",
                              const std::string& score_body = "") {
  return parse_graph(
      flex_forward(2, 4, "  %len: " + len_type + "@cuda:0 = placeholder\n", "", "%len,") +
      "graph mask0 {\n"
      "  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n  %q_idx: i32[] = placeholder\n"
      "  %kv_idx: i32[] = placeholder\n  %len: " + len_type + " = placeholder\n" + mask_body +
      "}\n"
      "graph score0 {\n"
      "  %score: bf16[] = placeholder\n  %b: i32[] = placeholder\n  %h: i32[] = placeholder\n"
      "  %q_idx: i32[] = placeholder\n  %kv_idx: i32[] = placeholder\n" +
      (score_body.empty() ? "  return (%score,)\n" : score_body) + "}\n");
}

TEST(flex_lowering, a_kv_padding_mask_runs_on_cudnn_with_sequence_lengths) {
  const std::string pad = "  %l: i32[] = aten::index.Tensor(%len, [%b])\n  %m: b8[] = aten::lt.Tensor(%kv_idx, %l)\n";
  auto g = padded(pad + "  return (%m,)\n");
  const int flex = g->find("flex_attention");
  FlexAnalysis a = analyze_flex(*g, flex);
  EXPECT_FALSE(a.band_ok);  // not a band for the kernels that read bands
  EXPECT_NE(a.mask_why.find("a padding, which only cuDNN's path takes"), std::string::npos) << a.mask_why;
  EXPECT_EQ(a.pad_kv, 0);
  EXPECT_TRUE(a.band.unbounded());
  EXPECT_EQ(cudnn_why_not(*g, flex, a), "");
  KernelChoice c = select_kernel(*g, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_NE(c.why.find("cudnn: no mask, kv padding (kv_idx < mask buffer 0[b]"), std::string::npos) << c.why;
  EXPECT_EQ(cudnn_sdpa_workspace_bytes(*g, flex, a), 1024 + 2 * 8);  // B = 2 sequence lengths
  // With causal (either order of the &), int64 lengths, lengths written len[b] > kv_idx.
  for (const std::string& body :
       {pad + "  %c: b8[] = aten::ge.Tensor(%q_idx, %kv_idx)\n  %a: b8[] = aten::bitwise_and.Tensor(%c, %m)\n  return (%a,)\n",
        std::string("  %l: i64[] = aten::index.Tensor(%len, [%b])\n  %m: b8[] = aten::gt.Tensor(%l, %kv_idx)\n") +
            "  %c: b8[] = aten::ge.Tensor(%q_idx, %kv_idx)\n  %a: b8[] = aten::bitwise_and.Tensor(%m, %c)\n  return (%a,)\n"}) {
    auto gc = padded(body, body.find("i64") != std::string::npos ? "i64[2]" : "i32[2]");
    a = analyze_flex(*gc, flex);
    EXPECT_EQ(a.pad_kv, 0) << body;
    EXPECT_EQ(to_string(a.band), "causal") << body;
    EXPECT_EQ(cudnn_why_not(*gc, flex, a), "") << body;
    EXPECT_NE(select_kernel(*gc, flex, with_cudnn()).why.find("cudnn: causal band, kv padding"), std::string::npos);
  }
  // Not a padding cuDNN takes: a query padding, lengths read by h, kv_idx <= len[b], two length buffers'
  // worth of reads of one (a second comparison), a float length, a learned bias beside it, a window.
  auto why_not = [&](const std::string& body, const std::string& len_type = "i32[2]", const std::string& score = "") {
    auto gx = padded(body, len_type, score);
    return cudnn_why_not(*gx, flex, analyze_flex(*gx, flex));
  };
  EXPECT_NE(why_not("  %l: i32[] = aten::index.Tensor(%len, [%b])\n  %m: b8[] = aten::lt.Tensor(%q_idx, %l)\n  return (%m,)\n"),
            "");
  EXPECT_NE(why_not("  %l: i32[] = aten::index.Tensor(%len, [%h])\n  %m: b8[] = aten::lt.Tensor(%kv_idx, %l)\n  return (%m,)\n"),
            "");
  EXPECT_NE(why_not("  %l: i32[] = aten::index.Tensor(%len, [%b])\n  %m: b8[] = aten::le.Tensor(%kv_idx, %l)\n  return (%m,)\n"),
            "");
  EXPECT_NE(why_not(pad + "  return (%m,)\n", "f32[2]").find("int32/int64 [B]"), std::string::npos);
  EXPECT_NE(why_not(pad + "  return (%m,)\n", "i32[1]").find("int32/int64 [B]"), std::string::npos);
  EXPECT_NE(why_not(pad + "  %c: b8[] = aten::ge.Tensor(%q_idx, %kv_idx)\n  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                          "  %w: b8[] = aten::lt.Tensor(%d, 16)\n  %cw: b8[] = aten::bitwise_and.Tensor(%c, %w)\n"
                          "  %a: b8[] = aten::bitwise_and.Tensor(%cw, %m)\n  return (%a,)\n")
                .find("band causal window 16"),
            std::string::npos);
  EXPECT_NE(why_not(pad + "  return (%m,)\n", "i32[2]",
                    "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n  %t: f32[] = aten::mul.Tensor(%d, 0.5)\n"
                    "  %out: f32[] = aten::add.Tensor(%score, %t)\n  return (%out,)\n")
                .find("neither the identity nor a row shift"),
            std::string::npos);
}

TEST(flex_lowering, pointwise_score_mods_translate_to_cudnn) {
  // softcap 30 * tanh(score / 30): cuDNN pointwise nodes, the band applied after them.
  auto softcap = flex_graph("bf16", "@cuda:0", "",
                            "  %d: f32[] = aten::div.Tensor(%score, 30)\n"
                            "  %t: f32[] = aten::tanh.default(%d)\n"
                            "  %out: f32[] = aten::mul.Tensor(%t, 30)\n");
  const int flex = softcap->find("flex_attention");
  FlexAnalysis a = analyze_flex(*softcap, flex);
  EXPECT_TRUE(a.score_pointwise) << a.pointwise_why;
  KernelChoice c = select_kernel(*softcap, flex, with_cudnn());
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnForward);
  EXPECT_EQ(c.why, "cudnn: causal band, score_mod is a soft cap 30.000000 * tanh(score / 30.000000) (cuDNN's Softcap "
                   "modifier)");
  EXPECT_EQ(a.softcap, 30.0);
  // c * tanh(score / d) with d != c is no soft cap: the generic translation runs it.
  auto skew = flex_graph("bf16", "@cuda:0", "",
                         "  %d: f32[] = aten::div.Tensor(%score, 20)\n"
                         "  %t: f32[] = aten::tanh.default(%d)\n"
                         "  %out: f32[] = aten::mul.Tensor(%t, 30)\n");
  const FlexAnalysis sk = analyze_flex(*skew, flex);
  EXPECT_EQ(sk.softcap, 0.0);
  EXPECT_TRUE(sk.score_pointwise);
  EXPECT_NE(select_kernel(*skew, flex, with_cudnn()).why.find("pointwise nodes (computes aten::div.Tensor, "
                                                               "aten::tanh.default, aten::mul.Tensor)"),
            std::string::npos);
  // ALiBi with a captured slope per head: buf[h] is a broadcast input.
  auto alibi = flex_graph("bf16", "@cuda:0", "",
                          "  %s: f32[] = aten::index.Tensor(%buf, [%h])\n"
                          "  %d: i32[] = aten::sub.Tensor(%kv_idx, %q_idx)\n"
                          "  %m: f32[] = aten::mul.Tensor(%s, %d)\n"
                          "  %out: f32[] = aten::add.Tensor(%score, %m)\n",
                          true, "f32[4]");
  const int aflex = alibi->find("flex_attention");  // one placeholder more: another index
  a = analyze_flex(*alibi, aflex);
  EXPECT_TRUE(a.score_pointwise) << a.pointwise_why;
  EXPECT_TRUE(a.score_bias);  // also additive: the pointwise form wins (no materialized bias)
  EXPECT_NE(select_kernel(*alibi, aflex, with_cudnn()).why.find("pointwise nodes"), std::string::npos);
  // The same slope per batch, buf[b]: cuDNN's score modifier got a per-batch input wrong (measured), so it
  // is no pointwise score_mod; as an additive bias cuDNN takes it materialized.
  auto per_batch = flex_graph("bf16", "@cuda:0", "",
                              "  %s: f32[] = aten::index.Tensor(%buf, [%b])\n"
                              "  %d: i32[] = aten::sub.Tensor(%kv_idx, %q_idx)\n"
                              "  %m: f32[] = aten::mul.Tensor(%s, %d)\n"
                              "  %out: f32[] = aten::add.Tensor(%score, %m)\n",
                              true, "f32[4]");
  a = analyze_flex(*per_batch, aflex);
  EXPECT_FALSE(a.score_pointwise);
  EXPECT_NE(a.pointwise_why.find("reads a buffer by the batch index, which cuDNN's score modifier gets wrong"),
            std::string::npos)
      << a.pointwise_why;
  EXPECT_TRUE(a.score_bias && a.bias_reads_b);
  // What does not translate says why: h in arithmetic, a 2-d gather, an op with no pointwise node.
  std::string why;
  a = analyze_flex(*flex_graph("bf16", "@cuda:0", "",
                               "  %hf: f32[] = aten::mul.Tensor(%h, 2)\n  %out: f32[] = aten::add.Tensor(%score, %hf)\n"),
                   flex);
  EXPECT_FALSE(a.score_pointwise);
  EXPECT_NE(a.pointwise_why.find("reads the head index other than as buf[index]"), std::string::npos) << a.pointwise_why;
  a = analyze_flex(*flex_graph("bf16", "@cuda:0", "",
                               "  %d: i32[] = aten::sub.Tensor(%q_idx, %kv_idx)\n"
                               "  %t: f32[] = aten::index.Tensor(%buf, [%d, %h])\n"
                               "  %out: f32[] = aten::add.Tensor(%score, %t)\n",
                               true, "f32[255, 4]"),
                   aflex);
  EXPECT_FALSE(a.score_pointwise);
  EXPECT_TRUE(a.score_bias);  // the learned relative bias stays a materialized bias
  a = analyze_flex(*flex_graph("bf16", "@cuda:0", "", "  %out: f32[] = aten::erf.default(%score)\n"), flex);
  EXPECT_FALSE(a.score_pointwise);
  EXPECT_NE(a.pointwise_why.find("computes aten::erf.default, which has no cuDNN pointwise node"), std::string::npos)
      << a.pointwise_why;
  const KernelChoice ref = select_kernel(*flex_graph("bf16", "@cuda:0", "", "  %out: f32[] = aten::erf.default(%score)\n"),
                                         flex, with_cudnn());
  EXPECT_EQ(ref.kind, KernelKind::FlexForward);
  EXPECT_NE(ref.why.find("has no cuDNN pointwise node"), std::string::npos) << ref.why;
}

TEST(flex_lowering, kernel_hint_forces_or_refuses_cudnn) {
  // kernel="aten" keeps the reference even where cuDNN could run it.
  auto g = flex_graph("bf16", "@cuda:0", "kernel=aten");
  const int flex = g->find("flex_attention");
  EXPECT_EQ(select_kernel(*g, flex, with_cudnn()).kind, KernelKind::FlexForward);
  // kernel="cudnn" where it cannot run (the CPU) is an error naming the node and why.
  auto cpu = flex_graph("bf16", "", "kernel=cudnn");
  try {
    select_kernels(*cpu, with_cudnn());
    FAIL() << "kernel=cudnn on the CPU must be refused";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("%flex_attention (higher_order::flex_attention)"), std::string::npos) << m;
    EXPECT_NE(m.find("kernel=\"cudnn\" was asked for"), std::string::npos) << m;
    EXPECT_NE(m.find("on cpu"), std::string::npos) << m;
  }
  // deterministic=True reaches the backward's choice (here: the forward's note has no such flag).
  auto ok = flex_graph("f16", "@cuda:0", "kernel=cudnn deterministic=true");
  EXPECT_EQ(select_kernel(*ok, flex, with_cudnn()).kind, KernelKind::FlexCudnnForward);
}

}  // namespace
}  // namespace hb

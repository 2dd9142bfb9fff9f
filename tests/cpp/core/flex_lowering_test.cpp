// flex-lowering's mask analysis: mask_mod graphs as bands on d = q_idx - kv_idx (what cuDNN expresses
// natively), and the reasons for masks that are not one. Expected bands follow from the masks'
// definitions (e.g. causal keeps kv_idx <= q_idx, i.e. d >= 0), not from the analyzer's output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "tests/cpp/core/IrTestUtil.h"

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

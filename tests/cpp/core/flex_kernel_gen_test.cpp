// The FlexAttention kernel generator (codegen/FlexKernelGen.h) and the host compiler's cache
// (codegen/HostCompiler.h). The generated code is built with the machine's C++ compiler and run on
// tiles; expected values are computed here from the score_mod's definition (not from the generator).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend/ir/Parser.h"
#include "codegen/FlexKernelAbi.h"
#include "codegen/FlexKernelGen.h"
#include "codegen/FlexLowering.h"
#include "codegen/HostCompiler.h"
#include "codegen/KernelSelect.h"
#include "codegen/TargetModel.h"
#include "tests/cpp/core/TempDir.h"

namespace hb {
namespace {

// flex_attention_backward with the learned relative bias under a soft cap, and a causal mask:
// score_mod(s) = 30 * tanh(s / 30) + lb[q - kv + 7, h], lb f32[15, 2]; the joint as AOT writes it.
const char* kBackward = R"(graph backward {
  %q: f32[1, 2, 8, 16] = placeholder
  %k: f32[1, 2, 8, 16] = placeholder
  %v: f32[1, 2, 8, 16] = placeholder
  %out: f32[1, 2, 8, 16] = placeholder
  %lse: f32[1, 2, 8] = placeholder
  %dout: f32[1, 2, 8, 16] = placeholder
  %lb: f32[15, 2] = placeholder
  %kvn: i32[1, 1, 1] = placeholder
  %kvi: i32[1, 1, 1, 1] = placeholder
  %fb: (f32[1, 2, 8, 16], f32[1, 2, 8, 16], f32[1, 2, 8, 16], (f32[15, 2])) = higher_order::flex_attention_backward(%q, %k, %v, %out, %lse, %dout, none, @fw0, @joint0, (8, 8, %kvn, %kvi, none, none, none, none, none, none, 128, 128, @mask0), 0.25, {}, (%lb,), ())
  %dq: f32[1, 2, 8, 16] = operator::getitem(%fb, 0)
  return (%dq,)
}
graph fw0 {
  %s: f32[] = placeholder
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %lb: f32[15, 2] = placeholder
  %div: f32[] = aten::div.Tensor(%s, 30)
  %tanh: f32[] = aten::tanh.default(%div)
  %mul: f32[] = aten::mul.Tensor(%tanh, 30)
  %sub: i32[] = aten::sub.Tensor(%qi, %ki)
  %add: i32[] = aten::add.Tensor(%sub, 7)
  %index: f32[] = aten::index.Tensor(%lb, [%add, %h])
  %add_1: f32[] = aten::add.Tensor(%mul, %index)
  return %add_1
}
graph joint0 {
  %s: f32[] = placeholder
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %g: f32[] = placeholder
  %lb: f32[15, 2] = placeholder
  %div: f32[] = aten::div.Tensor(%s, 30)
  %tanh: f32[] = aten::tanh.default(%div)
  %sub: i32[] = aten::sub.Tensor(%qi, %ki)
  %add: i32[] = aten::add.Tensor(%sub, 7)
  %scatter: f32[15, 2] = flex_lib::zeros_and_scatter.default([15, 2], [%add, %h], %g)
  %mul_1: f32[] = aten::mul.Tensor(%g, 30)
  %tb: f32[] = aten::tanh_backward.default(%mul_1, %tanh)
  %div_1: f32[] = aten::div.Tensor(%tb, 30)
  return [%div_1, none, none, none, none, %scatter]
}
graph mask0 {
  %b: i32[] = placeholder
  %h: i32[] = placeholder
  %qi: i32[] = placeholder
  %ki: i32[] = placeholder
  %ge: b8[] = aten::ge.Tensor(%qi, %ki)
  return (%ge,)
}
)";

FlexKernelSource generate(const std::string& ir) {
  auto g = parse_graph(ir);
  int node = -1;
  for (int i = 0; i < static_cast<int>(g->nodes.size()); ++i)
    if (g->nodes[i].target.rfind("higher_order::flex_attention", 0) == 0) node = i;
  std::string why;
  std::optional<FlexKernelSource> s = generate_flex_kernel(*g, node, &why);
  EXPECT_TRUE(s.has_value()) << why;
  return s ? *s : FlexKernelSource{};
}

std::string refusal(const std::string& ir) {
  auto g = parse_graph(ir);
  int node = -1;
  for (int i = 0; i < static_cast<int>(g->nodes.size()); ++i)
    if (g->nodes[i].target.rfind("higher_order::flex_attention", 0) == 0) node = i;
  std::string why;
  EXPECT_FALSE(generate_flex_kernel(*g, node, &why).has_value());
  return why;
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

using test::temp_dir;

bool have_compiler() { return std::system("c++ --version > /dev/null 2>&1") == 0; }

// Builds kBackward's generated CPU code and runs its score_mod over the n x n tile at q = kv = 0, h = 0,
// with lb a [rows, 2] table of ones: the tile's error fields say what the code reported.
HbFlexTile run_score_mod(const FlexKernelSource& s, int64_t rows, int n) {
  HbFlexTile t{};
  const HostBuild build = build_host_module(s.source, {"c++", temp_dir()});
  EXPECT_TRUE(build.module) << build.error;
  if (!build.module) return t;
  auto score = reinterpret_cast<FlexScoreF32>(build.module->symbol("hb_flex_score_f32"));
  std::vector<float> lb(rows * 2, 1.0f), sc(n * n, 0.f);
  HbFlexBuffer buf{};
  buf.data = lb.data();
  buf.rank = 2;
  buf.sizes[0] = rows, buf.sizes[1] = 2, buf.strides[0] = 2, buf.strides[1] = 1;
  t.nq = n, t.nk = n, t.ld = n;
  t.score_buffers = &buf;
  score(sc.data(), &t);
  t.score_buffers = nullptr;
  return t;
}

TEST(flex_kernel_gen, writes_each_node_as_a_scalar_statement) {
  const FlexKernelSource s = generate(kBackward);
  EXPECT_TRUE(s.score_mod && s.mask_mod && s.joint);
  EXPECT_EQ(s.buffer_grads, std::vector<bool>{true});
  // lb's row index moves with kv_idx (q - kv + 7) and its column with neither: the generated reads take lb
  // with its rows innermost, [1, 15] (read_layout; the runtime copies lb so before each call).
  EXPECT_EQ(s.summary, "score_mod: 7 ops; mask_mod: 1 op; joint: 8 ops, gradient scattered into buffer 0; buffer 0 "
                       "read with strides [1, 15] (a copy a call)");
  for (const char* line : {
           "const T v6 = score / ((T)(30));  // %div",
           "const T v7 = hb_tanh(v6);  // %tanh",
           // q < 8 and kv < 16 (the node's sizes): q - kv + 7 is int, and inside lb's 15 rows, so it is
           // read with the chosen strides as literals and no bounds check.
           "const int v9 = ((int)q) - ((int)kv);  // %sub",
           "const int v10 = v9 + 7;  // %add",
           "const T v11 = HB_LD((const float*)t->score_buffers[0].data + (v10 + ((int)h) * 15));  // %index",
           // The line scatter (its offset moves along the tiles' diagonals), which the CPU calls with LINE 0.
           "if (LINE || t->score_buffers[0].grad) hb_scatter_s<LINE, true>(t, 0, t->score_buffers[0].grad, (v10) * 2 + "
           "((int)h), ((double)(grad)));  // %scatter",
           "const bool v4 = (((int)q) >= ((int)kv));  // %ge",
           "const T v13 = v12 * (((T)1) - v8 * v8);  // %tb",
           "extern \"C\" void hb_flex_joint_f64(",
       })
    EXPECT_NE(s.source.find(line), std::string::npos) << line << "\n" << s.source;
  EXPECT_FALSE(s.may_fail);
  ASSERT_EQ(s.buffer_layouts.size(), 1u);
  ASSERT_TRUE(s.buffer_layouts[0].has_value());
  EXPECT_EQ(s.buffer_layouts[0]->sizes, (std::vector<int64_t>{15, 2}));
  EXPECT_EQ(s.buffer_layouts[0]->strides, (std::vector<int64_t>{1, 15}));
}

// The strides a buffer's reads are generated for (read_layout in codegen/FlexKernelGen.cpp): the dimension
// whose index moves with kv_idx goes innermost, the others keep the graph's order of strides; a buffer whose
// kv-moving dimension is already innermost, whose index is not affine, that is broadcast (a stride-0
// dimension) or above 16 MiB keeps the graph's strides.
std::string replace_all(std::string s, const std::string& from, const std::string& to);

TEST(flex_kernel_gen, reads_a_buffer_with_its_kv_moving_dimension_innermost) {
  auto layout = [](const std::string& shape, const std::string& strides, const std::string& index) {
    std::string ir = replace_all(kBackward, "f32[15, 2]", "f32[" + shape + "]" + strides);
    ir = replace_all(ir, "zeros_and_scatter.default([15, 2], [%add, %h]", "zeros_and_scatter.default([" + shape + "], " + index);
    ir = replace(ir, "aten::index.Tensor(%lb, [%add, %h])", "aten::index.Tensor(%lb, " + index + ")");
    const FlexKernelSource s = generate(ir);
    EXPECT_EQ(s.buffer_layouts.size(), 1u) << ir;
    return s.buffer_layouts.size() == 1 && s.buffer_layouts[0] ? s.buffer_layouts[0]->strides : std::vector<int64_t>{};
  };
  // lb[q - kv + 7, h, 1] in [15, 2, 3]: rows innermost, then the last dimension (stride 1 before), then h.
  EXPECT_EQ(layout("15, 2, 3", "", "[%add, %h, 1]"), (std::vector<int64_t>{1, 45, 15}));
  // lb[h, q - kv + 7] in [2, 15]: already innermost.
  EXPECT_EQ(layout("2, 15", "", "[%h, %add]"), (std::vector<int64_t>{15, 1}));
  // Rows broadcast (stride 0): kept, a copy would not be the same buffer.
  EXPECT_EQ(layout("15, 2", "[0, 1]", "[%add, %h]"), (std::vector<int64_t>{0, 1}));
  // 2 100 000 x 2 floats (16.8 MB, above 16 MiB): kept.
  EXPECT_EQ(layout("2100000, 2", "", "[%add, %h]"), (std::vector<int64_t>{2, 1}));
  // (q - kv) mod 15: not affine, kept.
  std::string wrapped = replace_all(kBackward, "aten::add.Tensor(%sub, 7)", "aten::remainder.Scalar(%sub, 15)");
  const FlexKernelSource w = generate(wrapped);
  ASSERT_TRUE(w.buffer_layouts.size() == 1 && w.buffer_layouts[0]) << wrapped;
  EXPECT_EQ(w.buffer_layouts[0]->strides, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(w.summary.find("read with strides"), std::string::npos) << w.summary;
}

// Ops the random score_mods of tests/python/test_flex_random_mods.py found missing: a clamp of integers (its
// range carried on, so the clamped index still reads the table unchecked), abs's derivative (sgn) and
// relu's (threshold_backward) in the joint.
TEST(flex_kernel_gen, clamps_integers_and_writes_the_derivatives_of_abs_and_relu) {
  std::string ir = replace(kBackward, "  %add: i32[] = aten::add.Tensor(%sub, 7)\n  %index",
                           "  %cl: i32[] = aten::clamp.default(%sub, -3, 5)\n  %add: i32[] = aten::add.Tensor(%cl, 7)\n"
                           "  %index");
  ir = replace(ir, "  %div_1: f32[] = aten::div.Tensor(%tb, 30)",
               "  %sg: f32[] = aten::sgn.default(%tb)\n  %th: f32[] = aten::threshold_backward.default(%sg, %s, 0)\n"
               "  %div_1: f32[] = aten::div.Tensor(%th, 30)");
  const FlexKernelSource s = generate(ir);
  for (const char* line : {
           "const int v10 = ((v9 < (-3) ? (-3) : v9) > 5 ? 5 : (v9 < (-3) ? (-3) : v9));  // %cl",
           "const T v12 = HB_LD((const float*)t->score_buffers[0].data + (v11 * 2 + ((int)h)));  // %index",
           "const T v14 = hb_sign<T>(v13);  // %sg",
           "const T v15 = (score <= ((T)(0)) ? (T)0 : v14);  // %th",
       })
    EXPECT_NE(s.source.find(line), std::string::npos) << line << "\n" << s.source;
  EXPECT_FALSE(s.may_fail);  // the clamped index is proven inside the table
}

// What the range analysis keeps: a symbolic sequence length leaves q and kv 64-bit and the read checked;
// a product that can leave 32 bits stays 64-bit.
TEST(flex_kernel_gen, indices_stay_64_bit_and_checked_where_their_range_is_unknown) {
  std::string ir = kBackward;
  for (size_t at; (at = ir.find("f32[1, 2, 8, 16]")) != std::string::npos;) ir.replace(at, 16, "f32[1, 2, s0, 16]");
  const FlexKernelSource dyn = generate(ir);
  EXPECT_NE(dyn.source.find("const long long v9 = q - kv;  // %sub"), std::string::npos) << dyn.source;
  EXPECT_NE(dyn.source.find("hb_index(v10, 15LL, t, 0)"), std::string::npos) << dyn.source;
  EXPECT_TRUE(dyn.may_fail);
  // (q - kv + 7) * 2^30 leaves int32: 64-bit, then checked against lb's 15 rows.
  const FlexKernelSource big = generate(replace(
      replace(kBackward, "  %index: f32[] = aten::index.Tensor(%lb, [%add, %h])",
              "  %big: i64[] = aten::mul.Tensor(%add, 1073741824)\n  %index: f32[] = aten::index.Tensor(%lb, [%big, %h])"),
      "  %add_1: f32[] = aten::add.Tensor(%mul, %index)", "  %add_1: f32[] = aten::add.Tensor(%mul, %index)"));
  EXPECT_NE(big.source.find("= ((long long)v10) * ((long long)1073741824);  // %big"), std::string::npos) << big.source;
  EXPECT_NE(big.source.find("hb_index("), std::string::npos) << big.source;
  EXPECT_TRUE(big.may_fail);
  if (!have_compiler()) return;
  // Run it: the index reported is the 64-bit product, 7 * 2^30 at q = kv = 0 (no int overflow on the way).
  const HbFlexTile t = run_score_mod(big, 15, 1);
  EXPECT_EQ(t.error, kFlexErrorIndex);
  EXPECT_EQ(t.error_index, 7LL << 30);
  EXPECT_EQ(t.error_size, 15);
}

TEST(flex_kernel_gen, the_identity_and_the_noop_mask_generate_nothing_to_call) {
  std::string ir = replace(kBackward, "  return %add_1\n", "  return %s\n");
  ir = replace(ir, "  %ge: b8[] = aten::ge.Tensor(%qi, %ki)\n  return (%ge,)",
               "  %ones: b8[] = aten::new_ones.default(%b, [])\n  return (%ones,)");
  ir = replace(ir, "return [%div_1, none, none, none, none, %scatter]", "return [%g, none, none, none, none, none]");
  const FlexKernelSource s = generate(ir);
  EXPECT_FALSE(s.score_mod);
  EXPECT_FALSE(s.mask_mod);
  EXPECT_FALSE(s.joint);
  EXPECT_EQ(s.source.find("hb_flex_"), std::string::npos);
}

TEST(flex_kernel_gen, the_memory_model_counts_working_copies_not_scores) {
  // B1 H2 S8 D16 float32: the reference materializes 1*2*8*8 scores at 28 bytes each; the generated kernel
  // takes kFlexFusedBackwardCopies float copies of [1, 2, 8, 16].
  auto g = parse_graph(kBackward);
  const Node& n = g->nodes[g->find("fb")];
  EXPECT_EQ(kernel_workspace_bytes(*g, n, false, false), 1 * 2 * 8 * 8 * kFlexBackwardWorkspace);
  EXPECT_EQ(kernel_workspace_bytes(*g, n, false, true), 1 * 2 * 8 * 16 * 4 * kFlexFusedBackwardCopies);
}

TEST(flex_kernel_gen, the_cuda_backward_sums_dq_a_launch_of_pairs_at_a_time) {
  // Launches of at least 1024 CTAs of 64 keys, as even as the pairs allow; one launch below two of those.
  EXPECT_EQ(flex_dq_pairs(64, 4096), 16);  // B4 H16 S4096: 64 key tiles, 16 pairs = 1024 CTAs, 4 launches
  EXPECT_EQ(flex_dq_pairs(64, 1024), 64);  // 16 key tiles: 64 pairs are one launch's least
  EXPECT_EQ(flex_dq_pairs(128, 1024), 64);
  EXPECT_EQ(flex_dq_pairs(100, 4096), 17);  // 6 launches of 16 or 17 pairs (not 16 x 6 + 4)
  EXPECT_EQ(flex_dq_pairs(16, 32768), 2);  // B1 H16 S32768: 512 key tiles a pair, 8 launches of 2
  EXPECT_EQ(flex_dq_pairs(3, 0), 3);
  // The memory model counts one launch's workspace: B4 H16 S4096 D128, 64 pairs in 4 launches: the delta
  // rows, 4 x 16 x 4096 floats, and a quarter of dQ, 16 x 4096 x 128 floats.
  std::string ir = kBackward;
  for (const char* d : {"%q", "%out", "%dout"})
    ir = replace(ir, std::string("  ") + d + ": f32[1, 2, 8, 16] = placeholder",
                 std::string("  ") + d + ": bf16[4, 16, 4096, 128]@cuda:0 = placeholder");
  for (const char* d : {"%k", "%v"})
    ir = replace(ir, std::string("  ") + d + ": f32[1, 2, 8, 16] = placeholder",
                 std::string("  ") + d + ": bf16[4, 16, 4096, 128]@cuda:0 = placeholder");
  ir = replace(ir, "%lse: f32[1, 2, 8] = placeholder", "%lse: f32[4, 16, 4096]@cuda:0 = placeholder");
  ir = replace(ir, "%kvn, %kvi, none, none, none, none, none, none", "%kvn, %kvi, none, none, %kvn, %kvi, none, none");
  auto g = parse_graph(ir);
  const Node& n = g->nodes[g->find("fb")];
  std::string why;
  ASSERT_TRUE(generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda)) << why;
  EXPECT_EQ(kernel_workspace_bytes(*g, n, false, false, /*fused_cuda=*/true),
            int64_t{4} * 16 * 4096 * 4 + int64_t{16} * 4096 * 128 * 4);
  // Several launches take two streams (flex_dq_streams): each launch half the pairs and half the workspace,
  // the halves in turn, so twice the launches over the same workspace; deterministic=True keeps one stream.
  EXPECT_EQ(flex_dq_streams(64, 16, 0), 2);
  EXPECT_EQ(flex_dq_streams(64, 16, 1), 1);
  EXPECT_EQ(flex_dq_streams(64, 64, 0), 1);  // one launch
  EXPECT_EQ(flex_dq_streams(2, 1, 0), 1);    // a pair a launch: no halves
  std::optional<FlexDqLaunches> l = flex_cuda_dq_launches(*g, g->find("fb"));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->pairs, 64);
  EXPECT_EQ(l->streams, 2);
  EXPECT_EQ(l->per_launch, 8);
  EXPECT_EQ(l->launches, 8);
  EXPECT_EQ(l->workspace_bytes, int64_t{16} * 4096 * 128 * 4);
}

TEST(flex_kernel_gen, refuses_what_it_cannot_express_naming_the_node) {
  EXPECT_EQ(refusal(replace(kBackward, "%tanh: f32[] = aten::tanh.default(%div)\n  %mul",
                            "%tanh: f32[] = aten::special_bessel_j0.default(%div)\n  %mul")),
            "score_mod: %tanh (aten::special_bessel_j0.default) has no generated form");
  EXPECT_EQ(refusal(replace(kBackward, "%index: f32[] = aten::index.Tensor(%lb, [%add, %h])",
                            "%index: f32[] = aten::index.Tensor(%lb, [%add])")),
            "score_mod: %index (aten::index.Tensor) indexes a rank-2 buffer with 1 indices (only whole-element reads "
            "are generated)");
  EXPECT_EQ(refusal(replace(kBackward, "return [%div_1, none, none, none, none, %scatter]",
                            "return [%div_1, none, none, none, none, %mul_1]")),
            "joint graph: %mul_1 (aten::mul.Tensor) is a buffer gradient that is not a sum of zeros_and_scatter");
}

// Builds the generated source and runs it on one 8 x 8 tile at (b=0, h=1), comparing with the definition.
TEST(flex_kernel_gen, the_built_kernel_computes_the_score_mod_its_mask_and_its_gradient) {
  if (!have_compiler()) GTEST_SKIP() << "no c++ on PATH";
  const FlexKernelSource s = generate(kBackward);
  const HostBuild build = build_host_module(s.source, {"c++", temp_dir()});
  ASSERT_TRUE(build.module) << build.error;
  auto score = reinterpret_cast<FlexScoreF64>(build.module->symbol("hb_flex_score_f64"));
  auto mask = reinterpret_cast<FlexMaskFn>(build.module->symbol("hb_flex_mask"));
  auto joint = reinterpret_cast<FlexJointF64>(build.module->symbol("hb_flex_joint_f64"));
  ASSERT_TRUE(score && mask && joint);

  // lb[r][c] = 0.1 (2 r + c) - 1, stored as the kernel reads it (its layout's strides, as the runtime's
  // copy lays it out); the gradient is row-major.
  std::vector<float> lb(15 * 2), stored(15 * 2);
  for (size_t i = 0; i < lb.size(); ++i) lb[i] = 0.1f * static_cast<float>(i) - 1.0f;
  ASSERT_TRUE(s.buffer_layouts.size() == 1 && s.buffer_layouts[0]);
  const std::vector<int64_t>& st = s.buffer_layouts[0]->strides;
  for (int r = 0; r < 15; ++r)
    for (int c = 0; c < 2; ++c) stored[r * st[0] + c * st[1]] = lb[r * 2 + c];
  HbFlexBuffer buf{};
  buf.data = stored.data();
  buf.rank = 2;
  buf.sizes[0] = 15, buf.sizes[1] = 2, buf.strides[0] = st[0], buf.strides[1] = st[1];
  std::vector<double> grad(lb.size(), 0.0);
  buf.grad = grad.data();
  HbFlexTile t{};
  t.b = 0, t.h = 1, t.q0 = 0, t.k0 = 0, t.nq = 8, t.nk = 8, t.ld = 8;
  t.score_buffers = &buf;

  std::vector<double> sc(64), pre(64), ds(64, 1.0);
  for (int e = 0; e < 64; ++e) pre[e] = sc[e] = std::sin(e) * 40;  // large enough for the cap to matter
  score(sc.data(), &t);
  std::vector<unsigned char> keep(64);
  mask(keep.data(), &t);
  joint(pre.data(), ds.data(), &t);
  ASSERT_EQ(t.error, 0);
  std::vector<double> want_grad(lb.size(), 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      const double s0 = pre[i * 8 + j];
      const double th = std::tanh(static_cast<float>(s0 / 30));
      EXPECT_NEAR(sc[i * 8 + j], 30 * th + lb[(i - j + 7) * 2 + 1], 1e-5) << i << "," << j;
      EXPECT_EQ(keep[i * 8 + j], i >= j ? 1 : 0);
      EXPECT_NEAR(ds[i * 8 + j], 1 - th * th, 1e-6);  // d/ds of 30 tanh(s/30)
      want_grad[(i - j + 7) * 2 + 1] += 1.0;         // the incoming gradient, scattered by diagonal
    }
  EXPECT_EQ(grad, want_grad);
}


// kBackward with score_mod(s) = the sum of `terms` (IR lines defining %t0, %t1, ... from %s) and a joint
// whose d/ds is the sum of `grads` (lines defining %d0, %d1, ... from %g and %s), no buffer read or gradient.
std::string ops_ir(const std::vector<std::string>& terms, const std::vector<std::string>& grads) {
  auto chain = [](const std::vector<std::string>& lines, const char* v, const char* sum) {
    std::string body;
    for (size_t k = 0; k < lines.size(); ++k) {
      const std::string name = std::string("%") + v + std::to_string(k);
      body += "  " + name + ": f32[] = " + lines[k] + "\n";
      const std::string prev = k ? std::string("%") + sum + std::to_string(k - 1) : "";
      if (k) body += std::string("  %") + sum + std::to_string(k) + ": f32[] = aten::add.Tensor(" + prev + ", " + name + ")\n";
      else body += std::string("  %") + sum + "0: f32[] = aten::mul.Tensor(" + name + ", 1)\n";
    }
    return body + "  return %" + sum + std::to_string(lines.size() - 1) + "\n";
  };
  std::string ir = kBackward;
  const size_t f0 = ir.find("  %div: f32[] = aten::div.Tensor(%s, 30)"), f1 = ir.find("}\ngraph joint0");
  ir.replace(f0, f1 - f0, chain(terms, "t", "u"));
  const size_t j0 = ir.find("  %div: f32[] = aten::div.Tensor(%s, 30)", ir.find("graph joint0")), j1 = ir.find("}\ngraph mask0");
  std::string jb = chain(grads, "d", "e");
  jb.replace(jb.rfind("  return %"), std::string::npos, "  return [%e" + std::to_string(grads.size() - 1) + ", none, none, none, none, none]\n");
  ir.replace(j0, j1 - j0, jb);
  return replace(ir, "(f32[1, 2, 8, 16], f32[1, 2, 8, 16], f32[1, 2, 8, 16], (f32[15, 2]))",
                 "(f32[1, 2, 8, 16], f32[1, 2, 8, 16], f32[1, 2, 8, 16], (none))");
}

// The activations and their derivatives (the *_backward ops autograd writes into the joint), and the other
// float functions, built and run in double: each forward against its definition written out here, each
// derivative against a central difference of the built forward. nvcc builds the same ops as CUDA code.
TEST(flex_kernel_gen, writes_the_activations_and_their_derivatives) {
  const std::vector<std::string> acts = {
      "aten::silu.default(%s)", "aten::gelu.default(%s)", "aten::gelu.default(%s, approximate=\"tanh\")",
      "aten::softplus.default(%s, 2.0, 1.0)", "aten::mish.default(%s)", "aten::leaky_relu.default(%s, 0.1)",
      "aten::hardtanh.default(%s, -1.5, 1.0)", "aten::hardsigmoid.default(%s)", "aten::hardswish.default(%s)",
      "aten::elu.default(%s, 1.0)", "aten::celu.default(%s, 1.5)",
      "aten::elu.default(%s, 1.6732632423543772, 1.0507009873554805)"};
  const std::vector<std::string> grads = {
      "aten::silu_backward.default(%g, %s)", "aten::gelu_backward.default(%g, %s)",
      "aten::gelu_backward.default(%g, %s, approximate=\"tanh\")", "aten::softplus_backward.default(%g, %s, 2.0, 1.0)",
      "aten::mish_backward.default(%g, %s)", "aten::leaky_relu_backward.default(%g, %s, 0.1, false)",
      "aten::hardtanh_backward.default(%g, %s, -1.5, 1.0)", "aten::hardsigmoid_backward.default(%g, %s)",
      "aten::hardswish_backward.default(%g, %s)", "aten::elu_backward.default(%g, 1.0, 1, 1, false, %s)",
      "aten::elu_backward.default(%g, 1.5, 1, 0.66666666666666663, false, %s)",
      "aten::elu_backward.default(%g, 1.6732632423543772, 1.0507009873554805, 1, false, %s)"};
  const std::vector<std::string> others = {
      "aten::atan2.default(%s, 0.7)", "aten::hypot.default(%s, 0.7)", "aten::logaddexp.default(%s, 0.3)",
      "aten::logaddexp2.default(%s, 0.3)", "aten::copysign.Tensor(%s, -1.0)", "aten::xlogy.Tensor(%s, 1.7)",
      "aten::sinc.default(%s)", "aten::frac.default(%s)", "aten::nan_to_num.default(%s)", "aten::rad2deg.default(%s)",
      "aten::deg2rad.default(%s)", "aten::asinh.default(%s)", "aten::lerp.Scalar(%s, 0.3, 0.25)",
      "aten::lerp.Scalar(%s, 0.3, 0.75)"};
  const double pi = 3.14159265358979323846;
  auto sp = [](double x, double beta, double th) { return x * beta > th ? x : std::log1p(std::exp(beta * x)) / beta; };
  auto elu = [](double x, double alpha, double scale, double in) { return x > 0 ? scale * x : scale * alpha * (std::exp(x * in) - 1); };
  const std::vector<std::function<double(double)>> act_defs = {
      [](double x) { return x / (1 + std::exp(-x)); },
      [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
      [pi](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x))); },
      [sp](double x) { return sp(x, 2.0, 1.0); },
      [sp](double x) { return x * std::tanh(sp(x, 1, 20)); },
      [](double x) { return x > 0 ? x : 0.1 * x; },
      [](double x) { return std::min(std::max(x, -1.5), 1.0); },
      [](double x) { return std::min(std::max(x + 3, 0.0), 6.0) / 6; },
      [](double x) { return x * std::min(std::max(x + 3, 0.0), 6.0) / 6; },
      [elu](double x) { return elu(x, 1, 1, 1); },
      [elu](double x) { return elu(x, 1.5, 1, 1 / 1.5); },
      [elu](double x) { return elu(x, 1.6732632423543772, 1.0507009873554805, 1); }};
  const std::vector<std::function<double(double)>> other_defs = {
      [](double x) { return std::atan2(x, 0.7); }, [](double x) { return std::sqrt(x * x + 0.49); },
      [](double x) { return std::log(std::exp(x) + std::exp(0.3)); },
      [](double x) { return std::log2(std::exp2(x) + std::exp2(0.3)); }, [](double x) { return -std::fabs(x); },
      [](double x) { return x * std::log(1.7); }, [pi](double x) { return std::sin(pi * x) / (pi * x); },
      [](double x) { return x - std::trunc(x); }, [](double x) { return x; }, [pi](double x) { return x * 180 / pi; },
      [pi](double x) { return x * pi / 180; }, [](double x) { return std::log(x + std::sqrt(x * x + 1)); },
      [](double x) { return x + 0.25 * (0.3 - x); }, [](double x) { return x + 0.75 * (0.3 - x); }};
  std::vector<std::string> all = acts;
  all.insert(all.end(), others.begin(), others.end());
  const FlexKernelSource s = generate(ops_ir(all, grads));
  EXPECT_FALSE(s.may_fail);
  if (have_compiler()) {
    // Off every kink (0, the thresholds, -3 and 3, integers): one score per column of a 1 x 12 tile.
    const std::vector<double> xs = {-3.7, -2.2, -1.2, -0.4, 0.3, 0.9, 1.6, 2.8, 5.1, -0.05, 0.45, 1.3};
    const HostBuild build = build_host_module(s.source, {"c++", temp_dir()});
    ASSERT_TRUE(build.module) << build.error;
    auto score = reinterpret_cast<FlexScoreF64>(build.module->symbol("hb_flex_score_f64"));
    auto joint = reinterpret_cast<FlexJointF64>(build.module->symbol("hb_flex_joint_f64"));
    ASSERT_TRUE(score && joint);
    const int n = static_cast<int>(xs.size());
    HbFlexTile t{};
    t.nq = 1, t.nk = n, t.ld = n;
    auto f = [&](std::vector<double> v) { score(v.data(), &t); return v; };
    std::vector<double> ds(n, 1.0);
    joint(xs.data(), ds.data(), &t);
    const std::vector<double> y = f(xs);
    const double h = 1e-6;
    std::vector<double> up = xs, dn = xs;
    for (double& v : up) v += h;
    for (double& v : dn) v -= h;
    const std::vector<double> yu = f(up), yd = f(dn);
    for (int e = 0; e < n; ++e) {
      double want = 0;
      for (const auto& d : act_defs) want += d(xs[e]);
      for (const auto& d : other_defs) want += d(xs[e]);
      EXPECT_NEAR(y[e], want, 1e-9 * (1 + std::fabs(want))) << "score_mod at " << xs[e];
      // The joint differentiates the activations only: the other functions' slopes come off the difference.
      double others_slope = 0;
      for (const auto& d : other_defs) others_slope += (d(xs[e] + h) - d(xs[e] - h)) / (2 * h);
      EXPECT_NEAR(ds[e], (yu[e] - yd[e]) / (2 * h) - others_slope, 1e-5) << "joint at " << xs[e];
    }
  }
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0) return;
  auto g = parse_graph(replace_all(replace_all(ops_ir(all, grads), "f32[1, 2, 8, 16]", "bf16[1, 2, 200, 64]"),
                                   "(8, 8, %kvn, %kvi, none, none, none, none,", "(200, 200, %kvn, %kvi, none, none, %kvn, %kvi,"));
  std::string why;
  const std::optional<FlexKernelSource> cs = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(cs.has_value()) << why;
  for (const char* arch : {"90", "80"}) {
    const HostBuild build = build_cuda_module(cs->source, {"nvcc", arch, cutlass, temp_dir()});
    EXPECT_TRUE(build.module) << arch << ": " << build.error;
  }
}

// The float score_mod's tanh (hb_tanh, a clamped rational so that the tile loops vectorize) against the
// library's on a sweep, with the values a score can take at the edges: infinities, NaN, tiny and huge.
TEST(flex_kernel_gen, the_float_tanh_matches_the_library_and_keeps_nan_and_infinities) {
  if (!have_compiler()) GTEST_SKIP() << "no c++ on PATH";
  // score_mod(s) = tanh(s), no buffer, no mask.
  std::string ir = replace(kBackward, "  %div: f32[] = aten::div.Tensor(%s, 30)\n  %tanh: f32[] = aten::tanh.default(%div)\n"
                                      "  %mul: f32[] = aten::mul.Tensor(%tanh, 30)\n",
                           "  %tanh: f32[] = aten::tanh.default(%s)\n");
  ir = replace(ir, "  %sub: i32[] = aten::sub.Tensor(%qi, %ki)\n  %add: i32[] = aten::add.Tensor(%sub, 7)\n"
                   "  %index: f32[] = aten::index.Tensor(%lb, [%add, %h])\n  %add_1: f32[] = aten::add.Tensor(%mul, %index)\n"
                   "  return %add_1\n",
               "  return %tanh\n");
  const FlexKernelSource s = generate(ir);
  ASSERT_NE(s.source.find("hb_tanh(score)"), std::string::npos) << s.source;
  const HostBuild build = build_host_module(s.source, {"c++", temp_dir()});
  ASSERT_TRUE(build.module) << build.error;
  auto score = reinterpret_cast<FlexScoreF32>(build.module->symbol("hb_flex_score_f32"));
  ASSERT_TRUE(score);
  std::vector<float> x;
  for (int e = -2000; e <= 2000; ++e) x.push_back(e * 0.0061f);  // -12.2 .. 12.2
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {inf, -inf, 1e30f, -1e30f, 1e-30f, -1e-30f, 0.0f, -0.0f, 3e-4f, 7.9f, -7.95f}) x.push_back(v);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  std::vector<float> y = x;
  HbFlexTile t{};
  t.nq = 1, t.nk = static_cast<int>(y.size()), t.ld = t.nk;
  score(y.data(), &t);
  for (size_t e = 0; e + 1 < x.size(); ++e) {
    const double want = std::tanh(static_cast<double>(x[e]));
    EXPECT_LE(std::fabs(y[e] - want), 4e-7 * std::max(std::fabs(want), 1e-30)) << "tanh(" << x[e] << ") = " << y[e];
  }
  EXPECT_TRUE(std::isnan(y.back()));
}

TEST(flex_kernel_gen, an_out_of_range_read_reports_the_index) {
  if (!have_compiler()) GTEST_SKIP() << "no c++ on PATH";
  // lb declared with 4 rows, too few for q - kv + 7: the read is checked (the range analysis proves
  // nothing) and reports the index.
  std::string ir = kBackward;
  for (size_t at; (at = ir.find("[15, 2]")) != std::string::npos;) ir.replace(at, 7, "[4, 2]");
  const FlexKernelSource s = generate(ir);
  EXPECT_TRUE(s.may_fail);
  const HbFlexTile t = run_score_mod(s, 4, 2);
  EXPECT_EQ(t.error, kFlexErrorIndex);
  EXPECT_EQ(t.error_buffer, 0);
  EXPECT_EQ(t.error_index, 7);  // q=0, kv=0: 0 - 0 + 7
  EXPECT_EQ(t.error_size, 4);
}

TEST(host_compiler, caches_by_source_and_rebuilds_what_it_cannot_trust) {
  if (!have_compiler()) GTEST_SKIP() << "no c++ on PATH";
  const std::string dir = temp_dir();
  const std::string src = "extern \"C\" int hb_answer() { return 42; }\n";
  HostBuild a = build_host_module(src, {"c++", dir});
  ASSERT_TRUE(a.module) << a.error;
  EXPECT_FALSE(a.cache_hit);
  EXPECT_EQ(reinterpret_cast<int (*)()>(a.module->symbol("hb_answer"))(), 42);
  const std::string path = a.path;
  a = {};  // unloaded: the next build must come from the disk
  HostBuild b = build_host_module(src, {"c++", dir});
  ASSERT_TRUE(b.module) << b.error;
  EXPECT_TRUE(b.cache_hit);
  EXPECT_EQ(b.path, path);
  b = {};
  // A corrupt library is rebuilt, not trusted.
  std::ofstream(path, std::ios::binary) << "garbage";
  HostBuild c = build_host_module(src, {"c++", dir});
  ASSERT_TRUE(c.module) << c.error;
  EXPECT_FALSE(c.cache_hit);
  EXPECT_EQ(reinterpret_cast<int (*)()>(c.module->symbol("hb_answer"))(), 42);
  c = {};
  // A source that does not match its entry (a stale or foreign one) is rebuilt too.
  std::ofstream(path.substr(0, path.size() - 3) + ".cpp", std::ios::binary) << "// something else\n";
  HostBuild d = build_host_module(src, {"c++", dir});
  ASSERT_TRUE(d.module) << d.error;
  EXPECT_FALSE(d.cache_hit);
}

TEST(host_compiler, a_failed_build_says_why) {
  if (!have_compiler()) GTEST_SKIP() << "no c++ on PATH";
  const HostBuild r = build_host_module("this is not C++\n", {"c++", temp_dir()});
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.error.find("`c++` failed"), std::string::npos) << r.error;
  EXPECT_EQ(build_host_module("int x;\n", {"", "/tmp"}).error, "no host C++ compiler is configured");
}

// The backward above on CUDA: bf16 [1, 2, 200, 64] q/k/v (S not a multiple of any tile), with the
// BlockMask's q lists (the CUDA backward walks them).
std::string cuda_backward_ir(const std::string& dtype = "bf16", int d = 64) {
  std::string ir = kBackward;
  const std::string t = dtype + "[1, 2, 200, " + std::to_string(d) + "]";
  for (const char* name : {"%q", "%k", "%v", "%out", "%dout"}) ir = replace(ir, std::string(name) + ": f32[1, 2, 8, 16]", std::string(name) + ": " + t);
  ir = replace(ir, "(f32[1, 2, 8, 16], f32[1, 2, 8, 16], f32[1, 2, 8, 16], (f32[15, 2]))",
               "(" + t + ", " + t + ", " + t + ", (f32[15, 2]))");
  ir = replace(ir, "%dq: f32[1, 2, 8, 16]", "%dq: " + t);
  ir = replace(ir, "%lse: f32[1, 2, 8]", "%lse: f32[1, 2, 200]");
  ir = replace(ir, "(8, 8, %kvn, %kvi, none, none, none, none,", "(200, 200, %kvn, %kvi, none, none, %kvn, %kvi,");
  return ir;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
  return s;
}

// cuda_backward_ir with the table sized to the sequence: lb[q - kv + 199, h], lb [399, 2], read and
// scattered inside for every q, kv < 200.
std::string cuda_relative_ir(const std::string& dtype = "bf16", int d = 64) {
  return replace_all(replace_all(cuda_backward_ir(dtype, d), "15, 2]", "399, 2]"), "aten::add.Tensor(%sub, 7)",
                     "aten::add.Tensor(%sub, 199)");
}

std::string cuda_refusal(const std::string& ir) {
  auto g = parse_graph(ir);
  std::string why;
  EXPECT_FALSE(generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda).has_value());
  return why;
}

TEST(flex_kernel_gen, cuda_source_specializes_the_tiled_kernels) {
  auto g = parse_graph(cuda_backward_ir());
  std::string why;
  const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(s.has_value()) << why;
  // (no proven line: see below)
  EXPECT_EQ(s->summary, "CUDA, head dim 64, bfloat16; score_mod: 7 ops; mask_mod: 1 op; joint: 8 ops, gradient "
                        "scattered into buffer 0; buffer 0 read with strides [1, 15] (a copy a call)");
  for (const char* line : {"#define HB_D 64\n", "#define HB_HALF 0\n", "#define HB_SCORE_MOD 1\n", "#define HB_MASK_MOD 1\n",
                           "#define HB_JOINT 1\n", "#define HB_SCATTER 1\n", "hb_scatter_s<LINE, false>(t, 0, t->score_buffers[0].grad, ", "extern \"C\" int hb_flex_cuda_backward("})
    EXPECT_NE(s->source.find(line), std::string::npos) << line;
  // 16-bit q/k/v: the hardware's tanh, defined before the library that reads it.
  EXPECT_LT(s->source.find("#define HB_TANH_APPROX 1\n"), s->source.find("HB_FN float hb_tanh(float x)"));
  // lb[q - kv + 7] over 200 positions may leave lb's 15 rows: no proven line (the kernel probes at run time).
  EXPECT_EQ(s->source.find("#define HB_LINE_STATIC 1"), std::string::npos);
  // No host tile wrappers: the scalar functions are device code only.
  EXPECT_EQ(s->source.find("hb_flex_score_f32"), std::string::npos);
  EXPECT_LT(s->source.find("HB_FN T hb_score_mod"), s->source.find(kFlexTemplateMarker));
}

// The CUDA source's line scatter (HB_LINE_*): a scatter whose offset the generator proves to move along
// rows, columns or diagonals of every tile inside both sequences, with the offset's steps per q_idx and
// kv_idx worked out by hand from the buffer's row-major layout ([n, 2]: 2 per row of the table).
TEST(flex_kernel_gen, cuda_proves_the_scatter_that_runs_along_lines) {
  auto cuda = [](const std::string& ir) {
    auto g = parse_graph(ir);
    std::string why;
    const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
    EXPECT_TRUE(s.has_value()) << why;
    return s ? *s : FlexKernelSource{};
  };
  auto with_table = [](const std::string& rows, const std::string& index, const std::string& sub) {
    std::string ir = replace_all(cuda_backward_ir(), "15, 2]", rows + ", 2]");
    ir = replace_all(ir, "%sub: i32[] = aten::sub.Tensor(%qi, %ki)", sub);
    return replace_all(ir, "[%add, %h]", index);
  };
  // lb[q - kv + 199, h]: the offset 2 (q - kv + 199) + h.
  const FlexKernelSource rel = cuda(cuda_relative_ir());
  EXPECT_NE(rel.source.find("#define HB_LINE_STATIC 1\n#define HB_LINE_BUF 0\n#define HB_LINE_ALPHA 2LL\n"
                            "#define HB_LINE_BETA -2LL\n"), std::string::npos) << rel.source;
  EXPECT_NE(rel.source.find("hb_scatter_s<LINE, true>(t, 0, "), std::string::npos);
  EXPECT_NE(rel.summary.find("(buffer 0 summed per tile along its diagonals: offset moves 2 per q_idx, -2 per "
                             "kv_idx)"), std::string::npos) << rel.summary;
  // A per-query table lb[q, h] (rows, 2 per q) and a per-key one lb[kv, h] (columns).
  const FlexKernelSource rows = cuda(with_table("200", "[%qi, %h]", "%sub: i32[] = aten::sub.Tensor(%qi, %ki)"));
  EXPECT_NE(rows.source.find("#define HB_LINE_ALPHA 2LL\n#define HB_LINE_BETA 0LL\n"), std::string::npos);
  EXPECT_NE(rows.summary.find("along its rows"), std::string::npos) << rows.summary;
  const FlexKernelSource cols = cuda(with_table("200", "[%ki, %h]", "%sub: i32[] = aten::sub.Tensor(%qi, %ki)"));
  EXPECT_NE(cols.source.find("#define HB_LINE_ALPHA 0LL\n#define HB_LINE_BETA 2LL\n"), std::string::npos);
  EXPECT_NE(cols.summary.find("along its columns"), std::string::npos) << cols.summary;
  // Not a line: lb[q + kv, h] moves 2 per q_idx and 2 per kv_idx (an anti-diagonal); lb[(q - kv) mod 15, h]
  // is not affine. Both scatter with the kernel's run-time probe.
  for (const std::string& ir :
       {replace_all(with_table("399", "[%add, %h]", "%sub: i32[] = aten::add.Tensor(%qi, %ki)"), "aten::add.Tensor(%sub, 7)",
                    "aten::add.Tensor(%sub, 0)"),
        replace_all(with_table("15", "[%add, %h]", "%sub: i32[] = aten::sub.Tensor(%qi, %ki)"), "aten::add.Tensor(%sub, 7)",
                    "aten::remainder.Scalar(%sub, 15)")}) {
    const FlexKernelSource s = cuda(ir);
    EXPECT_EQ(s.source.find("#define HB_LINE_STATIC 1"), std::string::npos) << ir;
    EXPECT_NE(s.source.find("hb_scatter_s<LINE, false>(t, 0, "), std::string::npos);
    EXPECT_EQ(s.summary.find("summed per tile"), std::string::npos) << s.summary;
  }
}

// Head dims between the built ones run on the next one up, q, k and v padded with zero columns by the
// runtime; a value head dim unlike q's takes the one that holds both.
TEST(flex_kernel_gen, cuda_pads_head_dims_up_to_the_next_built_one) {
  for (auto [d, built] : {std::pair{8, 16}, {24, 32}, {48, 64}, {80, 128}, {96, 128}, {100, 128}}) {
    auto g = parse_graph(cuda_backward_ir("bf16", d));
    std::string why;
    const auto src = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
    ASSERT_TRUE(src.has_value()) << d << ": " << why;
    EXPECT_NE(src->source.find("\n#define HB_D " + std::to_string(built) + "\n"), std::string::npos) << d;
    EXPECT_NE(src->summary.find("CUDA, head dim " + std::to_string(built) + " (q/k " + std::to_string(d) + ", v " +
                                std::to_string(d) + ", padded with zero columns)"),
              std::string::npos)
        << src->summary;
  }
  auto exact = parse_graph(cuda_backward_ir("bf16", 64));
  std::string why;
  const auto src = generate_flex_kernel(*exact, exact->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(src.has_value()) << why;
  EXPECT_NE(src->summary.find("CUDA, head dim 64, bfloat16;"), std::string::npos) << src->summary;
  EXPECT_EQ(flex_cuda_head_dim(64, 32), 64);
  EXPECT_EQ(flex_cuda_head_dim(40, 100), 128);
  EXPECT_EQ(flex_cuda_head_dim(200, 200), 256);
  EXPECT_EQ(flex_cuda_head_dim(16, 16), 16);
  EXPECT_EQ(flex_cuda_head_dim(257, 64), 0);
  EXPECT_EQ(flex_cuda_head_dim(64, 257), 0);
}

TEST(flex_kernel_gen, cuda_refuses_what_its_kernels_do_not_take) {
  EXPECT_EQ(cuda_refusal(cuda_backward_ir("f64")), "q is float64 (the CUDA kernels take bfloat16, float16 and float32)");
  EXPECT_EQ(cuda_refusal(cuda_backward_ir("bf16", 320)), "head dim 320 (the CUDA kernels take head dims up to 256)");
  // float32 and the backward at head dim 256 run the SIMT kernels, which add dQ with atomics.
  for (auto [dtype, d, what] : {std::tuple{"f32", 64, "float32"}, {"bf16", 256, "head dim 256"}, {"f16", 160, "head dim 256"}}) {
    auto g = parse_graph(cuda_backward_ir(dtype, d));
    g->nodes[g->find("fb")].hints.deterministic = true;
    std::string why;
    EXPECT_FALSE(generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda).has_value());
    EXPECT_EQ(why, std::string("deterministic=True, which the CUDA SIMT backward (") + what +
                       ") does not give: it adds dQ with atomics in no fixed order");
  }
  // k's head dim must be q's (flex_attention checks it too); v's may differ.
  EXPECT_EQ(cuda_refusal(replace(cuda_backward_ir("bf16", 64), "%k: bf16[1, 2, 200, 64]", "%k: bf16[1, 2, 200, 32]")),
            "k's head dim 32 differs from q's 64");
  EXPECT_EQ(cuda_refusal(replace(cuda_backward_ir(), "none, none, %kvn, %kvi, none, none, 128, 128,",
                                 "none, none, %kvn, %kvi, none, none, 64, 128,")),
            "block sizes 64 x 128 (the CUDA backward needs multiples of 128 x 64)");
  EXPECT_EQ(cuda_refusal(replace(cuda_backward_ir(), "(200, 200, %kvn, %kvi, none, none, %kvn, %kvi,",
                                 "(200, 200, %kvn, %kvi, none, none, none, none,")),
            "the block mask has no q block lists (the CUDA backward walks them)");
  EXPECT_EQ(cuda_refusal(kBackward), "the block mask has no q block lists (the CUDA backward walks them)");
  // The SIMT backward's tiles: 64 x 64 (32 x 32 at head dim 256).
  EXPECT_EQ(cuda_refusal(replace(cuda_backward_ir("f32"), "none, none, %kvn, %kvi, none, none, 128, 128,",
                                 "none, none, %kvn, %kvi, none, none, 32, 128,")),
            "block sizes 32 x 128 (the CUDA backward needs multiples of 64 x 64)");
  EXPECT_EQ(cuda_refusal(replace(cuda_backward_ir("bf16", 256), "none, none, %kvn, %kvi, none, none, 128, 128,",
                                 "none, none, %kvn, %kvi, none, none, 16, 128,")),
            "block sizes 16 x 128 (the CUDA backward needs multiples of 32 x 32)");
}

// float32 q/k/v (both ways) and the backward at head dim 256 (any dtype): the SIMT kernels
// (codegen/cuda/FlexSimtKernel.cuh, pasted after the template), named in the summary; float32 also takes
// the BlockMask blocks of 64 x 64 that the mma.sync backward (128 query rows) does not.
TEST(flex_kernel_gen, cuda_float32_and_the_head_dim_256_backward_run_the_simt_kernels) {
  auto gen = [](const std::string& ir) {
    auto g = parse_graph(ir);
    std::string why;
    const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
    EXPECT_TRUE(s.has_value()) << why;
    return s ? *s : FlexKernelSource{};
  };
  const FlexKernelSource f32 = gen(cuda_backward_ir("f32", 64));
  EXPECT_EQ(f32.summary.rfind("CUDA, head dim 64, float32, SIMT (CUDA cores, float FMA, no TF32); score_mod: 7 ops;", 0),
            0u) << f32.summary;
  for (const char* line : {"#define HB_HALF 0\n#define HB_F32 1\n", "__global__ void __launch_bounds__(NT, 1) flex_bwd_simt(",
                           "__global__ void __launch_bounds__(NT, 1) flex_fwd_simt("})
    EXPECT_NE(f32.source.find(line), std::string::npos) << line;
  EXPECT_LT(f32.source.find(kFlexTemplateMarker), f32.source.find("flex_bwd_simt("));
  EXPECT_EQ(f32.source.find("#define HB_TANH_APPROX"), std::string::npos);  // float32 keeps the rational tanh
  const FlexKernelSource d256 = gen(cuda_backward_ir("bf16", 200));
  EXPECT_EQ(d256.summary.rfind("CUDA, head dim 256 (q/k 200, v 200, padded with zero columns), bfloat16, SIMT (CUDA "
                               "cores, float FMA); ", 0), 0u) << d256.summary;
  EXPECT_NE(d256.source.find("#define HB_F32 0\n"), std::string::npos);
  EXPECT_NE(d256.source.find("flex_bwd_simt("), std::string::npos);
  // Tensor cores below 256 in half precision: no SIMT text.
  const FlexKernelSource bf16 = gen(cuda_backward_ir("bf16", 128));
  EXPECT_EQ(bf16.source.find("flex_bwd_simt("), std::string::npos);
  EXPECT_EQ(bf16.summary.find("SIMT"), std::string::npos) << bf16.summary;
  gen(replace(cuda_backward_ir("f32"), "none, none, %kvn, %kvi, none, none, 128, 128,",
              "none, none, %kvn, %kvi, none, none, 64, 64,"));
}

// nvcc builds the generated CUDA unit (no GPU needed) where the environment names CUTLASS's headers:
// HB_TEST_CUTLASS_INCLUDE=<site-packages>/cutlass_library/source/include (CI sets it).
TEST(flex_kernel_gen, nvcc_builds_the_cuda_source) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  // The proven line's kernels (HB_LINE_STATIC) here; selection_on_cuda_builds_the_generated_kernel builds
  // the run-time probe's.
  auto g = parse_graph(cuda_relative_ir("f16", 128));
  std::string why;
  const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(s.has_value()) << why;
  ASSERT_NE(s->source.find("#define HB_LINE_STATIC 1"), std::string::npos);
  CudaCompileSettings cs{"nvcc", "90", cutlass, temp_dir()};
  const HostBuild build = build_cuda_module(s->source, cs);
  ASSERT_TRUE(build.module) << build.error;
  EXPECT_NE(build.module->symbol("hb_flex_cuda_forward"), nullptr);
  EXPECT_NE(build.module->symbol("hb_flex_cuda_backward"), nullptr);
  // "90" builds sm_90a with the warpgroup-MMA kernels; "80" the mma.sync ones alone (which once failed to
  // compile there: the float2 atomics are sm_90's).
  const HostBuild ampere = build_cuda_module(s->source, {"nvcc", "80", cutlass, temp_dir()});
  ASSERT_TRUE(ampere.module) << ampere.error;
  EXPECT_NE(ampere.module->symbol("hb_flex_cuda_backward"), nullptr);
  EXPECT_EQ(build_cuda_module(s->source, {"nvcc", "90", "", "/tmp"}).error,
            "no CUTLASS headers (pip install nvidia-cutlass, or set HINTBACKEND_CUTLASS_INCLUDE)");
}

// bf16 with a causal mask_mod: the units Hopper's flex_bwd_ws is built into (codegen/cuda/FlexTiledKernel.cuh,
// HB_WS): at head dim 128 the identity score_mod, and a score_mod (the soft cap and the table read) with its
// joint, whose table gets no gradient (no scatter) or does (the run-time probe); a learned relative bias (the
// proven line) at head dims 128 and 64; at head dim 64 the identity; with deterministic=True the identity at
// both and the relative bias at 128 (its windows one per consumer, a 64-key tile's). nvcc builds each for sm_90a, and its backward's shared memory is flex_bwd_ws's (more than
// flex_bwd_wg's): K and V (2 x 128 rows), Q and dO double-buffered (4 x 64), D / 8 chunks of 16 bytes a
// row; the float dQ tiles, one [64][128] at D 128, two [64][64] at D 64; P and dS (2 x 64 rows of 128
// keys), which a scatter's two [64][65] float line tiles overlay and pass by 512 bytes; 16 bytes of
// hand-over; at D 64 without deterministic=True, 96 of the writer's Q/dO stages (their full and empty
// mbarriers and step records). A scatter at head dim 64 stays on flex_bwd_wg: one warpgroup's K and V
// (2 x 64), Q and dO (4 x 64), P and dS (2 x 64 rows of 64 keys), one line tile passing them by 256 bytes.
TEST(flex_kernel_gen, nvcc_builds_the_hopper_backward_of_three_warpgroups) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  auto identity = [](int d) {
    std::string ir = replace(cuda_backward_ir("bf16", d), "  return %add_1\n", "  return %s\n");
    return replace(ir, "return [%div_1, none, none, none, none, %scatter]", "return [%g, none, none, none, none, none]");
  };
  std::string no_scatter = replace(cuda_backward_ir("bf16", 128),
                                   "  %scatter: f32[15, 2] = flex_lib::zeros_and_scatter.default([15, 2], [%add, %h], %g)\n", "");
  no_scatter = replace(no_scatter, "return [%div_1, none, none, none, none, %scatter]", "return [%div_1, none, none, none, none, none]");
  struct Unit {
    std::string ir;
    int d;
    bool mods, deterministic, scatter;
  };
  for (const Unit& u : {Unit{identity(128), 128, false, false, false}, Unit{no_scatter, 128, true, false, false},
                        Unit{cuda_backward_ir("bf16", 128), 128, true, false, true},
                        Unit{cuda_relative_ir("bf16", 128), 128, true, false, true},
                        Unit{cuda_relative_ir("bf16", 64), 64, true, false, true},
                        Unit{identity(64), 64, false, false, false}, Unit{identity(128), 128, false, true, false},
                        Unit{identity(64), 64, false, true, false},
                        Unit{cuda_relative_ir("bf16", 128), 128, true, true, true}}) {
    auto g = parse_graph(u.ir);
    g->nodes[g->find("fb")].hints.deterministic = u.deterministic;
    std::string why;
    const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
    ASSERT_TRUE(s.has_value()) << why;
    const std::string what = "head dim " + std::to_string(u.d) + (u.mods ? ", a score_mod" : ", identity") +
                             (u.scatter ? ", a buffer gradient" : "") + (u.deterministic ? ", deterministic" : "");
    EXPECT_EQ(s->score_mod, u.mods) << what;
    EXPECT_EQ(s->joint, u.mods) << what;
    EXPECT_NE(s->source.find(u.scatter ? "#define HB_SCATTER 1\n" : "#define HB_SCATTER 0\n"), std::string::npos) << what;
    EXPECT_EQ(s->source.find("#define HB_DETERMINISTIC 1\n") != std::string::npos, u.deterministic) << what;
    const HostBuild build = build_cuda_module(s->source, {"nvcc", "90", cutlass, temp_dir()});
    ASSERT_TRUE(build.module) << what << ": " << build.error;
    auto smem = reinterpret_cast<long long (*)(int)>(build.module->symbol("hb_flex_cuda_smem"));
    ASSERT_NE(smem, nullptr);
    const long long ch = u.d / 8;
    const bool ws = !u.scatter || u.d == 128;
    const long long loader = u.d == 64 && !u.deterministic ? 96 : 0;
    const long long want = ws ? (2 * 128 * ch + 4 * 64 * ch + 2 * 64 * 16) * 16 + 64 * 128 * 4 + (u.scatter ? 512 : 0) + 16 + loader
                              : (2 * 64 * ch + 4 * 64 * ch + 2 * 64 * 8) * 16 + 256;
    EXPECT_EQ(smem(1), want) << what;
  }
}

// nvcc builds the SIMT kernels (FlexSimtKernel.cuh) for sm_90a and sm_80: float32 at head dims 16 (one
// float per thread and column group), 128 and 256, with the proven line (relative bias) and the run-time
// probe (the 15-row table), and the bfloat16 backward at head dim 256 (converted as it loads).
TEST(flex_kernel_gen, nvcc_builds_the_simt_kernels) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  for (auto [ir, archs] : {std::pair{cuda_relative_ir("f32", 128), std::vector<std::string>{"90", "80"}},
                           {cuda_backward_ir("f32", 16), {"80"}},
                           {cuda_relative_ir("f32", 256), {"90"}},
                           {cuda_relative_ir("bf16", 256), {"90", "80"}}}) {
    auto g = parse_graph(ir);
    std::string why;
    const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
    ASSERT_TRUE(s.has_value()) << why;
    ASSERT_NE(s->source.find("flex_bwd_simt("), std::string::npos);
    for (const std::string& arch : archs) {
      const HostBuild build = build_cuda_module(s->source, {"nvcc", arch, cutlass, temp_dir()});
      ASSERT_TRUE(build.module) << s->summary << " sm_" << arch << ": " << build.error;
      EXPECT_NE(build.module->symbol("hb_flex_cuda_forward"), nullptr);
      EXPECT_NE(build.module->symbol("hb_flex_cuda_backward"), nullptr);
    }
  }
}

// cuda_backward_ir's (or cuda_relative_ir's) score_mod and joint without the soft cap: score + lb[...].
std::string without_softcap(std::string ir) {
  for (const char* line : {"  %div: f32[] = aten::div.Tensor(%s, 30)\n", "  %tanh: f32[] = aten::tanh.default(%div)\n",
                           "  %mul: f32[] = aten::mul.Tensor(%tanh, 30)\n", "  %mul_1: f32[] = aten::mul.Tensor(%g, 30)\n",
                           "  %tb: f32[] = aten::tanh_backward.default(%mul_1, %tanh)\n",
                           "  %div_1: f32[] = aten::div.Tensor(%tb, 30)\n"})
    ir = replace_all(ir, line, "");
  ir = replace(ir, "aten::add.Tensor(%mul, %index)", "aten::add.Tensor(%s, %index)");
  return replace(ir, "return [%div_1, none,", "return [%g, none,");
}

// Kernel selection on a CUDA node cuDNN cannot run (a buffer gradient through a soft cap): the generated CUDA kernel, built with nvcc, saying why not cuDNN; with
// deterministic=True and the buffer's gradient, or without CUTLASS's headers, the reference, saying why.
// cuDNN builds dBias in q's dtype only, so a float32 table's gradient gathered from it would carry bf16
// rounding: the backward goes to the generated kernel where it can be built (the forward, which has no
// dBias, stays on cuDNN). Without CUTLASS's headers, cuDNN runs and the dump says why the rule did not
// apply; a bf16 table loses nothing to cuDNN's bf16 dBias and stays there.
TEST(flex_kernel_gen, a_float_buffer_gradient_goes_to_the_generated_backward) {
  std::string ir = without_softcap(cuda_relative_ir());  // score + lb[q - kv + 199, h]: cuDNN's materialized bias
  ir = replace_all(ir, "bf16[1, 2, 200, 64]", "bf16[1, 2, 200, 64]@cuda:0");
  auto g = parse_graph(ir);
  const int fb = g->find("fb");
  Target target;
  target.cudnn_attention = true;
  KernelChoice c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnBackward) << c.why;
  EXPECT_NE(c.why.find("(its dBias is bfloat16 only: buffer 0's float gradient would carry that rounding, but the "
                       "generated kernel cannot run: cannot build CUDA kernels"),
            std::string::npos) << c.why;
  auto bf16 = parse_graph(replace_all(ir, "f32[399, 2]", "bf16[399, 2]"));
  c = select_kernel(*bf16, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexCudnnBackward) << c.why;
  EXPECT_EQ(c.why.find("dBias is bfloat16 only"), std::string::npos) << c.why;

  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  target.cuda = {"nvcc", "90", cutlass, temp_dir()};
  c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  EXPECT_NE(c.why.find("(not cuDNN: its dBias is bfloat16 only: buffer 0's float gradient would carry that rounding)"),
            std::string::npos) << c.why;
  g->nodes[fb].hints.kernel = KernelPref::Cudnn;  // asked for: cuDNN, rounding and all
  EXPECT_EQ(select_kernel(*g, fb, target).kind, KernelKind::FlexCudnnBackward);
}

// A per-query bias, score + lb[q, h], only shifts each softmax row: the CUDA kernels run the identity and
// call score_mod once per row (HB_ROW_SHIFT), the backward (no logsumexp gradient) without the joint or a
// scatter; nvcc builds it where CUTLASS's headers are named.
TEST(flex_kernel_gen, a_row_shift_runs_once_per_row) {
  std::string ir = without_softcap(cuda_backward_ir());
  ir = replace_all(replace_all(ir, "15, 2]", "200, 2]"), "[%add, %h]", "[%qi, %h]");
  ir = replace_all(ir, "bf16[1, 2, 200, 64]", "bf16[1, 2, 200, 64]@cuda:0");
  auto g = parse_graph(ir);
  const int fb = g->find("fb");
  std::string why;
  const std::optional<FlexKernelSource> s = generate_flex_kernel(*g, fb, &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(s.has_value()) << why;
  for (const char* line : {"#define HB_SCORE_MOD 1\n", "#define HB_JOINT 0\n", "#define HB_SCATTER 0\n",
                           "#define HB_ROW_SHIFT 1\n"})
    EXPECT_NE(s->source.find(line), std::string::npos) << line;
  EXPECT_TRUE(s->row_shift);
  EXPECT_NE(s->summary.find("run once per row (a row shift)"), std::string::npos) << s->summary;
  // A logsumexp gradient asks for the bias's: the backward runs score_mod and the joint per element.
  auto with_lse = parse_graph(replace(ir, "%lse, %dout, none, @fw0", "%lse, %dout, %lse, @fw0"));
  const std::optional<FlexKernelSource> j = generate_flex_kernel(*with_lse, fb, &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(j.has_value()) << why;
  EXPECT_EQ(j->source.find("#define HB_ROW_SHIFT 1"), std::string::npos);
  EXPECT_NE(j->source.find("#define HB_JOINT 1\n"), std::string::npos);
  EXPECT_FALSE(j->row_shift);

  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  Target target;
  target.cuda = {"nvcc", "90", cutlass, temp_dir()};
  g->nodes[fb].hints.kernel = KernelPref::Fused;
  const KernelChoice c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  ASSERT_NE(c.module, nullptr);
}

// ALiBi with a slope buffer read by (b, h), score + lb[b, h] * (kv - q): the CUDA forward adds the bias as
// a ramp (HB_KV_RAMP; flex_lowering's a_slope_times_the_distance_is_a_ramp); the backward calls score_mod
// per element, its slope learned (the joint scatters into it) or not.
TEST(flex_kernel_gen, alibi_backward_calls_score_mod_per_element) {
  std::string ir = without_softcap(cuda_backward_ir());
  ir = replace(ir, "  %index: f32[] = aten::index.Tensor(%lb, [%add, %h])\n  %add_1: f32[] = aten::add.Tensor(%s, %index)\n",
               "  %index: f32[] = aten::index.Tensor(%lb, [%b, %h])\n  %ramp: f32[] = aten::mul.Tensor(%index, %sub)\n"
               "  %add_1: f32[] = aten::add.Tensor(%s, %ramp)\n");
  ir = replace_all(ir, "bf16[1, 2, 200, 64]", "bf16[1, 2, 200, 64]@cuda:0");
  std::string why;
  for (const char* ret : {"return [%g, none, none, none, none, %scatter]", "return [%g, none, none, none, none, none]"}) {
    auto g = parse_graph(replace(ir, "return [%g, none, none, none, none, %scatter]", ret));
    const int fb = g->find("fb");
    EXPECT_TRUE(analyze_flex(*g, fb).score_kv_ramp);
    const std::optional<FlexKernelSource> b = generate_flex_kernel(*g, fb, &why, FlexKernelDevice::Cuda);
    ASSERT_TRUE(b.has_value()) << why;
    EXPECT_EQ(b->source.find("#define HB_KV_RAMP 1\n"), std::string::npos) << ret;
    EXPECT_EQ(b->summary.find("a ramp"), std::string::npos) << b->summary;
  }
}

// A bf16 model's joint converts the score gradient it returns (`_to_copy(grad)`; here grad -> bf16 -> f32):
// the generated code computes every floating dtype in T, so the joint is still the identity (HB_JOINT 0),
// and the CUDA backward keeps its split schedule. A conversion across kinds (to an integer) is a statement.
TEST(flex_kernel_gen, a_joint_that_converts_the_gradient_is_the_identity) {
  std::string ir = replace_all(without_softcap(cuda_backward_ir()), "bf16[1, 2, 200, 64]", "bf16[1, 2, 200, 64]@cuda:0");
  ir = replace(ir, "return [%g, none, none, none, none, %scatter]",
               "%c: bf16[] = aten::_to_copy.default(%g, dtype=dtype.bfloat16)\n  %c_1: f32[] = aten::_to_copy.default(%c, "
               "dtype=dtype.float32)\n  return [%c_1, none, none, none, none, none]");
  std::string why;
  auto g = parse_graph(ir);
  std::optional<FlexKernelSource> b = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(b.has_value()) << why;
  EXPECT_NE(b->source.find("#define HB_JOINT 0\n"), std::string::npos);
  EXPECT_NE(b->summary.find("joint: identity"), std::string::npos) << b->summary;
  EXPECT_EQ(b->source.find("hb_joint("), std::string::npos);
  // Through an integer (truncation): a real joint.
  g = parse_graph(replace(ir, "%c: bf16[] = aten::_to_copy.default(%g, dtype=dtype.bfloat16)",
                          "%c: i64[] = aten::_to_copy.default(%g, dtype=dtype.int64)"));
  b = generate_flex_kernel(*g, g->find("fb"), &why, FlexKernelDevice::Cuda);
  ASSERT_TRUE(b.has_value()) << why;
  EXPECT_NE(b->source.find("#define HB_JOINT 1\n"), std::string::npos);
  EXPECT_NE(b->summary.find("joint: 5 ops"), std::string::npos) << b->summary;
}

TEST(flex_kernel_gen, selection_on_cuda_builds_the_generated_kernel) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  std::string ir = cuda_backward_ir();
  const std::string t = "bf16[1, 2, 200, 64]";
  for (size_t at = 0; (at = ir.find(t, at)) != std::string::npos; at += t.size())
    ir.insert(at + t.size(), "@cuda:0");
  auto g = parse_graph(ir);
  const int fb = g->find("fb");
  Target target;
  target.cuda = {"nvcc", "90", cutlass, temp_dir()};
  KernelChoice c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  EXPECT_EQ(c.why.rfind("fused: tiled over the block mask, generated code (CUDA, head dim 64, bfloat16; ", 0), 0u) << c.why;
  EXPECT_NE(c.why.find("(not cuDNN: score_mod computes aten::div.Tensor, aten::tanh.default"), std::string::npos) << c.why;
  ASSERT_NE(c.module, nullptr);
  EXPECT_NE(c.module->symbol("hb_flex_cuda_backward"), nullptr);

  // deterministic=True: the kernel orders dQ's adds, and a buffer gradient's only where it is one scatter
  // along the tiles' lines. lb[q - kv + 7] over 200 positions may leave lb's 15 rows (no proven line): the
  // reference runs; a table sized to the sequence (a proven diagonal) runs on the generated kernel;
  // without the table's gradient (the joint returns none for it), the generated kernel.
  g->nodes[fb].hints.deterministic = true;
  c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexBackward);
  EXPECT_NE(c.why.find("not fused: deterministic=True, and the joint's buffer gradient is not a scatter along the "
                       "tiles' rows, columns or diagonals (the CUDA backward adds only one such scatter in a fixed "
                       "order)"),
            std::string::npos) << c.why;
  std::string rel = cuda_relative_ir();
  for (size_t at = 0; (at = rel.find(t, at)) != std::string::npos; at += t.size()) rel.insert(at + t.size(), "@cuda:0");
  auto line = parse_graph(rel);
  line->nodes[fb].hints.deterministic = true;
  c = select_kernel(*line, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  EXPECT_NE(c.why.find("; deterministic: dQ added in key-tile order, the buffer gradient's line sums kept per key "
                       "tile and added in tile order"),
            std::string::npos) << c.why;
  auto no_grad = parse_graph(replace(ir, "return [%div_1, none, none, none, none, %scatter]",
                                     "return [%div_1, none, none, none, none, none]"));
  no_grad->nodes[fb].hints.deterministic = true;
  c = select_kernel(*no_grad, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  EXPECT_EQ(c.why.rfind("fused: tiled over the block mask, generated code (CUDA, head dim 64, bfloat16; ", 0), 0u) << c.why;
  EXPECT_NE(c.why.find("; deterministic: dQ added in key-tile order"), std::string::npos) << c.why;

  // float32 (which the tensor-core kernels took as TF32, so the reference ran): the SIMT kernels.
  auto f32 = parse_graph(replace_all(ir, "bf16[1, 2, 200, 64]", "f32[1, 2, 200, 64]"));
  c = select_kernel(*f32, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  EXPECT_EQ(c.why.rfind("fused: tiled over the block mask, generated code (CUDA, head dim 64, float32, SIMT (CUDA cores, "
                        "float FMA, no TF32); ", 0), 0u) << c.why;
  ASSERT_NE(c.module, nullptr);

  g->nodes[fb].hints.deterministic.reset();
  target.cuda.cutlass_include = "";
  c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexBackward);
  EXPECT_NE(c.why.find("not fused: cannot build CUDA kernels: no CUTLASS headers"), std::string::npos) << c.why;
}


// A GPU whose shared memory per block is below what the unit's kernels ask for (hb_flex_cuda_smem) gets the
// reference, saying why, rather than a kernel that fails to launch: the mma.sync backward at head dim 64
// asks for 112.5 KiB, which an A100 (163 KiB) gives and an sm_86 GPU (99 KiB) does not.
TEST(flex_kernel_gen, a_kernel_that_needs_more_shared_memory_than_the_gpu_gives_stays_off_it) {
  const char* cutlass = std::getenv("HB_TEST_CUTLASS_INCLUDE");
  if (!cutlass || !*cutlass || std::system("nvcc --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvcc or HB_TEST_CUTLASS_INCLUDE missing";
  auto g = parse_graph(replace_all(cuda_backward_ir(), "bf16[1, 2, 200, 64]", "bf16[1, 2, 200, 64]@cuda:0"));
  const int fb = g->find("fb");
  Target target;
  target.cuda = {"nvcc", "80", cutlass, temp_dir(), 166912};
  KernelChoice c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexFusedBackward) << c.why;
  ASSERT_NE(c.module, nullptr);
  using SmemFn = long long (*)(int);
  const auto smem = reinterpret_cast<SmemFn>(c.module->symbol("hb_flex_cuda_smem"));
  ASSERT_NE(smem, nullptr);
  // K, V: 2 x 64 rows, Q, dO: 2 x 2 x 128 rows, P, dS: 2 x 128 x 64, in bf16; and the line tile (the joint
  // scatters: [128][65] floats) reaching 512 bytes past P and dS.
  EXPECT_EQ(smem(1), (2 * 64 * 64 + 4 * 128 * 64 + 2 * 128 * 64) * 2 + 512);

  target.cuda = {"nvcc", "86", cutlass, temp_dir(), 101376};
  c = select_kernel(*g, fb, target);
  EXPECT_EQ(c.kind, KernelKind::FlexBackward);
  EXPECT_NE(c.why.find("not fused: the CUDA backward needs 112 KiB of shared memory per block; this GPU (sm_86) "
                       "gives 99 KiB"),
            std::string::npos) << c.why;
}

}  // namespace
}  // namespace hb

// Tests for backend/runtime/FlexAttention: forward and backward checked against an independent float64
// reference written here with dense ATen ops and autograd (no vmap, no broadcast index grids), over
// score_mods with and without learned buffers, masks (causal, fully masked rows), GQA, Bkv = 1, dtypes.
// The SubgraphFns below are C++ stand-ins for the traced FX graphs: same signatures, same outputs.
#include "backend/runtime/FlexAttention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

namespace hb::rt {
namespace {

using IValues = std::vector<c10::IValue>;
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kLn2 = std::log(2.0);

// buf[idx0, idx1, ...] as the traced graphs write it (aten.index.Tensor).
at::Tensor gather(const at::Tensor& buf, const std::vector<at::Tensor>& idx) {
  c10::List<std::optional<at::Tensor>> list;
  for (const auto& t : idx) list.push_back(t);
  return at::index(buf, list);
}

// The joint graphs' outputs: grad of score, None for b, h, q_idx, kv_idx, then the buffer grads.
IValues joint_outputs(const at::Tensor& grad_score, const IValues& buffer_grads) {
  IValues out{grad_score, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue()};
  out.insert(out.end(), buffer_grads.begin(), buffer_grads.end());
  return out;
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-300);
}

// Same -inf pattern, and close relative error on the finite entries.
void expect_close_with_inf(const at::Tensor& got, const at::Tensor& want, double tol, const char* what) {
  const at::Tensor got_inf = got.to(at::kDouble).isneginf(), want_inf = want.isneginf();
  EXPECT_TRUE(got_inf.equal(want_inf)) << what << ": -inf entries differ";
  EXPECT_LT(rel_err(got.to(at::kDouble).masked_fill(got_inf, 0), want.masked_fill(want_inf, 0)), tol) << what;
}

// ---- score_mods: the runtime's subgraphs and a dense float64 version for the reference ----

struct ScoreMod {
  SubgraphFn fw, joint;
  std::vector<at::Tensor> buffers;
  std::vector<bool> trainable;  // whether the joint graph returns a gradient for each buffer
  // Dense version over the full scores [B, H, Sq, Skv] and float64 copies of the buffers.
  std::function<at::Tensor(const at::Tensor&, const std::vector<at::Tensor>&)> dense;
};

ScoreMod identity_mod() {
  return {[](IValues in) { return IValues{in[0]}; },
          [](IValues in) { return joint_outputs(in[5].toTensor(), {}); },
          {},
          {},
          [](const at::Tensor& s, const std::vector<at::Tensor>&) { return s; }};
}

// cap * tanh(score / kCap): a non-linear score_mod with no buffers.
constexpr double kCap = 20.0;
ScoreMod softcap_mod() {
  return {[](IValues in) { return IValues{(in[0].toTensor() / kCap).tanh() * kCap}; },
          [](IValues in) {
            const at::Tensor t = (in[0].toTensor() / kCap).tanh();
            return joint_outputs(in[5].toTensor() * (1 - t * t), {});
          },
          {},
          {},
          [](const at::Tensor& s, const std::vector<at::Tensor>&) { return (s / kCap).tanh() * kCap; }};
}

// score * temp[h] + bias[h]: bias is learned (fp32), temp is a constant (the joint returns None for it).
// Softmax ignores a per-row shift, so bias's gradient is 0 up to rounding unless grad_logsumexp is given:
// tests using this mod set grad_lse so that the gradient is non-trivial and a relative error is meaningful.
ScoreMod head_bias_mod(int64_t H) {
  const at::Tensor bias = at::randn({H}), temp = at::rand({H}) + 0.5;
  return {[](IValues in) {
            const at::Tensor h = in[2].toTensor();
            return IValues{in[0].toTensor() * gather(in[6].toTensor(), {h}) + gather(in[5].toTensor(), {h})};
          },
          [H](IValues in) {
            const at::Tensor h = in[2].toTensor(), grad = in[5].toTensor();
            return joint_outputs(grad * gather(in[7].toTensor(), {h}),
                                 {zeros_and_scatter({H}, {h}, grad), c10::IValue()});
          },
          {bias, temp},
          {true, false},
          [H](const at::Tensor& s, const std::vector<at::Tensor>& b) {
            return s * b[1].view({1, H, 1, 1}) + b[0].view({1, H, 1, 1});
          }};
}

// score + lb[q_idx - kv_idx + S - 1, h] with a learned lb of shape (2S - 1, H); needs Sq = Skv = S.
ScoreMod rel_bias_mod(int64_t S, int64_t H) {
  const at::Tensor lb = at::randn({2 * S - 1, H});
  return {[S](IValues in) {
            const at::Tensor rel = in[3].toTensor() - in[4].toTensor() + (S - 1);
            return IValues{in[0].toTensor() + gather(in[5].toTensor(), {rel, in[2].toTensor()})};
          },
          [S, H](IValues in) {
            const at::Tensor rel = in[3].toTensor() - in[4].toTensor() + (S - 1), grad = in[5].toTensor();
            return joint_outputs(grad, {zeros_and_scatter({2 * S - 1, H}, {rel, in[2].toTensor()}, grad)});
          },
          {lb},
          {true},
          [S, H](const at::Tensor& s, const std::vector<at::Tensor>& b) {
            // bias[h, i, j] = lb[i - j + S - 1, h], index built by loops.
            std::vector<int64_t> rel;
            for (int64_t i = 0; i < S; ++i)
              for (int64_t j = 0; j < S; ++j) rel.push_back(i - j + S - 1);
            const at::Tensor idx = at::tensor(rel, at::kLong).view({S, S});
            return s + b[0].index_select(0, idx.flatten()).view({S, S, H}).permute({2, 0, 1}).unsqueeze(0);
          }};
}

// ---- masks: the runtime's FlexMask and a dense bool [B, 1, Sq, Skv] built by loops ----

struct MaskCase {
  FlexMask mask;
  at::Tensor dense;  // undefined: no mask
};

at::Tensor dense_mask(int64_t B, int64_t Sq, int64_t Skv, const std::function<bool(int64_t, int64_t, int64_t)>& keep) {
  at::Tensor m = at::zeros({B, 1, Sq, Skv}, at::kBool);
  auto a = m.accessor<bool, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t j = 0; j < Skv; ++j) a[b][0][i][j] = keep(b, i, j);
  return m;
}

MaskCase no_mask() { return {}; }

MaskCase causal_mask(int64_t B, int64_t Sq, int64_t Skv) {
  FlexMask m{[](IValues in) { return IValues{in[2].toTensor().ge(in[3].toTensor())}; }, {}};
  return {m, dense_mask(B, Sq, Skv, [](int64_t, int64_t i, int64_t j) { return i >= j; })};
}

// keep_row[q_idx] & (kv_idx < kv_len[b]): every third query row is fully masked; uses mask buffers.
MaskCase padded_rows_mask(int64_t B, int64_t Sq, int64_t Skv) {
  const at::Tensor keep_row = at::arange(Sq).remainder(3).ne(0);
  const at::Tensor kv_len = at::arange(B, at::kInt).mul(-2).add(Skv).clamp_min(1);
  FlexMask m{[](IValues in) {
               const at::Tensor row = gather(in[4].toTensor(), {in[2].toTensor()});
               return IValues{row.logical_and(in[3].toTensor().lt(gather(in[5].toTensor(), {in[0].toTensor()})))};
             },
             {keep_row, kv_len}};
  const auto len = kv_len.accessor<int, 1>();
  return {m, dense_mask(B, Sq, Skv, [&](int64_t b, int64_t i, int64_t j) { return i % 3 != 0 && j < len[b]; })};
}

// ---- the float64 reference ----

struct Case {
  int64_t B = 2, Bkv = 2, Hq = 4, Hkv = 4, Sq = 8, Skv = 12, D = 16, Dv = 8;
  at::ScalarType dtype = at::kFloat;
  bool grad_lse = false;
  double tol = 1e-5;
};

struct Inputs {
  at::Tensor q, k, v, grad_out;
  c10::optional<at::Tensor> grad_lse;  // gradient w.r.t. the base-2 logsumexp
  double scale;
};

Inputs make_inputs(const Case& c) {
  const auto opt = at::TensorOptions().dtype(c.dtype);
  Inputs in{at::randn({c.B, c.Hq, c.Sq, c.D}).to(opt), at::randn({c.Bkv, c.Hkv, c.Skv, c.D}).to(opt),
            at::randn({c.Bkv, c.Hkv, c.Skv, c.Dv}).to(opt), at::randn({c.B, c.Hq, c.Sq, c.Dv}).to(opt),
            c10::nullopt, 1.0 / std::sqrt(static_cast<double>(c.D))};
  if (c.grad_lse) in.grad_lse = at::randn({c.B, c.Hq, c.Sq});
  return in;
}

struct Expected {
  at::Tensor out, lse2, max2, dq, dk, dv;
  std::vector<at::Tensor> dbuf;
};

at::Tensor leaf64(const at::Tensor& t) { return t.to(at::kDouble).detach().requires_grad_(true); }

// Dense attention in float64: kv heads gathered per query head, batch expanded, softmax with fully
// masked rows kept finite (scores 0) and then zeroed, gradients from autograd.
Expected reference(const Case& c, const Inputs& in, const ScoreMod& mod, const MaskCase& mask) {
  const at::Tensor q = leaf64(in.q), k = leaf64(in.k), v = leaf64(in.v);
  std::vector<at::Tensor> bufs;
  for (const auto& b : mod.buffers) bufs.push_back(leaf64(b));
  const at::Tensor heads = at::arange(c.Hq).floor_divide(c.Hq / c.Hkv);
  const at::Tensor kh = k.index_select(1, heads).expand({c.B, c.Hq, c.Skv, c.D});
  const at::Tensor vh = v.index_select(1, heads).expand({c.B, c.Hq, c.Skv, c.Dv});

  at::Tensor s = mod.dense(q.matmul(kh.transpose(-2, -1)) * in.scale, bufs);
  const at::Tensor keep = mask.dense.defined() ? mask.dense.expand_as(s) : at::ones_like(s, at::kBool);
  const at::Tensor dead = keep.any(-1, /*keepdim=*/true).logical_not();
  s = s.masked_fill(keep.logical_not(), -kInf);
  const at::Tensor safe = s.masked_fill(dead, 0);
  const at::Tensor lse = safe.logsumexp(-1, /*keepdim=*/true);
  const at::Tensor p = (safe - lse).exp().masked_fill(dead, 0);
  const at::Tensor out = p.matmul(vh);
  const at::Tensor lse2 = lse.masked_fill(dead, 0).squeeze(-1) / kLn2;

  at::Tensor loss = (out * in.grad_out.to(at::kDouble)).sum();
  if (in.grad_lse) loss = loss + (lse2 * in.grad_lse->to(at::kDouble)).sum();
  std::vector<at::Tensor> wrt{q, k, v};
  wrt.insert(wrt.end(), bufs.begin(), bufs.end());
  const auto grads = torch::autograd::grad({loss}, wrt, {}, c10::nullopt, false, /*allow_unused=*/true);

  const at::Tensor dead_rows = dead.squeeze(-1);
  return {out.detach(),
          lse2.detach().masked_fill(dead_rows, -kInf),
          std::get<0>(s.detach().max(-1)) / kLn2,
          grads[0], grads[1], grads[2],
          std::vector<at::Tensor>(grads.begin() + 3, grads.end())};
}

// ---- the check: runtime forward + backward vs the reference ----

void check(const Case& c, const ScoreMod& mod, const MaskCase& mask) {
  const Inputs in = make_inputs(c);
  const Expected want = reference(c, in, mod, mask);

  const auto fwd = flex_attention_forward(in.q, in.k, in.v, mod.fw, mask.mask, in.scale, mod.buffers);
  ASSERT_EQ(fwd.size(), 3u);
  EXPECT_EQ(fwd[0].sizes().vec(), (std::vector<int64_t>{c.B, c.Hq, c.Sq, c.Dv}));
  EXPECT_EQ(fwd[0].scalar_type(), c.dtype);
  EXPECT_LT(rel_err(fwd[0], want.out), c.tol) << "out";
  // lse and max are computed in the working precision whatever the input dtype: tight tolerance.
  expect_close_with_inf(fwd[1], want.lse2, 1e-5, "logsumexp");
  expect_close_with_inf(fwd[2], want.max2, 1e-5, "max_scores");

  const auto bwd = flex_attention_backward(in.q, in.k, in.v, fwd[0], fwd[1], in.grad_out, in.grad_lse, mod.fw,
                                           mod.joint, mask.mask, in.scale, mod.buffers);
  EXPECT_EQ(bwd.dq.sizes(), in.q.sizes());
  EXPECT_EQ(bwd.dk.sizes(), in.k.sizes());
  EXPECT_EQ(bwd.dv.sizes(), in.v.sizes());
  EXPECT_EQ(bwd.dq.scalar_type(), c.dtype);
  EXPECT_EQ(bwd.dk.scalar_type(), c.dtype);
  EXPECT_EQ(bwd.dv.scalar_type(), c.dtype);
  EXPECT_LT(rel_err(bwd.dq, want.dq), c.tol) << "dq";
  EXPECT_LT(rel_err(bwd.dk, want.dk), c.tol) << "dk";
  EXPECT_LT(rel_err(bwd.dv, want.dv), c.tol) << "dv";

  ASSERT_EQ(bwd.buffer_grads.size(), mod.buffers.size());
  for (size_t i = 0; i < mod.buffers.size(); ++i) {
    ASSERT_EQ(bwd.buffer_grads[i].defined(), mod.trainable[i]) << "buffer " << i;
    if (!mod.trainable[i]) continue;
    EXPECT_EQ(bwd.buffer_grads[i].sizes(), mod.buffers[i].sizes());
    EXPECT_EQ(bwd.buffer_grads[i].scalar_type(), mod.buffers[i].scalar_type());
    // Returned in the buffer's dtype (fp32 here), which bounds the error for fp64 inputs.
    EXPECT_LT(rel_err(bwd.buffer_grads[i], want.dbuf[i]), std::max(c.tol, 1e-6)) << "buffer " << i << " grad";
  }
}

class FlexAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(1234); }
};

TEST_F(FlexAttentionTest, IdentityScoreMod) { check(Case{}, identity_mod(), no_mask()); }

TEST_F(FlexAttentionTest, SoftcapWithCausalMask) {
  Case c;
  check(c, softcap_mod(), causal_mask(c.B, c.Sq, c.Skv));
}

TEST_F(FlexAttentionTest, HeadBiasGradientAndConstantBuffer) {
  Case c;
  c.grad_lse = true;
  check(c, head_bias_mod(c.Hq), no_mask());
}

TEST_F(FlexAttentionTest, LearnedRelativeBiasGradient) {
  Case c;
  c.Skv = c.Sq;
  check(c, rel_bias_mod(c.Sq, c.Hq), causal_mask(c.B, c.Sq, c.Skv));
}

TEST_F(FlexAttentionTest, FullyMaskedRows) {
  Case c;
  c.grad_lse = true;
  check(c, head_bias_mod(c.Hq), padded_rows_mask(c.B, c.Sq, c.Skv));
  // Output rows of fully masked queries are exactly 0 and their logsumexp -inf.
  const Inputs in = make_inputs(c);
  const auto fwd = flex_attention_forward(in.q, in.k, in.v, identity_mod().fw,
                                          padded_rows_mask(c.B, c.Sq, c.Skv).mask, in.scale, {});
  const at::Tensor dead = at::arange(c.Sq).remainder(3).eq(0);
  EXPECT_TRUE(fwd[0].index_select(2, dead.nonzero().flatten()).eq(0).all().item<bool>());
  EXPECT_TRUE(fwd[1].index_select(2, dead.nonzero().flatten()).isneginf().all().item<bool>());
}

TEST_F(FlexAttentionTest, GroupedQueryAttention) {
  Case c;
  c.Hkv = 2;
  c.Skv = c.Sq;
  check(c, rel_bias_mod(c.Sq, c.Hq), no_mask());
}

TEST_F(FlexAttentionTest, BroadcastKvBatch) {
  Case c;
  c.grad_lse = true;
  c.B = 3;
  c.Bkv = 1;
  c.Hkv = 2;
  check(c, head_bias_mod(c.Hq), causal_mask(c.B, c.Sq, c.Skv));
}

TEST_F(FlexAttentionTest, GradLogsumexp) {
  Case c;
  c.grad_lse = true;
  check(c, softcap_mod(), padded_rows_mask(c.B, c.Sq, c.Skv));
}

TEST_F(FlexAttentionTest, Bfloat16) {
  Case c;
  c.dtype = at::kBFloat16;
  c.tol = 1e-2;
  c.Hkv = 2;
  c.Skv = c.Sq = 16;
  c.grad_lse = true;
  check(c, rel_bias_mod(c.Sq, c.Hq), causal_mask(c.B, c.Sq, c.Skv));
}

TEST_F(FlexAttentionTest, Float64WorksInDoublePrecision) {
  Case c;
  c.dtype = at::kDouble;
  c.tol = 1e-12;
  c.grad_lse = true;
  check(c, head_bias_mod(c.Hq), causal_mask(c.B, c.Sq, c.Skv));
  const Inputs in = make_inputs(c);
  const auto fwd = flex_attention_forward(in.q, in.k, in.v, identity_mod().fw, {}, in.scale, {});
  EXPECT_EQ(fwd[1].scalar_type(), at::kDouble);
}

TEST_F(FlexAttentionTest, OutputsFollowInputLayouts) {
  // q laid out as [B, S, H, D] and viewed as [B, H, S, D]: out and dq keep that stride order.
  Case c;
  const Inputs in = make_inputs(c);
  const at::Tensor q = in.q.transpose(1, 2).contiguous().transpose(1, 2);
  const ScoreMod mod = identity_mod();
  const auto fwd = flex_attention_forward(q, in.k, in.v, mod.fw, {}, in.scale, {});
  const auto bwd = flex_attention_backward(q, in.k, in.v, fwd[0], fwd[1], in.grad_out, c10::nullopt, mod.fw,
                                           mod.joint, {}, in.scale, {});
  const std::vector<int64_t> bshd{c.Sq * c.Hq * c.Dv, c.Dv, c.Hq * c.Dv, 1};
  EXPECT_EQ(fwd[0].strides(), at::IntArrayRef(bshd));
  EXPECT_EQ(bwd.dq.strides(), q.strides());
  EXPECT_LT(rel_err(fwd[0], reference(c, in, mod, no_mask()).out), c.tol);
}

TEST_F(FlexAttentionTest, ZerosAndScatterBroadcastsAndAccumulates) {
  // Indices as broadcast grids (h [1,H,1,1], rel [1,1,S,S]) against full values [B,H,S,S].
  const int64_t B = 2, H = 3, S = 5;
  const at::Tensor h = at::arange(H, at::kInt).view({1, H, 1, 1});
  const at::Tensor rel = at::arange(S, at::kInt).view({1, 1, S, 1}) - at::arange(S, at::kInt).view({1, 1, 1, S}) + (S - 1);
  const at::Tensor vals = at::randn({B, H, S, S});
  const at::Tensor got = zeros_and_scatter({2 * S - 1, H}, {rel, h}, vals);

  at::Tensor want = at::zeros({2 * S - 1, H}, at::kDouble);
  auto w = want.accessor<double, 2>();
  const auto x = vals.to(at::kDouble).contiguous();
  const auto a = x.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) w[i - j + S - 1][hh] += a[b][hh][i][j];
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(rel_err(got, want), 1e-6);

  // A 0-dim index (temp[0] in a score_mod) sums every value into one entry.
  const at::Tensor one = zeros_and_scatter({4}, {at::scalar_tensor(2, at::kLong)}, vals.to(at::kDouble));
  EXPECT_EQ(one.scalar_type(), at::kDouble);
  EXPECT_NEAR(one[2].item<double>(), vals.to(at::kDouble).sum().item<double>(), 1e-9);
  EXPECT_EQ(one.abs().sum().item<double>(), std::abs(one[2].item<double>()));
}

// The kernels' results in flex's layout (_permute_strides of q): a result that has it already is returned
// as it is (a copy cost 3 x 64 MiB at the peak of a B4 H16 S4096 D128 backward); one that has not is copied.
TEST(LikeStridesOf, KeepsAResultLaidOutAlreadyAndCopiesOneThatIsNot) {
  const at::Tensor q = at::randn({2, 3, 5, 4});
  const at::Tensor same = at::randn({2, 3, 5, 4});
  const at::Tensor r = like_strides_of(same, q.strides());
  EXPECT_TRUE(r.is_same(same));
  // q laid out [B, S, H, D] (a transposed view): the result follows it, values unchanged.
  const at::Tensor qt = at::randn({2, 5, 3, 4}).transpose(1, 2);
  const at::Tensor c = like_strides_of(same, qt.strides());
  EXPECT_FALSE(c.is_same(same));
  EXPECT_EQ(c.strides(), qt.strides());
  EXPECT_TRUE(at::equal(c, same));
  // size-1 dims' strides do not matter
  const at::Tensor one = at::randn({1, 3, 5, 4});
  EXPECT_TRUE(like_strides_of(one, at::randn({1, 3, 5, 4}).transpose(0, 1).strides()).is_same(one));
}

}  // namespace
}  // namespace hb::rt

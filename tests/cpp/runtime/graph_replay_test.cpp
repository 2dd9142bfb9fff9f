// GraphReplay's bookkeeping (backend/runtime/GraphReplay.h) in its emulated mode, on a plain function of
// CPU tensors: when it records and replays, which inputs it reads in place and which it copies, outputs
// that share a storage sharing a version counter, held outputs never overwritten (a second recording,
// then runs as usual), moved in-place inputs, changed signatures, and the notes it gives once each.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/runtime/GraphReplay.h"

namespace hb::rt {
namespace {

// f(w, x) = (w * x + 1, the same as a view of its first row, x itself): a weight read in place, a batch
// copied, two outputs on one storage and one that is an input.
struct Fixture {
  int runs = 0;
  std::vector<std::pair<bool, std::string>> notes;
  GraphReplay replay{[this](std::vector<c10::IValue> in) {
                       ++runs;
                       at::Tensor y = in[0].toTensor() * in[1].toTensor() + 1;
                       return std::vector<c10::IValue>{y, y.select(0, 0), in[0]};
                     },
                     GraphReplay::Mode::kEmulated, std::vector<int64_t>{0},
                     [this](bool warning, const std::string& text) { notes.emplace_back(warning, text); }};

  std::vector<c10::IValue> call(const at::Tensor& w, const at::Tensor& x) {
    at::NoGradGuard no_grad;
    return replay.run({w, x});
  }
};

void expect_values(const std::vector<c10::IValue>& out, const at::Tensor& w, const at::Tensor& x) {
  at::Tensor want = w * x + 1;
  EXPECT_TRUE(at::equal(out[0].toTensor(), want));
  EXPECT_TRUE(at::equal(out[1].toTensor(), want.select(0, 0)));
  EXPECT_TRUE(out[2].toTensor().is_same(w));
}

void expect_counts(const GraphReplay& r, int64_t recordings, int64_t replays, int64_t plain) {
  GraphReplay::Stats s = r.stats();
  EXPECT_EQ(s.recordings, recordings);
  EXPECT_EQ(s.replays, replays);  // the recording calls included
  EXPECT_EQ(s.plain, plain);
}

TEST(graph_replay, records_after_a_warm_up_and_replays_with_fresh_values) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  for (int step = 0; step < 5; ++step) {
    at::Tensor x = at::randn({3, 4});
    expect_values(f.call(w, x), w, x);  // (each call's outputs dropped before the next)
  }
  GraphReplay::Stats s = f.replay.stats();
  EXPECT_EQ(s.calls, 5);
  EXPECT_EQ(s.plain, 1);  // the warm-up
  EXPECT_EQ(s.recordings, 1);
  EXPECT_EQ(s.replays, 4);  // the recording call and three replays
  EXPECT_EQ(s.copied_inputs, 1);  // the batch; the weight is read in place
  ASSERT_EQ(f.notes.size(), 1u);
  EXPECT_FALSE(f.notes[0].first);
  EXPECT_NE(f.notes[0].second.find("replays as a CUDA graph"), std::string::npos);
}

TEST(graph_replay, outputs_on_one_storage_share_a_version_counter) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  f.call(w, at::randn({3, 4}));
  std::vector<c10::IValue> out = f.call(w, at::randn({3, 4}));
  ASSERT_EQ(f.replay.stats().replays, 1);
  at::Tensor a = out[0].toTensor(), row = out[1].toTensor();
  EXPECT_EQ(a.storage().unsafeGetStorageImpl(), row.storage().unsafeGetStorageImpl());
  const uint32_t before = row._version();
  a.add_(1);
  EXPECT_EQ(row._version(), before + 1);
  EXPECT_FALSE(row.is_view());  // fresh tensors on the storage, not views
}

TEST(graph_replay, held_outputs_are_never_overwritten) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  std::vector<at::Tensor> xs;
  std::vector<std::vector<c10::IValue>> kept;
  for (int step = 0; step < 6; ++step) {
    xs.push_back(at::randn({3, 4}));
    kept.push_back(f.call(w, xs.back()));
  }
  for (size_t i = 0; i < xs.size(); ++i) expect_values(kept[i], w, xs[i]);
  GraphReplay::Stats s = f.replay.stats();
  EXPECT_EQ(s.recordings, 2);  // a second one while the first one's outputs were held
  EXPECT_EQ(s.graphs, 2);
  EXPECT_EQ(s.replays, 2);     // then both held: as usual
  EXPECT_EQ(s.plain, 4);
  int busy = 0;
  for (const auto& [warning, text] : f.notes) busy += warning && text.find("still referenced") != std::string::npos;
  EXPECT_EQ(busy, 1);  // said once
}

TEST(graph_replay, a_loop_that_keeps_the_last_output_alternates) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  std::vector<c10::IValue> last;
  for (int step = 0; step < 8; ++step) {
    at::Tensor x = at::randn({3, 4});
    std::vector<c10::IValue> out = f.call(w, x);  // the last step's output is alive during the call
    expect_values(out, w, x);
    last = std::move(out);
  }
  expect_counts(f.replay, 2, 7, 1);
}

TEST(graph_replay, a_moved_in_place_input_gets_its_own_recording) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  for (int step = 0; step < 3; ++step) f.call(w, at::randn({3, 4}));
  at::Tensor w2 = at::randn({3, 4});  // another address
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({3, 4});
    expect_values(f.call(w2, x), w2, x);
  }
  at::Tensor x = at::randn({3, 4});
  expect_values(f.call(w, x), w, x);  // the first recording again
  expect_counts(f.replay, 2, 6, 1);
}

TEST(graph_replay, another_signature_runs_as_usual_and_says_why) {
  Fixture f;
  at::Tensor w = at::randn({3, 4});
  f.call(w, at::randn({3, 4}));
  f.call(w, at::randn({3, 4}));
  at::Tensor x = at::randn({4}).expand({3, 4});  // other strides
  expect_values(f.call(w, x), w, x);
  GraphReplay::Stats s = f.replay.stats();
  EXPECT_EQ(s.plain, 2);
  bool said = false;
  for (const auto& [warning, text] : f.notes) said |= warning && text.find("differ from the recorded") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(graph_replay, grad_mode_and_other_devices_run_as_usual) {
  Fixture f;
  at::Tensor w = at::randn({3, 4}), x = at::randn({3, 4});
  {
    at::AutoGradMode grad(true);
    for (int step = 0; step < 3; ++step) expect_values(f.replay.run({w, x}), w, x);
  }
  EXPECT_EQ(f.replay.stats().plain, 3);
  GraphReplay cuda_mode([](std::vector<c10::IValue> in) { return in; }, GraphReplay::Mode::kCuda, std::nullopt,
                        nullptr);
  at::NoGradGuard no_grad;
  for (int step = 0; step < 3; ++step) cuda_mode.run({x});
  EXPECT_EQ(cuda_mode.stats().refused, "an input is not a CUDA tensor");
  EXPECT_EQ(cuda_mode.stats().plain, 3);
}


// A forward and the backward that follows it (reads its output in place): the forward replays a recording
// only while that recording's followers' outputs are free too (they may sit in its pool, where its
// intermediates were), and goes to its other recording while they are held.
TEST(graph_replay, a_forward_waits_for_its_followers_outputs) {
  auto fw = std::make_shared<GraphReplay>(
      [](std::vector<c10::IValue> in) { return std::vector<c10::IValue>{in[0].toTensor() * in[1].toTensor()}; },
      GraphReplay::Mode::kEmulated, std::vector<int64_t>{0}, nullptr);
  GraphReplay bw([](std::vector<c10::IValue> in) { return std::vector<c10::IValue>{in[0].toTensor() + in[1].toTensor()}; },
                 GraphReplay::Mode::kEmulated, std::vector<int64_t>{0}, nullptr);
  bw.follow(fw);
  at::NoGradGuard no_grad;
  at::Tensor w = at::randn({5});
  std::vector<at::Tensor> grads;  // the backward's outputs, kept from step 3 on
  for (int step = 0; step < 8; ++step) {
    at::Tensor x = at::randn({5}), g = at::randn({5});
    at::Tensor saved = fw->run({w, x})[0].toTensor();
    ASSERT_TRUE(at::allclose(saved, w * x));
    at::Tensor grad = bw.run({saved, g})[0].toTensor();
    ASSERT_TRUE(at::allclose(grad, w * x + g));
    if (step >= 3) grads.push_back(grad);
  }
  // Forward: warm-up, a recording (replayed at steps 1-3), then its follower's outputs held: a second
  // recording (steps 4-7; its own followers' outputs are held from step 5, so step 5 on run as usual).
  expect_counts(*fw, 2, 4, 4);
}

}  // namespace
}  // namespace hb::rt

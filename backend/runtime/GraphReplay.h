// CUDA-graph replay of a compiled graph (option cuda_graphs with the lean runtime: docs/debugging.md,
// "CUDA graphs"). A small training step is host time: each of its kernels costs the host several
// microseconds to launch, more than the GPU spends on it. GraphReplay records a graph's launches once
// (at::cuda::CUDAGraph, the graphs' own memory pool) and replays them with one launch.
//
// What a replay may assume, and how each call checks it (a call that breaks an assumption runs the graph
// as usual, and the first time says why through `note`):
// - The same input signature: dtypes, devices, sizes, strides and the values of non-tensor inputs.
// - Where an input lives. The inputs the caller names `in_place` (a forward's parameters and buffers, a
//   backward's saved values) are read where they are: a recording replays only for calls whose in-place
//   inputs are where it read them. The others (the batch, the tangents) are copied into the recording's
//   static buffers. Calls whose in-place inputs sit elsewhere (a backward whose forward alternates between
//   two recordings) get a recording of their own while there is room; once full, a free recording gives
//   way only to addresses that came back within the last calls, so a one-off (a backward whose forward
//   ran as usual) runs as usual.
// - Nothing outside still holds an output of the recording it replays: a replay overwrites its outputs'
//   memory. Outputs come back as fresh tensors on the recording's storages (those that share a storage
//   share a version counter); each call checks that no one else holds a reference to any of them. A
//   graph keeps up to two recordings (kBuffers) and replays the first whose outputs are free: a loop that
//   keeps the last step's output (`out = model(x)`) alternates between the two. Where both are held, the
//   call runs as usual.
// - One memory pool for a forward's recording and the backward's recordings that read its outputs
//   (follow()): the backward's capture reuses what the forward's freed (its intermediates), as on the
//   allocator. Its outputs may then sit where the forward's intermediates were, so a forward replays a
//   recording only while the outputs of that recording's followers are free too (gradients set to None;
//   gradients that zero_grad(set_to_none=False) keeps send the forward to its other recording), and the
//   replays of one pool are ordered on the device through an event.
// Recording waits for a second call with the same signature (the first warms up: handles, plans, kernels
// compiled at first use), runs the graph under capture on a side stream (one per device, for all
// recordings) and replays it once for that call's values. A graph that cannot be captured (a host
// synchronization inside, an op CUDA graphs refuse) runs as usual from then on.
//
// Mode::kEmulated keeps all of this bookkeeping on the CPU, where no capture exists: a "replay" runs the
// graph on the static inputs and copies its results into the recorded storages. The tests use it to
// check the bookkeeping in CI, which has no GPU.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace hb::rt {

class GraphReplay {
 public:
  using Run = std::function<std::vector<c10::IValue>(std::vector<c10::IValue>)>;
  // (warning, text): once per distinct event; warning=false for a recording that worked.
  using Note = std::function<void(bool, const std::string&)>;
  enum class Mode { kCuda, kEmulated };

  // in_place: the inputs read where they are (nullopt: all of them).
  GraphReplay(Run run, Mode mode, std::optional<std::vector<int64_t>> in_place, Note note);
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs);

  // This graph (a backward) reads outputs of `producer` (its forward) in place: a recording of this graph
  // whose in-place inputs live on a recording of the producer shares that recording's memory pool.
  void follow(std::shared_ptr<GraphReplay> producer);

  struct Stats {
    int64_t calls = 0, replays = 0, plain = 0, recordings = 0;
    int64_t graphs = 0;         // recordings kept
    int64_t copied_inputs = 0;  // inputs the last recording copies into static buffers
    std::string refused;        // why this graph never replays (empty while it may)
  };
  Stats stats() const;

  // Recordings kept at once, and made in all before a graph whose inputs keep moving runs as usual.
  static constexpr size_t kBuffers = 2;
  static constexpr int kMaxRecordings = 6;
  static constexpr size_t kHistory = 4;  // calls whose in-place addresses are remembered

 private:
  struct Recording;
  struct PoolOrder;
  // The producer's recording holding one of these storages (the pool a follower's recording joins).
  std::shared_ptr<Recording> holder(const std::vector<const c10::StorageImpl*>& storages) const;
  enum class Decision { kPlain, kRecord, kReplay };
  Decision decide(const std::vector<c10::IValue>& inputs, std::string& why);
  std::vector<c10::IValue> record(const std::vector<c10::IValue>& inputs);
  std::vector<c10::IValue> replay(const std::vector<c10::IValue>& inputs);
  std::vector<c10::IValue> results(const std::vector<c10::IValue>& inputs) const;
  void say(bool warning, const std::string& text);

  Run run_;
  Mode mode_;
  std::optional<std::vector<int64_t>> in_place_;
  std::vector<bool> read_in_place_;  // per input, from in_place_ at the first call
  Note note_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Recording>> recs_;
  std::shared_ptr<GraphReplay> producer_;
  size_t chosen_ = 0;  // the recording this call replays
  // An input as a call's signature sees it: a tensor's dtype, device, sizes and strides, or a scalar.
  struct InputSig {
    bool tensor = false;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    c10::Device device = c10::Device(c10::kCPU);
    std::vector<int64_t> sizes, strides;
    c10::IValue value;  // a non-tensor input (None, bool, int, float)
    bool operator==(const InputSig& o) const;
  };
  bool in_place(size_t k) const;
  static std::vector<InputSig> signature(const std::vector<c10::IValue>& inputs);
  std::vector<InputSig> last_;           // the last call's signature
  int settled_ = 0;                      // calls in a row with that signature
  std::deque<std::vector<const void*>> history_;  // the last calls' in-place addresses
  std::set<std::string> said_;
  std::vector<std::pair<bool, std::string>> pending_;  // notes to give once the lock is released
  Stats stats_;
};

}  // namespace hb::rt

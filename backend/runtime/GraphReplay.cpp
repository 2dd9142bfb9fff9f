// CUDA-graph replay of a compiled graph: GraphReplay.h says what a replay assumes and how calls check it.
#include "backend/runtime/GraphReplay.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <map>
#include <utility>

#ifdef HB_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/detail/CUDAHooks.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "backend/ir/Error.h"

namespace hb::rt {
namespace {

// Where a replay's output k comes from.
struct OutSpec {
  enum Kind { kNone, kValue, kInput, kInputView, kOwned } kind = kNone;
  c10::IValue value;  // kValue
  int input = -1;     // kInput, kInputView: the input it is (a view of)
  int storage = -1;   // kOwned: the recording's storage it lives on
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::DispatchKeySet keys;
  caffe2::TypeMeta dtype;
};

}  // namespace

// The order of the replays that write one memory pool (a forward's recording and its followers'): each
// waits on the device for the one before.
struct GraphReplay::PoolOrder {
  std::mutex mutex;
#ifdef HB_WITH_CUDA
  std::optional<at::cuda::CUDAEvent> last;
#endif
};

struct GraphReplay::Recording {
  std::vector<bool> fixed;             // per input: read where it is
  std::vector<const void*> fixed_ptrs;
  std::vector<at::Tensor> statics;     // per input: its static buffer where it is copied
  std::vector<InputSig> sig;
  std::vector<c10::Storage> owned;     // the storages the outputs live on
  std::vector<size_t> base_uses;       // each one's use count when no one outside holds it
  std::vector<OutSpec> outs;
  std::shared_ptr<PoolOrder> order;
  // Recordings of the graphs that follow this one (backwards) made in its pool, after it.
  mutable std::mutex followers_mutex;
  std::vector<std::weak_ptr<const Recording>> followers;

  bool outputs_free() const {  // no one outside holds its outputs
    for (size_t s = 0; s < owned.size(); ++s)
      if (static_cast<size_t>(owned[s].use_count()) != base_uses[s]) return false;
    return true;
  }
  // Its outputs and its followers' are free: a replay may write all it wrote at its capture.
  bool free() const {
    if (!outputs_free()) return false;
    std::lock_guard<std::mutex> lock(followers_mutex);
    for (const auto& f : followers)
      if (auto r = f.lock(); r && !r->outputs_free()) return false;
    return true;
  }
#ifdef HB_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  c10::cuda::MempoolId_t pool{0, 0};  // the graph's memory pool (the static buffers are allocated in it too)
  c10::DeviceIndex device = 0;

  ~Recording() {
    statics.clear();
    owned.clear();
    outs.clear();
    graph.reset();  // (releases the pool once, for its capture)
    if (pool.first || pool.second) {  // and once for the static buffers' allocation (record)
      try {
        c10::cuda::CUDACachingAllocator::releasePool(device, pool);
      } catch (...) {
      }
    }
  }
#endif
};

#ifdef HB_WITH_CUDA
namespace {

// One capture stream per device for every recording: cuBLAS keeps a workspace per stream, which a capture
// on a new stream would allocate in its graph's pool (32 MiB on Hopper, per recording). Its first use,
// outside any capture, allocates that stream's cuBLAS and cuBLASLt workspaces where eager's are (the
// allocator's own pool, once per process), so a graph's pool holds the graph's memory only.
at::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, at::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  at::cuda::CUDAStream stream = at::cuda::getStreamFromPool(false, device);
  {
    c10::cuda::CUDAStreamGuard on(stream);
    at::NoGradGuard no_grad;
    at::Tensor a = at::ones({16, 16}, at::TensorOptions().device(c10::Device(c10::kCUDA, device)));
    (void)at::mm(a, a);         // cuBLAS
    (void)at::addmm(a, a, a);  // with its bias: cuBLASLt
  }
  return streams.emplace(device, stream).first->second;
}

template <typename F>
void quietly(F&& f) {  // a cleanup step after a failure: one that fails must not stop the others
  try {
    f();
  } catch (...) {
  }
}

}  // namespace
#endif

bool GraphReplay::InputSig::operator==(const InputSig& o) const {
  if (tensor != o.tensor) return false;
  if (tensor) return dtype == o.dtype && device == o.device && sizes == o.sizes && strides == o.strides;
  if (value.tagKind() != o.value.tagKind()) return false;
  if (value.isNone()) return true;
  if (value.isBool()) return value.toBool() == o.value.toBool();
  if (value.isInt()) return value.toInt() == o.value.toInt();
  if (value.isDouble()) return value.toDouble() == o.value.toDouble();
  return false;  // anything else: never the same (no replay)
}

std::vector<GraphReplay::InputSig> GraphReplay::signature(const std::vector<c10::IValue>& inputs) {
  std::vector<InputSig> sig(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const c10::IValue& v = inputs[k];
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      sig[k].tensor = true;
      sig[k].dtype = t.scalar_type();
      sig[k].device = t.device();
      sig[k].sizes = t.sizes().vec();
      sig[k].strides = t.strides().vec();
    } else {
      sig[k].value = v.isTensor() ? c10::IValue() : v;
    }
  }
  return sig;
}

GraphReplay::GraphReplay(Run run, Mode mode, std::optional<std::vector<int64_t>> in_place, Note note)
    : run_(std::move(run)), mode_(mode), in_place_(std::move(in_place)), note_(std::move(note)) {}

GraphReplay::~GraphReplay() = default;

void GraphReplay::follow(std::shared_ptr<GraphReplay> producer) {
  std::lock_guard<std::mutex> lock(mutex_);
  producer_ = std::move(producer);
}

std::shared_ptr<GraphReplay::Recording> GraphReplay::holder(
    const std::vector<const c10::StorageImpl*>& storages) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : recs_)
    for (const c10::Storage& s : r->owned)
      if (std::find(storages.begin(), storages.end(), s.unsafeGetStorageImpl()) != storages.end()) return r;
  return nullptr;
}

GraphReplay::Stats GraphReplay::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.graphs = static_cast<int64_t>(recs_.size());
  return s;
}

void GraphReplay::say(bool warning, const std::string& text) {
  if (text.empty() || !said_.insert(text).second) return;
  pending_.emplace_back(warning, text);
}

bool GraphReplay::in_place(size_t k) const { return k < read_in_place_.size() && read_in_place_[k]; }

GraphReplay::Decision GraphReplay::decide(const std::vector<c10::IValue>& inputs, std::string& why) {
  ++stats_.calls;
  if (!stats_.refused.empty()) return Decision::kPlain;
  if (at::GradMode::is_enabled()) {
    why = "it ran with grad mode on (autograd would record the replayed ops' results)";
    return Decision::kPlain;
  }
  if (read_in_place_.size() != inputs.size()) {  // (once: a graph's inputs do not change in number)
    read_in_place_.assign(inputs.size(), !in_place_);
    if (in_place_)
      for (int64_t k : *in_place_)
        if (k >= 0 && static_cast<size_t>(k) < inputs.size()) read_in_place_[k] = true;
  }
  std::vector<InputSig> sig = signature(inputs);
  if (!recs_.empty() && !(sig == recs_.front()->sig)) {
    why = "a call's inputs differ from the recorded call's (shapes, strides, dtypes or scalar values)";
    return Decision::kPlain;
  }
  if (recs_.empty()) {  // one device of the mode's kind
    const c10::Device* device = nullptr;
    for (const InputSig& s : sig) {
      if (!s.tensor) continue;
      if (mode_ == Mode::kCuda ? !s.device.is_cuda() : !s.device.is_cpu())
        stats_.refused = mode_ == Mode::kCuda ? "an input is not a CUDA tensor" : "an input is not a CPU tensor";
      else if (device && *device != s.device)
        stats_.refused = "its inputs are on several devices";
      if (!stats_.refused.empty()) return Decision::kPlain;
      device = &s.device;
    }
    if (!device) {
      stats_.refused = "it has no tensor inputs";
      return Decision::kPlain;
    }
  }
  // The addresses of the inputs read in place, and whether a recent call had the same.
  std::vector<const void*> ptrs(inputs.size(), nullptr);
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].isTensor() && inputs[k].toTensor().defined() && in_place(k)) ptrs[k] = inputs[k].toTensor().data_ptr();
  const bool seen = std::find(history_.begin(), history_.end(), ptrs) != history_.end();
  history_.push_back(ptrs);
  if (history_.size() > kHistory) history_.pop_front();
  settled_ = sig == last_ ? settled_ + 1 : 1;
  last_ = std::move(sig);

  bool busy = false;
  for (size_t r = 0; r < recs_.size(); ++r) {
    if (recs_[r]->fixed_ptrs != ptrs) continue;
    if (recs_[r]->free()) {
      chosen_ = r;
      return Decision::kReplay;
    }
    busy = true;
  }
  const char* kBusy =
      "the outputs of its recordings (or of the backward recordings that share their memory) were still "
      "referenced when it was called again (tensors the caller kept, saved values whose backward has not run, "
      "gradients kept by zero_grad(set_to_none=False) or not yet set to None): such calls run without the "
      "CUDA graph, whose replay would overwrite those outputs";
  // Record after a first call of this signature (its warm-up), while there is room; once full, replace a
  // free recording only for addresses that came back (not a one-off: a backward whose forward ran as usual).
  const bool room = recs_.size() < kBuffers;
  if (settled_ < 2 || stats_.recordings >= kMaxRecordings || (!room && !seen)) {
    if (busy) why = kBusy;
    else if (stats_.recordings >= kMaxRecordings)
      why = "the inputs it reads in place keep moving (" + std::to_string(kMaxRecordings) +
            " recordings made): calls whose inputs are not where a recording reads them run as usual";
    return Decision::kPlain;
  }
  if (room) return Decision::kRecord;
  for (size_t r = 0; r < recs_.size(); ++r)
    if (recs_[r]->free()) {  // make room
      recs_.erase(recs_.begin() + static_cast<std::ptrdiff_t>(r));
      return Decision::kRecord;
    }
  why = kBusy;
  return Decision::kPlain;
}

std::vector<c10::IValue> GraphReplay::run(std::vector<c10::IValue> inputs) {
  Decision d;
  std::string why;
  std::vector<c10::IValue> out;
  std::vector<std::pair<bool, std::string>> notes;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    d = decide(inputs, why);
    if (d == Decision::kRecord) {
      try {
        out = record(inputs);
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        stats_.refused = "it could not be recorded as a CUDA graph (" + what + ")";
        d = Decision::kPlain;
      }
    } else if (d == Decision::kReplay) {
      out = replay(inputs);
    } else if (!why.empty()) {
      say(true, "runs without CUDA graphs where " + why);
    }
    if (!stats_.refused.empty()) say(true, "runs without CUDA graphs: " + stats_.refused);
    if (d == Decision::kPlain) ++stats_.plain;
    notes.swap(pending_);
  }
  if (note_)
    for (const auto& [warning, text] : notes) note_(warning, text);
  if (d != Decision::kPlain) return out;
  return run_(std::move(inputs));
}

std::vector<c10::IValue> GraphReplay::record(const std::vector<c10::IValue>& inputs) {
  auto rec = std::make_shared<Recording>();
  const size_t n = inputs.size();
  rec->sig = last_;
  rec->fixed.assign(n, false);
  rec->fixed_ptrs.assign(n, nullptr);
  rec->statics.resize(n);
  std::vector<c10::IValue> args = inputs;
  c10::Device device = c10::Device(c10::kCPU);
  for (const InputSig& s : rec->sig)
    if (s.tensor) device = s.device;
  std::vector<size_t> copied;
  for (size_t k = 0; k < n; ++k) {
    if (!inputs[k].isTensor() || !inputs[k].toTensor().defined()) continue;
    const at::Tensor& t = inputs[k].toTensor();
    if (in_place(k)) {
      rec->fixed[k] = true;
      rec->fixed_ptrs[k] = t.data_ptr();
      continue;
    }
    HB_USER_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes)
        << "input " << k << " overlaps itself in memory (an expanded tensor), so it cannot be copied into a "
        << "static buffer";
    copied.push_back(k);
  }
  // A follower's recording joins the pool of the producer's recording whose outputs it reads.
  std::shared_ptr<Recording> host;
  if (producer_) {
    std::vector<const c10::StorageImpl*> read;
    for (size_t k = 0; k < n; ++k)
      if (rec->fixed[k]) read.push_back(inputs[k].toTensor().storage().unsafeGetStorageImpl());
    host = producer_->holder(read);
  }
  rec->order = host ? host->order : std::make_shared<PoolOrder>();
  auto make_statics = [&] {
    for (size_t k : copied) {
      const at::Tensor& t = inputs[k].toTensor();
      rec->statics[k] = at::empty_strided(t.sizes(), t.strides(), t.options());
    }
  };
  std::vector<c10::IValue> outs;
  if (mode_ == Mode::kEmulated) {
    make_statics();
    for (size_t k : copied) {
      rec->statics[k].copy_(inputs[k].toTensor());
      args[k] = rec->statics[k];
    }
    outs = run_(args);
  } else {
#ifdef HB_WITH_CUDA
    c10::cuda::CUDAGuard guard(device);
    at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream();
    at::cuda::CUDAStream side = capture_stream(device.index());
    const c10::cuda::MempoolId_t pool = host ? host->pool : at::cuda::graph_pool_handle();
    {  // the static buffers in the graph's pool, so that the pool's size is all a recording holds
      c10::cuda::CUDAStreamGuard on_side(side);
      c10::cuda::CUDACachingAllocator::beginAllocateToPool(
          device.index(), pool, [s = side.stream()](cudaStream_t st) { return st == s; });
      rec->pool = pool;
      rec->device = device.index();
      try {
        make_statics();
      } catch (...) {
        quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool); });
        throw;
      }
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool);
    }
    // (the pool's replays in order: the static copies and this call's replay after the last one's)
    std::lock_guard<std::mutex> order_lock(rec->order->mutex);
    if (rec->order->last) rec->order->last->block(current);
    for (size_t k : copied) {
      rec->statics[k].copy_(inputs[k].toTensor());
      args[k] = rec->statics[k];
    }
    at::cuda::CUDAEvent fork;
    fork.record(current);
    fork.block(side);
    rec->graph = std::make_unique<at::cuda::CUDAGraph>();
    rec->graph->register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device.index()));
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      rec->graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      bool ended = false;
      try {
        outs = run_(args);
        ended = true;  // capture_end ends the capture even where it throws (an invalidated capture)
        rec->graph->capture_end();
      } catch (...) {
        // Leave no capture, allocator routing or error behind: what capture_end would have undone.
        outs.clear();
        if (!ended) {
          cudaGraph_t g = nullptr;
          cudaStreamEndCapture(side.stream(), &g);
          if (g) cudaGraphDestroy(g);
        }
        (void)cudaGetLastError();
        quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool); });
        quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
        quietly([&] { rec->graph.reset(); });
        quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(device.index(), pool); });
        throw;  // (the recording's destructor releases the pool's other use, the static buffers')
      }
    }
    at::cuda::CUDAEvent join;
    join.record(side);
    join.block(current);
    rec->graph->replay();  // this call's values
    if (!rec->order->last) rec->order->last.emplace();
    rec->order->last->record(current);
#else
    throw InternalError("hintbackend: CUDA-graph replay needs the CUDA build");
#endif
  }
  // Where each output lives.
  std::vector<const c10::StorageImpl*> owned_impls;
  rec->outs.resize(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    OutSpec& o = rec->outs[i];
    const c10::IValue& v = outs[i];
    if (!v.isTensor()) {
      o.kind = v.isNone() ? OutSpec::kNone : OutSpec::kValue;
      o.value = v;
      HB_USER_CHECK(v.isNone() || v.isBool() || v.isInt() || v.isDouble())
          << "output " << i << " is a " << v.tagKind() << ", which a replay cannot return";
      continue;
    }
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) continue;
    HB_USER_CHECK(mode_ == Mode::kEmulated || t.is_cuda())
        << "output " << i << " is a " << t.device() << " tensor, whose value a replay would not recompute";
    o.sizes = t.sizes().vec();
    o.strides = t.strides().vec();
    o.offset = t.storage_offset();
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    for (size_t k = 0; k < n && o.kind == OutSpec::kNone; ++k) {
      if (!rec->fixed[k]) continue;
      const at::Tensor& in = inputs[k].toTensor();
      if (in.storage().unsafeGetStorageImpl() != impl) continue;
      o.kind = in.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() ? OutSpec::kInput : OutSpec::kInputView;
      o.input = static_cast<int>(k);
    }
    if (o.kind != OutSpec::kNone) continue;
    o.kind = OutSpec::kOwned;
    o.keys = t.key_set();
    o.dtype = t.dtype();
    size_t s = 0;
    while (s < owned_impls.size() && owned_impls[s] != impl) ++s;
    if (s == owned_impls.size()) {
      owned_impls.push_back(impl);
      rec->owned.push_back(t.storage());
    }
    o.storage = static_cast<int>(s);
  }
  outs.clear();
  args.clear();
  for (const c10::Storage& s : rec->owned) rec->base_uses.push_back(static_cast<size_t>(s.use_count()));
  stats_.copied_inputs = 0;
  for (const at::Tensor& t : rec->statics) stats_.copied_inputs += t.defined();
  ++stats_.recordings;
  if (host) {
    std::lock_guard<std::mutex> lock(host->followers_mutex);
    host->followers.push_back(rec);
  }
  recs_.push_back(std::move(rec));
  chosen_ = recs_.size() - 1;
  say(false, "replays as a CUDA graph (recording " + std::to_string(stats_.recordings) + ", " +
                 std::to_string(stats_.copied_inputs) + " inputs copied per call)");
  ++stats_.replays;
  return results(inputs);
}

std::vector<c10::IValue> GraphReplay::replay(const std::vector<c10::IValue>& inputs) {
  Recording& r = *recs_.at(chosen_);
  std::lock_guard<std::mutex> lock(r.order->mutex);  // the pool's replays one after another
  std::vector<c10::IValue> args;
  if (mode_ == Mode::kEmulated) {
    args = inputs;
  } else {
#ifdef HB_WITH_CUDA
    if (r.order->last) r.order->last->block(at::cuda::getCurrentCUDAStream(r.device));
#endif
  }
  for (size_t k = 0; k < inputs.size(); ++k)
    if (r.statics[k].defined()) {
      r.statics[k].copy_(inputs[k].toTensor());
      if (!args.empty()) args[k] = r.statics[k];
    }
  if (mode_ == Mode::kEmulated) {
    std::vector<c10::IValue> outs = run_(std::move(args));
    HB_INTERNAL_CHECK(outs.size() == r.outs.size()) << "graph replay: a run returned " << outs.size() << " values";
    std::vector<c10::IValue> into = results(inputs);
    for (size_t i = 0; i < outs.size(); ++i)
      if (r.outs[i].kind == OutSpec::kOwned) into[i].toTensor().copy_(outs[i].toTensor());
  } else {
#ifdef HB_WITH_CUDA
    r.graph->replay();
    at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(r.device);
    if (!r.order->last) r.order->last.emplace();
    r.order->last->record(current);
#endif
  }
  ++stats_.replays;
  return results(inputs);
}

std::vector<c10::IValue> GraphReplay::results(const std::vector<c10::IValue>& inputs) const {
  const Recording& r = *recs_.at(chosen_);
  std::vector<c10::VariableVersion> versions;
  versions.reserve(r.owned.size());
  for (size_t s = 0; s < r.owned.size(); ++s) versions.emplace_back(0);
  std::vector<c10::IValue> out(r.outs.size());
  for (size_t i = 0; i < r.outs.size(); ++i) {
    const OutSpec& o = r.outs[i];
    switch (o.kind) {
      case OutSpec::kNone:
        break;
      case OutSpec::kValue:
        out[i] = o.value;
        break;
      case OutSpec::kInput:
        out[i] = inputs[o.input];
        break;
      case OutSpec::kInputView: {
        at::AutoGradMode no_grad(false);
        out[i] = inputs[o.input].toTensor().as_strided(o.sizes, o.strides, o.offset);
        break;
      }
      case OutSpec::kOwned: {
        auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(r.owned[o.storage]), o.keys, o.dtype);
        impl->set_sizes_and_strides(o.sizes, o.strides, o.offset);
        impl->set_version_counter(versions[o.storage]);
        out[i] = at::Tensor(std::move(impl));
        break;
      }
    }
  }
  return out;
}

}  // namespace hb::rt

// A DFS region's slice loop as a Call (the contract: backend/ir/SliceLoop.h): the body runs once per
// slice on views of the inputs, in one arena for all slices (its memory plan, MemoryPlan::bodies), and
// writes its results into slice i of preallocated full results, straight through its out= overloads
// where the plan says it can (MemoryPlan::output_writes), else by a copy. Whole results are slice 0's
// (replicated) or the sum over the slices (summed: a captured buffer's gradient), added in slice order.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>

#include "backend/ir/Error.h"
#include "backend/ir/SliceLoop.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "backend/runtime/Executor.h"

namespace hb::rt {

namespace {

// slice_view(t, d, k, N, i) of the contract: narrow dims d..d+k-1 to slice i's box.
at::Tensor slice_view(const at::Tensor& t, int64_t d, int64_t k, int64_t slices, int64_t i) {
  std::vector<int64_t> group(t.sizes().begin() + d, t.sizes().begin() + d + k);
  auto box = slice_box(group, slices, i);
  HB_INTERNAL_CHECK(box.has_value()) << "slice " << i << " of " << slices << " is not a box";
  at::Tensor v = t;
  for (int64_t j = 0; j < k; ++j) v = v.narrow(d + j, (*box)[j].start, (*box)[j].length);
  return v;
}

at::TensorOptions options_of(const TensorType& t) {
  return at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(device_of(t));
}
// A new tensor of type t: the traced strides, not contiguous ones (a later view, flex's output
// transposed and viewed say, relies on the layout eager gave the value).
at::Tensor new_traced(const TensorType& t) {
  const std::vector<int64_t> shape = sizes_of(t), stride = strides_of(t);
  return stride.size() == shape.size() ? at::empty_strided(shape, stride, options_of(t))
                                       : at::empty(shape, options_of(t));
}
// x as type t: itself when dtype and strides already match, else a copy into new_traced(t).
at::Tensor as_traced(const at::Tensor& x, const TensorType& t) {
  const std::vector<int64_t> stride = strides_of(t);
  if (x.scalar_type() == to_scalar_type(t.dtype) && (stride.size() != t.shape.size() || x.strides().equals(stride)))
    return x;
  at::Tensor r = new_traced(t);
  r.copy_(x);
  return r;
}

class SliceLoopCall : public Call {
 public:
  std::shared_ptr<Executor> body;
  SliceLoopArgs loop;
  std::vector<TensorType> results;  // full result types

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats& stats) const override {
    std::vector<at::Tensor> full;
    for (size_t k = 0; k < results.size(); ++k) {
      const TensorType& t = results[k];
      if (loop.out_dims[k] < 0) {  // replicated or summed: from the slices' values below
        full.emplace_back();
        continue;
      }
      full.push_back(new_traced(t));
    }
    // The body's arena, once for all slices: nothing placed in slice i outlives its body call (the
    // body's outputs are never in its arena, and they are copied out before slice i + 1 runs).
    at::Tensor arena;
    bool direct = false;  // the body writes its outputs straight into the results (decided on slice 0)
    for (int64_t i = 0; i < loop.slices; ++i) {
      std::vector<c10::IValue> in;
      in.reserve(loop.inputs.size());
      for (size_t j = 0; j < loop.inputs.size(); ++j) {
        const c10::IValue& x = slots[loop.inputs[j]];
        in.push_back(loop.in_dims[j] < 0
                         ? x
                         : c10::IValue(slice_view(x.toTensor(), loop.in_dims[j], loop.in_ndims[j], loop.slices, i)));
      }
      if (i == 0) {  // every slice's inputs are views of the same tensors: decide once
        if (body->places(in)) {
          arena = body->new_arena();
          ++stats.arenas;
        }
        direct = body->writes_out(in);
      }
      // Slice i of each result: the body writes there directly where it can (MemoryPlan::output_writes).
      std::vector<at::Tensor> dests(full.size());
      for (size_t k = 0; k < full.size(); ++k)
        if (loop.out_dims[k] >= 0) dests[k] = slice_view(full[k], loop.out_dims[k], loop.out_ndims[k], loop.slices, i);
      std::vector<c10::IValue> out;
      try {
        out = body->run(std::move(in), arena, false, direct ? &dests : nullptr);
      } catch (c10::Error& e) {
        e.add_context("hintbackend: in slice " + std::to_string(i) + " of " + std::to_string(loop.slices));
        throw;
      } catch (...) {
        note_failure_site("slice " + std::to_string(i) + " of " + std::to_string(loop.slices));
        throw;
      }
      HB_INTERNAL_CHECK(out.size() == full.size()) << "slice body returned " << out.size() << " values";
      const Executor::ArenaStats body_stats = body->arena_stats();
      stats.written += body_stats.written;
      stats.workspace = std::max(stats.workspace, body_stats.workspace);
      for (size_t k = 0; k < out.size(); ++k) {
        if (loop.out_dims[k] == kOutReplicated) {  // slice 0's value is the loop's
          if (i == 0) full[k] = out[k].toTensor();
          continue;
        }
        if (loop.out_dims[k] == kOutSummed) {  // in float32 at least: N parts rounded to bf16 would drift
          const at::Tensor& t = out[k].toTensor();
          if (i == 0) full[k] = at::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t.clone();
          else full[k].add_(t);
          continue;
        }
        const at::Tensor& t = out[k].toTensor();
        // Written there already: the same elements at the same addresses (strides of size-1 dims aside).
        const bool same = t.data_ptr() == dests[k].data_ptr() && t.sizes().equals(dests[k].sizes()) &&
                          t.is_contiguous() && dests[k].is_contiguous();
        if (same) continue;
        dests[k].copy_(t);
      }
    }
    for (size_t k = 0; k < full.size(); ++k)  // a summed result in its own dtype and traced strides
      if (loop.out_dims[k] == kOutSummed) full[k] = as_traced(full[k], results[k]);
    std::vector<c10::IValue> r(full.begin(), full.end());
    return c10::ivalue::Tuple::create(std::move(r));
  }
};

}  // namespace

std::shared_ptr<const Call> lower_slice_loop(const LowerContext& ctx) {
  const Node& n = ctx.n();
  auto call = std::make_shared<SliceLoopCall>();
  call->loop = slice_loop_args(n);
  // The body is an ordinary graph with the per-slice types, so it runs its own plan (the program's).
  call->body = ctx.subgraph(n.args.at(0), /*with_memory_plan=*/true);
  HB_INTERNAL_CHECK(n.type.kind == ValueType::Kind::Tuple) << ctx.where << ": a slice loop's type must be a tuple";
  for (const ValueType& t : n.type.elems) {
    HB_INTERNAL_CHECK(t.kind == ValueType::Kind::Tensor && t.tensor.numel().has_value())
        << ctx.where << ": slice loop results must be tensors of static shape";
    call->results.push_back(t.tensor);
  }
  return call;
}

}  // namespace hb::rt

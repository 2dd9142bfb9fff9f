// FlexAttention's higher-order ops and the gradient scatter of its captured buffers, as Calls: the
// arguments resolved once, the reference kernels of FlexAttention.h run per call.
#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/FlexAttention.h"

namespace hb::rt {

namespace {

std::vector<c10::IValue> values_of(const c10::IValue& v) {
  if (v.isNone()) return {};
  const auto& e = v.toTupleRef().elements();
  return std::vector<c10::IValue>(e.begin(), e.end());  // not {..}: that would be two IValues made of pointers
}

SubgraphFn as_fn(const std::shared_ptr<Executor>& e) {
  return [e](std::vector<c10::IValue> in) { return e->run(std::move(in)); };
}

class FlexAttentionCall : public Call {
 public:
  bool backward = false;
  std::vector<ArgSpec> tensors;  // fw: q k v; bw: q k v out lse grad_out grad_lse
  std::shared_ptr<Executor> score_mod, joint, mask_mod;
  FloatArg scale;  // a constant, or 1 / sqrt(D) computed at run time where D is symbolic
  ArgSpec score_buffers, mask_buffers;

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    std::vector<at::Tensor> t;
    for (const ArgSpec& a : tensors) {
      c10::IValue v = build_arg(a, slots);
      t.push_back(v.isNone() ? at::Tensor() : v.toTensor());
    }
    // Captured values go to the subgraphs as they are (a SymInt stays a number); the typed API sees tensors.
    const c10::IValue mask_values = build_arg(mask_buffers, slots), score_values = build_arg(score_buffers, slots);
    FlexMask mask{with_captured(as_fn(mask_mod), 4, values_of(mask_values)), captured_tensors(mask_values)};
    const std::vector<at::Tensor> score_bufs = captured_tensors(score_values);
    const SubgraphFn score_fn = with_captured(as_fn(score_mod), 5, values_of(score_values));
    const double scale = this->scale.at(slots);
    if (!backward) {
      std::vector<at::Tensor> r = flex_attention_forward(t[0], t[1], t[2], score_fn, mask, scale, score_bufs);
      return c10::ivalue::Tuple::create({r[0], r[1], r[2]});
    }
    c10::optional<at::Tensor> grad_lse;
    if (t[6].defined()) grad_lse = t[6];
    FlexBackwardResult r = flex_attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], grad_lse, score_fn,
                                                   with_captured(as_fn(joint), 6, values_of(score_values)), mask,
                                                   scale, score_bufs);
    std::vector<c10::IValue> grads;
    for (const at::Tensor& x : r.buffer_grads) grads.push_back(x.defined() ? c10::IValue(x) : c10::IValue());
    return c10::ivalue::Tuple::create({r.dq, r.dk, r.dv, c10::ivalue::Tuple::create(std::move(grads))});
  }
};

class ZerosAndScatterCall : public Call {
 public:
  std::vector<ArgSpec> args;  // (shape, indices, values)

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    // Bind every IValue to a local: iterating over a temporary's tuple would dangle.
    const c10::IValue shape = build_arg(args[0], slots);
    const c10::IValue indices = build_arg(args[1], slots);
    std::vector<int64_t> dims;
    for (const c10::IValue& d : shape.toTupleRef().elements()) dims.push_back(d.toInt());
    std::vector<at::Tensor> idx;
    for (const c10::IValue& t : indices.toTupleRef().elements()) idx.push_back(t.toTensor());
    return zeros_and_scatter(dims, idx, build_arg(args[2], slots).toTensor());
  }
};

}  // namespace

std::shared_ptr<const Call> lower_flex_attention(const LowerContext& ctx) {
  const Node& n = ctx.n();
  const bool backward = n.target == "higher_order::flex_attention_backward";
  const std::string& where = ctx.where;
  // fw: (q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs)
  // bw: (q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
  //      kernel_options, score_bufs, mask_bufs)
  const size_t want = backward ? 14 : 9;
  HB_USER_CHECK(n.args.size() == want) << where << ": expected " << want << " arguments, got " << n.args.size();
  auto call = std::make_shared<FlexAttentionCall>();
  call->backward = backward;
  const size_t ntensors = backward ? 7 : 3;
  for (size_t k = 0; k < ntensors; ++k) call->tensors.push_back(convert_untyped(n.args[k], where));
  const size_t base = backward ? 7 : 3;
  // No arena for the mods: they are traced on 0-dim values but run on whole broadcast score grids,
  // so their IR shapes are not the shapes they compute.
  call->score_mod = ctx.subgraph(n.args[base]);
  if (backward) call->joint = ctx.subgraph(n.args[base + 1]);
  const Arg& block_mask = n.args[backward ? 9 : 4];
  HB_USER_CHECK((block_mask.kind == Arg::Kind::Tuple || block_mask.kind == Arg::Kind::List) && !block_mask.items.empty())
      << where << ": the block mask must be a tuple ending in the mask_mod graph";
  // torch 2.11 has 13 entries, 2.5 had 11, newer main 17: the mask graph is always the last one.
  call->mask_mod = ctx.subgraph(block_mask.items.back());
  call->scale = float_or_value_arg(n.args[backward ? 10 : 5], where);
  call->score_buffers = convert_untyped(n.args[backward ? 12 : 7], where);
  call->mask_buffers = convert_untyped(n.args[backward ? 13 : 8], where);
  return call;
}

std::shared_ptr<const Call> lower_zeros_and_scatter(const LowerContext& ctx) {
  const Node& n = ctx.n();
  HB_USER_CHECK(n.args.size() == 3) << ctx.where << ": zeros_and_scatter takes (shape, indices, values)";
  auto call = std::make_shared<ZerosAndScatterCall>();
  for (const Arg& a : n.args) call->args.push_back(convert_untyped(a, ctx.where));
  return call;
}

}  // namespace hb::rt

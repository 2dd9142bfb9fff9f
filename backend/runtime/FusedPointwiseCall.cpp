// A fused pointwise group (passes/PointwiseFusion.h) as a Call: its kernel (CPU, or CUDA in a CUDA
// build, FusedPointwise.h) when it accepts the inputs, else the body op by op.
#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/FusedPointwise.h"

namespace hb::rt {

namespace {

class FusedPointwiseCall : public Call {
 public:
  std::unique_ptr<FusedPointwiseKernel> kernel;
  std::shared_ptr<Executor> body;
  std::vector<ArgSpec> inputs;

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor& out, CallStats&) const override {
    std::vector<at::Tensor> in;
    in.reserve(inputs.size());
    for (const ArgSpec& a : inputs) in.push_back(build_arg(a, slots).toTensor());
    if (kernel->accepts(in)) return kernel->run(in, out);
    std::vector<c10::IValue> args(in.begin(), in.end());
    std::vector<c10::IValue> r = body->run(std::move(args));
    HB_INTERNAL_CHECK(r.size() == 1) << "fused body returned " << r.size() << " values";
    if (!out.defined()) return r[0];
    out.copy_(r[0].toTensor());
    return out;
  }
};

}  // namespace

std::shared_ptr<const Call> lower_fused_pointwise(const LowerContext& ctx) {
  const Node& n = ctx.n();
  HB_USER_CHECK(n.args.size() == 2 && n.args[1].kind == Arg::Kind::List)
      << ctx.where << ": fused_pointwise takes (@body, [inputs])";
  auto call = std::make_shared<FusedPointwiseCall>();
  call->body = ctx.subgraph(n.args[0]);
  HB_USER_CHECK(n.type.kind == ValueType::Kind::Tensor) << ctx.where << ": a fused pointwise result must be a tensor";
  call->kernel = std::make_unique<FusedPointwiseKernel>(compile_pointwise(call->body->graph()), n.type.tensor);
  for (const Arg& a : n.args[1].items) call->inputs.push_back(convert_untyped(a, ctx.where));
  return call;
}

}  // namespace hb::rt

// aten::native_layer_norm and aten::native_layer_norm_backward over narrow rows on CUDA, and
// hintbackend::layer_norm_act and its backward, the same with an activation of the input
// (backend/runtime/LayerNormAct.h) (KernelKind::LayerNormRows; codegen/KernelSelect.h has the rule,
// codegen/cuda/LayerNorm.h the kernels): the kernels where they take the tensors, else the node's own op.
// The results are ATen's in shape and dtype: the output like the input, mean and rstd float32 with the
// input's leading sizes and ones for the normalized dims; the backward's gradients undefined where
// output_mask leaves them out.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <optional>
#include <vector>

#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "codegen/KernelSelect.h"

#ifdef HB_WITH_CUDA
#include "codegen/cuda/LayerNorm.h"
#endif

namespace hb::rt {

namespace {

at::Tensor optional_tensor(const c10::IValue& v) { return v.isNone() ? at::Tensor() : v.toTensor(); }

class LayerNormCall : public Call {
 public:
  c10::OperatorHandle op;  // the node's op, for whatever the kernels do not take
  std::vector<ArgSpec> args;
  LayerNormShape shape;  // the normalized shape's elements and dims, forward or backward

  LayerNormCall(c10::OperatorHandle o, LayerNormShape s) : op(std::move(o)), shape(s) {}

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    std::vector<c10::IValue> stack;
    stack.reserve(args.size());
    for (const ArgSpec& a : args) stack.push_back(build_arg(a, slots));
#ifdef HB_WITH_CUDA
    if (std::optional<c10::IValue> r = shape.backward ? run_backward(stack) : run_forward(stack)) return std::move(*r);
#endif
    op.callBoxed(stack);
    return c10::ivalue::Tuple::create(std::move(stack));
  }

 private:
#ifdef HB_WITH_CUDA
  // mean and rstd as ATen's CUDA kernel returns them: float32, [leading sizes..., 1 per normalized dim].
  at::Tensor statistic(const at::Tensor& x) const {
    std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end() - shape.dims);
    sizes.resize(x.dim(), 1);
    return at::empty(sizes, x.options().dtype(at::kFloat));
  }

  // (input, normalized_shape, weight?, bias?, eps[, act])
  std::optional<c10::IValue> run_forward(const std::vector<c10::IValue>& s) const {
    const at::Tensor& x = s[0].toTensor();
    if (!x.is_cuda() || x.dim() < shape.dims) return std::nullopt;
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous), mean = statistic(x), rstd = statistic(x);
    if (!hb::cuda::layer_norm_forward(x, shape.columns, optional_tensor(s[2]), optional_tensor(s[3]), s[4].toDouble(), y, mean,
                                      rstd, shape.act))
      return std::nullopt;
    return c10::ivalue::Tuple::create({std::move(y), std::move(mean), std::move(rstd)});
  }

  // (grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask[, act])
  std::optional<c10::IValue> run_backward(const std::vector<c10::IValue>& s) const {
    const at::Tensor& x = s[1].toTensor();
    const at::Tensor w = optional_tensor(s[5]), b = optional_tensor(s[6]);
    const c10::List<bool> mask = s[7].toBoolList();
    if (!x.is_cuda() || (mask.get(1) && !w.defined()) || (mask.get(2) && !b.defined())) return std::nullopt;
    // A gradient that arrives as a view (an expand of a scalar loss's gradient) is made rows here: one
    // copy, where ATen's kernel would run on the strides at its own speed.
    const at::Tensor grad = s[0].toTensor().contiguous();
    at::Tensor dx, dw, db;
    if (mask.get(0)) dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    if (mask.get(1)) dw = at::empty_like(w, at::MemoryFormat::Contiguous);
    if (mask.get(2)) db = at::empty_like(b, at::MemoryFormat::Contiguous);
    if (!hb::cuda::layer_norm_backward(grad, x, shape.columns, s[3].toTensor(), s[4].toTensor(), w, dx, dw, db,
                                       shape.act))
      return std::nullopt;
    return c10::ivalue::Tuple::create({std::move(dx), std::move(dw), std::move(db)});
  }
#endif
};

}  // namespace

std::shared_ptr<const Call> lower_layer_norm(const LowerContext& ctx) {
  const std::optional<LayerNormShape> ln = layer_norm_shape(ctx.n());
  HB_USER_CHECK(ln) << ctx.where << ": not a layer norm with a normalized shape of constants";
  AtenArgs a = aten_args(ctx.graph(), ctx.node, ctx.where);
  auto call = std::make_shared<LayerNormCall>(a.op, *ln);
  call->args = std::move(a.args);
  return call;
}

}  // namespace hb::rt

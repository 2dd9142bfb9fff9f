// View ops made without the dispatcher (KernelKind::View; codegen/KernelSelect.h has the rule): the result
// is a tensor over its input's storage, at the input's offset plus the node's constant one, sharing the
// input's version counter (so an in-place op through either bumps both, as through a view). A boxed call
// costs the host a few microseconds a view, and ADInplaceOrView allocates view metadata that nothing
// inside the graph reads (the rule keeps returned values out).
//
// The result's sizes, strides and offset are ATen's own for the input layout the graph was traced with:
// the op runs once, when the executor is built, on a meta tensor of that layout (so a size-1 dimension's
// stride is the one ATen gives, which the IR's type need not be: ATen's overlap checks compare strides).
// An input that arrives with other sizes or strides, or that is not a plain dense tensor (a subclass, a
// wrapper, sparse), takes the node's own op instead; so does every call where the meta run failed.
#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <typeinfo>
#include <vector>

#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "codegen/KernelSelect.h"

namespace hb::rt {

namespace {

class ViewCall : public Call {
 public:
  int input = -1;                                // the input's slot
  std::vector<int64_t> in_sizes, in_strides;     // the input's IR layout, checked every call
  bool fast = false;                             // the meta run gave the result's layout
  std::vector<int64_t> sizes, strides;           // the result's, as ATen makes them for in_sizes/in_strides
  int64_t delta = 0;                             // added to the input's storage offset
  int64_t absolute = -1;                         // >= 0: the result's storage offset (as_strided's)
  c10::OperatorHandle op;                        // the node's own op, for an input of another layout
  std::vector<ArgSpec> args;

  ViewCall(c10::OperatorHandle o, std::vector<ArgSpec> a) : op(std::move(o)), args(std::move(a)) {}

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    const c10::IValue& v = slots[input];
    if (v.isTensor()) {
      const at::Tensor& x = v.toTensor();
      if (fast && plain(x) && x.sizes().equals(in_sizes) && x.strides().equals(in_strides)) return alias(x);
    }
    std::vector<c10::IValue> stack;
    stack.reserve(args.size());
    for (const ArgSpec& a : args) stack.push_back(build_arg(a, slots));
    op.callBoxed(stack);
    return std::move(stack[0]);
  }

 private:
  // A dense tensor of TensorImpl itself (no subclass: no functionalization or functorch wrapper, no sparse,
  // nested or quantized tensor) and no Python subclass.
  static bool plain(const at::Tensor& x) {
    const c10::TensorImpl* impl = x.unsafeGetTensorImpl();
    return x.defined() && typeid(*impl) == typeid(c10::TensorImpl) && impl->has_storage() &&
           !impl->is_python_dispatch() && x.layout() == at::kStrided;
  }

  at::Tensor alias(const at::Tensor& x) const {
    at::Tensor y = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(x.storage()),
                                                            x.key_set(), x.dtype());
    c10::TensorImpl* impl = y.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(sizes, strides, absolute >= 0 ? absolute : x.storage_offset() + delta);
    impl->set_version_counter(x.unsafeGetTensorImpl()->version_counter());
    return y;
  }
};

bool reads_slots(const ArgSpec& a) {
  if (a.k == ArgSpec::K::Slot || a.k == ArgSpec::K::NumberSlot) return true;
  for (const ArgSpec& x : a.items)
    if (reads_slots(x)) return true;
  return false;
}

// Runs the view op on a meta tensor of the input's IR layout (offset 0) and keeps the result's sizes,
// strides and offset in `call`; false when it cannot (an argument computed at run time, an error).
bool meta_layout(const TensorType& in, ViewCall& call) {
  for (size_t k = 1; k < call.args.size(); ++k)
    if (reads_slots(call.args[k])) return false;
  try {
    // Plain kernels: no Python mode (a fake or functional mode of the tracer) and no view tracking.
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    at::AutoDispatchBelowADInplaceOrView below;
    const at::Tensor m = at::empty_strided(sizes_of(in), strides_of(in),
                                           at::TensorOptions().device(at::kMeta).dtype(to_scalar_type(in.dtype)));
    const std::vector<c10::IValue> no_slots;
    std::vector<c10::IValue> stack{m};
    for (size_t k = 1; k < call.args.size(); ++k) stack.push_back(build_arg(call.args[k], no_slots));
    call.op.callBoxed(stack);
    if (stack.size() != 1 || !stack[0].isTensor()) return false;
    const at::Tensor& r = stack[0].toTensor();
    call.sizes = r.sizes().vec();
    call.strides = r.strides().vec();
    call.delta = r.storage_offset();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::shared_ptr<const Call> lower_view(const LowerContext& ctx) {
  const Graph& g = ctx.graph();
  const Node& n = ctx.n();
  HB_INTERNAL_CHECK(view_why_not(g, ctx.node).empty())
      << ctx.where << ": selected as a view, but " << view_why_not(g, ctx.node);
  AtenArgs a = aten_args(g, ctx.node, ctx.where);
  auto call = std::make_shared<ViewCall>(a.op, std::move(a.args));
  call->input = n.args[0].ref;
  const TensorType& in = *g.tensor_type(n.args[0]);
  call->in_sizes = sizes_of(in);
  call->in_strides = strides_of(in);
  int64_t absolute = -1;
  if (!view_offset(g, n, &absolute)) call->absolute = absolute;  // as_strided's own offset
  call->fast = meta_layout(in, *call) && call->sizes == sizes_of(n.type.tensor);
  return call;
}

}  // namespace hb::rt

// FlexAttention's forward and backward on the tiled kernels with generated score/mask/joint code, on the
// CPU (FlexTiledCpu.h) or CUDA (FlexTiledCuda.h) as the node's device says
// (KernelKind::FlexFusedForward / FlexFusedBackward): kernel selection generated and built the code
// (codegen/FlexKernelGen.h, codegen/HostCompiler.h) and keeps the library in the plan; the lowering
// resolves its entry points and the arguments once, the tiled kernel (FlexTiledCpu.h) runs per call.
#include <ATen/ATen.h>

#include "backend/ir/Error.h"
#include "backend/runtime/Args.h"
#include "backend/runtime/Call.h"
#include "backend/runtime/FlexTiledCpu.h"
#include "backend/runtime/FlexTiledCuda.h"
#include "codegen/FlexKernelGen.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "codegen/HostCompiler.h"

namespace hb::rt {

namespace {

at::Tensor tensor_or_undefined(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

class FlexFusedCall : public Call {
 public:
  bool backward = false;
  std::vector<ArgSpec> tensors;  // fw: q k v; bw: q k v out lse grad_out grad_lse
  // kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, and on CUDA the q lists after them
  std::vector<ArgSpec> block_lists;
  bool cuda = false;
  FlexCudaFns cuda_fns;
  int64_t q_block = 0, kv_block = 0;
  FloatArg scale;  // a constant, or 1 / sqrt(D) computed at run time where D is symbolic
  ArgSpec score_buffers, mask_buffers;
  std::shared_ptr<HostModule> module;  // keeps the generated code loaded
  FlexKernelFns fns;
  std::vector<bool> buffer_grads;
  std::vector<std::optional<FlexKernelSource::Layout>> layouts;  // score buffers, then mask buffers
  std::string where;

  // A buffer as the generated code reads it: the sizes and strides it was built with (strides of size-1
  // dims aside), else a copy with those strides where they do not overlap, else an error.
  at::Tensor laid_out(const at::Tensor& b, size_t i) const {
    if (i >= layouts.size() || !layouts[i] || b.dim() == 0) return b;
    const FlexKernelSource::Layout& l = *layouts[i];
    bool same = static_cast<size_t>(b.dim()) == l.sizes.size(), overlaps = false;
    for (size_t d = 0; d < l.sizes.size(); ++d) {
      if (same) same = b.size(d) == l.sizes[d] && (l.sizes[d] == 1 || b.stride(d) == l.strides[d]);
      overlaps = overlaps || (l.sizes[d] > 1 && l.strides[d] == 0);
    }
    if (same) return b;
    TORCH_CHECK(!overlaps && static_cast<size_t>(b.dim()) == l.sizes.size() && b.sizes().vec() == l.sizes, where,
                ": captured buffer ", i, " has sizes ", b.sizes(), " and strides ", b.strides(),
                " at run time; the generated kernel was built for sizes ", c10::IntArrayRef(l.sizes), " and strides ",
                c10::IntArrayRef(l.strides), " (kernel=\"aten\" in hinted_context runs the reference)");
    return at::empty_strided(l.sizes, l.strides, b.options()).copy_(b);
  }
  std::vector<at::Tensor> laid_out(std::vector<at::Tensor> bufs, size_t first) const {
    for (size_t i = 0; i < bufs.size(); ++i) bufs[i] = laid_out(bufs[i], first + i);
    return bufs;
  }

  c10::IValue run(const std::vector<c10::IValue>& slots, const at::Tensor&, CallStats&) const override {
    std::vector<at::Tensor> t;
    for (const ArgSpec& a : tensors) t.push_back(tensor_or_undefined(build_arg(a, slots)));
    FlexBlocks blocks;
    blocks.kv_num = tensor_or_undefined(build_arg(block_lists[0], slots));
    blocks.kv_idx = tensor_or_undefined(build_arg(block_lists[1], slots));
    blocks.full_num = tensor_or_undefined(build_arg(block_lists[2], slots));
    blocks.full_idx = tensor_or_undefined(build_arg(block_lists[3], slots));
    if (block_lists.size() == 8) {
      blocks.q_num = tensor_or_undefined(build_arg(block_lists[4], slots));
      blocks.q_idx = tensor_or_undefined(build_arg(block_lists[5], slots));
      blocks.full_q_num = tensor_or_undefined(build_arg(block_lists[6], slots));
      blocks.full_q_idx = tensor_or_undefined(build_arg(block_lists[7], slots));
    }
    blocks.q_block = q_block;
    blocks.kv_block = kv_block;
    const std::vector<at::Tensor> sbufs = laid_out(captured_tensors(build_arg(score_buffers, slots)), 0);
    const std::vector<at::Tensor> mbufs = laid_out(captured_tensors(build_arg(mask_buffers, slots)), sbufs.size());
    const double scale = this->scale.at(slots);
    if (!backward) {
      std::vector<at::Tensor> r = cuda ? flex_cuda_forward(t[0], t[1], t[2], cuda_fns, blocks, scale, sbufs, mbufs)
                                       : flex_tiled_forward(t[0], t[1], t[2], fns, blocks, scale, sbufs, mbufs);
      return c10::ivalue::Tuple::create({r[0], r[1], r[2]});
    }
    std::optional<at::Tensor> grad_lse;
    if (t[6].defined()) grad_lse = t[6];
    FlexBackwardResult r =
        cuda ? flex_cuda_backward(t[0], t[1], t[2], t[3], t[4], t[5], grad_lse, cuda_fns, blocks, scale, sbufs, mbufs,
                                  buffer_grads)
             : flex_tiled_backward(t[0], t[1], t[2], t[3], t[4], t[5], grad_lse, fns, blocks, scale, sbufs, mbufs,
                                   buffer_grads);
    std::vector<c10::IValue> grads;
    for (const at::Tensor& x : r.buffer_grads) grads.push_back(x.defined() ? c10::IValue(x) : c10::IValue());
    return c10::ivalue::Tuple::create({r.dq, r.dk, r.dv, c10::ivalue::Tuple::create(std::move(grads))});
  }
};

template <typename F>
F entry(const HostModule& m, const char* name, bool wanted, const std::string& where) {
  if (!wanted) return nullptr;
  void* f = m.symbol(name);
  HB_INTERNAL_CHECK(f != nullptr) << where << ": the generated kernel " << m.path() << " has no " << name;
  return reinterpret_cast<F>(f);
}

}  // namespace

std::shared_ptr<const Call> lower_fused_flex_attention(const LowerContext& ctx) {
  const Node& n = ctx.n();
  const std::string& where = ctx.where;
  const KernelChoice& choice = ctx.program.kernels->nodes[ctx.node];
  HB_INTERNAL_CHECK(choice.module != nullptr) << where << ": a fused flex kernel was chosen but none was built";
  std::string why;
  const bool cuda = n.args.size() > 0 && n.args[0].kind == Arg::Kind::Ref &&
                    ctx.graph().nodes[n.args[0].ref].type.tensor.device.rfind("cuda", 0) == 0;
  const std::optional<FlexKernelSource> src = generate_flex_kernel(
      ctx.graph(), ctx.node, &why, cuda ? FlexKernelDevice::Cuda : FlexKernelDevice::Cpu);
  HB_INTERNAL_CHECK(src && src->source == choice.source) << where << ": the generated source changed since selection";
  auto call = std::make_shared<FlexFusedCall>();
  call->backward = n.target == "higher_order::flex_attention_backward";
  call->cuda = cuda;
  const size_t ntensors = call->backward ? 7 : 3;
  for (size_t k = 0; k < ntensors; ++k) call->tensors.push_back(convert_untyped(n.args[k], where));
  const Arg& bm = n.args[call->backward ? 9 : 4];
  const std::optional<FlexBlockMaskLayout> layout = flex_block_mask_layout(bm, &why);
  HB_USER_CHECK(layout.has_value()) << where << ": " << why;
  for (int i : {layout->kv_num_blocks, layout->kv_indices, layout->full_kv_num_blocks, layout->full_kv_indices})
    call->block_lists.push_back(convert_untyped(bm.items[i], where));
  if (cuda)
    for (int i : {layout->q_num_blocks, layout->q_indices, layout->full_q_num_blocks, layout->full_q_indices})
      call->block_lists.push_back(convert_untyped(bm.items[i], where));
  call->q_block = layout->q_block;
  call->kv_block = layout->kv_block;
  call->scale = float_or_value_arg(n.args[call->backward ? 10 : 5], where);
  call->score_buffers = convert_untyped(n.args[call->backward ? 12 : 7], where);
  call->mask_buffers = convert_untyped(n.args[call->backward ? 13 : 8], where);
  call->module = choice.module;
  const HostModule& m = *choice.module;
  call->buffer_grads = src->buffer_grads;
  call->layouts = src->buffer_layouts;
  call->where = where;
  if (cuda) {
    call->cuda_fns.forward = entry<FlexCudaLaunch>(m, "hb_flex_cuda_forward", true, where);
    call->cuda_fns.backward = entry<FlexCudaLaunch>(m, "hb_flex_cuda_backward", true, where);
    call->cuda_fns.error_string = entry<FlexCudaErrorString>(m, "hb_flex_cuda_error_string", true, where);
    call->cuda_fns.head_dim = flex_cuda_head_dim(ctx.graph().nodes[n.args[0].ref].type.tensor.shape[3].value,
                                                 ctx.graph().nodes[n.args[2].ref].type.tensor.shape[3].value);
    call->cuda_fns.elem_bytes =
        static_cast<int>(dtype_bytes(ctx.graph().nodes[n.args[0].ref].type.tensor.dtype));
    call->cuda_fns.reports_errors = src->may_fail;
    // A row shift's joint is skipped: the score gradient passes through, the buffers' gradients stay zero
    // (the generator decided it: its row_shift is fused_row_shift on a backward node).
    call->cuda_fns.row_shift = src->row_shift;
    call->cuda_fns.run_joint = src->joint && !src->row_shift;
    call->cuda_fns.deterministic = n.hints.deterministic.value_or(false);
    return call;
  }
  call->fns.score_f32 = entry<FlexScoreF32>(m, "hb_flex_score_f32", src->score_mod, where);
  call->fns.score_f64 = entry<FlexScoreF64>(m, "hb_flex_score_f64", src->score_mod, where);
  call->fns.mask = entry<FlexMaskFn>(m, "hb_flex_mask", src->mask_mod, where);
  // A row shift's joint is skipped: the score gradient passes through, the buffers' gradients stay zero.
  const bool joint = src->joint && !fused_row_shift(ctx.graph(), ctx.node, analyze_flex(ctx.graph(), ctx.node));
  call->fns.joint_f32 = entry<FlexJointF32>(m, "hb_flex_joint_f32", joint, where);
  call->fns.joint_f64 = entry<FlexJointF64>(m, "hb_flex_joint_f64", joint, where);
  return call;
}

}  // namespace hb::rt

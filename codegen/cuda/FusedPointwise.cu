#include "codegen/cuda/FusedPointwise.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "backend/ir/Error.h"

namespace hb::cuda {
namespace {

struct DevInstr {
  PwOp op;
  int16_t a, b;
  double k;
};
struct DevProgram {
  int n = 0;
  DevInstr code[kMaxProgram];
};
// Strides in elements; input strides are those of the input expanded to out's shape (0 = broadcast).
struct DevOperands {
  int ndim = 0;
  int nin = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims];
  int64_t out_strides[kMaxDims];
  int64_t in_strides[kMaxInputs][kMaxDims];
  const void* in[kMaxInputs];
  void* out;
};

template <typename S, typename T>
__global__ void fused_kernel(const DevProgram p, const DevOperands o) {
  T r[kMaxProgram];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < o.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t in_off[kMaxInputs];
    int64_t out_off = 0;
    for (int j = 0; j < o.nin; ++j) in_off[j] = 0;
    int64_t rest = i;
    for (int d = o.ndim - 1; d >= 0; --d) {
      const int64_t c = rest % o.sizes[d];
      rest /= o.sizes[d];
      out_off += c * o.out_strides[d];
      for (int j = 0; j < o.nin; ++j) in_off[j] += c * o.in_strides[j][d];
    }
    for (int pc = 0; pc < p.n; ++pc) {
      const DevInstr& in = p.code[pc];
      const T x = in.a >= 0 && in.op != PwOp::Load ? r[in.a] : T(0);
      const T y = in.b >= 0 ? r[in.b] : x;
      const T k = static_cast<T>(in.k);
      switch (in.op) {
        case PwOp::Load: r[pc] = static_cast<T>(static_cast<const S*>(o.in[in.a])[in_off[in.a]]); break;
        case PwOp::Const: r[pc] = k; break;
#define HB_PW_GPU_CASE(N) \
  case PwOp::N: r[pc] = pw_apply<PwOp::N, T>(x, y, k); break;
          HB_PW_COMPUTE_OPS(HB_PW_GPU_CASE)
#undef HB_PW_GPU_CASE
      }
    }
    static_cast<S*>(o.out)[out_off] = static_cast<S>(r[p.n - 1]);
  }
}

template <typename S, typename T>
void launch(const DevProgram& p, const DevOperands& o) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((o.numel + kThreads - 1) / kThreads, 65535LL * 8);
  fused_kernel<S, T><<<static_cast<unsigned>(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p, o);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

struct DeviceProgram {
  DevProgram code;
  int num_inputs = 0;
};

std::shared_ptr<const DeviceProgram> make_device_program(const PointwiseProgram& p, int64_t ndim) {
  if (static_cast<int>(p.code.size()) > kMaxProgram || p.num_inputs > kMaxInputs || ndim > kMaxDims) return nullptr;
  auto dp = std::make_shared<DeviceProgram>();
  dp->num_inputs = p.num_inputs;
  dp->code.n = static_cast<int>(p.code.size());
  for (int i = 0; i < dp->code.n; ++i)
    dp->code.code[i] = {p.code[i].op, static_cast<int16_t>(p.code[i].a), static_cast<int16_t>(p.code[i].b),
                        p.code[i].k};
  return dp;
}

void fused_pointwise(const DeviceProgram& p, const std::vector<at::Tensor>& inputs, const at::Tensor& out) {
  HB_INTERNAL_CHECK(static_cast<int>(inputs.size()) == p.num_inputs) << "fused pointwise: wrong input count";
  HB_INTERNAL_CHECK(out.dim() <= kMaxDims) << "fused pointwise: result of " << out.dim() << " dims";
  if (out.numel() == 0) return;
  DevOperands o;
  o.ndim = static_cast<int>(out.dim());
  o.nin = p.num_inputs;
  o.numel = out.numel();
  o.out = out.data_ptr();
  for (int d = 0; d < o.ndim; ++d) {
    o.sizes[d] = out.size(d);
    o.out_strides[d] = out.stride(d);
  }
  for (int j = 0; j < o.nin; ++j) {
    // Broadcast strides, right-aligned as in expand(): 0 along missing and size-1 dims.
    const at::Tensor& x = inputs[j];
    o.in[j] = x.const_data_ptr();
    const int lead = o.ndim - static_cast<int>(x.dim());
    HB_INTERNAL_CHECK(lead >= 0) << "fused pointwise: input " << j << " has more dims than the result";
    for (int d = 0; d < o.ndim; ++d)
      o.in_strides[j][d] = d < lead || x.size(d - lead) == 1 ? 0 : x.stride(d - lead);
  }
  const c10::cuda::CUDAGuard guard(out.device());
  switch (out.scalar_type()) {
    case at::kFloat: launch<float, float>(p.code, o); break;
    case at::kDouble: launch<double, double>(p.code, o); break;
    case at::kHalf: launch<c10::Half, float>(p.code, o); break;
    case at::kBFloat16: launch<c10::BFloat16, float>(p.code, o); break;
    default: HB_INTERNAL_CHECK(false) << "fused pointwise: unsupported dtype " << out.scalar_type();
  }
}

}  // namespace hb::cuda

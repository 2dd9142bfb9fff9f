#include "backend/runtime/Placement.h"

#include <map>
#include <mutex>
#include <string>

#include "backend/runtime/Args.h"
#include "codegen/KernelSelect.h"
#include "codegen/TargetModel.h"
#include "passes/CallInvariance.h"
#include "passes/MemoryPlan.h"

namespace hb::rt {

namespace {

bool same_argument(const c10::Argument& a, const c10::Argument& b) {
  if (a.name() != b.name() || !(*a.type() == *b.type())) return false;
  const c10::AliasInfo* x = a.alias_info();
  const c10::AliasInfo* y = b.alias_info();
  return (!x && !y) || (x && y && *x == *y);
}

// `o` is the out= form of `f`: f's arguments (same names, types, order), then one Tensor(a!)
// argument, and it returns that one tensor.
bool is_out_overload_of(const c10::FunctionSchema& f, const c10::FunctionSchema& o) {
  const auto& fa = f.arguments();
  const auto& oa = o.arguments();
  if (oa.size() != fa.size() + 1 || o.returns().size() != 1) return false;
  for (size_t k = 0; k < fa.size(); ++k)
    if (!same_argument(fa[k], oa[k])) return false;
  const c10::Argument& out = oa.back();
  return out.type()->kind() == c10::TypeKind::TensorType && out.alias_info() && out.alias_info()->isWrite() &&
         o.returns()[0].type()->kind() == c10::TypeKind::TensorType;
}

// Overload names registered for an operator name ("aten::sum" -> "", "dim_IntList", "IntList_out", ...).
std::vector<std::string> overloads_of(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::vector<std::string>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it == cache.end()) {  // (re)build: libraries may have registered operators since the last time
    cache.clear();
    for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames())
      cache[op.name].push_back(op.overload_name);
    it = cache.find(name);
    if (it == cache.end()) return {};
  }
  return it->second;
}

}  // namespace

std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& f = op.schema();
  const std::string& overload = f.overload_name();
  std::vector<std::string> names;
  if (!overload.empty()) names.push_back(overload + "_out");
  names.push_back("out");
  for (std::string& n : overloads_of(f.name())) names.push_back(std::move(n));
  for (const std::string& n : names) {
    if (n == overload) continue;
    auto h = c10::Dispatcher::singleton().findSchema({f.name(), n});
    if (h && is_out_overload_of(f, h->schema())) return h;
  }
  return std::nullopt;
}

namespace {

// The op part of the rule: one fresh tensor result, an out= overload, and a kernel of its own for the
// device (an out= overload without one is torch's generated wrapper: it runs the functional op and
// copies the result into `out`, a transient second result, as convolution.out does).
std::string op_unplaceable(const Node& n, const std::string& device) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;  // "target device dtype" -> why
  const std::string key = n.target + " " + device + " " + dtype_name(n.type.tensor.dtype);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::string why;
  auto [name, overload] = split_target(n.target);
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!op) {
    why = "not registered";
  } else {
    const c10::FunctionSchema& f = op->schema();
    if (f.is_mutable() || f.returns().size() != 1 || f.returns()[0].type()->kind() != c10::TypeKind::TensorType ||
        f.returns()[0].alias_info())
      why = "schema is not one fresh tensor";
    else if (to_scalar_type(n.type.tensor.dtype) == c10::ScalarType::Undefined)
      why = "unknown dtype";
    else if (auto out_op = find_out_overload(*op); !out_op)
      why = "no matching out= overload";
    else if (!out_op->hasKernelForDispatchKey(c10::Device(device).is_cuda() ? c10::DispatchKey::CUDA
                                                                           : c10::DispatchKey::CPU))
      why = "out= overload copies (no " + device + " kernel)";
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = why;
  return why;
}

}  // namespace

at::Tensor arena_view(const at::Tensor& arena, const Placement& p) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(arena.storage()), arena.key_set(), p.dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(p.sizes, p.strides, p.offset);
  return t;
}

namespace {
bool in_arena(const at::Tensor& t, const c10::StorageImpl* arena) {
  return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == arena;
}
}  // namespace

void keep_out_of_arena(c10::IValue& v, const c10::StorageImpl* arena) {
  if (v.isTensor()) {
    if (in_arena(v.toTensor(), arena)) v = v.toTensor().clone();
  } else if (v.isTuple()) {
    bool hit = false;
    for (const c10::IValue& x : v.toTupleRef().elements()) hit |= x.isTensor() && in_arena(x.toTensor(), arena);
    if (!hit) return;
    std::vector<c10::IValue> e(v.toTupleRef().elements().begin(), v.toTupleRef().elements().end());
    for (c10::IValue& x : e) keep_out_of_arena(x, arena);
    v = c10::ivalue::Tuple::create(std::move(e));
  } else if (v.isTensorList()) {
    bool hit = false;
    for (const at::Tensor& x : v.toTensorVector()) hit |= in_arena(x, arena);
    if (!hit) return;
    std::vector<at::Tensor> e = v.toTensorVector();
    for (at::Tensor& x : e)
      if (in_arena(x, arena)) x = x.clone();
    v = c10::IValue(std::move(e));
  }
}

Target runtime_target(const HostCompileSettings& host, const CudaCompileSettings& cuda) {
  Target t = make_target("runtime", op_unplaceable);
  t.host = host;
#ifdef HB_WITH_CUDA
  t.cuda = cuda;
  t.cuda_kernels = true;
#endif
  const bool cudnn =
#ifdef HB_WITH_CUDNN
      true;
  t.cudnn_attention = true;
#else
      false;
#endif
  const bool fused_cpu = host.enabled(), fused_cuda = t.cuda.enabled();
  t.workspace = [=](const Graph& g, const Node& n) { return kernel_workspace_bytes(g, n, cudnn, fused_cpu, fused_cuda); };
  return t;
}

Program program_of(std::shared_ptr<Graph> g, MemoryPlanOptions opt) {
  opt.target = runtime_target();
  Program p;
  p.kernels = std::make_shared<const KernelPlan>(select_kernels(*g, opt.target));
  p.memory = std::make_shared<const MemoryPlan>(memory_plan(*g, opt));
  p.invariants = find_call_invariants(*g, p.memory.get());
  p.graph = std::move(g);
  return p;
}

}  // namespace hb::rt

// The lean runtime's autograd node (LeanAutograd.h). What it does is what torch.autograd.Function does for
// a graph AOTAutograd's metadata shows to be plain (lean_runtime.plan_of), in C++: the Python
// Function's per-call work (its apply, the forward's and the once_differentiable backward's bodies, the
// engine's call into Python) was a third of the host time of a small training step on the GPU machine.
//
// Forward (LeanFunction::call): run the compiled forward without grad, wrap the outputs as a custom
// Function's are (torch::autograd::_wrap_outputs: the same history, views and non-differentiable
// marks), save the saved values (SavedVariable: version-counter checks) and copy the new values of
// mutated inputs in. Backward (LeanBackward::apply): unpack and release the saved values (unless
// retain_graph) so the compiled backward frees each after its last use, give each tangent the layout it
// was traced with, run the backward, or its variant for tangents that never came (undefined gradients:
// built once by Python through fold-zero-inputs, kept), and refuse a second differentiation as
// once_differentiable does.
#include "backend/bindings/LeanAutograd.h"

#include <pybind11/stl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>

#include "backend/bindings/PyValues.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::Variable;
using torch::autograd::variable_list;

namespace hb {
namespace {

// The layout a tangent was traced with (AOTAutograd's MemoryFormatMeta): a memory format, or exact sizes
// and strides.
struct TangentLayout {
  std::optional<at::MemoryFormat> format;
  std::vector<int64_t> sizes, strides;
};

// AOTAutograd's coerce_to_expected_memory_format, for one tangent.
at::Tensor coerce(const at::Tensor& g, const TangentLayout& want) {
  if (want.format) return g.is_contiguous(*want.format) ? g : g.contiguous(*want.format);
  if (g.sizes().equals(want.sizes) && g.strides().equals(want.strides)) return g;
  at::Tensor r = at::empty_strided(want.sizes, want.strides, g.options());
  r.copy_(g);
  return r;
}

// Whether `input` already holds `value`: the same memory read the same way (the graph wrote the input in
// place and returned its data: write-inputs-in-place).
bool holds_already(const at::Tensor& input, const at::Tensor& value) {
  return input.is_alias_of(value) && input.storage_offset() == value.storage_offset() &&
         input.sizes().equals(value.sizes()) && input.strides().equals(value.strides()) &&
         input.scalar_type() == value.scalar_type();
}

TangentLayout parse_layout(const py::handle& h) {
  TangentLayout l;
  if (py::isinstance<py::str>(h)) {
    const std::string name = h.cast<std::string>();
    if (name == "contiguous_format") l.format = at::MemoryFormat::Contiguous;
    else if (name == "channels_last") l.format = at::MemoryFormat::ChannelsLast;
    else if (name == "channels_last_3d") l.format = at::MemoryFormat::ChannelsLast3d;
    else if (name == "preserve_format") l.format = at::MemoryFormat::Preserve;
    else throw InternalError("hintbackend: lean runtime: unknown tangent memory format " + name);
    return l;
  }
  auto t = h.cast<py::sequence>();  // [sizes, strides] (a list once stored in the compile cache)
  l.sizes = t[0].cast<std::vector<int64_t>>();
  l.strides = t[1].cast<std::vector<int64_t>>();
  return l;
}

// The plan (lean_runtime.LeanPlan) and the compiled graphs, shared by the function and its nodes.
struct LeanState {
  std::shared_ptr<GraphRun> forward, backward;
  int64_t num_outputs = 0;
  int64_t saved_begin = 0, saved_end = 0, unchecked_begin = 0, unchecked_end = 0;
  std::vector<int64_t> differentiable;  // user outputs whose gradients the backward takes, in its order
  std::vector<bool> is_differentiable;  // per user output
  std::vector<TangentLayout> layouts;   // per differentiable output
  bool donated = false;
  std::vector<bool> unsafe_view;        // per user output
  std::vector<int64_t> mutated_inputs;  // inputs whose new values are the forward's first outputs
  // positions -> (the backward with those inputs as zeros, the positions it does not read); built by
  // Python (lean_runtime._zero_graph, through backend._zero_variants) at the first use.
  py::object build_variant;
  std::mutex variants_mutex;
  std::map<std::vector<int64_t>, std::pair<std::shared_ptr<GraphRun>, std::set<int64_t>>> variants;

  std::pair<std::shared_ptr<GraphRun>, std::set<int64_t>> variant(const std::vector<int64_t>& positions) {
    std::lock_guard<std::mutex> lock(variants_mutex);
    auto it = variants.find(positions);
    if (it != variants.end()) return it->second;
    py::gil_scoped_acquire gil;
    py::object got = build_variant(py::tuple(py::cast(positions)));
    auto pair = got.cast<py::tuple>();
    // None: no variant (the backward as compiled, given zeros)
    std::pair<std::shared_ptr<GraphRun>, std::set<int64_t>> v{
        pair[0].is_none() ? backward : pair[0].cast<std::shared_ptr<GraphRun>>(), pair[1].cast<std::set<int64_t>>()};
    return variants.emplace(positions, std::move(v)).first->second;
  }

  ~LeanState() {
    if (!build_variant) return;
    if (!Py_IsInitialized()) {  // at exit, after the interpreter: leave it
      build_variant.release();
      return;
    }
    py::gil_scoped_acquire gil;  // the last node may die on an autograd thread
    build_variant = py::object();
  }
};

constexpr const char* kDonated =
    "hintbackend: this compiled backward may overwrite the tensors its forward saved (AOTAutograd's donated "
    "buffers), so it runs once: call backward() without retain_graph=True or create_graph=True, or set "
    "torch._functorch.config.donated_buffer=False before compiling.";

struct LeanBackward final : Node {
  std::shared_ptr<LeanState> state;
  std::vector<SavedVariable> saved;
  std::vector<at::Tensor> unchecked;  // saved without version-counter checks (AOTAutograd's split)
  // Each differentiable output's sizes and options, for a zero gradient no variant folds away.
  std::vector<std::pair<std::vector<int64_t>, at::TensorOptions>> tangent_meta;
  bool released = false;

  std::string name() const override { return "hintbackend::LeanBackward"; }

  // Compiled autograd traces the nodes it runs; this one it cannot (the lean runtime hands a forward run
  // under compiled autograd to AOTAutograd's runtime, whose nodes it traces).
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs&) const override {
    TORCH_CHECK(false,
                "hintbackend: compiled autograd reached the backward of a graph whose forward ran outside it (that "
                "forward ran on hintbackend's lean runtime, whose autograd node compiled autograd cannot trace): "
                "run the forward under compiled autograd too, or compile with options={\"lean_runtime\": False}");
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    saved.clear();
    unchecked.clear();
    released = true;
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const LeanState& s = *state;
    const bool keep_graph = torch::autograd::get_current_graph_task_keep_graph();
    TORCH_CHECK(!(s.donated && keep_graph), kDonated);
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    std::vector<c10::IValue> args;
    args.reserve(saved.size() + unchecked.size() + s.differentiable.size());
    const std::shared_ptr<Node> self = shared_from_this();
    auto value = [](at::Tensor t) { return t.defined() ? c10::IValue(std::move(t)) : c10::IValue(); };
    for (const SavedVariable& v : saved) args.push_back(value(v.unpack(self)));
    for (const at::Tensor& t : unchecked) args.push_back(value(t));
    if (!keep_graph) {  // the compiled backward frees each saved value after its last use
      saved.clear();
      unchecked.clear();
      released = true;
    }
    const size_t nm = s.mutated_inputs.size();  // (the mutated inputs' new values take no gradient)
    const int64_t base = static_cast<int64_t>(args.size());
    std::vector<int64_t> undefined;
    for (size_t k = 0; k < s.differentiable.size(); ++k)
      if (!grads.at(nm + s.differentiable[k]).defined()) undefined.push_back(base + static_cast<int64_t>(k));
    std::pair<std::shared_ptr<GraphRun>, std::set<int64_t>> run{s.backward, {}};
    if (!undefined.empty()) run = state->variant(undefined);
    for (size_t k = 0; k < s.differentiable.size(); ++k) {
      at::Tensor g = grads[nm + s.differentiable[k]];
      if (!g.defined()) {
        if (run.second.count(base + static_cast<int64_t>(k))) {
          args.emplace_back();
          continue;
        }
        g = at::zeros(tangent_meta[k].first, tangent_meta[k].second);
      }
      args.emplace_back(coerce(g, s.layouts[k]));
    }
    std::vector<c10::IValue> out;
    {
      at::AutoGradMode no_grad(false);  // once_differentiable
      out = run.first->run_values(std::move(args));
    }
    HB_INTERNAL_CHECK(out.size() == num_outputs())
        << "lean backward: the compiled backward returned " << out.size() << " gradients for "
        << num_outputs() << " inputs";
    variable_list result(out.size());
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].isTensor()) result[i] = out[i].toTensor();
    bool differentiable_grads = false;
    for (const Variable& g : grads) differentiable_grads |= g.defined() && g.requires_grad();
    if (!at::GradMode::is_enabled() || !differentiable_grads) return result;
    // create_graph=True: as once_differentiable, gradients whose own backward raises.
    variable_list fake(result.size());
    for (size_t i = 0; i < result.size(); ++i)
      if (result[i].defined()) {
        fake[i] = result[i].detach();
        fake[i].set_requires_grad(true);
      }
    auto err = std::make_shared<torch::autograd::DelayedError>(
        "trying to differentiate twice a function that was marked with @once_differentiable",
        static_cast<int64_t>(fake.size()));
    return (*err)(std::move(fake));
  }
};

PyTypeObject lean_backward_type;

class LeanFunction {
 public:
  explicit LeanFunction(std::shared_ptr<LeanState> s) : state_(std::move(s)) {}

  // The backend call: the user outputs as a tuple (the mutated inputs written).
  py::object call(const py::args& args) {
    const size_t n = args.size();
    std::vector<c10::IValue> inputs;
    inputs.reserve(n);
    variable_list vars(n);  // the tensor inputs at their positions
    bool needs_grad = false;
    for (size_t k = 0; k < n; ++k) {
      inputs.push_back(to_ivalue(args[k].ptr(), k));
      if (inputs.back().isTensor()) {
        vars[k] = inputs.back().toTensor();
        needs_grad |= vars[k].requires_grad();
      }
    }
    needs_grad &= at::GradMode::is_enabled();
    variable_list user;
    {
      py::gil_scoped_release no_gil;
      user = forward(std::move(inputs), vars, needs_grad);
    }
    py::tuple t(user.size());
    for (size_t i = 0; i < user.size(); ++i) t[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(user[i]));
    return std::move(t);
  }

 private:
  variable_list forward(std::vector<c10::IValue> inputs, const variable_list& vars, bool needs_grad) {
    const LeanState& s = *state_;
    std::vector<c10::IValue> outs;
    {
      at::AutoGradMode no_grad(false);  // as autograd.Function.forward
      outs = s.forward->run_values(std::move(inputs));
    }
    const size_t nm = s.mutated_inputs.size();
    HB_INTERNAL_CHECK(outs.size() >= nm + s.num_outputs && outs.size() >= static_cast<size_t>(s.saved_end) &&
                      outs.size() >= static_cast<size_t>(s.unchecked_end))
        << "lean forward: the compiled forward returned " << outs.size() << " values";
    std::vector<std::optional<Variable>> raw;
    raw.reserve(nm + s.num_outputs);
    for (size_t i = 0; i < nm + s.num_outputs; ++i) {
      at::Tensor t = outs[i].toTensor();
      if (i >= nm && s.unsafe_view[i - nm]) {  // not a view for autograd (as AOTAutograd's runtime returns it)
        at::AutoGradMode no_grad(false);
        t = at::_unsafe_view(t, t.sizes());
      }
      raw.emplace_back(std::move(t));
    }
    variable_list result;
    if (!needs_grad) {
      for (auto& r : raw) result.push_back(std::move(*r));
    } else {
      std::shared_ptr<LeanBackward> node(new LeanBackward(), torch::autograd::deleteNode);
      node->state = state_;
      node->set_next_edges(torch::autograd::collect_next_edges(vars));
      std::unordered_set<at::TensorImpl*> non_differentiable;
      for (size_t i = 0; i < raw.size(); ++i)
        if (i < nm || !s.is_differentiable[i - nm]) non_differentiable.insert(raw[i]->unsafeGetTensorImpl());
      auto jvp = [](const variable_list&, const variable_list&) -> variable_list {
        TORCH_CHECK(false, "hintbackend: forward-mode AD (jvp) through a compiled graph is not supported");
        return {};
      };
      auto view_as_self = [](const at::Tensor& x) { return x.view_as(x); };
      auto wrapped = torch::autograd::_wrap_outputs(vars, non_differentiable, {}, raw, node, jvp, {}, view_as_self,
                                                    false);
      std::unordered_set<at::TensorImpl*> returned;  // outputs now with this node as grad_fn
      for (auto& w : wrapped) {
        result.push_back(w ? std::move(*w) : at::Tensor());
        if (result.back().defined()) returned.insert(result.back().unsafeGetTensorImpl());
      }
      // (a saved value may be None: an undefined tensor, as the backward was traced with)
      for (int64_t i = s.saved_begin; i < s.saved_end; ++i) {
        at::Tensor t = outs[i].isTensor() ? outs[i].toTensor() : at::Tensor();
        if (t.defined() && t.is_view()) t = t.detach();
        node->saved.emplace_back(t, /*is_output=*/t.defined() && returned.count(t.unsafeGetTensorImpl()) > 0);
      }
      for (int64_t i = s.unchecked_begin; i < s.unchecked_end; ++i) {
        at::Tensor t = outs[i].isTensor() ? outs[i].toTensor() : at::Tensor();
        // (a returned output held as is would hold this node: a cycle no one frees)
        if (t.defined() && (t.is_view() || returned.count(t.unsafeGetTensorImpl()))) t = t.detach();
        node->unchecked.push_back(std::move(t));
      }
      for (int64_t i : s.differentiable) {
        const at::Tensor& u = result.at(nm + i);
        node->tangent_meta.emplace_back(u.sizes().vec(), u.options());
      }
    }
    for (size_t i = 0; i < nm; ++i) {  // as AOTAutograd's runtime writes a data mutation back
      const at::Tensor& input = vars.at(s.mutated_inputs[i]);
      // (nothing to copy where the graph wrote the input in place: write-inputs-in-place)
      if (!holds_already(input, result[i])) input.copy_(result[i]);
    }
    return variable_list(result.begin() + static_cast<std::ptrdiff_t>(nm), result.end());
  }

  std::shared_ptr<LeanState> state_;
};

}  // namespace

void register_lean_autograd(py::module_& m) {
  torch::autograd::_initFunctionPyTypeObject(lean_backward_type, "hintbackend.LeanBackward", nullptr, nullptr);
  Py_INCREF(&lean_backward_type);
  torch::autograd::registerCppFunction(typeid(LeanBackward), &lean_backward_type);
  py::class_<LeanFunction>(m, "LeanFunction")
      .def(py::init([](std::shared_ptr<GraphRun> forward, std::shared_ptr<GraphRun> backward, py::dict plan,
                       py::object build_variant) {
             auto s = std::make_shared<LeanState>();
             s->forward = std::move(forward);
             s->backward = std::move(backward);
             s->num_outputs = plan["num_outputs"].cast<int64_t>();
             auto range = [&](const char* key, int64_t& a, int64_t& b) {
               auto r = plan[key].cast<std::vector<int64_t>>();
               a = r.at(0);
               b = r.at(1);
             };
             range("saved", s->saved_begin, s->saved_end);
             range("saved_unchecked", s->unchecked_begin, s->unchecked_end);
             s->differentiable = plan["differentiable"].cast<std::vector<int64_t>>();
             s->is_differentiable.assign(s->num_outputs, false);
             for (int64_t i : s->differentiable) s->is_differentiable.at(i) = true;
             for (const py::handle h : plan["tangent_layouts"].cast<py::list>()) s->layouts.push_back(parse_layout(h));
             HB_INTERNAL_CHECK(s->layouts.size() == s->differentiable.size()) << "lean plan: one layout per tangent";
             s->donated = plan["donated"].cast<bool>();
             s->unsafe_view.assign(s->num_outputs, false);
             for (int64_t i : plan["unsafe_views"].cast<std::vector<int64_t>>()) s->unsafe_view.at(i) = true;
             s->mutated_inputs = plan["mutated_inputs"].cast<std::vector<int64_t>>();
             s->build_variant = std::move(build_variant);
             return LeanFunction(std::move(s));
           }),
           py::arg("forward"), py::arg("backward"), py::arg("plan"), py::arg("build_variant"),
           "A plain graph's compiled forward and backward as one autograd function (plan: LeanPlan.to_json(); "
           "build_variant(positions) -> (CompiledGraph, positions it does not read))")
      .def("__call__", &LeanFunction::call, "Runs the forward; records the backward where a gradient is needed");
}

}  // namespace hb

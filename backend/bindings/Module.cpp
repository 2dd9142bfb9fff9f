// The pybind11 module hintbackend._C: compile a graph document into a CompiledGraph and run it.
// The only translation unit that includes torch's Python headers.
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <memory>
#include <optional>

#include "backend/bindings/LeanAutograd.h"
#include "backend/bindings/PyValues.h"
#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Printer.h"
#include "backend/ir/SliceLoop.h"
#include "backend/runtime/Executor.h"
#include "backend/runtime/GraphReplay.h"
#include "backend/runtime/Placement.h"
#include "codegen/FlexLowering.h"
#include "codegen/KernelSelect.h"
#include "codegen/TargetModel.h"
#include "passes/Pipeline.h"

namespace py = pybind11;

namespace hb {
namespace {

// A memory plan as plain data for the memory picture (python/hintbackend/memory_picture.py): the plan's
// buffers with their values, live ranges and offsets, the region each belongs to, the slice loops of
// the graph and the plans of their bodies.
py::dict plan_data(const MemoryPlan& p, const Graph& g) {
  auto vname = [&](const ValueRef& v) {
    return "%" + g.nodes[v.node].name + (v.elem >= 0 ? "." + std::to_string(v.elem) : "");
  };
  py::list buffers;
  for (const PlannedBuffer& b : p.buffers) {
    py::list values;
    for (const ValueRef& v : b.values) values.append(vname(v));
    const Node& n = g.nodes[b.values[0].node];
    py::dict d;
    d["values"] = values;
    d["op"] = n.target;
    d["offset"] = b.offset;
    d["size"] = b.size;
    d["start"] = b.start;
    d["end"] = b.end;
    d["segment"] = b.segment;
    d["region"] = n.hints.empty() ? -1 : n.hints.region;
    buffers.append(d);
  }
  py::list segments;
  for (const ArenaSegment& s : p.segments) segments.append(py::make_tuple(s.start, s.end, s.bytes));
  py::list loops;
  for (const Node& n : g.nodes) {
    const Graph* body = slice_loop_body(g, n);
    if (!body) continue;
    const SliceLoopArgs a = slice_loop_args(n);
    py::dict d;
    d["node"] = "%" + n.name;
    d["step"] = static_cast<int>(&n - g.nodes.data());
    d["body"] = a.body;
    d["slices"] = a.slices;
    d["region"] = n.hints.empty() ? -1 : n.hints.region;
    loops.append(d);
  }
  py::dict bodies;
  for (const auto& kv : p.bodies) {
    auto it = g.subgraphs.find(kv.first);
    if (it != g.subgraphs.end()) bodies[py::str(kv.first)] = plan_data(*kv.second, *it->second);
  }
  py::dict out;
  out["graph"] = p.graph;
  out["device"] = p.device;
  out["strategy"] = p.strategy;
  out["steps"] = static_cast<int>(g.nodes.size());
  out["arena_bytes"] = p.arena_bytes;
  out["live_peak_bytes"] = p.live_peak_bytes;
  out["no_reuse_bytes"] = p.no_reuse_bytes;
  out["buffers"] = buffers;
  out["segments"] = segments;
  out["slice_loops"] = loops;
  out["bodies"] = bodies;
  return out;
}

// The settings of one compile, read once in Python (options.py) and passed down as values.
struct CompileSettings {
  std::vector<std::string> disable_passes;
  std::vector<std::string> zero_inputs;  // placeholders passed as zeros (fold-zero-inputs)
  std::vector<std::string> input_writes;  // placeholders the first outputs are written back into, in order
  bool verify_each_pass = false;
  std::string memory_plan_strategy;  // "" = the planner keeps the better of its strategies
  bool memory_plan_in_place = true;
  bool fast_views = true;  // Target::fast_views: views read inside the graph made without the dispatcher
  // Program::keep_across_calls: keep device values from one call for the next (the steps that read only
  // constants run once). Off under CUDA graphs.
  bool keep_across_calls = true;
  bool arena = true;
  bool dump = false;  // print the IR after every pass, the kernels and the plan (else none is printed)
  std::string host_compiler;  // builds generated CPU kernels ("" = none: the reference runs instead)
  std::string cache_dir;      // the kernel cache's root (<cache_dir>/kernels)
  std::string nvcc;             // builds generated CUDA kernels ("" = none)
  std::string cuda_arch;        // the GPU's compute capability, "90"
  long long cuda_smem_per_block = 0;  // its shared memory per block with opt-in, bytes (0: unknown)
  std::string cutlass_include;  // CUTLASS's headers (cute/, cutlass/)

  PassContext pass_context() const {
    PassContext ctx;
    ctx.disabled.insert(disable_passes.begin(), disable_passes.end());
    ctx.zero_inputs.insert(zero_inputs.begin(), zero_inputs.end());
    ctx.input_writes = input_writes;
    ctx.verify_each = verify_each_pass;
    ctx.memory.strategy = memory_plan_strategy;
    ctx.memory.in_place = memory_plan_in_place;
    ctx.memory.arena = arena;
    ctx.memory.target = rt::runtime_target({host_compiler, cache_dir}, {nvcc, cuda_arch, cutlass_include, cache_dir, cuda_smem_per_block});  // plan exactly what this runtime runs
    ctx.memory.target.fast_views = fast_views;
    ctx.keep_across_calls = keep_across_calls;
    return ctx;
  }
};

// One compiled FX graph: the program the pipeline made, the executor that runs it, and the dumps.
class CompiledGraph final : public GraphRun {
 public:
  CompiledGraph(const std::string& document, std::vector<at::Tensor> constants, const CompileSettings& settings) {
    std::shared_ptr<Graph> graph = import_json(document);
    PassContext ctx = settings.pass_context();
    int step = 0;
    if (settings.dump) {
      dumps_.emplace_back("ir-import", print_graph(*graph));
      ctx.after_pass = [&](const std::string& pass, const Graph& g, bool changed) {
        ++step;
        dumps_.emplace_back("ir-after-" + std::to_string(step) + "-" + pass,
                            changed ? print_graph(g) : "(unchanged)\n");
      };
    }
    program_ = compile_program(std::move(graph), ctx);
    ctx.after_pass = nullptr;
    const Graph& g = *program_.graph;
    if (settings.dump) {
      dumps_.emplace_back("ir-final", print_graph(g));
      dumps_.emplace_back("kernels", print_kernel_plan(g, *program_.kernels));
      dumps_.emplace_back("memory-plan", program_.memory ? to_string(*program_.memory, g) + "\n"
                                                         : "memory-plan disabled: nothing is placed\n");
      dumps_.emplace_back("placement", placement_table(g, ctx.memory.target));
    }
    run_label_ = "hb run " + g.name;
    exec_label_ = "hb executor " + g.name;
    if (program_.kernels->unsupported_descriptions.empty()) {
      auto consts = std::make_shared<const std::vector<at::Tensor>>(std::move(constants));
      executor_ = std::make_unique<rt::Executor>(program_, consts);
    }
  }

  py::object run(py::list args) {
    HB_USER_CHECK(executor_ != nullptr) << "graph '" << program_.graph->name
                                        << "' has unsupported nodes and cannot run in hintbackend";
    // Host-time ranges under torch.profiler: the whole call, and the executor inside it.
    RECORD_FUNCTION(run_label_, std::vector<c10::IValue>());
    std::vector<c10::IValue> inputs;
    inputs.reserve(args.size());
    for (size_t k = 0; k < args.size(); ++k) inputs.push_back(to_ivalue(args[k].ptr(), k));
    args.attr("clear")();  // boxed calling convention: we own the inputs now, free them early
    std::vector<c10::IValue> out;
    {
      py::gil_scoped_release no_gil;
      out = run_values(std::move(inputs));
    }
    py::tuple t(out.size());
    for (size_t i = 0; i < out.size(); ++i) t[i] = to_py(out[i]);
    return std::move(t);
  }

  // The run without Python (the caller holds no GIL or does not need it): what run() and the lean
  // autograd node (LeanAutograd.h) call.
  std::vector<c10::IValue> run_values(std::vector<c10::IValue> inputs) override {
    HB_USER_CHECK(executor_ != nullptr) << "graph '" << program_.graph->name
                                        << "' has unsupported nodes and cannot run in hintbackend";
    rt::take_failure_site();  // a site left by an earlier failure no caller took
    RECORD_FUNCTION(exec_label_, std::vector<c10::IValue>());
    return executor_->run(std::move(inputs));
  }

  std::vector<std::string> unsupported() const { return program_.kernels->unsupported_descriptions; }
  std::vector<std::pair<std::string, std::string>> dumps() const { return dumps_; }
  std::vector<std::string> notes() const { return program_.notes; }
  std::vector<std::string> warnings() const { return program_.warnings; }
  std::string ir() const { return print_graph(*program_.graph); }  // printed on demand only
  std::vector<std::string> unread_inputs() const {
    const Graph& g = *program_.graph;
    const std::vector<std::vector<int>> users = g.users();
    std::vector<std::string> out;
    for (int p : g.placeholders())
      if (users[p].empty()) out.push_back(g.nodes[p].name);
    return out;
  }
  std::string kernels() const { return print_kernel_plan(*program_.graph, *program_.kernels); }
  // The last run's largest workspace one kernel allocated for itself (cuDNN's SDPA), 0 before a run.
  int64_t kernel_workspace_bytes() const { return executor_ ? executor_->arena_stats().workspace : 0; }
  // cuDNN's workspace as the plan models it (cudnn_sdpa_workspace_bytes), per node that runs on cuDNN,
  // slice-loop bodies' included: [(node, bytes)].
  std::vector<std::pair<std::string, int64_t>> cudnn_workspace_model() const {
    std::vector<std::pair<std::string, int64_t>> out;
    std::function<void(const Graph&, const KernelPlan&)> walk = [&](const Graph& g, const KernelPlan& kp) {
      for (size_t i = 0; i < g.nodes.size() && i < kp.nodes.size(); ++i) {
        const KernelKind k = kp.nodes[i].kind;
        if (k != KernelKind::FlexCudnnForward && k != KernelKind::FlexCudnnBackward) continue;
        const int node = static_cast<int>(i);
        out.emplace_back(g.nodes[i].name, cudnn_sdpa_workspace_bytes(g, node, analyze_flex(g, node)));
      }
      for (const auto& [name, sub] : kp.subgraphs) {
        auto it = g.subgraphs.find(name);
        if (it != g.subgraphs.end() && sub) walk(*it->second, *sub);
      }
    };
    walk(*program_.graph, *program_.kernels);
    return out;
  }
  py::object memory_plan() const {
    return program_.memory ? py::object(plan_data(*program_.memory, *program_.graph)) : py::object(py::none());
  }

 private:
  std::string run_label_, exec_label_;  // the profiler's names for run() and the executor in it
  Program program_;
  std::unique_ptr<rt::Executor> executor_;
  std::vector<std::pair<std::string, std::string>> dumps_;
};

// A compiled graph replayed as a CUDA graph (backend/runtime/GraphReplay.h): what the lean runtime runs
// under options={"cuda_graphs": True}. `note(warning, text)` hears each distinct event once (the backend
// logs it); `emulate` keeps the bookkeeping on the CPU without a capture (the tests' mode).
class ReplayedGraph final : public GraphRun {
 public:
  ReplayedGraph(std::shared_ptr<GraphRun> graph, bool emulate, std::optional<std::vector<int64_t>> in_place,
                py::object note)
      : note_(new py::object(std::move(note)), [](py::object* o) {
          if (Py_IsInitialized()) {  // the last reference may drop on an autograd thread
            py::gil_scoped_acquire gil;
            delete o;
          } else {
            o->release();
            delete o;
          }
        }),
        replay_(std::make_shared<rt::GraphReplay>(
            [g = std::move(graph)](std::vector<c10::IValue> in) { return g->run_values(std::move(in)); },
            emulate ? rt::GraphReplay::Mode::kEmulated : rt::GraphReplay::Mode::kCuda, std::move(in_place),
            [n = note_](bool warning, const std::string& text) {
              py::gil_scoped_acquire gil;
              try {
                (*n)(warning, text);
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable(__func__);
              }
            })) {}

  std::vector<c10::IValue> run_values(std::vector<c10::IValue> inputs) override {
    return replay_->run(std::move(inputs));
  }

  // This graph (a backward) reads `producer`'s outputs (its forward's) in place: GraphReplay::follow.
  void follow(const ReplayedGraph& producer) { replay_->follow(producer.replay_); }

  py::dict stats() const {
    const rt::GraphReplay::Stats s = replay_->stats();
    py::dict d;
    d["calls"] = s.calls;
    d["replays"] = s.replays;
    d["plain"] = s.plain;
    d["recordings"] = s.recordings;
    d["graphs"] = s.graphs;
    d["copied_inputs"] = s.copied_inputs;
    d["refused"] = s.refused;
    return d;
  }

 private:
  std::shared_ptr<py::object> note_;
  std::shared_ptr<rt::GraphReplay> replay_;
};

}  // namespace
}  // namespace hb

PYBIND11_MODULE(_C, m) {
  m.doc() = "hintbackend's C++ core: IR import, passes, kernel selection and the runtime";
  py::register_exception<hb::UserError>(m, "GraphError", PyExc_ValueError);
  py::register_exception<hb::InternalError>(m, "InternalError", PyExc_RuntimeError);
  m.attr("SCHEMA_VERSION") = hb::kSchemaVersion;
  m.attr("SCHEMA_FORMAT") = hb::kSchemaFormat;
#ifdef HB_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif
  py::class_<hb::CompileSettings>(m, "CompileSettings")
      .def(py::init<>())
      .def_readwrite("disable_passes", &hb::CompileSettings::disable_passes)
      .def_readwrite("zero_inputs", &hb::CompileSettings::zero_inputs)
      .def_readwrite("input_writes", &hb::CompileSettings::input_writes)
      .def_readwrite("verify_each_pass", &hb::CompileSettings::verify_each_pass)
      .def_readwrite("memory_plan_strategy", &hb::CompileSettings::memory_plan_strategy)
      .def_readwrite("memory_plan_in_place", &hb::CompileSettings::memory_plan_in_place)
      .def_readwrite("fast_views", &hb::CompileSettings::fast_views)
      .def_readwrite("keep_across_calls", &hb::CompileSettings::keep_across_calls)
      .def_readwrite("arena", &hb::CompileSettings::arena)
      .def_readwrite("dump", &hb::CompileSettings::dump)
      .def_readwrite("host_compiler", &hb::CompileSettings::host_compiler)
      .def_readwrite("cache_dir", &hb::CompileSettings::cache_dir)
      .def_readwrite("nvcc", &hb::CompileSettings::nvcc)
      .def_readwrite("cuda_arch", &hb::CompileSettings::cuda_arch)
      .def_readwrite("cuda_smem_per_block", &hb::CompileSettings::cuda_smem_per_block)
      .def_readwrite("cutlass_include", &hb::CompileSettings::cutlass_include);
  py::class_<hb::GraphRun, std::shared_ptr<hb::GraphRun>>(m, "GraphRun");
  py::class_<hb::CompiledGraph, hb::GraphRun, std::shared_ptr<hb::CompiledGraph>>(m, "CompiledGraph")
      .def(py::init<const std::string&, std::vector<at::Tensor>, const hb::CompileSettings&>(), py::arg("document"),
           py::arg("constants"), py::arg("settings"))
      .def("run", &hb::CompiledGraph::run, "Runs the graph on a list of inputs (boxed: the list is cleared)")
      .def_property_readonly("unsupported", &hb::CompiledGraph::unsupported)
      .def_property_readonly("dumps", &hb::CompiledGraph::dumps)
      .def_property_readonly("notes", &hb::CompiledGraph::notes)
      .def_property_readonly("warnings", &hb::CompiledGraph::warnings)
      .def_property_readonly("ir", &hb::CompiledGraph::ir)
      .def_property_readonly("unread_inputs", &hb::CompiledGraph::unread_inputs,
                             "The placeholders the compiled graph does not read, by name (the runtime drops them)")
      .def_property_readonly("kernels", &hb::CompiledGraph::kernels, "The kernel chosen for each node and why (text)")
      .def_property_readonly("kernel_workspace_bytes", &hb::CompiledGraph::kernel_workspace_bytes,
                             "The last run's largest workspace one kernel allocated for itself (cuDNN's SDPA), "
                             "slice-loop bodies included; 0 before a run")
      .def_property_readonly("cudnn_workspace_model", &hb::CompiledGraph::cudnn_workspace_model,
                             "cuDNN's workspace as the memory plan models it, per node that runs on cuDNN: "
                             "[(node, bytes)]")
      .def_property_readonly("memory_plan", &hb::CompiledGraph::memory_plan,
                             "The memory plan as data (dict; None when memory-plan is disabled)");
  py::class_<hb::ReplayedGraph, hb::GraphRun, std::shared_ptr<hb::ReplayedGraph>>(m, "ReplayedGraph")
      .def(py::init<std::shared_ptr<hb::GraphRun>, bool, std::optional<std::vector<int64_t>>, py::object>(),
           py::arg("graph"), py::arg("emulate"), py::arg("in_place"), py::arg("note"),
           "graph replayed as a CUDA graph; in_place: the inputs read where they are (None: all), the others "
           "copied into static buffers")
      .def("follow", &hb::ReplayedGraph::follow, py::arg("producer"),
           "This graph (a backward) reads producer's outputs in place: its recordings share the pools of the "
           "producer's recordings they read")
      .def_property_readonly("stats", &hb::ReplayedGraph::stats,
                             "calls, replays (the recording calls included), plain runs, recordings, inputs "
                             "copied per replay, and why it never replays (refused; empty while it may)");
  hb::register_lean_autograd(m);
  m.def("import_graph", [](const std::string& doc) { return hb::print_graph(*hb::import_json(doc)); },
        "Parses and verifies a graph document; returns its IR text");
  m.def("slice_decisions", [](const std::string& doc, const hb::CompileSettings& settings) {
    auto g = hb::import_json(doc);
    hb::PassContext ctx = settings.pass_context();
    std::vector<std::string> upto;
    for (const auto& p : hb::pipeline()) {
      if (!ctx.disabled.count(p.name)) upto.push_back(p.name);
      if (std::string(p.name) == "slice-schedule") break;
    }
    hb::run_passes(*g, upto, ctx);
    return ctx.slice_counts;
  }, py::arg("document"), py::arg("settings"),
     "slice-schedule's slice count per hinted region id of a graph document (1: left whole), as compiling "
     "it would decide");
  m.def("take_failure_site", &hb::rt::take_failure_site,
        "Where the last failed run on this thread raised an error the runtime could not annotate (a Python "
        "kernel's): the node, and the slice loop around it; empty if none. Clears it.");
  m.def("pipeline", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& p : hb::pipeline()) out.emplace_back(p.name, p.why);
    return out;
  }, "The pass pipeline: (name, why it sits there) in order");
}

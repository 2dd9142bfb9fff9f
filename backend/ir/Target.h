// What the machine that will run a graph can do, as the passes need to know it: which results the
// runtime can write into a planned arena, and how much memory a node takes while it runs beyond its
// results (a kernel's workspace). A value handed to the pipeline (PassContext::memory.target), never
// a global: the bindings pass the runtime's (backend/runtime/Placement.h), hb-opt builds one from
// --placement, tests pass theirs explicitly (codegen/TargetModel.h has the plain-C++ ones). The same graph
// and the same target give the same plan, slice counts and dumps everywhere.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "backend/ir/Graph.h"
#include "codegen/HostCompiler.h"

namespace hb {

struct Target {
  std::string name = "all-placeable";  // for the dumps: which model planned this graph
  // Why node's result cannot be written into the arena ("" = it can). Null: every value can.
  std::function<std::string(const Graph& g, int node)> unplaceable;
  // Bytes node allocates and frees while it runs, beyond its results. Null: none.
  std::function<int64_t(const Graph& g, const Node& n)> workspace;
  // The runtime can run FlexAttention on cuDNN's SDPA (a CUDA build with cudnn-frontend): kernel
  // selection may pick it for nodes on CUDA devices.
  bool cudnn_attention = false;
  // The runtime was built with its own CUDA kernels (codegen/cuda/*.cu): kernel selection may pick them
  // for nodes on CUDA devices (LayerNormRows).
  bool cuda_kernels = false;
  // Kernel selection may make views that the graph reads only inside itself without the dispatcher
  // (KernelKind::View, backend/runtime/ViewCall.cpp). False: every view a dispatcher call (a kill switch).
  bool fast_views = true;
  // How generated CPU kernels are built (a host C++ compiler and the kernel cache): kernel selection
  // generates and builds the tiled FlexAttention (kernel="fused") for CPU nodes when it is enabled.
  HostCompileSettings host;
  // How generated CUDA kernels are built (nvcc, the GPU's architecture, CUTLASS's headers): kernel
  // selection generates and builds the tiled CUDA FlexAttention for CUDA nodes when it is enabled.
  CudaCompileSettings cuda;

  std::string why_unplaceable(const Graph& g, int node) const { return unplaceable ? unplaceable(g, node) : ""; }
  int64_t workspace_bytes(const Graph& g, const Node& n) const { return workspace ? workspace(g, n) : 0; }
};

}  // namespace hb

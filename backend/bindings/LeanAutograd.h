// The lean runtime's autograd node in C++ (python/hintbackend/lean_runtime.py decides where it runs): one
// call runs a plain training graph's compiled forward and records a node whose backward runs the compiled
// backward, with no Python on either side.
#pragma once

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace hb {

// What the lean autograd node needs of a compiled graph (Module.cpp's CompiledGraph, or the same replayed
// as a CUDA graph: ReplayedGraph): run it on values from C++, without Python.
class GraphRun {
 public:
  virtual ~GraphRun() = default;
  virtual std::vector<c10::IValue> run_values(std::vector<c10::IValue> inputs) = 0;
};

// hintbackend._C.LeanFunction and the node type's Python name (LeanBackward).
void register_lean_autograd(pybind11::module_& m);

}  // namespace hb

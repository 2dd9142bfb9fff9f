// The lean runtime's autograd node in C++ (python/hintbackend/lean_runtime.py decides where it runs): one
// call runs a plain training graph's compiled forward and records a node whose backward runs the compiled
// backward, with no Python on either side.
#pragma once

#include <pybind11/pybind11.h>

namespace hb {

// hintbackend._C.LeanFunction and the node type's Python name (LeanBackward).
void register_lean_autograd(pybind11::module_& m);

}  // namespace hb

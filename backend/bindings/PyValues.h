// Graph inputs and outputs between Python objects and IValues: what the bindings' run calls and the lean
// autograd node's forward take and give (tensors, None, bools, ints, floats; tuples and lists out).
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

#include "backend/ir/Error.h"

namespace hb {

inline c10::IValue to_ivalue(PyObject* o, size_t k) {
  if (THPVariable_Check(o)) return c10::IValue(THPVariable_Unpack(o));
  if (o == Py_None) return c10::IValue();
  if (PyBool_Check(o)) return c10::IValue(o == Py_True);
  if (PyLong_Check(o)) return c10::IValue(static_cast<int64_t>(PyLong_AsLongLong(o)));
  if (PyFloat_Check(o)) return c10::IValue(PyFloat_AsDouble(o));
  // SymInt/SymFloat arrive as plain ints/floats at run time; anything else is a contract breach.
  throw UserError("hintbackend: graph input " + std::to_string(k) + " has unsupported type " +
                  std::string(Py_TYPE(o)->tp_name) + " (expected a tensor, int, float, bool or None)");
}

inline pybind11::object to_py(const c10::IValue& v) {
  namespace py = pybind11;
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    py::tuple t(e.size());
    for (size_t i = 0; i < e.size(); ++i) t[i] = to_py(e[i]);
    return std::move(t);
  }
  if (v.isList()) {
    py::list l;
    for (const c10::IValue& x : v.toListRef()) l.append(to_py(x));
    return std::move(l);
  }
  throw InternalError("hintbackend: cannot return a value of kind " + std::string(v.tagKind()) + " to Python");
}

}  // namespace hb

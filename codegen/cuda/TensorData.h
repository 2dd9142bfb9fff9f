// Typed data pointers of tensors for kernel launches, null for an undefined tensor (an optional
// operand): the host side of the row kernels (RowSoftmax.cu, LayerNorm.cu).
#pragma once
#include <ATen/core/Tensor.h>

namespace hb::cuda {

template <typename T>
inline const T* ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<const T*>(t.const_data_ptr()) : nullptr;
}

template <typename T>
inline T* mut_ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.mutable_data_ptr()) : nullptr;
}

}  // namespace hb::cuda

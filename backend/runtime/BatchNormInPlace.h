// hintbackend::batch_norm_in_place, the op passes/WriteInputsInPlace.h rewrites training BatchNorm's
// functional form into where the caller writes the new running statistics back into its inputs,
// registered with the dispatcher (namespace `hintbackend`, CPU and CUDA):
//
//   batch_norm_in_place(input, weight?, bias?, running_mean, running_var, momentum, eps)
//       -> (output, save_mean, save_invstd, running_mean', running_var')
//
// It is aten::_native_batch_norm_legit_functional(input, ..., training=True, momentum, eps) without the
// two clones: ATen's native_batch_norm (the kernel the functional form runs on its clones, so the same
// bits) updates running_mean and running_var in place, as eager's nn.BatchNorm does, and elements 3 and
// 4 are those tensors' data: new tensors over the same storage with version counters of their own
// (Tensor::variable_data). So the caller's write-back copy finds its input already holds the value (the
// lean runtime skips it, ATen's copy_ returns at once), and a forward output saved for the backward
// keeps a version the write-back's copy_ (AOTAutograd's runtime) cannot change. As with eager's module,
// the statistics' own version counters do not move.
#pragma once

namespace hb::rt {

// Called by the executor so the static registration of the op is linked in (see RowSoftmax.h).
void link_batch_norm_in_place_ops();

}  // namespace hb::rt

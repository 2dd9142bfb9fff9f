// A relative-position bias table read along diagonals (FlexBiasLayout::Kind::Toeplitz in
// codegen/FlexLowering.h): t[h, i, j] = buf[sign * (i - j) + offset, h]. cuDNN's SDPA takes t as a bias
// tensor; these kernels build that tensor and send cuDNN's dBias back into the table, in place of the
// generic grid evaluation (a gather of int64 index grids) and the joint graph's index_put_ scatter
// (a sort of B*H*Sq*Skv indices), which cost 10x the attention itself at S = 4096.
//
// The table is addressed through element strides: row r = sign * (i - j) + offset, head h at
// r * stride_d + h * stride_h (stride_h = 0: one row for every head). The caller checks that every
// r of the Sq x Skv grid is inside the table. With h_map, head h reads table column h_map[h *
// h_map_stride] (int64 or int32; a DFS slice's global head), negative values wrapped as an index
// wraps them; one outside [-h_bound, h_bound) is a device-side assert, as eager's out-of-range index.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hb::cuda {

struct ToeplitzIndex {
  int sign = 1;
  int64_t offset = 0;
  int64_t stride_d = 0, stride_h = 0;
  const void* h_map = nullptr;  // nullptr: head h reads column h
  bool h_map_int64 = true;
  int64_t h_map_stride = 1;
  int64_t h_bound = 0;          // the table's column count (h_map's range)
};

// out: [1, H, Sq, Skv] contiguous, on buf's device, float32 or buf's dtype; buf: float32, bfloat16 or
// float16.
void toeplitz_bias(const at::Tensor& buf, const ToeplitzIndex& ix, const at::Tensor& out);

// grad: float32 with the table's element strides, zeroed by the caller; dbias: [1, H, Sq, Skv]
// contiguous, float32, bfloat16 or float16. grad[r(i, j), h] += sum of dbias[0, h, i, j] over the
// diagonal: each 64 x 64 tile sums its 127 diagonals in shared memory, then one atomic add each
// (heads mapped to one column add up).
// `deterministic` (hinted_context(deterministic=True)): no atomics, the same bits every run: each tile
// writes its 127 diagonal sums to a partials buffer (H * tiles * 127 floats, 33 MB at H16 S4096), and
// one thread per diagonal sums them in tile order.
void toeplitz_bias_backward(const at::Tensor& dbias, const ToeplitzIndex& ix, const at::Tensor& grad,
                            bool deterministic = false);

}  // namespace hb::cuda

#pragma once
// Average pooling of our own, for what cuDNN's pooling cannot say (cudnn_pool.hpp refuses them):
// `divisor_override`, a `ceil_mode` that changes the output size, 3-d windows. The reference's
// (PyTorch's) rules exactly: the window of output o along a dimension starts at o * stride - pad,
// its taps inside the input are summed in float32 in scan order (d, then h, then w), and the sum
// is divided by divisor_override when given, else by the window clipped to the input plus its
// padding (count_include_pad) or to the input alone. The backward gathers: one thread per input
// element adds, in increasing output order, dy / divisor of every window holding it (the
// reference's scatter order), so no atomics and bitwise repeatable results.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treadle::cuda {

// (planes, D, H, W) volumes, 1-d and 2-d pools with leading unit dimensions (kernel 1, stride 1,
// pad 0 there).
struct AvgPoolGeometry {
  int64_t planes = 0;  // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
  bool include_pad = true;
  int64_t divisor_override = 0;  // 0: none
};

// y (planes, out) from x (planes, in).
void avg_pool_forward(const float* x, float* y, const AvgPoolGeometry& g, cudaStream_t stream);
// dx (planes, in) from dy (planes, out).
void avg_pool_backward(const float* dy, float* dx, const AvgPoolGeometry& g, cudaStream_t stream);

}  // namespace treadle::cuda

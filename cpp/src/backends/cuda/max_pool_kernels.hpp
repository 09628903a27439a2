#pragma once
// Max pooling with the core's int64 argmax indices: the max_pool op's second output and the input
// of its max_pool_backward. cuDNN's max pooling (cudnn_pool.hpp) produces no indices, so these are
// kernels of our own; without cuDNN's limits they also take dilation and ceil_mode. Semantics of
// the core's (and PyTorch's) reference: each output is the first maximum of its window in scan
// order, a NaN wins over any number (the last NaN of a window, as the reference's running rule
// gives), the index is the flat position h * W + w within the (n, c) plane ((d * H + h) * W + w for
// a 3-d pool, whose depth parts default to a unit depth); the backward adds each
// dy to dx at its index. The backward gathers instead of scattering: one thread per input element
// sums, in increasing output order, the dy of the windows whose index points at it: no atomics, and
// the same summation order as the reference.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cudnn_pool.hpp"

namespace treadle::cuda {

struct MaxPoolGeometry {
  int64_t planes = 0;  // N * C
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1,
          dilation_w = 1;
  // A 3-d pool's depth: the scan runs d, then h, then w, as the reference's.
  int64_t in_d = 1, out_d = 1, kernel_d = 1, stride_d = 1, pad_d = 0, dilation_d = 1;
};

// The geometry of a max-pooling configuration (mode must be max; divisor_override 0), with the
// core's checks: padding at most half the kernel, output sizes (floor or ceil mode, dilation) >= 1.
// ValueError naming "max_pool2d_indices" otherwise.
MaxPoolGeometry max_pool_geometry(const Pool2dConfig& config);

// y (planes, out_d, out_h, out_w) and indices (same shape, int64) from x (planes, in_d, in_h, in_w).
void max_pool2d_with_indices(const float* x, float* y, int64_t* indices, const MaxPoolGeometry& g,
                             cudaStream_t stream);
// dx (planes, in_d, in_h, in_w) = the sum of dy over the outputs whose index is that position.
void max_pool2d_backward_indices(const float* dy, const int64_t* indices, float* dx, const MaxPoolGeometry& g,
                                 cudaStream_t stream);

}  // namespace treadle::cuda

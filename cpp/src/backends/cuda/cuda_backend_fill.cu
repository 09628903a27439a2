// The one kernel the core's plans need beyond the kernel layer: `constant` (a loss's seed 1.0, the
// ones of a broadcast gradient) as a fill of float32 values on the plan's stream.
#include "backends/cuda/cuda_backend_fill.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"

namespace treadle::cuda {
namespace {

__global__ void fill_kernel(float* y, float value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = value;
}

}  // namespace

void fill(float* y, float value, int64_t n, cudaStream_t stream) {
  if (n < 0) throw_value_error("fill: negative element count ", n);
  if (n == 0) return;
  if (y == nullptr) throw_value_error("fill: null device pointer for ", n, " elements");
  fill_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(y, value, n);
  check_launch("fill_kernel");
}

}  // namespace treadle::cuda

// Kernels of the core's plans that the kernel layer lacks: `constant` as a fill, and the running
// statistics update of batch norm (cuDNN's own update cannot read the cumulative-average count,
// which lives on the device as a parameter).
#include "backends/cuda/cuda_backend_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"

namespace treadle::cuda {
namespace {

__global__ void fill_kernel(float* y, float value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = value;
}

// One block: every thread reads the old count before thread 0 writes the new one.
__global__ void update_stats_kernel(const float* mean, const float* rstd, float* rm, float* rv, float* tracked,
                                    int64_t channels, double eps, double momentum, double count) {
  const double batches = static_cast<double>(tracked[0]) + 1.0;
  __syncthreads();
  if (threadIdx.x == 0) tracked[0] = static_cast<float>(batches);
  const double f = momentum < 0 ? 1.0 / batches : momentum;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const double rs = rstd[c];
    const double var = fmax(0.0, 1.0 / (rs * rs) - eps);
    rm[c] = static_cast<float>((1.0 - f) * rm[c] + f * mean[c]);
    rv[c] = static_cast<float>((1.0 - f) * rv[c] + f * var * count / (count - 1.0));
  }
}

}  // namespace

void fill(float* y, float value, int64_t n, cudaStream_t stream) {
  if (n < 0) throw_value_error("fill: negative element count ", n);
  if (n == 0) return;
  if (y == nullptr) throw_value_error("fill: null device pointer for ", n, " elements");
  fill_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(y, value, n);
  check_launch("fill_kernel");
}

void batch_norm_update_stats(const float* mean, const float* rstd, float* running_mean, float* running_var,
                             float* num_batches_tracked, int64_t channels, double eps, double momentum, int64_t count,
                             cudaStream_t stream) {
  if (channels < 1 || count < 2)
    throw_value_error("batch_norm_update_stats: expected channels >= 1 and count >= 2, got ", channels, " and ", count);
  if (!mean || !rstd || !running_mean || !running_var || !num_batches_tracked)
    throw_value_error("batch_norm_update_stats: null device pointer");
  update_stats_kernel<<<1, kElementThreads, 0, stream>>>(mean, rstd, running_mean, running_var, num_batches_tracked,
                                                         channels, eps, momentum, static_cast<double>(count));
  check_launch("update_stats_kernel");
}

}  // namespace treadle::cuda

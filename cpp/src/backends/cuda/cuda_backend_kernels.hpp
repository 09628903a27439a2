#pragma once
// The kernels the core's plans need beyond the kernel layer (cuda_backend_kernels.cu). Part of the
// kernel layer themselves (no core header), used by the backend's adapters.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treadle::cuda {

// y[0, n) = value on `stream`: the core's `constant` op.
void fill(float* y, float value, int64_t n, cudaStream_t stream);

// The core's batch_norm_update_stats on the device, its reference's arithmetic (in double): the
// count of batches goes up by one, f = momentum, or 1 / batches for the cumulative average
// (momentum < 0); running_mean = (1 - f) running_mean + f mean and running_var = (1 - f) running_var
// + f var * count / (count - 1), the biased variance recovered from rstd = 1 / sqrt(var + eps)
// (clamped at 0). `num_batches_tracked` is the float32 counter parameter; count >= 2 values per channel.
void batch_norm_update_stats(const float* mean, const float* rstd, float* running_mean, float* running_var,
                             float* num_batches_tracked, int64_t channels, double eps, double momentum, int64_t count,
                             cudaStream_t stream);

}  // namespace treadle::cuda

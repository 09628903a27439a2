#pragma once
// y[0, n) = value on `stream`: the core's `constant` op on the device (cuda_backend_fill.cu). Part of
// the kernel layer (no core header needed), used by the backend's adapters.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treadle::cuda {

void fill(float* y, float value, int64_t n, cudaStream_t stream);

}  // namespace treadle::cuda

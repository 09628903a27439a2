#pragma once
// The offset of element `index` of a row-major iteration space (dims) in a tensor that walks it with
// `strides`: the index is split into coordinates from the last dimension on. Shared by the
// broadcast and sum_to kernels, and callable from host code (checks of the layouts).
#include <cuda_runtime.h>

#include <cstdint>

namespace treadle::cuda {

__host__ __device__ __forceinline__ int64_t strided_offset(int64_t index, int ndim, const int64_t* dims,
                                                            const int64_t* strides) {
  int64_t offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    offset += (index % dims[d]) * strides[d];
    index /= dims[d];
  }
  return offset;
}

}  // namespace treadle::cuda

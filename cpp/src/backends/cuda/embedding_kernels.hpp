#pragma once
// The core's embedding op on the device: a row gather, and its weight gradient without float
// atomics. cuda_kernels.hpp conventions: device pointers, host-side validation (ValueError), the
// stream explicit, no allocation (scratch sized by embedding_backward_layout).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// y (n, dim) = weight (num, dim)[indices], int64 or int32 indices. An index outside [0, num) cannot
// raise on the device: its output row is NaN (the host checks indices it has).
void embedding_forward(const float* weight, const void* indices, bool indices_int64, float* y, int64_t n,
                       int64_t num, int64_t dim, cudaStream_t stream);

// The gradient's scratch: the positions 0..n-1 stably sorted by index (a radix sort: integer keys,
// deterministic), then each weight row sums its run of dy rows in position order, exactly the
// reference's float32 summation. Offsets into the workspace, each part 256-byte aligned.
struct EmbeddingGradLayout {
  int64_t n = 0;
  bool indices_int64 = true;
  std::size_t keys = 0, positions_in = 0, positions_out = 0, sort_scratch = 0;  // offsets
  std::size_t sort_scratch_bytes = 0, total = 0;
};
// n <= 2^31 - 1 (ValueError otherwise). Asks CUB for the sort's scratch size, which reads the current
// device's properties (no device work is queued).
EmbeddingGradLayout embedding_backward_layout(int64_t n, bool indices_int64);

// dweight (num, dim): row r = the sum, in position order, of dy's rows whose index is r; zero for
// the padding row (padding < 0: none) and for rows no index names. Out-of-range indices add nowhere.
void embedding_backward(const float* dy, const void* indices, float* dweight, int64_t num, int64_t dim,
                        int64_t padding, const EmbeddingGradLayout& layout, void* workspace, cudaStream_t stream);

}  // namespace treadle::cuda

// Sequence kernels around cuDNN's RNN calls (cuda_kernels.hpp): a reversed layer runs cuDNN's forward
// direction on each sequence reversed within its own length, and variable-length layers need the
// positions past each length zeroed and the core's int64 lengths as cuDNN's int32.
#include <climits>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Where the (t, n) row of a (T, N, W) or batch-first (N, T, W) sequence starts.
struct SeqLayout {
  int64_t T, N, W;
  bool batch_first;
  __device__ int64_t row(int64_t t, int64_t n) const { return batch_first ? n * T + t : t * N + n; }
};

// The length of sequence n clamped to [0, T]: the host validated the lengths before any launch
// that reads them, and the clamp keeps a stray value from indexing outside the tensor.
__device__ int64_t length_of(const int32_t* lengths, int64_t n, int64_t T) {
  if (lengths == nullptr) return T;
  const int64_t v = lengths[n];
  return v < 0 ? 0 : (v > T ? T : v);
}

// One thread per element of dst; element i is (row, w) with row the flat (t, n) position of dst.
__global__ void sequence_copy_kernel(const float* __restrict__ src, float* __restrict__ dst, SeqLayout s,
                                     const int32_t* lengths, bool reverse) {
  const int64_t total = s.T * s.N * s.W;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t w = i % s.W, r = i / s.W;
    const int64_t t = s.batch_first ? r % s.T : r / s.N;
    const int64_t n = s.batch_first ? r / s.T : r % s.N;
    const int64_t len = length_of(lengths, n, s.T);
    if (t >= len) {
      dst[i] = 0.0f;
      continue;
    }
    const int64_t from = reverse ? len - 1 - t : t;
    dst[i] = src[s.row(from, n) * s.W + w];
  }
}

__global__ void zero_padding_kernel(float* data, SeqLayout s, const int32_t* lengths) {
  const int64_t total = s.T * s.N * s.W;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / s.W;
    const int64_t t = s.batch_first ? r % s.T : r / s.N;
    const int64_t n = s.batch_first ? r / s.T : r % s.N;
    if (t >= length_of(lengths, n, s.T)) data[i] = 0.0f;
  }
}

// Saturating: a value outside int32 stays outside [1, T] after the conversion.
__global__ void lengths_to_int32_kernel(const int64_t* src, int32_t* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t v = src[i];
    dst[i] = static_cast<int32_t>(v > INT_MAX ? INT_MAX : (v < INT_MIN ? INT_MIN : v));
  }
}

void check_sequence(const char* who, int64_t T, int64_t N, int64_t W) {
  if (T < 1 || N < 1 || W < 1) throw_value_error(who, ": expected T, N, W >= 1, got (", T, ", ", N, ", ", W, ")");
}

}  // namespace

void sequence_copy(const float* src, float* dst, int64_t T, int64_t N, int64_t W, const int32_t* lengths,
                   bool batch_first, bool reverse, cudaStream_t stream) {
  constexpr const char* who = "sequence_copy";
  check_sequence(who, T, N, W);
  if (src == nullptr || dst == nullptr) throw_value_error(who, ": null device pointer");
  if (src == dst) throw_value_error(who, ": src and dst must not overlap (got the same pointer)");
  sequence_copy_kernel<<<element_blocks(T * N * W), kElementThreads, 0, stream>>>(src, dst, {T, N, W, batch_first},
                                                                                 lengths, reverse);
  check_launch("sequence_copy_kernel");
}

void sequence_zero_padding(float* data, int64_t T, int64_t N, int64_t W, const int32_t* lengths, bool batch_first,
                           cudaStream_t stream) {
  constexpr const char* who = "sequence_zero_padding";
  check_sequence(who, T, N, W);
  if (data == nullptr || lengths == nullptr) throw_value_error(who, ": null device pointer");
  zero_padding_kernel<<<element_blocks(T * N * W), kElementThreads, 0, stream>>>(data, {T, N, W, batch_first},
                                                                                lengths);
  check_launch("zero_padding_kernel");
}

void lengths_to_int32(const int64_t* src, int32_t* dst, int64_t n, cudaStream_t stream) {
  if (n < 1) throw_value_error("lengths_to_int32: expected n >= 1, got ", n);
  if (src == nullptr || dst == nullptr) throw_value_error("lengths_to_int32: null device pointer");
  lengths_to_int32_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(src, dst, n);
  check_launch("lengths_to_int32_kernel");
}

}  // namespace treadle::cuda

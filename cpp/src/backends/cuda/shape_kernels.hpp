#pragma once
// Data-movement kernels of the core's shape and attention ops (slice, slice_backward, concat,
// permute, causal_mask). The copies move elements of 1, 2, 4 or 8 bytes, so they serve
// every dtype. Same conventions as cuda_kernels.hpp: device pointers, host-side validation
// (ValueError), the stream explicit, no allocation, no atomics.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// A tensor seen as (outer, axis, inner) around the sliced or concatenated axis: rows of
// axis * inner contiguous elements.
// slice: y (outer, count, inner) = x (outer, axis, inner)[:, start:start + count, :].
void slice_copy(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t count,
                std::size_t element_bytes, cudaStream_t stream);
// slice_backward: dx (outer, axis, inner) = zeros with dx[:, start:start + count, :] = dy.
void slice_backward_copy(const void* dy, void* dx, int64_t outer, int64_t axis, int64_t inner, int64_t start,
                         int64_t count, std::size_t element_bytes, cudaStream_t stream);
// One input of a concat: y (outer, out_axis, inner)[:, offset:offset + axis, :] = x (outer, axis, inner).
void concat_part(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, int64_t out_axis, int64_t offset,
                 std::size_t element_bytes, cudaStream_t stream);

// permute: y[i_0, ..., i_{d-1}] = x at the input position whose dimension dims[k] is i_k. Up to
// kMaxPermuteDims dimensions; `out_dims` are y's sizes, `in_strides` x's element strides taken in
// y's dimension order (in_strides[k] = stride of x's dimension dims[k]).
constexpr int kMaxPermuteDims = 8;
struct PermuteShape {
  int ndim = 0;
  int64_t out_dims[kMaxPermuteDims] = {};
  int64_t in_strides[kMaxPermuteDims] = {};
};
void permute_copy(const void* x, void* y, const PermuteShape& shape, int64_t numel, std::size_t element_bytes,
                  cudaStream_t stream);

// causal_mask: y (rows, cols) = -inf above the diagonal (j > i), 0 elsewhere.
void causal_mask_fill(float* y, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace treadle::cuda

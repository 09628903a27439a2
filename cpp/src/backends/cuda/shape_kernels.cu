// Copy kernels of the shape ops: one thread per output element (grid-stride, 64-bit
// indices), each element read from where the reference's copy takes it. Elements move as unsigned
// integers of their size, so every dtype (float or integer) shares one kernel per size.
#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/shape_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

__device__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <typename E>
__global__ void slice_k(const E* __restrict__ x, E* __restrict__ y, int64_t total, int64_t in_row, int64_t out_row,
                        int64_t head) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / out_row, j = i % out_row;
    y[i] = x[r * in_row + head + j];
  }
}

// y's row of out_row elements: zeros, then dy's row of in_row elements from `head`, then zeros.
template <typename E>
__global__ void slice_backward_k(const E* __restrict__ dy, E* __restrict__ dx, int64_t total, int64_t in_row,
                                 int64_t out_row, int64_t head) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / out_row, j = i % out_row - head;
    dx[i] = (j >= 0 && j < in_row) ? dy[r * in_row + j] : E(0);
  }
}

// One input's rows (in_row elements each) into the output rows (out_row) from `head`.
template <typename E>
__global__ void concat_k(const E* __restrict__ x, E* __restrict__ y, int64_t total, int64_t in_row, int64_t out_row,
                         int64_t head) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / in_row, j = i % in_row;
    y[r * out_row + head + j] = x[i];
  }
}

template <typename E>
__global__ void permute_k(const E* __restrict__ x, E* __restrict__ y, PermuteShape s, int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t rem = i, src = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
      src += (rem % s.out_dims[d]) * s.in_strides[d];
      rem /= s.out_dims[d];
    }
    y[i] = x[src];
  }
}

__global__ void causal_mask_k(float* __restrict__ y, int64_t rows, int64_t cols) {
  for (int64_t i = first_index(); i < rows * cols; i += grid_stride())
    y[i] = (i % cols) > (i / cols) ? -INFINITY : 0.0f;
}

// Runs launch(E{}) with E the unsigned type of `bytes`.
template <typename F>
void by_element_size(const char* fn, std::size_t bytes, F&& launch) {
  switch (bytes) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    default: throw_value_error(fn, ": element size must be 1, 2, 4 or 8 bytes, got ", bytes);
  }
}

void check_axes(const char* fn, int64_t outer, int64_t axis, int64_t inner) {
  if (outer < 0 || axis < 0 || inner < 0)
    throw_value_error(fn, ": expected non-negative (outer, axis, inner), got (", outer, ", ", axis, ", ", inner, ")");
}

void check_pointers(const char* fn, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, ": null device pointer");
}

}  // namespace

void slice_copy(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t count,
                std::size_t element_bytes, cudaStream_t stream) {
  check_axes("slice_copy", outer, axis, inner);
  if (start < 0 || count < 0 || start + count > axis)
    throw_value_error("slice_copy: range [", start, ", ", start + count, ") outside an axis of ", axis);
  const int64_t total = outer * count * inner;
  if (total == 0) return;
  check_pointers("slice_copy", {x, y});
  by_element_size("slice_copy", element_bytes, [&](auto e) {
    using E = decltype(e);
    slice_k<<<element_blocks(total), kElementThreads, 0, stream>>>(static_cast<const E*>(x), static_cast<E*>(y), total,
                                                                   axis * inner, count * inner, start * inner);
  });
  check_launch("slice_copy");
}

void slice_backward_copy(const void* dy, void* dx, int64_t outer, int64_t axis, int64_t inner, int64_t start,
                         int64_t count, std::size_t element_bytes, cudaStream_t stream) {
  check_axes("slice_backward_copy", outer, axis, inner);
  if (start < 0 || count < 0 || start + count > axis)
    throw_value_error("slice_backward_copy: range [", start, ", ", start + count, ") outside an axis of ", axis);
  const int64_t total = outer * axis * inner;
  if (total == 0) return;
  check_pointers("slice_backward_copy", {dx});
  if (count > 0) check_pointers("slice_backward_copy", {dy});
  by_element_size("slice_backward_copy", element_bytes, [&](auto e) {
    using E = decltype(e);
    slice_backward_k<<<element_blocks(total), kElementThreads, 0, stream>>>(
        static_cast<const E*>(dy), static_cast<E*>(dx), total, count * inner, axis * inner, start * inner);
  });
  check_launch("slice_backward_copy");
}

void concat_part(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, int64_t out_axis, int64_t offset,
                 std::size_t element_bytes, cudaStream_t stream) {
  check_axes("concat_part", outer, axis, inner);
  if (offset < 0 || offset + axis > out_axis)
    throw_value_error("concat_part: part [", offset, ", ", offset + axis, ") outside an output axis of ", out_axis);
  const int64_t total = outer * axis * inner;
  if (total == 0) return;
  check_pointers("concat_part", {x, y});
  by_element_size("concat_part", element_bytes, [&](auto e) {
    using E = decltype(e);
    concat_k<<<element_blocks(total), kElementThreads, 0, stream>>>(static_cast<const E*>(x), static_cast<E*>(y), total,
                                                                    axis * inner, out_axis * inner, offset * inner);
  });
  check_launch("concat_part");
}

void permute_copy(const void* x, void* y, const PermuteShape& shape, int64_t numel, std::size_t element_bytes,
                  cudaStream_t stream) {
  if (shape.ndim < 0 || shape.ndim > kMaxPermuteDims)
    throw_value_error("permute_copy: ", shape.ndim, " dimensions, at most ", kMaxPermuteDims, " supported");
  if (numel <= 0) return;
  check_pointers("permute_copy", {x, y});
  by_element_size("permute_copy", element_bytes, [&](auto e) {
    using E = decltype(e);
    permute_k<<<element_blocks(numel), kElementThreads, 0, stream>>>(static_cast<const E*>(x), static_cast<E*>(y),
                                                                     shape, numel);
  });
  check_launch("permute_copy");
}

void causal_mask_fill(float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw_value_error("causal_mask_fill: negative size (", rows, ", ", cols, ")");
  if (rows * cols == 0) return;
  check_pointers("causal_mask_fill", {y});
  causal_mask_k<<<element_blocks(rows * cols), kElementThreads, 0, stream>>>(y, rows, cols);
  check_launch("causal_mask_fill");
}

}  // namespace treadle::cuda

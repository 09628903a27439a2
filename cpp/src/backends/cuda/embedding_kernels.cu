// Embedding forward (a row gather) and weight gradient. The gradient sorts the positions by index
// with CUB's radix sort (stable, integer keys: the same order on every run), so each weight row
// finds its run of positions by binary search and one block adds the run's dy rows in position
// order: the reference's scatter-add order, without atomics, in O(n log n + (num + n) * dim).
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/embedding_kernels.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

template <typename I>
__global__ void embedding_k(const float* __restrict__ w, const I* __restrict__ idx, float* __restrict__ y,
                            int64_t n, int64_t num, int64_t dim) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * dim; i += stride) {
    const auto row = static_cast<int64_t>(idx[i / dim]);
    y[i] = (row >= 0 && row < num) ? w[row * dim + i % dim] : NAN;
  }
}

__global__ void iota_k(int32_t* __restrict__ p, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = static_cast<int32_t>(i);
}

// First position k in the sorted keys with keys[k] >= v (strict: > v).
template <typename I>
__device__ int64_t lower_bound(const I* keys, int64_t n, int64_t v, bool strict) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const auto k = static_cast<int64_t>(keys[mid]);
    if (strict ? k <= v : k < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// One block per weight row: its run [lo, hi) of the sorted keys, summed column by column.
template <typename I>
__global__ void embedding_grad_rows(const float* __restrict__ dy, const I* __restrict__ keys,
                                    const int32_t* __restrict__ positions, float* __restrict__ dw, int64_t n,
                                    int64_t num, int64_t dim, int64_t padding) {
  __shared__ int64_t run[2];
  for (int64_t r = blockIdx.x; r < num; r += gridDim.x) {
    __syncthreads();  // the previous row's readers are done with `run`
    if (threadIdx.x == 0) {
      run[0] = r == padding ? 0 : lower_bound(keys, n, r, false);
      run[1] = r == padding ? 0 : lower_bound(keys, n, r, true);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t k = run[0]; k < run[1]; ++k) acc += dy[static_cast<int64_t>(positions[k]) * dim + c];
      dw[r * dim + c] = acc;
    }
  }
}

template <typename I>
std::size_t sort_scratch_bytes(int n) {
  std::size_t bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const I*>(nullptr), static_cast<I*>(nullptr),
                                             static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n),
             "embedding_backward: cub::DeviceRadixSort::SortPairs (scratch size)");
  return bytes;
}

template <typename I>
void sort_and_sum(const float* dy, const I* indices, float* dweight, int64_t num, int64_t dim, int64_t padding,
                  const EmbeddingGradLayout& l, char* ws, cudaStream_t stream) {
  auto* keys = reinterpret_cast<I*>(ws + l.keys);
  auto* pos_in = reinterpret_cast<int32_t*>(ws + l.positions_in);
  auto* pos_out = reinterpret_cast<int32_t*>(ws + l.positions_out);
  if (l.n > 0) {
    iota_k<<<element_blocks(l.n), kElementThreads, 0, stream>>>(pos_in, l.n);
    check_launch("embedding_backward: positions");
    std::size_t scratch = l.sort_scratch_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(ws + l.sort_scratch, scratch, indices, keys, pos_in, pos_out,
                                               static_cast<int>(l.n), 0, static_cast<int>(sizeof(I) * 8), stream),
               "embedding_backward: cub::DeviceRadixSort::SortPairs");
  }
  embedding_grad_rows<<<row_blocks(num), reduction_threads(dim), 0, stream>>>(dy, keys, pos_out, dweight, l.n, num,
                                                                              dim, padding);
  check_launch("embedding_backward");
}

}  // namespace

void embedding_forward(const float* weight, const void* indices, bool indices_int64, float* y, int64_t n,
                       int64_t num, int64_t dim, cudaStream_t stream) {
  if (n < 0 || num < 1 || dim < 0)
    throw_value_error("embedding_forward: expected n >= 0, num >= 1, dim >= 0, got (", n, ", ", num, ", ", dim, ")");
  if (n * dim == 0) return;
  if (weight == nullptr || indices == nullptr || y == nullptr)
    throw_value_error("embedding_forward: null device pointer");
  if (indices_int64)
    embedding_k<<<element_blocks(n * dim), kElementThreads, 0, stream>>>(
        weight, static_cast<const int64_t*>(indices), y, n, num, dim);
  else
    embedding_k<<<element_blocks(n * dim), kElementThreads, 0, stream>>>(
        weight, static_cast<const int32_t*>(indices), y, n, num, dim);
  check_launch("embedding_forward");
}

EmbeddingGradLayout embedding_backward_layout(int64_t n, bool indices_int64) {
  if (n < 0 || n > INT_MAX)
    throw_value_error("embedding_backward: ", n, " indices; the device gradient sorts at most ", INT_MAX);
  EmbeddingGradLayout l;
  l.n = n;
  l.indices_int64 = indices_int64;
  const auto count = static_cast<std::size_t>(n);
  if (n > 0)
    l.sort_scratch_bytes = indices_int64 ? sort_scratch_bytes<int64_t>(static_cast<int>(n))
                                         : sort_scratch_bytes<int32_t>(static_cast<int>(n));
  l.keys = 0;
  l.positions_in = align256(count * (indices_int64 ? 8 : 4));
  l.positions_out = l.positions_in + align256(count * 4);
  l.sort_scratch = l.positions_out + align256(count * 4);
  l.total = l.sort_scratch + align256(l.sort_scratch_bytes);
  return l;
}

void embedding_backward(const float* dy, const void* indices, float* dweight, int64_t num, int64_t dim,
                        int64_t padding, const EmbeddingGradLayout& layout, void* workspace, cudaStream_t stream) {
  if (num < 1 || dim < 0)
    throw_value_error("embedding_backward: expected num >= 1, dim >= 0, got (", num, ", ", dim, ")");
  if (dim == 0) return;
  if (dweight == nullptr) throw_value_error("embedding_backward: null device pointer for the weight gradient");
  if (layout.n > 0 && (dy == nullptr || indices == nullptr || workspace == nullptr))
    throw_value_error("embedding_backward: null device pointer (dy, indices or a workspace of ", layout.total,
                      " bytes) for ", layout.n, " indices");
  auto* ws = static_cast<char*>(workspace);
  if (layout.indices_int64)
    sort_and_sum(dy, static_cast<const int64_t*>(indices), dweight, num, dim, padding, layout, ws, stream);
  else
    sort_and_sum(dy, static_cast<const int32_t*>(indices), dweight, num, dim, padding, layout, ws, stream);
}

}  // namespace treadle::cuda

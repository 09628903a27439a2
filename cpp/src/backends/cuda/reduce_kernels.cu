// Column sums of a row-major (rows, cols) matrix: the bias gradient of linear. Deterministic two-pass
// scheme: blocks of 32 columns x 8 row lanes each sum one chunk of rows into a partial row of the
// workspace, then one pass adds the partials of each column in chunk order. The chunking depends
// only on the shape.
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinChunkRows = 512;

int64_t chunk_count(int64_t rows) {
  const int64_t chunks = (rows + kMinChunkRows - 1) / kMinChunkRows;
  return chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks);
}

// Block (32, 8): column c = tile * 32 + tx; rows of chunk blockIdx.y, lane ty takes every 8th row.
__global__ void partial_column_sums(const float* __restrict__ x, float* __restrict__ partial, int64_t rows,
                                    int64_t cols, int64_t chunk_rows) {
  __shared__ float tile[kRowLanes][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) s += x[r * cols + c];
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) t += tile[i][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + c] = t;
  }
}

__global__ void sum_partials(const float* __restrict__ partial, float* __restrict__ out, int64_t chunks,
                             int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += stride) {
    float t = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) t += partial[k * cols + c];
    out[c] = t;
  }
}

}  // namespace

std::size_t column_sum_workspace_bytes(int64_t rows, int64_t cols) {
  const int64_t chunks = chunk_count(rows);
  return chunks > 1 ? static_cast<std::size_t>(chunks * cols) * sizeof(float) : 0;
}

void column_sum(const float* x, float* out, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw_value_error("column_sum: negative shape (", rows, ", ", cols, ")");
  if (cols == 0) return;
  if (out == nullptr || (rows > 0 && x == nullptr))
    throw_value_error("column_sum: null device pointer for shape (", rows, ", ", cols, ")");
  if (rows == 0) {
    check_cuda(cudaMemsetAsync(out, 0, static_cast<std::size_t>(cols) * sizeof(float), stream),
               "column_sum: cudaMemsetAsync");
    return;
  }
  const int64_t chunks = chunk_count(rows);
  if (chunks > 1 && workspace == nullptr)
    throw_value_error("column_sum: shape (", rows, ", ", cols, ") needs a workspace of ",
                      column_sum_workspace_bytes(rows, cols), " bytes, got null");
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kRowLanes);
  float* partial = chunks > 1 ? static_cast<float*>(workspace) : out;
  partial_column_sums<<<grid, block, 0, stream>>>(x, partial, rows, cols, chunk_rows);
  check_launch("column_sum");
  if (chunks > 1) {
    sum_partials<<<element_blocks(cols), kElementThreads, 0, stream>>>(partial, out, chunks, cols);
    check_launch("column_sum: partials");
  }
}

}  // namespace treadle::cuda

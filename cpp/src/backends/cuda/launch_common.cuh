#pragma once
// Launch helpers shared by the .cu files: grid sizing for grid-stride loops and deterministic
// block reductions (fixed order for a given block size).
#include <cuda_runtime.h>

#include <cstdint>

namespace treadle::cuda {

constexpr int kElementThreads = 256;
// Enough blocks to fill any current GPU several times over; grid-stride loops cover the rest.
constexpr int64_t kMaxElementBlocks = 8192;

inline unsigned element_blocks(int64_t n) {
  const int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(blocks < kMaxElementBlocks ? blocks : kMaxElementBlocks);
}

// Threads per block for a reduction over `len` items: a power of two in [32, 1024].
inline int reduction_threads(int64_t len) {
  int t = 32;
  while (t < 1024 && t < len) t *= 2;
  return t;
}

// Blocks for a "one block per row" kernel that loops over rows with a grid stride.
inline unsigned row_blocks(int64_t rows) {
  constexpr int64_t kMaxRowBlocks = 65535;
  return static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
}

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }  // NaN in b is dropped; see callers
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduces one value per thread over the block; every thread gets the result. blockDim.x must be a
// multiple of 32; `smem` holds at least 32 T. Safe to call repeatedly with the same smem.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* smem) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // the previous call's readers are done with smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? smem[lane] : identity;
    v = warp_reduce(v, op);
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  return smem[0];
}

}  // namespace treadle::cuda

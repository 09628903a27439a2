// sum_to over any broadcast dimensions (the gradient of broadcasting). (rows, cols) -> (cols,) after
// merging is column_sum's (reduce_kernels.cu); every other case sums each output in double: short
// sums (kShortSum elements or fewer) with one thread per output in increasing order of x's index,
// longer ones with one block per output, each thread a strided partial and then the block's fixed
// reduction tree. The block size depends only on the sum's length, so the order is fixed by the
// shape and results are bitwise repeatable.
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/strided_index.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr int64_t kShortSum = 32;
constexpr int kMaxSumThreads = 256;

__device__ __forceinline__ int64_t output_base(int64_t o, const SumToLayout& l) {
  return strided_offset(o, l.kept_ndim, l.kept_dims, l.kept_strides);
}
__device__ __forceinline__ int64_t reduced_offset(int64_t r, const SumToLayout& l) {
  return strided_offset(r, l.reduced_ndim, l.reduced_dims, l.reduced_strides);
}

__global__ void sum_to_threads(const float* __restrict__ x, float* __restrict__ y, SumToLayout l) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < l.outputs; o += stride) {
    const float* base = x + output_base(o, l);
    double s = 0.0;
    for (int64_t r = 0; r < l.reduced; ++r) s += static_cast<double>(base[reduced_offset(r, l)]);
    y[o] = static_cast<float>(s);
  }
}

__global__ void sum_to_blocks(const float* __restrict__ x, float* __restrict__ y, SumToLayout l) {
  __shared__ double smem[32];
  for (int64_t o = blockIdx.x; o < l.outputs; o += gridDim.x) {
    const float* base = x + output_base(o, l);
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < l.reduced; r += blockDim.x) s += static_cast<double>(base[reduced_offset(r, l)]);
    s = block_reduce(s, SumOp{}, 0.0, smem);
    if (threadIdx.x == 0) y[o] = static_cast<float>(s);
  }
}

void check_layout(const SumToLayout& l) {
  if (l.kept_ndim < 0 || l.kept_ndim > kMaxLayoutDims || l.reduced_ndim < 0 || l.reduced_ndim > kMaxLayoutDims)
    throw_value_error("sum_to: layout of ", l.kept_ndim, " kept and ", l.reduced_ndim,
                      " summed dimensions (at most ", kMaxLayoutDims, " each)");
  int64_t outputs = 1, reduced = 1;
  for (int d = 0; d < l.kept_ndim; ++d) outputs *= l.kept_dims[d];
  for (int d = 0; d < l.reduced_ndim; ++d) reduced *= l.reduced_dims[d];
  if (outputs != l.outputs || reduced != l.reduced || outputs < 0 || reduced < 0)
    throw_value_error("sum_to: inconsistent layout: ", outputs, " outputs of ", reduced, " elements each, recorded as ",
                      l.outputs, " of ", l.reduced);
}

}  // namespace

void sum_to(const float* x, float* y, const SumToLayout& layout, void* workspace, cudaStream_t stream) {
  check_layout(layout);
  if (layout.outputs == 0) return;
  if (y == nullptr || (layout.reduced > 0 && x == nullptr))
    throw_value_error("sum_to: null device pointer for ", layout.outputs, " outputs of ", layout.reduced,
                      " elements each");
  if (layout.columns()) {
    column_sum(x, y, layout.reduced, layout.outputs, workspace, stream);
    return;
  }
  if (layout.reduced <= kShortSum) {
    sum_to_threads<<<element_blocks(layout.outputs), kElementThreads, 0, stream>>>(x, y, layout);
  } else {
    const int threads = reduction_threads(layout.reduced);
    sum_to_blocks<<<row_blocks(layout.outputs), threads < kMaxSumThreads ? threads : kMaxSumThreads, 0, stream>>>(
        x, y, layout);
  }
  check_launch("sum_to");
}

}  // namespace treadle::cuda

// Operand rounding to bf16 / fp16 values kept in float32 (precision_kernels.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/precision_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// The conversions of cuda_bf16.h / cuda_fp16.h round to nearest even, keep NaN, overflow to Inf and
// (fp16) produce subnormals: the reference's rounding.
__global__ void round_bf16_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

__global__ void round_fp16_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __half2float(__float2half_rn(x[i]));
}

}  // namespace

const char* rounding_name(OperandRounding r) {
  return r == OperandRounding::bf16 ? "bf16" : r == OperandRounding::fp16 ? "fp16" : "none";
}

void round_operand(OperandRounding r, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) throw_value_error("round_operand: negative element count ", n);
  if (r == OperandRounding::none) throw_value_error("round_operand: no rounding format given");
  if (n == 0) return;
  if (x == nullptr || y == nullptr) throw_value_error("round_operand: null device pointer for ", n, " elements");
  if (r == OperandRounding::bf16)
    round_bf16_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, n);
  else
    round_fp16_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, n);
  check_launch("round_operand");
}

}  // namespace treadle::cuda

// Loss-scaling and fp16 conversion kernels: grid-stride elementwise loops with 64-bit indices. The
// non-finite flag is set by plain stores of 1 (every writer stores the same value).
#include <cuda_fp16.h>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/loss_scale.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

__global__ void scale_kernel(const float* in, float* out, int64_t n, const float* scale, bool divide,
                             int32_t* flag) {
  const float s = divide ? 1.0f / *scale : *scale;
  bool bad = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = in[i];
    const float r = v * s;
    out[i] = r;
    bad |= !isfinite(v) || !isfinite(r);
  }
  if (bad) *flag = 1;
}

__global__ void unscale_half_kernel(const uint16_t* in, float* out, int64_t n, const float* scale, int32_t* flag) {
  const float s = 1.0f / *scale;
  bool bad = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = __half2float(__ushort_as_half(in[i]));
    const float r = v * s;
    out[i] = r;
    bad |= !isfinite(v) || !isfinite(r);
  }
  if (bad) *flag = 1;
}

__global__ void update_kernel(float* scale, int32_t* good, const int32_t* flag, LossScaleRule rule) {
  float s = *scale;
  int32_t count = *good;
  apply_loss_scale_rule(s, count, *flag != 0, rule);
  *scale = s;
  *good = count;
}

__global__ void to_half_kernel(const float* in, uint16_t* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __half_as_ushort(__float2half_rn(in[i]));
}

__global__ void from_half_kernel(const uint16_t* in, float* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __half2float(__ushort_as_half(in[i]));
}

void check_buffers(const char* who, int64_t n, const void* in, const void* out) {
  if (n < 0) throw_value_error(who, ": negative element count ", n);
  if (n > 0 && (in == nullptr || out == nullptr)) throw_value_error(who, ": null device pointer for ", n, " elements");
}

}  // namespace

void clear_nonfinite_flag(int32_t* flag, cudaStream_t stream) {
  if (flag == nullptr) throw_value_error("clear_nonfinite_flag: null device pointer");
  check_cuda(cudaMemsetAsync(flag, 0, sizeof(int32_t), stream), "clear_nonfinite_flag: cudaMemsetAsync");
}

void scale_gradients(const float* in, float* out, int64_t n, const float* scale, ScaleDirection direction,
                     int32_t* found_nonfinite, cudaStream_t stream) {
  check_buffers("scale_gradients", n, in, out);
  if (scale == nullptr || found_nonfinite == nullptr)
    throw_value_error("scale_gradients: null device pointer for the scale or the flag");
  if (n == 0) return;
  scale_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(in, out, n, scale,
                                                                  direction == ScaleDirection::divide, found_nonfinite);
  check_launch("scale_gradients");
}

void unscale_fp16_gradients(const uint16_t* in, float* out, int64_t n, const float* scale, int32_t* found_nonfinite,
                            cudaStream_t stream) {
  check_buffers("unscale_fp16_gradients", n, in, out);
  if (scale == nullptr || found_nonfinite == nullptr)
    throw_value_error("unscale_fp16_gradients: null device pointer for the scale or the flag");
  if (n == 0) return;
  unscale_half_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(in, out, n, scale, found_nonfinite);
  check_launch("unscale_fp16_gradients");
}

void loss_scale_update(float* scale, int32_t* good_steps, const int32_t* found_nonfinite, const LossScaleRule& r,
                       cudaStream_t stream) {
  validate_loss_scale_rule(r);
  if (scale == nullptr || good_steps == nullptr || found_nonfinite == nullptr)
    throw_value_error("loss_scale_update: null device pointer for the scale, the step count or the flag");
  update_kernel<<<1, 1, 0, stream>>>(scale, good_steps, found_nonfinite, r);
  check_launch("loss_scale_update");
}

void loss_scale_update(float* scale, int32_t* good_steps, const int32_t* found_nonfinite, const LossScaleOptions& o,
                       cudaStream_t stream) {
  validate_loss_scale_options(o);
  loss_scale_update(scale, good_steps, found_nonfinite, loss_scale_rule(o), stream);
}

void float_to_fp16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  check_buffers("float_to_fp16", n, in, out);
  if (n == 0) return;
  to_half_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(in, out, n);
  check_launch("float_to_fp16");
}

void fp16_to_float(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  check_buffers("fp16_to_float", n, in, out);
  if (n == 0) return;
  from_half_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(in, out, n);
  check_launch("fp16_to_float");
}

}  // namespace treadle::cuda

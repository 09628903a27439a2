// Average pooling forward and backward (avg_pool_kernels.hpp): grid-stride loops with 64-bit
// indices, one thread per output (forward) or per input element (backward).
#include "backends/cuda/avg_pool_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// The reference's divisor for the window starting at `start` (per dimension).
__device__ int64_t window_divisor(const AvgPoolGeometry& g, const int64_t* start) {
  if (g.divisor_override > 0) return g.divisor_override;
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t padded_end = g.in[i] + g.pad[i];
    const int64_t end = start[i] + g.kernel[i] < padded_end ? start[i] + g.kernel[i] : padded_end;
    if (g.include_pad) {
      n *= end - start[i];
    } else {
      const int64_t hi = end < g.in[i] ? end : g.in[i], lo = start[i] > 0 ? start[i] : 0;
      n *= hi - lo;
    }
  }
  return n;
}

__global__ void avg_forward_kernel(const float* __restrict__ x, float* __restrict__ y, AvgPoolGeometry g) {
  const int64_t ov = g.out[0] * g.out[1] * g.out[2], iv = g.in[0] * g.in[1] * g.in[2];
  const int64_t total = g.planes * ov, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % g.out[2], oh = (o / g.out[2]) % g.out[1], od = (o / (g.out[2] * g.out[1])) % g.out[0];
    const float* xp = x + (o / ov) * iv;
    const int64_t start[3] = {od * g.stride[0] - g.pad[0], oh * g.stride[1] - g.pad[1], ow * g.stride[2] - g.pad[2]};
    float sum = 0.0f;
    int64_t count = 0;
    for (int64_t d = start[0]; d < start[0] + g.kernel[0]; ++d) {
      if (d < 0 || d >= g.in[0]) continue;
      for (int64_t h = start[1]; h < start[1] + g.kernel[1]; ++h) {
        if (h < 0 || h >= g.in[1]) continue;
        for (int64_t w = start[2]; w < start[2] + g.kernel[2]; ++w) {
          if (w < 0 || w >= g.in[2]) continue;
          sum += xp[(d * g.in[1] + h) * g.in[2] + w];
          ++count;
        }
      }
    }
    y[o] = count == 0 ? 0.0f : sum / static_cast<float>(window_divisor(g, start));
  }
}

// The outputs along one dimension whose window holds input position i: o * s - p <= i < o * s - p + k.
__device__ void covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t& lo, int64_t& hi) {
  const int64_t top = i + p, span = top - (k - 1);
  lo = span <= 0 ? 0 : (span + s - 1) / s;
  hi = top / s;  // top >= 0: i >= 0 and p >= 0
  if (hi > out - 1) hi = out - 1;
}

__global__ void avg_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, AvgPoolGeometry g) {
  const int64_t ov = g.out[0] * g.out[1] * g.out[2], iv = g.in[0] * g.in[1] * g.in[2];
  const int64_t total = g.planes * iv, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t pos = i % iv, plane = i / iv;
    const int64_t at[3] = {pos / (g.in[1] * g.in[2]), (pos / g.in[2]) % g.in[1], pos % g.in[2]};
    int64_t lo[3], hi[3];
    for (int k = 0; k < 3; ++k) covering(at[k], g.kernel[k], g.stride[k], g.pad[k], g.out[k], lo[k], hi[k]);
    const float* dyp = dy + plane * ov;
    float sum = 0.0f;
    for (int64_t od = lo[0]; od <= hi[0]; ++od)
      for (int64_t oh = lo[1]; oh <= hi[1]; ++oh)
        for (int64_t ow = lo[2]; ow <= hi[2]; ++ow) {
          const int64_t start[3] = {od * g.stride[0] - g.pad[0], oh * g.stride[1] - g.pad[1],
                                    ow * g.stride[2] - g.pad[2]};
          sum += dyp[(od * g.out[1] + oh) * g.out[2] + ow] / static_cast<float>(window_divisor(g, start));
        }
    dx[i] = sum;
  }
}

void check_geometry(const char* who, const AvgPoolGeometry& g, const void* a, const void* b) {
  for (int d = 0; d < 3; ++d)
    if (g.in[d] < 1 || g.out[d] < 1 || g.kernel[d] < 1 || g.stride[d] < 1 || g.pad[d] < 0 || g.pad[d] > g.kernel[d] / 2)
      throw_value_error(who, ": dimension ", d, " has input ", g.in[d], ", output ", g.out[d], ", kernel ", g.kernel[d],
                        ", stride ", g.stride[d], ", padding ", g.pad[d],
                        " (sizes >= 1, padding in [0, kernel / 2])");
  if (g.planes < 0 || g.divisor_override < 0)
    throw_value_error(who, ": planes and divisor_override must be >= 0, got ", g.planes, " and ", g.divisor_override);
  if (g.planes > 0 && (a == nullptr || b == nullptr)) throw_value_error(who, ": null device pointer");
}

}  // namespace

void avg_pool_forward(const float* x, float* y, const AvgPoolGeometry& g, cudaStream_t stream) {
  check_geometry("avg_pool_forward", g, x, y);
  const int64_t n = g.planes * g.out[0] * g.out[1] * g.out[2];
  if (n == 0) return;
  avg_forward_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, g);
  check_launch("avg_pool_forward");
}

void avg_pool_backward(const float* dy, float* dx, const AvgPoolGeometry& g, cudaStream_t stream) {
  check_geometry("avg_pool_backward", g, dy, dx);
  const int64_t n = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (n == 0) return;
  avg_backward_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(dy, dx, g);
  check_launch("avg_pool_backward");
}

}  // namespace treadle::cuda

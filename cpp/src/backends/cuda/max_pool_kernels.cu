// Max pooling with int64 indices (forward) and its index-driven backward, as gathers: one thread
// per output (forward) or per input element (backward), grid-stride loops with 64-bit indices.
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/max_pool_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr const char* kWho = "max_pool2d_indices";

__global__ void max_pool_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                        int64_t* __restrict__ indices, MaxPoolGeometry g) {
  const int64_t total = g.planes * g.out_d * g.out_h * g.out_w, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % g.out_w, oh = (o / g.out_w) % g.out_h, od = (o / (g.out_w * g.out_h)) % g.out_d;
    const int64_t plane = o / (g.out_w * g.out_h * g.out_d);
    const float* xp = x + plane * g.in_d * g.in_h * g.in_w;
    const int64_t d0 = od * g.stride_d - g.pad_d, h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    float best = -INFINITY;
    int64_t arg = -1;
    for (int64_t kd = 0; kd < g.kernel_d; ++kd) {
      const int64_t d = d0 + kd * g.dilation_d;
      if (d < 0 || d >= g.in_d) continue;
      for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
        const int64_t h = h0 + kh * g.dilation_h;
        if (h < 0 || h >= g.in_h) continue;
        for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
          const int64_t w = w0 + kw * g.dilation_w;
          if (w < 0 || w >= g.in_w) continue;
          const int64_t at = (d * g.in_h + h) * g.in_w + w;
          const float v = xp[at];
          if (arg < 0 || v > best || isnan(v)) best = v, arg = at;  // the reference's rule
        }
      }
    }
    y[o] = best;
    indices[o] = arg;
  }
}

// The outputs along one dimension whose window has a tap at input position i: o * s - p + k * d = i
// with 0 <= k < kernel, i.e. o in [ceil((i + p - (kernel - 1) d) / s), floor((i + p) / s)].
__device__ void covering(int64_t i, int64_t kernel, int64_t s, int64_t p, int64_t d, int64_t out, int64_t& lo,
                         int64_t& hi) {
  const int64_t top = i + p, span = top - (kernel - 1) * d;
  lo = span <= 0 ? 0 : (span + s - 1) / s;
  hi = top < 0 ? -1 : top / s;
  if (hi > out - 1) hi = out - 1;
}

__global__ void max_pool_backward_kernel(const float* __restrict__ dy, const int64_t* __restrict__ indices,
                                         float* __restrict__ dx, MaxPoolGeometry g) {
  const int64_t volume = g.in_d * g.in_h * g.in_w;
  const int64_t total = g.planes * volume, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t pos = i % volume, plane = i / volume;
    const int64_t d = pos / (g.in_h * g.in_w), h = (pos / g.in_w) % g.in_h, w = pos % g.in_w;
    int64_t od0, od1, oh0, oh1, ow0, ow1;
    covering(d, g.kernel_d, g.stride_d, g.pad_d, g.dilation_d, g.out_d, od0, od1);
    covering(h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h, g.out_h, oh0, oh1);
    covering(w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w, g.out_w, ow0, ow1);
    const int64_t base = plane * g.out_d * g.out_h * g.out_w;
    float sum = 0.0f;
    for (int64_t od = od0; od <= od1; ++od)
      for (int64_t oh = oh0; oh <= oh1; ++oh)
        for (int64_t ow = ow0; ow <= ow1; ++ow) {
          const int64_t o = base + (od * g.out_h + oh) * g.out_w + ow;
          if (indices[o] == pos) sum += dy[o];  // windows that merely cover pos never point at it
        }
    dx[i] = sum;
  }
}

void check_geometry_pointers(const char* who, const MaxPoolGeometry& g, const void* a, const void* b, const void* c) {
  if (g.planes < 0 || g.in_h < 1 || g.in_w < 1 || g.out_h < 1 || g.out_w < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
      g.stride_h < 1 || g.stride_w < 1 || g.dilation_h < 1 || g.dilation_w < 1 || g.pad_h < 0 || g.pad_w < 0 ||
      g.in_d < 1 || g.out_d < 1 || g.kernel_d < 1 || g.stride_d < 1 || g.dilation_d < 1 || g.pad_d < 0)
    throw_value_error(who, ": invalid geometry (planes ", g.planes, ", in (", g.in_d, ", ", g.in_h, ", ", g.in_w,
                      "), out (", g.out_d, ", ", g.out_h, ", ", g.out_w, ")); build it with max_pool_geometry");
  if (g.planes > 0 && (a == nullptr || b == nullptr || c == nullptr))
    throw_value_error(who, ": null device pointer for ", g.planes, " planes");
}

}  // namespace

MaxPoolGeometry max_pool_geometry(const Pool2dConfig& c) {
  if (c.mode != PoolMode::max) throw_value_error(kWho, ": the configuration is not max pooling");
  check_cudnn_sizes(kWho, "input", c.batch, c.channels, c.height, c.width);
  const Hw s = c.stride ? *c.stride : c.kernel;
  const Hw checks[] = {c.kernel, s, c.dilation};
  for (const Hw& v : checks)
    if (v.h < 1 || v.w < 1 || v.h > (1 << 24) || v.w > (1 << 24))
      throw_value_error(kWho, ": kernel, stride and dilation must be in [1, 2^24], got (", v.h, ", ", v.w, ")");
  if (c.padding.h < 0 || c.padding.w < 0 || c.padding.h > c.kernel.h / 2 || c.padding.w > c.kernel.w / 2)
    throw_value_error(kWho, ": padding should be at most half of kernel size, got padding (", c.padding.h, ", ",
                      c.padding.w, ") and kernel (", c.kernel.h, ", ", c.kernel.w, ")");
  MaxPoolGeometry g;
  g.planes = c.batch * c.channels, g.in_h = c.height, g.in_w = c.width;
  g.kernel_h = c.kernel.h, g.kernel_w = c.kernel.w, g.stride_h = s.h, g.stride_w = s.w;
  g.pad_h = c.padding.h, g.pad_w = c.padding.w, g.dilation_h = c.dilation.h, g.dilation_w = c.dilation.w;
  g.out_h = pool_window_output_size(c.height, c.kernel.h, s.h, c.padding.h, c.dilation.h, c.ceil_mode);
  g.out_w = pool_window_output_size(c.width, c.kernel.w, s.w, c.padding.w, c.dilation.w, c.ceil_mode);
  if (g.out_h < 1 || g.out_w < 1)
    throw_value_error(kWho, ": input (", c.height, ", ", c.width, ") is too small for kernel (", c.kernel.h, ", ",
                      c.kernel.w, ") with padding (", c.padding.h, ", ", c.padding.w, ") and dilation (",
                      c.dilation.h, ", ", c.dilation.w, ")");
  return g;
}

void max_pool2d_with_indices(const float* x, float* y, int64_t* indices, const MaxPoolGeometry& g,
                             cudaStream_t stream) {
  check_geometry_pointers("max_pool2d_with_indices", g, x, y, indices);
  const int64_t n = g.planes * g.out_d * g.out_h * g.out_w;
  if (n == 0) return;
  max_pool_forward_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, indices, g);
  check_launch("max_pool2d_with_indices");
}

void max_pool2d_backward_indices(const float* dy, const int64_t* indices, float* dx, const MaxPoolGeometry& g,
                                 cudaStream_t stream) {
  check_geometry_pointers("max_pool2d_backward_indices", g, dy, indices, dx);
  const int64_t n = g.planes * g.in_d * g.in_h * g.in_w;
  if (n == 0) return;
  max_pool_backward_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(dy, indices, dx, g);
  check_launch("max_pool2d_backward_indices");
}

}  // namespace treadle::cuda

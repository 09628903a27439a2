// Zero-padding copies and crops of (planes, D, H, W) volumes (conv_pad_kernels.hpp): grid-stride
// loops with 64-bit indices, one thread per element written.
#include "backends/cuda/conv_pad_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// PadGeometry::padded on the device (the header carries no CUDA syntax).
__device__ int64_t padded_size(const PadGeometry& g, int d) { return g.in[d] + g.pad_begin[d] + g.pad_end[d]; }

__global__ void pad_kernel(const float* __restrict__ x, float* __restrict__ xp, PadGeometry g) {
  const int64_t pd = padded_size(g, 0), ph = padded_size(g, 1), pw = padded_size(g, 2);
  const int64_t total = g.planes * pd * ph * pw, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t w = o % pw - g.pad_begin[2], h = (o / pw) % ph - g.pad_begin[1];
    const int64_t d = (o / (pw * ph)) % pd - g.pad_begin[0], plane = o / (pw * ph * pd);
    const bool inside = d >= 0 && d < g.in[0] && h >= 0 && h < g.in[1] && w >= 0 && w < g.in[2];
    xp[o] = inside ? x[((plane * g.in[0] + d) * g.in[1] + h) * g.in[2] + w] : 0.0f;
  }
}

__global__ void crop_kernel(const float* __restrict__ xp, float* __restrict__ x, PadGeometry g,
                            const float* __restrict__ bias, int64_t channels) {
  const int64_t pd = padded_size(g, 0), ph = padded_size(g, 1), pw = padded_size(g, 2);
  const int64_t total = g.planes * g.in[0] * g.in[1] * g.in[2], stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t w = i % g.in[2] + g.pad_begin[2], h = (i / g.in[2]) % g.in[1] + g.pad_begin[1];
    const int64_t d = (i / (g.in[2] * g.in[1])) % g.in[0] + g.pad_begin[0];
    const int64_t plane = i / (g.in[2] * g.in[1] * g.in[0]);
    const bool kept = d < pd && h < ph && w < pw;  // the begin padding is never negative
    const float v = kept ? xp[((plane * pd + d) * ph + h) * pw + w] : 0.0f;
    x[i] = bias != nullptr ? v + bias[plane % channels] : v;
  }
}

void check_geometry(const char* who, const PadGeometry& g, const void* a, const void* b) {
  for (int d = 0; d < 3; ++d)
    if (g.in[d] < 1 || g.pad_begin[d] < 0 || g.padded(d) < 1)
      throw_value_error(who, ": dimension ", d, " has size ", g.in[d], ", padding ", g.pad_begin[d], " / ",
                        g.pad_end[d], " (sizes >= 1, begin padding >= 0, padded size >= 1)");
  if (g.planes < 0) throw_value_error(who, ": planes must be >= 0, got ", g.planes);
  if (g.planes > 0 && (a == nullptr || b == nullptr)) throw_value_error(who, ": null device pointer");
}

}  // namespace

void pad_volume(const float* x, float* xp, const PadGeometry& g, cudaStream_t stream) {
  check_geometry("pad_volume", g, x, xp);
  const int64_t n = g.padded_elements();
  if (n == 0) return;
  pad_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, xp, g);
  check_launch("pad_volume");
}

void crop_volume(const float* xp, float* x, const PadGeometry& g, const float* bias, int64_t channels,
                 cudaStream_t stream) {
  check_geometry("crop_volume", g, xp, x);
  if (bias != nullptr && channels < 1) throw_value_error("crop_volume: channels must be >= 1 with a bias, got ", channels);
  const int64_t n = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (n == 0) return;
  crop_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(xp, x, g, bias, channels);
  check_launch("crop_volume");
}

}  // namespace treadle::cuda

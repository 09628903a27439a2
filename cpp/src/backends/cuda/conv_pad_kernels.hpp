#pragma once
// Explicit padding around cuDNN's convolutions, for what its descriptors cannot say: the core's
// `padding_end` differing from `padding` (cuDNN pads both sides equally). The convolution's input
// is copied into a zero-padded buffer and cuDNN runs unpadded on it; the data gradient comes back
// padded and is cropped. A negative end padding (a transposed convolution's output_padding beyond
// its padding) crops the input instead: those positions take no part in the convolution, and their
// gradient is zero. Element-wise copies, one thread per element: exact and bitwise repeatable.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace treadle::cuda {

// (planes, D, H, W) volumes, a 1-d or 2-d problem with leading unit dimensions; the padded volume
// is (planes, in + pad_begin + pad_end) per dimension.
struct PadGeometry {
  int64_t planes = 0;  // N * C
  int64_t in[3] = {1, 1, 1};
  int64_t pad_begin[3] = {0, 0, 0};
  int64_t pad_end[3] = {0, 0, 0};
  int64_t padded(int d) const { return in[d] + pad_begin[d] + pad_end[d]; }
  int64_t padded_elements() const { return planes * padded(0) * padded(1) * padded(2); }
};

// xp (planes, padded) = x where the shifted position lies inside x, else 0.
void pad_volume(const float* x, float* xp, const PadGeometry& g, cudaStream_t stream);
// x (planes, in) = the interior of xp (0 where a negative end padding cut it off), plus
// bias[plane % channels] when bias is not null (the core's conv_transpose bias).
void crop_volume(const float* xp, float* x, const PadGeometry& g, const float* bias, int64_t channels,
                 cudaStream_t stream);

}  // namespace treadle::cuda

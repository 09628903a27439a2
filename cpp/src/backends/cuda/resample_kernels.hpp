#pragma once
// Kernels of the core's adaptive_avg_pool, upsample2d and output_transform ops and their backward
// ops, float32, the reference's arithmetic (cuda_kernels.hpp conventions: host-side validation,
// the stream explicit, no allocation, no atomics). The backward passes gather: each input element
// sums, in the reference's order, the output gradients that its forward taps fed.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// ---- adaptive average pooling over (planes, in_d, in_h, in_w) -> (planes, out_d, out_h, out_w)
// (1-d and 2-d problems have unit leading spatial sizes): PyTorch's windows
// [floor(o * in / out), ceil((o + 1) * in / out)) per dimension.
struct AdaptivePoolShape {
  int64_t planes = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
};
void adaptive_avg_pool_forward(const float* x, float* y, const AdaptivePoolShape& s, cudaStream_t stream);
void adaptive_avg_pool_backward(const float* dy, float* dx, const AdaptivePoolShape& s, cudaStream_t stream);

// ---- upsample2d over (planes, in_h, in_w) -> (planes, out_h, out_w): nearest or bilinear with
// torch's source-index rules (align_corners, scale factors > 0 replacing in/out). The taps per output
// row and column are computed on the device into the workspace (upsample_workspace_bytes) by every
// call, with the reference's float arithmetic.
struct UpsampleShape {
  int64_t planes = 0, in_h = 1, in_w = 1, out_h = 1, out_w = 1;
  bool bilinear = false, align_corners = false;
  double scale_h = 0.0, scale_w = 0.0;  // the user's scale factors, 0 for none
};
std::size_t upsample_workspace_bytes(const UpsampleShape& s);
void upsample2d_forward(const float* x, float* y, const UpsampleShape& s, void* workspace, cudaStream_t stream);
void upsample2d_backward(const float* dy, float* dx, const UpsampleShape& s, void* workspace, cudaStream_t stream);

// ---- output_transform: y = act_j(x) * scale_j + shift_j over the last dimension (size d), scale
// and shift of length d or 1, activation codes (0 identity, 1 softplus, 2 sigmoid, 3 tanh) per
// column or one for all, at most kMaxOutputActivations of them. Computed in double as the reference.
constexpr int kMaxOutputActivations = 64;
struct OutputTransformShape {
  int64_t rows = 0, d = 1, scale_len = 1, shift_len = 1;
  int num_acts = 1;
  int8_t acts[kMaxOutputActivations] = {};
};
void output_transform_forward(const float* x, const float* scale, const float* shift, float* y,
                              const OutputTransformShape& s, cudaStream_t stream);
// dx = dy * act'(x) * scale; dscale = sum dy * act(x) and dshift = sum dy per parameter entry (one
// block each, in double).
void output_transform_backward(const float* dy, const float* x, const float* scale, float* dx, float* dscale,
                               float* dshift, const OutputTransformShape& s, cudaStream_t stream);

}  // namespace treadle::cuda

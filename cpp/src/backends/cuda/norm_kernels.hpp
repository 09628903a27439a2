#pragma once
// Row-wise normalisation kernels (layer_norm, rms_norm, group_norm, batch_norm_eval_backward) and
// log_softmax, as the core's ops compute them on the reference backend: statistics and reductions
// accumulate in double (the reference's two-pass mean and centred variance per row), outputs are
// rounded to float32 once. Same conventions as cuda_kernels.hpp: float32 device pointers, host-side
// validation (ValueError), the stream explicit, no allocation (scratch sized by *_workspace_bytes),
// no atomics: results are bitwise repeatable for a given shape.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// ---- layer_norm / rms_norm over rows of `len` contiguous values.
// layer_norm: y = (x - mean) * rstd [* weight] [+ bias], mean and rstd = 1/sqrt(biased var + eps)
// written per row. weight and bias may be null (bias only with weight).
void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t len, double eps, cudaStream_t stream);
// rms_norm: rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd [* weight].
void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t len,
                      double eps, cudaStream_t stream);

// The backward of both: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy [* weight],
// xhat = (x - mean) * rstd; `mean` null gives the RMS form (no mean(g) term, xhat = x * rstd).
// With a weight, dweight[j] = sum_r dy * xhat and (dbias non-null) dbias[j] = sum_r dy, reduced over
// rows in two passes through the workspace (row_norm_workspace_bytes; 0 without a weight).
std::size_t row_norm_workspace_bytes(int64_t rows, int64_t len);
void row_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* weight,
                       float* dx, float* dweight, float* dbias, int64_t rows, int64_t len, void* workspace,
                       cudaStream_t stream);

// ---- group_norm over x (n, channels, spatial): rows are (sample, group) blocks of
// (channels / groups) * spatial contiguous values; weight and bias (channels) both or neither.
struct GroupNormShape {
  int64_t n = 0, channels = 0, spatial = 1, groups = 1;
};
void group_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                        const GroupNormShape& s, double eps, cudaStream_t stream);
// dx as row_norm_backward per (sample, group) with g = dy * weight[channel]; with a weight, dweight
// and dbias per channel (one block per channel, summed in double).
void group_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* weight,
                         float* dx, float* dweight, float* dbias, const GroupNormShape& s, cudaStream_t stream);

// ---- batch_norm_eval_backward over x (n, channels, spatial) with the running statistics:
// dx = dy * weight / sqrt(running_var + eps); with a weight, dweight = sum dy * (x - running_mean) /
// sqrt(running_var + eps) and dbias = sum dy per channel.
void batch_norm_eval_backward(const float* dy, const float* x, const float* running_mean, const float* running_var,
                              const float* weight, float* dx, float* dweight, float* dbias, int64_t n,
                              int64_t channels, int64_t spatial, double eps, cudaStream_t stream);

// ---- log_softmax over one axis of a tensor viewed as (outer, axis, inner), float32 arithmetic as
// the reference: y = (x - max) - log(sum(exp(x - max))); backward dx = dy - exp(y) * sum(dy).
void log_softmax_forward(const float* x, float* y, int64_t outer, int64_t axis, int64_t inner, cudaStream_t stream);
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t outer, int64_t axis, int64_t inner,
                          cudaStream_t stream);

}  // namespace treadle::cuda

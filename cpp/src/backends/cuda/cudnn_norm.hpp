#pragma once
// Batch normalisation (spatial: one mean and variance per channel over N and every spatial
// position) through cuDNN's legacy API, as the core's batch_norm / batch_norm_eval /
// batch_norm_backward / batch_norm_update_stats ops define it, for float32 x (N, C, *spatial)
// seen as (N, C, S, 1):
//   forward_training   y, the batch mean and rstd = 1 / sqrt(biased var + eps) (the core's saved
//                      outputs), and optionally the running statistics updated in the same call:
//                      running = (1 - f) running + f batch, the variance unbiased (var * M / (M - 1),
//                      M = N * S) as the core's batch_norm_update_stats and PyTorch; f from
//                      batch_norm_average_factor.
//   forward_inference  y from the running statistics (batch_norm_eval).
//   backward           dx, dweight, dbias from x, dy and the saved mean / rstd (batch_norm_backward).
// Without affine parameters (the core's batch_norm without weight and bias) cuDNN still needs a
// scale and a shift: ones and zeros are written into the caller's workspace (with room for the
// parameter gradients it then discards). Every call takes the caller's cuDNN handle.
#include <cudnn_ops.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/cudnn_descriptors.hpp"

namespace treadle::cuda {

struct BatchNormConfig {
  int64_t batch = 0, channels = 0;
  int64_t spatial = 1;  // product of the spatial sizes (1 for (N, C) inputs)
  double eps = 1e-5;
  bool affine = true;
};

// The running-statistics weight f of one update: `momentum`, or 1 / num_batches_tracked (the count
// after this batch) for the cumulative average (momentum < 0, torch's momentum=None). ValueError for
// momentum > 1 or a count < 1 in cumulative mode.
double batch_norm_average_factor(double momentum, int64_t num_batches_tracked);
void validate_batch_norm(const BatchNormConfig& c);

class CudnnBatchNorm {
 public:
  explicit CudnnBatchNorm(const BatchNormConfig& config);
  CudnnBatchNorm(const CudnnBatchNorm&) = delete;
  CudnnBatchNorm& operator=(const CudnnBatchNorm&) = delete;

  const BatchNormConfig& config() const { return config_; }
  // 0 with affine parameters; else room for ones, zeros and two discarded gradients (C floats each).
  std::size_t workspace_bytes() const { return workspace_; }

  // weight/bias: (C) or null when not affine. running_mean/running_var: both null (no update) or
  // both given, then updated with weight `average_factor` (needs N * S >= 2, checked here).
  void forward_training(cudnnHandle_t handle, const float* x, const float* weight, const float* bias, float* y,
                        float* save_mean, float* save_rstd, float* running_mean, float* running_var,
                        double average_factor, void* workspace) const;
  void forward_inference(cudnnHandle_t handle, const float* x, const float* weight, const float* bias,
                         const float* running_mean, const float* running_var, float* y, void* workspace) const;
  // dweight/dbias: null when not affine; added to their contents when `accumulate_params`.
  void backward(cudnnHandle_t handle, const float* x, const float* dy, const float* weight, const float* save_mean,
                const float* save_rstd, float* dx, float* dweight, float* dbias, bool accumulate_params,
                void* workspace) const;

 private:
  struct Params {
    const float* scale;
    const float* shift;
    float* dscale;
    float* dshift;
  };
  // The affine parameters, or ones/zeros (written now) and scratch gradients in the workspace.
  Params params(cudnnHandle_t handle, const char* who, const float* weight, const float* bias, float* dweight,
                float* dbias, void* workspace) const;

  BatchNormConfig config_;
  std::size_t workspace_ = 0, part_ = 0;
  TensorDescriptor x_, param_;
};

}  // namespace treadle::cuda

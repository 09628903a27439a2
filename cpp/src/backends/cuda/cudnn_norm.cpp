// Batch normalisation through cuDNN (spatial mode): validation, descriptors, launches.
#include "backends/cuda/cudnn_norm.hpp"

#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr const char* kWho = "batch_norm_cudnn";

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

double batch_norm_average_factor(double momentum, int64_t num_batches_tracked) {
  if (!(momentum <= 1.0) || std::isnan(momentum))
    throw_value_error(kWho, ": momentum must be in [0, 1] (or negative for a cumulative average), got ", momentum);
  if (momentum >= 0.0) return momentum;
  if (num_batches_tracked < 1)
    throw_value_error(kWho, ": the cumulative average needs num_batches_tracked >= 1 (counting this batch), got ",
                      num_batches_tracked);
  return 1.0 / static_cast<double>(num_batches_tracked);
}

void validate_batch_norm(const BatchNormConfig& c) {
  check_cudnn_sizes(kWho, "input (N, C, S, 1)", c.batch, c.channels, c.spatial, 1);
  if (!(c.eps > 0.0) || !std::isfinite(c.eps) || c.eps < CUDNN_BN_MIN_EPSILON)
    throw_value_error(kWho, ": eps must be positive and finite, got ", c.eps);
}

CudnnBatchNorm::CudnnBatchNorm(const BatchNormConfig& c) : config_(c) {
  validate_batch_norm(c);
  x_.set_nchw(kWho, "input (N, C, S, 1)", c.batch, c.channels, c.spatial, 1);
  TREADLE_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(param_.get(), x_.get(), CUDNN_BATCHNORM_SPATIAL));
  if (!c.affine) {
    part_ = align256(static_cast<std::size_t>(c.channels) * sizeof(float));
    workspace_ = 4 * part_;
  }
}

CudnnBatchNorm::Params CudnnBatchNorm::params(cudnnHandle_t handle, const char* who, const float* weight,
                                              const float* bias, float* dweight, float* dbias,
                                              void* workspace) const {
  if (config_.affine) {
    check_device_pointer(who, "weight", weight);
    return {weight, bias, dweight, dbias};
  }
  if (weight != nullptr || bias != nullptr || dweight != nullptr || dbias != nullptr)
    throw_value_error(who, ": built without affine parameters, got a weight, bias or their gradient");
  if (workspace == nullptr) throw_value_error(who, ": needs a device workspace of ", workspace_, " bytes, got null");
  char* base = static_cast<char*>(workspace);
  auto* ones = reinterpret_cast<float*>(base);
  auto* zeros = reinterpret_cast<float*>(base + part_);
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(cudnnSetTensor(handle, param_.get(), ones, &one));
  TREADLE_CUDNN_CHECK(cudnnSetTensor(handle, param_.get(), zeros, &zero));
  return {ones, zeros, reinterpret_cast<float*>(base + 2 * part_), reinterpret_cast<float*>(base + 3 * part_)};
}

void CudnnBatchNorm::forward_training(cudnnHandle_t handle, const float* x, const float* weight, const float* bias,
                                      float* y, float* save_mean, float* save_rstd, float* running_mean,
                                      float* running_var, double average_factor, void* workspace) const {
  const char* who = "batch_norm_cudnn forward_training";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "y", y);
  check_device_pointer(who, "save_mean", save_mean);
  check_device_pointer(who, "save_rstd", save_rstd);
  if (config_.affine) check_device_pointer(who, "bias", bias);
  if ((running_mean == nullptr) != (running_var == nullptr))
    throw_value_error(who, ": give both running_mean and running_var, or neither");
  if (running_mean != nullptr) {
    if (config_.batch * config_.spatial < 2)
      throw_value_error(who, ": expected more than 1 value per channel when updating running statistics, got ",
                        config_.batch * config_.spatial);
    if (!(average_factor >= 0.0 && average_factor <= 1.0))
      throw_value_error(who, ": average_factor must be in [0, 1], got ", average_factor);
  }
  const Params p = params(handle, who, weight, bias, nullptr, nullptr, workspace);
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_.get(), x, x_.get(), y, param_.get(), p.scale, p.shift,
      average_factor, running_mean, running_var, config_.eps, save_mean, save_rstd));
}

void CudnnBatchNorm::forward_inference(cudnnHandle_t handle, const float* x, const float* weight, const float* bias,
                                       const float* running_mean, const float* running_var, float* y,
                                       void* workspace) const {
  const char* who = "batch_norm_cudnn forward_inference";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "y", y);
  check_device_pointer(who, "running_mean", running_mean);
  check_device_pointer(who, "running_var", running_var);
  if (config_.affine) check_device_pointer(who, "bias", bias);
  const Params p = params(handle, who, weight, bias, nullptr, nullptr, workspace);
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_.get(),
                                                              x, x_.get(), y, param_.get(), p.scale, p.shift,
                                                              running_mean, running_var, config_.eps));
}

void CudnnBatchNorm::backward(cudnnHandle_t handle, const float* x, const float* dy, const float* weight,
                              const float* save_mean, const float* save_rstd, float* dx, float* dweight,
                              float* dbias, bool accumulate_params, void* workspace) const {
  const char* who = "batch_norm_cudnn backward";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "save_mean", save_mean);
  check_device_pointer(who, "save_rstd", save_rstd);
  check_device_pointer(who, "dx", dx);
  if (config_.affine) {
    check_device_pointer(who, "dweight", dweight);
    check_device_pointer(who, "dbias", dbias);
  }
  // The backward reads the scale only; the shift's gradient is written, the shift never read.
  const Params p = params(handle, who, weight, nullptr, dweight, dbias, workspace);
  const float one = 1.0f, zero = 0.0f, param_beta = accumulate_params ? 1.0f : 0.0f;
  TREADLE_CUDNN_CHECK(cudnnBatchNormalizationBackward(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &param_beta,
                                                      x_.get(), x, x_.get(), dy, x_.get(), dx, param_.get(), p.scale,
                                                      p.dscale, p.dshift, config_.eps, save_mean, save_rstd));
}

}  // namespace treadle::cuda

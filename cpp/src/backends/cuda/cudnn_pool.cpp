// 2-d pooling through cuDNN: validation against what cuDNN can express, descriptors, launches.
#include "backends/cuda/cudnn_pool.hpp"

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr const char* kWho = "pool2d_cudnn";

cudnnPoolingMode_t cudnn_mode(PoolMode m) {
  switch (m) {
    case PoolMode::max: return CUDNN_POOLING_MAX_DETERMINISTIC;
    case PoolMode::avg_include_pad: return CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    case PoolMode::avg_exclude_pad: return CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  }
  return CUDNN_POOLING_MAX_DETERMINISTIC;
}

Hw stride_of(const Pool2dConfig& c) { return c.stride ? *c.stride : c.kernel; }

void check_positive(const char* name, const Hw& v) {
  constexpr int64_t kMax = 1 << 24;
  if (v.h < 1 || v.w < 1 || v.h > kMax || v.w > kMax)
    throw_value_error(kWho, ": ", name, " must be in [1, ", kMax, "], got (", v.h, ", ", v.w, ")");
}

}  // namespace

const char* pool_mode_name(PoolMode m) {
  switch (m) {
    case PoolMode::max: return "max";
    case PoolMode::avg_include_pad: return "avg_include_pad";
    case PoolMode::avg_exclude_pad: return "avg_exclude_pad";
  }
  return "unknown";
}

int64_t pool_window_output_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  // In ceil mode the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

void validate_pool2d(const Pool2dConfig& c) {
  check_cudnn_sizes(kWho, "input", c.batch, c.channels, c.height, c.width);
  check_positive("kernel", c.kernel);
  const Hw s = stride_of(c);
  check_positive("stride", s);
  check_positive("dilation", c.dilation);
  if (c.padding.h < 0 || c.padding.w < 0 || c.padding.h > c.kernel.h / 2 || c.padding.w > c.kernel.w / 2)
    throw_value_error(kWho, ": padding should be at most half of kernel size, got padding (", c.padding.h, ", ",
                      c.padding.w, ") and kernel (", c.kernel.h, ", ", c.kernel.w, ")");
  if (c.dilation.h != 1 || c.dilation.w != 1)
    throw_value_error(kWho, ": cuDNN pooling has no dilation, got dilation (", c.dilation.h, ", ", c.dilation.w, ")");
  if (c.divisor_override != 0)
    throw_value_error(kWho, ": cuDNN average pooling has no divisor_override, got ", c.divisor_override);
  const int64_t oh = pool_window_output_size(c.height, c.kernel.h, s.h, c.padding.h, 1, false);
  const int64_t ow = pool_window_output_size(c.width, c.kernel.w, s.w, c.padding.w, 1, false);
  if (oh < 1 || ow < 1)
    throw_value_error(kWho, ": input (", c.height, ", ", c.width, ") is too small for kernel (", c.kernel.h, ", ",
                      c.kernel.w, ") with padding (", c.padding.h, ", ", c.padding.w, ")");
  if (c.ceil_mode) {
    const int64_t ch = pool_window_output_size(c.height, c.kernel.h, s.h, c.padding.h, 1, true);
    const int64_t cw = pool_window_output_size(c.width, c.kernel.w, s.w, c.padding.w, 1, true);
    if (ch != oh || cw != ow)
      throw_value_error(kWho, ": ceil_mode gives output (", ch, ", ", cw, ") where cuDNN's floor division gives (",
                        oh, ", ", ow, "); cuDNN cannot express the partial windows of ceil mode");
  }
}

CudnnPool2d::CudnnPool2d(const Pool2dConfig& c) : config_(c) {
  validate_pool2d(c);
  const Hw s = stride_of(c);
  out_ = {pool_window_output_size(c.height, c.kernel.h, s.h, c.padding.h, 1, false),
          pool_window_output_size(c.width, c.kernel.w, s.w, c.padding.w, 1, false)};
  x_.set_nchw(kWho, "input", c.batch, c.channels, c.height, c.width);
  y_.set_nchw(kWho, "output", c.batch, c.channels, out_.h, out_.w);
  // NaN propagates through max pooling, as in the core and PyTorch.
  TREADLE_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool_.get(), cudnn_mode(c.mode), CUDNN_PROPAGATE_NAN,
                                                  static_cast<int>(c.kernel.h), static_cast<int>(c.kernel.w),
                                                  static_cast<int>(c.padding.h), static_cast<int>(c.padding.w),
                                                  static_cast<int>(s.h), static_cast<int>(s.w)));
  int n = 0, ch = 0, oh = 0, ow = 0;
  TREADLE_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pool_.get(), x_.get(), &n, &ch, &oh, &ow));
  if (oh != out_.h || ow != out_.w)
    throw RuntimeError(detail::concat(kWho, ": cuDNN's output (", oh, ", ", ow, ") differs from the expected (",
                                      out_.h, ", ", out_.w, ") for input (", c.height, ", ", c.width, ")"));
}

void CudnnPool2d::forward(cudnnHandle_t handle, const float* x, float* y) const {
  const char* who = "pool2d_cudnn forward";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "y", y);
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(cudnnPoolingForward(handle, pool_.get(), &one, x_.get(), x, &zero, y_.get(), y));
}

void CudnnPool2d::backward(cudnnHandle_t handle, const float* x, const float* y, const float* dy, float* dx) const {
  const char* who = "pool2d_cudnn backward";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "dx", dx);
  if (config_.mode == PoolMode::max) {
    check_device_pointer(who, "x (max pooling reads the forward's input)", x);
    check_device_pointer(who, "y (max pooling reads the forward's output)", y);
  }
  const float* xs = x != nullptr ? x : dx;
  const float* ys = y != nullptr ? y : dy;
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(
      cudnnPoolingBackward(handle, pool_.get(), &one, y_.get(), ys, y_.get(), dy, x_.get(), xs, &zero, x_.get(), dx));
}

}  // namespace treadle::cuda

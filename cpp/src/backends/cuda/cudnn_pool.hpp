#pragma once
// 2-d NCHW float32 max and average pooling through cuDNN's legacy API, as the core's max_pool /
// avg_pool ops define them, forward and backward. Prepared once per shape (descriptors only; no
// algorithm choice, no workspace); every call takes the caller's cuDNN handle (bound to its stream).
//
// What cuDNN cannot express is refused with ValueError when the object is built:
//   - dilation other than 1 (the legacy pooling descriptor has none);
//   - ceil_mode when it changes the output size (cuDNN sizes windows with floor division; when the
//     two agree, ceil_mode changes nothing and is accepted);
//   - divisor_override (cuDNN divides by the window's size or its in-range count only).
// Padding follows the core: at most half the kernel; max pooling never takes a padded position,
// average pooling counts padded positions (avg_include_pad) or not (avg_exclude_pad).
//
// Differences from the core's ops, for integration: max_pool's second output (int64 argmax indices)
// is not produced; cuDNN's backward instead reads x and y again and routes each gradient to the
// window's maximum (for continuous inputs, where ties have probability zero, that is the same element).
// CUDNN_POOLING_MAX_DETERMINISTIC is used, so the backward is bitwise repeatable.
#include <cudnn_ops.h>

#include <cstdint>
#include <optional>

#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cudnn_descriptors.hpp"

namespace treadle::cuda {

enum class PoolMode { max, avg_include_pad, avg_exclude_pad };
const char* pool_mode_name(PoolMode m);

struct Pool2dConfig {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  PoolMode mode = PoolMode::max;
  Hw kernel{1, 1};
  std::optional<Hw> stride;  // absent: the kernel size, as the core's default
  Hw padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false;
  int64_t divisor_override = 0;  // avg only; 0: none
};

// The core's (PyTorch's) output size, floor or ceil mode; may be < 1 when the window does not fit.
int64_t pool_window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                                bool ceil_mode);
// Checks the configuration (ValueError naming "pool2d_cudnn" and the values), without a device.
void validate_pool2d(const Pool2dConfig& c);

class CudnnPool2d {
 public:
  explicit CudnnPool2d(const Pool2dConfig& config);
  CudnnPool2d(const CudnnPool2d&) = delete;
  CudnnPool2d& operator=(const CudnnPool2d&) = delete;

  const Pool2dConfig& config() const { return config_; }
  int64_t out_height() const { return out_.h; }
  int64_t out_width() const { return out_.w; }

  void forward(cudnnHandle_t handle, const float* x, float* y) const;
  // dx = pooling gradient of dy. Max pooling reads x and y (the forward's input and output); the
  // average modes do not need them and accept null (dx and dy then stand in for cuDNN's x and y
  // arguments, which have the same shapes).
  void backward(cudnnHandle_t handle, const float* x, const float* y, const float* dy, float* dx) const;

 private:
  Pool2dConfig config_;
  Hw out_;
  TensorDescriptor x_, y_;
  PoolingDescriptor pool_;
};

}  // namespace treadle::cuda

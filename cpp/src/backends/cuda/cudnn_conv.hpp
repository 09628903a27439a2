#pragma once
// 2-d NCHW (and 3-d NCDHW) float32 convolution through cuDNN's legacy API, as the core's `conv` op defines it:
// cross-correlation, weight (out_channels, in_channels/groups, kH, kW), stride / padding /
// dilation / groups, optional bias; and the three gradients (data, filter, bias) that the core's
// conv_backward_data / conv_backward_weight / conv_backward_bias ops compute.
//
// Prepared once per shape (descriptors built and one algorithm per pass chosen, like LtGemm): the
// object is immutable afterwards. cuDNN handles are bound to a stream, so every call takes the
// caller's handle (one per context); the prepared object holds none. Workspace: the caller provides
// workspace_bytes() of device memory (the largest of the three passes); nothing is allocated here.
//
// Algorithms come from cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7), taken in their order
// and filtered: deterministic only (unless config.deterministic is false), workspace within
// config.workspace_limit, and the math type of config.math:
//   fp32       CUDNN_FMA_MATH: float32 FMA kernels only, no TF32, and no FFT / Winograd algorithms
//              (their transformed-domain rounding is not a float32 sum's): the reference's precision.
//   tensor_op  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION allowed: tensor cores with TF32 (or bf16)
//              operands, float32 accumulation: ~1e-2 relative agreement, not 1e-5.
#include <cudnn_cnn.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backends/cuda/cudnn_descriptors.hpp"

namespace treadle::cuda {

enum class ConvMath { fp32, tensor_op };
const char* conv_math_name(ConvMath m);

constexpr std::size_t kDefaultConvWorkspace = std::size_t{256} << 20;

struct Hw {
  int64_t h = 0, w = 0;
  bool operator==(const Hw&) const = default;
};

struct Conv2dConfig {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;  // x (N, C, H, W)
  int64_t out_channels = 0;                                    // y (N, K, OH, OW)
  Hw kernel{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  // The core's "padding_end"; cuDNN pads both sides equally, so it must equal `padding` (or be
  // absent): anything else is refused with ValueError.
  std::optional<Hw> padding_end;
  int64_t groups = 1;
  // A 3-d convolution, x (N, C, D, H, W), when depth > 0: cuDNN's Nd descriptors (5-d tensors), the
  // window's depth parts here. 0: a 2-d one on the 4-d descriptors.
  int64_t depth = 0, kernel_d = 1, stride_d = 1, padding_d = 0, dilation_d = 1;
  ConvMath math = ConvMath::fp32;
  bool deterministic = true;
  std::size_t workspace_limit = kDefaultConvWorkspace;
};

// The core's output size: floor((in + 2 pad - dilation (k - 1) - 1) / stride) + 1 (< 1: does not fit).
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation);
// Checks the configuration as the core's conv infer does (ValueError naming "conv2d_cudnn" and the
// values), without touching the device.
void validate_conv2d(const Conv2dConfig& c);

class CudnnConv2d {
 public:
  // Validates, builds the descriptors and chooses the algorithms with `handle` (ValueError for a
  // bad configuration, RuntimeError when no algorithm meets the constraints).
  CudnnConv2d(cudnnHandle_t handle, const Conv2dConfig& config);
  CudnnConv2d(const CudnnConv2d&) = delete;
  CudnnConv2d& operator=(const CudnnConv2d&) = delete;

  const Conv2dConfig& config() const { return config_; }
  int64_t out_height() const { return out_.h; }
  int64_t out_width() const { return out_.w; }
  int64_t out_depth() const { return out_d_; }  // 0 for a 2-d convolution
  std::size_t workspace_bytes() const { return workspace_; }
  // The chosen algorithms, their math types and workspaces, for logs and benchmark records.
  std::string describe() const;

  // y = conv(x, w) [+ bias per output channel]; bias may be null.
  void forward(cudnnHandle_t handle, const float* x, const float* w, const float* bias, float* y,
               void* workspace) const;
  // dx = conv_backward_data(dy, w), or dx += ... when `accumulate`.
  void backward_data(cudnnHandle_t handle, const float* dy, const float* w, float* dx, bool accumulate,
                     void* workspace) const;
  // dw = conv_backward_weight(x, dy), or dw += ... when `accumulate`.
  void backward_filter(cudnnHandle_t handle, const float* x, const float* dy, float* dw, bool accumulate,
                       void* workspace) const;
  // dx += bias per input channel (the core's conv_transpose: conv_backward_data with a bias).
  void add_input_bias(cudnnHandle_t handle, const float* bias, float* dx) const;
  // db[k] = sum over n, oh, ow of dy, or db += ... when `accumulate`.
  void backward_bias(cudnnHandle_t handle, const float* dy, float* db, bool accumulate) const;

 private:
  void choose_forward(cudnnHandle_t handle);
  void choose_backward_data(cudnnHandle_t handle);
  void choose_backward_filter(cudnnHandle_t handle);
  void check_workspace(const char* who, std::size_t need, const void* workspace) const;
  void set_descriptors();  // x_, y_, bias_, in_bias_, w_ and the convolution descriptors

  Conv2dConfig config_;
  Hw out_;
  int64_t out_d_ = 0;
  TensorDescriptor x_, y_, bias_, in_bias_;
  FilterDescriptor w_;
  // One convolution descriptor per pass: each carries the math type of its chosen algorithm.
  ConvolutionDescriptor fwd_desc_, data_desc_, filter_desc_;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo_{};
  cudnnMathType_t fwd_math_ = CUDNN_FMA_MATH, data_math_ = CUDNN_FMA_MATH, filter_math_ = CUDNN_FMA_MATH;
  std::size_t fwd_ws_ = 0, data_ws_ = 0, filter_ws_ = 0, workspace_ = 0;
};

}  // namespace treadle::cuda

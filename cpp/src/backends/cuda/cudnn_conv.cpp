// 2-d and 3-d convolution through cuDNN: validation, descriptors, algorithm choice, launches.
#include "backends/cuda/cudnn_conv.hpp"

#include <algorithm>
#include <array>
#include <sstream>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr const char* kWho = "conv2d_cudnn";
constexpr int kMaxPerfs = 16;

std::string shape_text(const Conv2dConfig& c) {
  std::ostringstream os;
  if (c.depth > 0)
    os << "depth " << c.depth << " (kernel " << c.kernel_d << ", stride " << c.stride_d << ", padding " << c.padding_d
       << ", dilation " << c.dilation_d << "), ";
  os << "x (" << c.batch << ", " << c.in_channels << ", " << c.height << ", " << c.width << "), weight ("
     << c.out_channels << ", " << (c.groups > 0 ? c.in_channels / c.groups : 0) << ", " << c.kernel.h << ", "
     << c.kernel.w << "), stride (" << c.stride.h << ", " << c.stride.w << "), padding (" << c.padding.h << ", "
     << c.padding.w << "), dilation (" << c.dilation.h << ", " << c.dilation.w << "), groups " << c.groups;
  return os.str();
}

// The math type the algorithm heuristics are asked under: FMA only, or tensor ops (TF32) allowed.
cudnnMathType_t heuristic_math(ConvMath m) {
  return m == ConvMath::fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

bool is_tensor_op(cudnnMathType_t m) { return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; }

const char* math_type_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor_op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor_op_conversion";
    case CUDNN_FMA_MATH: return "fma";
  }
  return "unknown";
}

// Walks cuDNN's heuristic list in order and takes the first algorithm that is deterministic (when
// required), of an allowed math type (and, in fp32 mode, not transform-based), supported with that math type on this descriptor, and within
// the workspace limit. `query(algo, &bytes)` asks cuDNN for the algorithm's exact workspace (the
// heuristic's estimate can differ). Throws RuntimeError listing every candidate and why it was
// rejected when none qualifies.
// FFT and Winograd algorithms compute in a transformed domain whose rounding differs from a direct
// float32 sum (errors up to ~1e-4 relative); fp32 mode keeps to direct / GEMM-based algorithms.
bool transform_based(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

template <typename Perf, typename Algo, typename Query>
void choose_algorithm(const char* pass, const Conv2dConfig& c, const std::array<Perf, kMaxPerfs>& perfs, int count,
                      cudnnConvolutionDescriptor_t desc, Query query, Algo& algo, cudnnMathType_t& math,
                      std::size_t& workspace) {
  std::ostringstream rejected;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[i];
    rejected << " algo " << static_cast<int>(p.algo) << "/" << math_type_name(p.mathType) << ": ";
    if (p.status != CUDNN_STATUS_SUCCESS) {
      rejected << cudnnGetErrorString(p.status) << ";";
      continue;
    }
    if (c.deterministic && p.determinism != CUDNN_DETERMINISTIC) {
      rejected << "not deterministic;";
      continue;
    }
    if (c.math == ConvMath::fp32 && is_tensor_op(p.mathType)) {
      rejected << "tensor-op math;";
      continue;
    }
    if (c.math == ConvMath::fp32 && transform_based(p.algo)) {
      rejected << "FFT/Winograd rounding;";
      continue;
    }
    const cudnnMathType_t m = c.math == ConvMath::fp32 ? CUDNN_FMA_MATH : p.mathType;
    TREADLE_CUDNN_CHECK(cudnnSetConvolutionMathType(desc, m));
    std::size_t bytes = 0;
    const cudnnStatus_t st = query(p.algo, &bytes);
    if (st != CUDNN_STATUS_SUCCESS) {
      rejected << "workspace query: " << cudnnGetErrorString(st) << ";";
      continue;
    }
    if (bytes > c.workspace_limit) {
      rejected << "needs " << bytes << " bytes;";
      continue;
    }
    algo = p.algo;
    math = m;
    workspace = bytes;
    return;
  }
  throw RuntimeError(detail::concat(kWho, ": no ", pass, " algorithm for ", shape_text(c), ", math ",
                                    conv_math_name(c.math), c.deterministic ? ", deterministic" : "",
                                    ", workspace limit ", c.workspace_limit, " bytes; cuDNN offered ", count, " candidates:",
                                    rejected.str()));
}

void set_convolution(cudnnConvolutionDescriptor_t d, const Conv2dConfig& c) {
  if (c.depth > 0) {
    const int pad[3] = {static_cast<int>(c.padding_d), static_cast<int>(c.padding.h), static_cast<int>(c.padding.w)};
    const int stride[3] = {static_cast<int>(c.stride_d), static_cast<int>(c.stride.h), static_cast<int>(c.stride.w)};
    const int dil[3] = {static_cast<int>(c.dilation_d), static_cast<int>(c.dilation.h),
                        static_cast<int>(c.dilation.w)};
    TREADLE_CUDNN_CHECK(
        cudnnSetConvolutionNdDescriptor(d, 3, pad, stride, dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  } else {
    TREADLE_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d, static_cast<int>(c.padding.h), static_cast<int>(c.padding.w), static_cast<int>(c.stride.h),
        static_cast<int>(c.stride.w), static_cast<int>(c.dilation.h), static_cast<int>(c.dilation.w),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  }
  TREADLE_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, static_cast<int>(c.groups)));
}

// A packed float32 (n, c, d, h, w) tensor; the sizes checked as the 4-d setter checks them (d * h
// standing for two dimensions: when it fits, both do).
void set_tensor_5d(TensorDescriptor& t, const char* what, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) {
  check_cudnn_sizes(kWho, what, n, c, d * h, w);
  const int dims[5] = {static_cast<int>(n), static_cast<int>(c), static_cast<int>(d), static_cast<int>(h),
                       static_cast<int>(w)};
  const int strides[5] = {static_cast<int>(c * d * h * w), static_cast<int>(d * h * w), static_cast<int>(h * w),
                          static_cast<int>(w), 1};
  TREADLE_CUDNN_CHECK(cudnnSetTensorNdDescriptor(t.get(), CUDNN_DATA_FLOAT, 5, dims, strides));
}

void check_scalar(const char* name, int64_t v, int64_t min_value) {
  constexpr int64_t kMax = 1 << 24;
  if (v < min_value || v > kMax) throw_value_error(kWho, ": ", name, " must be in [", min_value, ", ", kMax, "], got ", v);
}

// The 3-d parts of validate_conv2d: the depth window and the 5-d sizes.
void validate_depth(const Conv2dConfig& c, int64_t oh, int64_t ow) {
  check_scalar("depth", c.depth, 1);
  check_scalar("depth kernel", c.kernel_d, 1);
  check_scalar("depth stride", c.stride_d, 1);
  check_scalar("depth dilation", c.dilation_d, 1);
  check_scalar("depth padding", c.padding_d, 0);
  const int64_t od = conv_output_size(c.depth, c.kernel_d, c.stride_d, c.padding_d, c.dilation_d);
  if (od < 1)
    throw_value_error(kWho, ": depth ", c.depth, " with padding ", c.padding_d, " is too small for kernel ", c.kernel_d,
                      " with dilation ", c.dilation_d);
  check_cudnn_sizes(kWho, "input", c.batch, c.in_channels, c.depth * c.height, c.width);
  check_cudnn_sizes(kWho, "output", c.batch, c.out_channels, od * oh, ow);
  check_cudnn_sizes(kWho, "weight", c.out_channels, c.in_channels / c.groups, c.kernel_d * c.kernel.h, c.kernel.w);
}

void check_window(const char* name, const Hw& v, int64_t min_value) {
  constexpr int64_t kMax = 1 << 24;  // far beyond any real window; keeps the int arithmetic exact
  if (v.h < min_value || v.w < min_value || v.h > kMax || v.w > kMax)
    throw_value_error(kWho, ": ", name, " must be in [", min_value, ", ", kMax, "], got (", v.h, ", ", v.w, ")");
}

}  // namespace

const char* conv_math_name(ConvMath m) { return m == ConvMath::fp32 ? "fp32" : "tensor_op"; }

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

void validate_conv2d(const Conv2dConfig& c) {
  check_cudnn_sizes(kWho, "input", c.batch, c.in_channels, c.height, c.width);
  if (c.out_channels < 1) throw_value_error(kWho, ": out_channels must be >= 1, got ", c.out_channels);
  check_window("kernel", c.kernel, 1);
  check_window("stride", c.stride, 1);
  check_window("dilation", c.dilation, 1);
  check_window("padding", c.padding, 0);
  if (c.padding_end && !(*c.padding_end == c.padding))
    throw_value_error(kWho, ": cuDNN pads both sides equally; padding (", c.padding.h, ", ", c.padding.w,
                      ") with padding_end (", c.padding_end->h, ", ", c.padding_end->w, ") is not supported");
  if (c.groups < 1) throw_value_error(kWho, ": groups must be >= 1, got ", c.groups);
  if (c.in_channels % c.groups != 0 || c.out_channels % c.groups != 0)
    throw_value_error(kWho, ": groups=", c.groups, " must divide the input channels (", c.in_channels,
                      ") and the output channels (", c.out_channels, ")");
  const int64_t oh = conv_output_size(c.height, c.kernel.h, c.stride.h, c.padding.h, c.dilation.h);
  const int64_t ow = conv_output_size(c.width, c.kernel.w, c.stride.w, c.padding.w, c.dilation.w);
  if (oh < 1 || ow < 1)
    throw_value_error(kWho, ": spatial size (", c.height, ", ", c.width, ") with padding (", c.padding.h, ", ",
                      c.padding.w, ") is too small for kernel (", c.kernel.h, ", ", c.kernel.w, ") with dilation (",
                      c.dilation.h, ", ", c.dilation.w, ")");
  check_cudnn_sizes(kWho, "output", c.batch, c.out_channels, oh, ow);
  check_cudnn_sizes(kWho, "weight", c.out_channels, c.in_channels / c.groups, c.kernel.h, c.kernel.w);
  if (c.depth != 0) validate_depth(c, oh, ow);
}

CudnnConv2d::CudnnConv2d(cudnnHandle_t handle, const Conv2dConfig& c) : config_(c) {
  validate_conv2d(c);
  check_cudnn_handle(kWho, handle);
  out_ = {conv_output_size(c.height, c.kernel.h, c.stride.h, c.padding.h, c.dilation.h),
          conv_output_size(c.width, c.kernel.w, c.stride.w, c.padding.w, c.dilation.w)};
  if (c.depth > 0) out_d_ = conv_output_size(c.depth, c.kernel_d, c.stride_d, c.padding_d, c.dilation_d);
  set_descriptors();
  // Our output size must be cuDNN's: a disagreement would be a semantic mismatch, not a detail.
  int dims[5] = {0, 0, 0, 0, 0};
  const int rank = c.depth > 0 ? 5 : 4;
  if (rank == 5)
    TREADLE_CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(fwd_desc_.get(), x_.get(), w_.get(), rank, dims));
  else
    TREADLE_CUDNN_CHECK(
        cudnnGetConvolution2dForwardOutputDim(fwd_desc_.get(), x_.get(), w_.get(), &dims[0], &dims[1], &dims[2], &dims[3]));
  const int64_t want[5] = {c.batch, c.out_channels, c.depth > 0 ? out_d_ : out_.h, c.depth > 0 ? out_.h : out_.w,
                           out_.w};
  for (int i = 0; i < rank; ++i)
    if (dims[i] != want[i])
      throw RuntimeError(detail::concat(kWho, ": cuDNN's output (", dims[0], ", ", dims[1], ", ", dims[2], ", ",
                                        dims[3], rank == 5 ? detail::concat(", ", dims[4]) : std::string(),
                                        ") differs from the expected for ", shape_text(c), " (dimension ", i, ": ",
                                        want[i], ")"));
  choose_forward(handle);
  choose_backward_data(handle);
  choose_backward_filter(handle);
  workspace_ = std::max({fwd_ws_, data_ws_, filter_ws_});
}

void CudnnConv2d::set_descriptors() {
  const Conv2dConfig& c = config_;
  const int64_t cg = c.in_channels / c.groups;
  if (c.depth > 0) {
    set_tensor_5d(x_, "input", c.batch, c.in_channels, c.depth, c.height, c.width);
    set_tensor_5d(y_, "output", c.batch, c.out_channels, out_d_, out_.h, out_.w);
    set_tensor_5d(bias_, "bias", 1, c.out_channels, 1, 1, 1);
    set_tensor_5d(in_bias_, "input bias", 1, c.in_channels, 1, 1, 1);
    const int dims[5] = {static_cast<int>(c.out_channels), static_cast<int>(cg), static_cast<int>(c.kernel_d),
                         static_cast<int>(c.kernel.h), static_cast<int>(c.kernel.w)};
    TREADLE_CUDNN_CHECK(cudnnSetFilterNdDescriptor(w_.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 5, dims));
  } else {
    x_.set_nchw(kWho, "input", c.batch, c.in_channels, c.height, c.width);
    y_.set_nchw(kWho, "output", c.batch, c.out_channels, out_.h, out_.w);
    bias_.set_nchw(kWho, "bias", 1, c.out_channels, 1, 1);
    in_bias_.set_nchw(kWho, "input bias", 1, c.in_channels, 1, 1);
    w_.set_kchw(kWho, c.out_channels, cg, c.kernel.h, c.kernel.w);
  }
  for (const ConvolutionDescriptor* d : {&fwd_desc_, &data_desc_, &filter_desc_}) set_convolution(d->get(), c);
}

void CudnnConv2d::choose_forward(cudnnHandle_t handle) {
  std::array<cudnnConvolutionFwdAlgoPerf_t, kMaxPerfs> perfs{};
  int count = 0;
  TREADLE_CUDNN_CHECK(cudnnSetConvolutionMathType(fwd_desc_.get(), heuristic_math(config_.math)));
  TREADLE_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, x_.get(), w_.get(), fwd_desc_.get(), y_.get(),
                                                             kMaxPerfs, &count, perfs.data()));
  auto query = [&](cudnnConvolutionFwdAlgo_t a, std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(handle, x_.get(), w_.get(), fwd_desc_.get(), y_.get(), a, bytes);
  };
  choose_algorithm("forward", config_, perfs, count, fwd_desc_.get(), query, fwd_algo_, fwd_math_, fwd_ws_);
}

void CudnnConv2d::choose_backward_data(cudnnHandle_t handle) {
  std::array<cudnnConvolutionBwdDataAlgoPerf_t, kMaxPerfs> perfs{};
  int count = 0;
  TREADLE_CUDNN_CHECK(cudnnSetConvolutionMathType(data_desc_.get(), heuristic_math(config_.math)));
  TREADLE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w_.get(), y_.get(), data_desc_.get(),
                                                                  x_.get(), kMaxPerfs, &count, perfs.data()));
  auto query = [&](cudnnConvolutionBwdDataAlgo_t a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, w_.get(), y_.get(), data_desc_.get(), x_.get(), a,
                                                        bytes);
  };
  choose_algorithm("backward data", config_, perfs, count, data_desc_.get(), query, data_algo_, data_math_,
                   data_ws_);
}

void CudnnConv2d::choose_backward_filter(cudnnHandle_t handle) {
  std::array<cudnnConvolutionBwdFilterAlgoPerf_t, kMaxPerfs> perfs{};
  int count = 0;
  TREADLE_CUDNN_CHECK(cudnnSetConvolutionMathType(filter_desc_.get(), heuristic_math(config_.math)));
  TREADLE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x_.get(), y_.get(), filter_desc_.get(),
                                                                    w_.get(), kMaxPerfs, &count, perfs.data()));
  auto query = [&](cudnnConvolutionBwdFilterAlgo_t a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x_.get(), y_.get(), filter_desc_.get(), w_.get(), a,
                                                          bytes);
  };
  choose_algorithm("backward filter", config_, perfs, count, filter_desc_.get(), query, filter_algo_, filter_math_,
                   filter_ws_);
}

std::string CudnnConv2d::describe() const {
  return detail::concat("fwd algo ", static_cast<int>(fwd_algo_), "/", math_type_name(fwd_math_), " (", fwd_ws_,
                        " B), bwd data algo ", static_cast<int>(data_algo_), "/", math_type_name(data_math_), " (",
                        data_ws_, " B), bwd filter algo ", static_cast<int>(filter_algo_), "/",
                        math_type_name(filter_math_), " (", filter_ws_, " B)");
}

void CudnnConv2d::check_workspace(const char* who, std::size_t need, const void* workspace) const {
  if (need > 0 && workspace == nullptr)
    throw_value_error(who, ": needs a device workspace of ", need, " bytes, got null");
}

void CudnnConv2d::forward(cudnnHandle_t handle, const float* x, const float* w, const float* bias, float* y,
                          void* workspace) const {
  const char* who = "conv2d_cudnn forward";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "w", w);
  check_device_pointer(who, "y", y);
  check_workspace(who, fwd_ws_, workspace);
  const float one = 1.0f, zero = 0.0f;
  TREADLE_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, x_.get(), x, w_.get(), w, fwd_desc_.get(), fwd_algo_,
                                              workspace, fwd_ws_, &zero, y_.get(), y));
  if (bias != nullptr) TREADLE_CUDNN_CHECK(cudnnAddTensor(handle, &one, bias_.get(), bias, &one, y_.get(), y));
}

void CudnnConv2d::backward_data(cudnnHandle_t handle, const float* dy, const float* w, float* dx, bool accumulate,
                                void* workspace) const {
  const char* who = "conv2d_cudnn backward_data";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "w", w);
  check_device_pointer(who, "dx", dx);
  check_workspace(who, data_ws_, workspace);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  TREADLE_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, w_.get(), w, y_.get(), dy, data_desc_.get(),
                                                   data_algo_, workspace, data_ws_, &beta, x_.get(), dx));
}

void CudnnConv2d::backward_filter(cudnnHandle_t handle, const float* x, const float* dy, float* dw, bool accumulate,
                                  void* workspace) const {
  const char* who = "conv2d_cudnn backward_filter";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "dw", dw);
  check_workspace(who, filter_ws_, workspace);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  TREADLE_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, x_.get(), x, y_.get(), dy, filter_desc_.get(),
                                                     filter_algo_, workspace, filter_ws_, &beta, w_.get(), dw));
}

void CudnnConv2d::add_input_bias(cudnnHandle_t handle, const float* bias, float* dx) const {
  const char* who = "conv2d_cudnn add_input_bias";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "bias", bias);
  check_device_pointer(who, "dx", dx);
  const float one = 1.0f;
  TREADLE_CUDNN_CHECK(cudnnAddTensor(handle, &one, in_bias_.get(), bias, &one, x_.get(), dx));
}

void CudnnConv2d::backward_bias(cudnnHandle_t handle, const float* dy, float* db, bool accumulate) const {
  const char* who = "conv2d_cudnn backward_bias";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "db", db);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  TREADLE_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, y_.get(), dy, &beta, bias_.get(), db));
}

}  // namespace treadle::cuda

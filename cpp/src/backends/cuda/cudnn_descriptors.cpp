// cuDNN descriptor owners: creation checked, destruction silent (destructors never throw).
#include "backends/cuda/cudnn_descriptors.hpp"

#include <limits>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

void check_cudnn_sizes(const char* who, const char* what, int64_t n, int64_t c, int64_t h, int64_t w) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  const int64_t dims[] = {n, c, h, w};
  int64_t total = 1;
  for (int64_t d : dims) {
    if (d < 1 || d > kMax)
      throw_value_error(who, ": ", what, " (", n, ", ", c, ", ", h, ", ", w,
                        ") must have sizes in [1, 2^31 - 1] for cuDNN's descriptors");
    total = total > kMax / d ? kMax + 1 : total * d;
  }
  if (total > kMax)
    throw_value_error(who, ": ", what, " (", n, ", ", c, ", ", h, ", ", w,
                      ") has more than 2^31 - 1 elements, beyond cuDNN's 32-bit strides");
}

void check_cudnn_handle(const char* who, cudnnHandle_t handle) {
  if (handle == nullptr) throw_value_error(who, ": null cuDNN handle");
}

void check_device_pointer(const char* who, const char* name, const void* p) {
  if (p == nullptr) throw_value_error(who, ": ", name, " is a null device pointer");
}

TensorDescriptor::TensorDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }

TensorDescriptor::~TensorDescriptor() {
  if (desc_ != nullptr) cudnnDestroyTensorDescriptor(desc_);
}

void TensorDescriptor::set_nchw(const char* who, const char* what, int64_t n, int64_t c, int64_t h, int64_t w) {
  check_cudnn_sizes(who, what, n, c, h, w);
  TREADLE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                                 static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
}

void TensorDescriptor::set_3d(const char* who, const char* what, int64_t a, int64_t b, int64_t c) {
  check_cudnn_sizes(who, what, a, b, c, 1);
  const int dims[3] = {static_cast<int>(a), static_cast<int>(b), static_cast<int>(c)};
  const int strides[3] = {static_cast<int>(b * c), static_cast<int>(c), 1};
  TREADLE_CUDNN_CHECK(cudnnSetTensorNdDescriptor(desc_, CUDNN_DATA_FLOAT, 3, dims, strides));
}

FilterDescriptor::FilterDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_)); }

FilterDescriptor::~FilterDescriptor() {
  if (desc_ != nullptr) cudnnDestroyFilterDescriptor(desc_);
}

void FilterDescriptor::set_kchw(const char* who, int64_t k, int64_t c, int64_t h, int64_t w) {
  check_cudnn_sizes(who, "weight", k, c, h, w);
  TREADLE_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(k),
                                                 static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
}

ConvolutionDescriptor::ConvolutionDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_)); }

ConvolutionDescriptor::~ConvolutionDescriptor() {
  if (desc_ != nullptr) cudnnDestroyConvolutionDescriptor(desc_);
}

PoolingDescriptor::PoolingDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc_)); }

PoolingDescriptor::~PoolingDescriptor() {
  if (desc_ != nullptr) cudnnDestroyPoolingDescriptor(desc_);
}

DropoutDescriptor::DropoutDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateDropoutDescriptor(&desc_)); }

DropoutDescriptor::~DropoutDescriptor() {
  if (desc_ != nullptr) cudnnDestroyDropoutDescriptor(desc_);
}

RnnDescriptor::RnnDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateRNNDescriptor(&desc_)); }

RnnDescriptor::~RnnDescriptor() {
  if (desc_ != nullptr) cudnnDestroyRNNDescriptor(desc_);
}

RnnDataDescriptor::RnnDataDescriptor() { TREADLE_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&desc_)); }

RnnDataDescriptor::~RnnDataDescriptor() {
  if (desc_ != nullptr) cudnnDestroyRNNDataDescriptor(desc_);
}

}  // namespace treadle::cuda

#pragma once
// Owners of cuDNN's descriptors (tensor, filter, convolution, pooling, dropout, RNN, RNN data) for
// the prepared objects of cudnn_conv/cudnn_pool/cudnn_norm/cudnn_rnn: created and set once per shape, destroyed in
// destructors that never throw. The legacy API takes 32-bit sizes, so every setter checks that
// each dimension and the element count fit in an int (ValueError naming `who` otherwise) before
// cuDNN sees them.
#include <cudnn_adv.h>
#include <cudnn_cnn.h>
#include <cudnn_ops.h>

#include <cstdint>

namespace treadle::cuda {

// Throws ValueError naming `who` when any of the sizes or their product exceeds INT32_MAX.
void check_cudnn_sizes(const char* who, const char* what, int64_t n, int64_t c, int64_t h, int64_t w);
// Throws ValueError naming `who` for a null handle (the calls below need one bound to the stream).
void check_cudnn_handle(const char* who, cudnnHandle_t handle);
// Throws ValueError naming `who` and `name` for a null device pointer.
void check_device_pointer(const char* who, const char* name, const void* p);

class TensorDescriptor {
 public:
  TensorDescriptor();
  ~TensorDescriptor();
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  // Packed NCHW float32.
  void set_nchw(const char* who, const char* what, int64_t n, int64_t c, int64_t h, int64_t w);
  // Packed (a, b, c) float32: the RNN state tensors (layers, N, H).
  void set_3d(const char* who, const char* what, int64_t a, int64_t b, int64_t c);
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor();
  ~FilterDescriptor();
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  // float32 (k, c, h, w) in NCHW order: the core's (out_channels, in_channels/groups, kH, kW).
  void set_kchw(const char* who, int64_t k, int64_t c, int64_t h, int64_t w);
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor();
  ~ConvolutionDescriptor();
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

class PoolingDescriptor {
 public:
  PoolingDescriptor();
  ~PoolingDescriptor();
  PoolingDescriptor(const PoolingDescriptor&) = delete;
  PoolingDescriptor& operator=(const PoolingDescriptor&) = delete;
  cudnnPoolingDescriptor_t get() const { return desc_; }

 private:
  cudnnPoolingDescriptor_t desc_ = nullptr;
};

class DropoutDescriptor {
 public:
  DropoutDescriptor();
  ~DropoutDescriptor();
  DropoutDescriptor(const DropoutDescriptor&) = delete;
  DropoutDescriptor& operator=(const DropoutDescriptor&) = delete;
  cudnnDropoutDescriptor_t get() const { return desc_; }

 private:
  cudnnDropoutDescriptor_t desc_ = nullptr;
};

class RnnDescriptor {
 public:
  RnnDescriptor();
  ~RnnDescriptor();
  RnnDescriptor(const RnnDescriptor&) = delete;
  RnnDescriptor& operator=(const RnnDescriptor&) = delete;
  cudnnRNNDescriptor_t get() const { return desc_; }

 private:
  cudnnRNNDescriptor_t desc_ = nullptr;
};

class RnnDataDescriptor {
 public:
  RnnDataDescriptor();
  ~RnnDataDescriptor();
  RnnDataDescriptor(const RnnDataDescriptor&) = delete;
  RnnDataDescriptor& operator=(const RnnDataDescriptor&) = delete;
  cudnnRNNDataDescriptor_t get() const { return desc_; }

 private:
  cudnnRNNDataDescriptor_t desc_ = nullptr;
};

}  // namespace treadle::cuda

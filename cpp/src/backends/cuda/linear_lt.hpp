#pragma once
// linear (y = x W^T + b, W of shape (out, in) as torch.nn.Linear) through cuBLASLt, float32 tensors.
// Prepared once per shape, as a plan prepares a node: one LtGemm per product (forward, dX, dW); the
// calls then only launch. Immutable afterwards: contexts on different threads may share it.
//
// Row-major tensors are column-major transposes, so with cuBLAS's column-major products:
//   forward   y^T  (out x N)  = W   (op T of the stored (in x out))  x^T (in x N)   [+ bias, relu]
//   dX        dx^T (in x N)   = W^T (stored (in x out))              dy^T (out x N)
//   dW        dW^T (in x out) = x^T (stored (in x N))                dy  (op T of the stored (out x N))
// db is column_sum(dy) (cuda_kernels.hpp). With the relu epilogue, y = relu(x W^T + b) and the
// backward first masks dy with activation_backward(relu, y, ...), since relu'(z) = [y > 0].
//
// Every pointer must be 16-byte aligned (see lt_gemm.hpp).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/lt_gemm.hpp"

namespace treadle::cuda {

enum class LinearEpilogue { none, bias, bias_relu };

struct LinearConfig {
  int64_t batch = 0;  // N, rows of x and y
  int64_t in_features = 0;
  int64_t out_features = 0;
  LinearEpilogue epilogue = LinearEpilogue::bias;
  MathMode math = MathMode::f32;
  std::size_t workspace_limit = kDefaultGemmWorkspace;  // what the algorithms may use at most
};

class LtLinear {
 public:
  // Throws ValueError for a bad shape, RuntimeError when cuBLASLt has no algorithm for it.
  LtLinear(cublasLtHandle_t handle, const LinearConfig& config);
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;

  const LinearConfig& config() const { return config_; }
  // Device scratch that each of the calls below needs (may be 0; then workspace may be null).
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // y (N, out) = x (N, in) W^T + b [relu]; b is ignored (may be null) without a bias epilogue.
  void forward(const float* x, const float* w, const float* b, float* y, void* workspace, cudaStream_t stream) const;
  // dx (N, in) = dy (N, out) W.
  void backward_input(const float* dy, const float* w, float* dx, void* workspace, cudaStream_t stream) const;
  // dW (out, in) = dy^T x, added to dW's contents when `accumulate`.
  void backward_weight(const float* dy, const float* x, float* dw, bool accumulate, void* workspace,
                       cudaStream_t stream) const;

 private:
  LinearConfig config_;
  std::size_t workspace_bytes_ = 0;
  LtGemm forward_, backward_input_, backward_weight_;
  StagedWorkspace forward_ws_, backward_input_ws_, backward_weight_ws_;
};

}  // namespace treadle::cuda

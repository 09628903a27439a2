#pragma once
// linear (y = x W^T + b, W of shape (out, in) as torch.nn.Linear) through cuBLASLt, float32 tensors.
// Prepared once per shape, as a plan prepares a node: the constructor validates the shape, builds
// the matrix layouts and asks cuBLASLt's heuristic for one algorithm per product (forward, dX, dW);
// the calls then only launch. The object is immutable afterwards, so contexts on different threads
// may share it (each call builds its operation descriptor on the stack, without allocating).
//
// Row-major tensors are column-major transposes, so with cuBLAS's column-major products:
//   forward   y^T  (out x N)  = W   (op T of the stored (in x out))  x^T (in x N)   [+ bias, relu]
//   dX        dx^T (in x N)   = W^T (stored (in x out))              dy^T (out x N)
//   dW        dW^T (in x out) = x^T (stored (in x N))                dy  (op T of the stored (out x N))
// db is column_sum(dy) (cuda_kernels.hpp). With the relu epilogue, y = relu(x W^T + b) and the
// backward first masks dy with activation_backward(relu, y, ...), since relu'(z) = [y > 0].
//
// Every pointer must be 16-byte aligned (the algorithms are chosen for that alignment; blocks from
// CachingDeviceAllocator are 256-byte aligned).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

enum class LinearEpilogue { none, bias, bias_relu };
// f32: float32 products (CUBLAS_COMPUTE_32F, no TF32). bf16: float32 tensors, products on bf16
// tensor cores with float32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF): ~1e-2 relative accuracy.
enum class MathMode { f32, bf16 };

struct LinearConfig {
  int64_t batch = 0;  // N, rows of x and y
  int64_t in_features = 0;
  int64_t out_features = 0;
  LinearEpilogue epilogue = LinearEpilogue::bias;
  MathMode math = MathMode::f32;
  std::size_t workspace_limit = std::size_t{32} << 20;  // what the algorithms may use at most
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
  struct Gemm {
    cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatrixLayoutOpaque_t a{}, b{}, c{};
    cublasLtMatmulAlgo_t algo{};
  };
  void prepare(Gemm& g, const char* what, cublasOperation_t ta, cublasOperation_t tb, uint64_t m, uint64_t n,
               uint64_t k, cublasLtEpilogue_t epilogue);
  void init_desc(cublasLtMatmulDescOpaque_t& desc, const Gemm& g, const void* bias) const;
  void run(const Gemm& g, const char* what, const void* a, const void* b, void* c, float beta, const void* bias,
           void* workspace, cudaStream_t stream) const;

  cublasLtHandle_t handle_;
  LinearConfig config_;
  std::size_t workspace_bytes_ = 0;
  Gemm forward_, backward_input_, backward_weight_;
};

}  // namespace treadle::cuda

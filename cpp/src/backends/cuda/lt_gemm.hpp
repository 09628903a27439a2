#pragma once
// cuBLASLt products of float32 tensors, prepared once per shape: the layouts are built and one
// algorithm chosen by cuBLASLt's heuristic; each call then builds its operation descriptor on the
// stack (no allocation, nothing shared is written), so one prepared object serves concurrent
// contexts on different threads and streams.
//
//   LtGemm    one column-major product C (m x n) = op(A) op(B) [+ bias per row of C] [relu], the
//             building block of LtLinear and LtMatmul.
//   LtMatmul  the core's matmul op on row-major tensors: c (M, N) = op(a) op(b), with a stored as
//             (M, K), or (K, M) when trans_a, and b as (K, N), or (N, K) when trans_b.
//
// Every pointer must be 16-byte aligned (the algorithms are chosen for that; blocks from
// CachingDeviceAllocator are 256-byte aligned and the core's arena offsets 64-byte aligned).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// f32: float32 products (CUBLAS_COMPUTE_32F, no TF32). bf16: float32 tensors, products on tensor
// cores with float32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF, which lets cuBLASLt round the
// operands to bf16 or TF32): ~1e-2 relative accuracy.
enum class MathMode { f32, bf16 };
const char* math_name(MathMode m);

constexpr std::size_t kDefaultGemmWorkspace = std::size_t{32} << 20;

// Throws ValueError naming `who` when p is null or not 16-byte aligned.
void check_gemm_pointer(const char* who, const char* name, const void* p);

struct GemmShape {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint64_t m = 0, n = 0, k = 0;  // C is m x n, the inner dimension k; all >= 1
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // DEFAULT, BIAS or RELU_BIAS
};

class LtGemm {
 public:
  LtGemm() = default;  // not prepared: for shapes with nothing to multiply
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Throws RuntimeError (naming `who` and the shape) when cuBLASLt has no algorithm.
  void prepare(cublasLtHandle_t handle, const GemmShape& shape, MathMode math, std::size_t workspace_limit,
               const char* who);
  bool prepared() const { return handle_ != nullptr; }
  std::size_t workspace_bytes() const { return workspace_; }
  // C = op(A) op(B) (+ bias) + beta * C; `workspace_bytes` is what the caller provides (>= workspace_bytes()).
  void run(const void* a, const void* b, void* c, float beta, const void* bias, void* workspace,
           std::size_t workspace_bytes, cudaStream_t stream, const char* who) const;

 private:
  void init_desc(cublasLtMatmulDescOpaque_t& desc, const void* bias) const;

  cublasLtHandle_t handle_ = nullptr;
  GemmShape shape_;
  MathMode math_ = MathMode::f32;
  cublasLtMatrixLayoutOpaque_t a_{}, b_{}, c_{};
  cublasLtMatmulAlgo_t algo_{};
  std::size_t workspace_ = 0;
};

struct MatmulConfig {
  int64_t m = 0, k = 0, n = 0;  // c (m, n) = op(a) (m, k) @ op(b) (k, n)
  bool trans_a = false, trans_b = false;
  MathMode math = MathMode::f32;
  std::size_t workspace_limit = kDefaultGemmWorkspace;
};

class LtMatmul {
 public:
  // Throws ValueError for a bad shape, RuntimeError when cuBLASLt has no algorithm for it.
  LtMatmul(cublasLtHandle_t handle, const MatmulConfig& config);
  const MatmulConfig& config() const { return config_; }
  std::size_t workspace_bytes() const { return gemm_.workspace_bytes(); }
  // c = op(a) op(b), or c += op(a) op(b) when `accumulate`.
  void run(const float* a, const float* b, float* c, bool accumulate, void* workspace, cudaStream_t stream) const;

 private:
  MatmulConfig config_;
  LtGemm gemm_;
};

}  // namespace treadle::cuda

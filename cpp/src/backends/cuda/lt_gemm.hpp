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

// f32: float32 products (CUBLAS_COMPUTE_32F, no TF32).
// bf16: float32 tensors, products on tensor cores with float32 accumulation
//   (CUBLAS_COMPUTE_32F_FAST_16BF, which lets cuBLASLt round the operands to bf16 or TF32 as each
//   algorithm likes): ~1e-2 relative accuracy, no extra memory traffic.
// bf16_operands: the core's `precision: "bf16"` exactly: both operands rounded to bf16 (to nearest,
//   ties to even) into the workspace, then bf16 x bf16 products with float32 accumulation and
//   float32 output (and bias). Products of bf16 values are exact in float32, so the result differs
//   from the float64 product of the rounded operands by the summation's rounding only.
// fp16_operands: the core's `precision: "fp16"` likewise, with IEEE half operands (subnormals kept,
//   overflow to Inf): fp16 x fp16 products on tensor cores, float32 accumulation and output.
enum class MathMode { f32, bf16, bf16_operands, fp16_operands };
const char* math_name(MathMode m);
// The operand type of the products (CUDA_R_16BF for bf16_operands, CUDA_R_16F for fp16_operands,
// else CUDA_R_32F).
cudaDataType_t operand_type(MathMode m);

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

// Workspace layout of a staged product (bf16/fp16_operands): [gemm scratch][A 16-bit][B 16-bit], each
// part 256-byte aligned. For other modes the operands are used in place and only scratch is needed.
struct StagedWorkspace {
  std::size_t gemm = 0;     // bytes of cuBLASLt scratch, at offset 0
  std::size_t a_offset = 0, b_offset = 0;
  std::size_t total = 0;
};
StagedWorkspace staged_workspace(MathMode math, std::size_t gemm_bytes, int64_t a_elements, int64_t b_elements);
// The operands the product reads: `a`, `b` themselves, or (bf16/fp16_operands) their 16-bit copies written
// into the workspace on `stream`.
struct StagedOperands {
  const void* a;
  const void* b;
};
StagedOperands stage_operands(MathMode math, const StagedWorkspace& layout, const float* a, int64_t a_elements,
                              const float* b, int64_t b_elements, void* workspace, cudaStream_t stream);

class LtMatmul {
 public:
  // Throws ValueError for a bad shape, RuntimeError when cuBLASLt has no algorithm for it.
  LtMatmul(cublasLtHandle_t handle, const MatmulConfig& config);
  const MatmulConfig& config() const { return config_; }
  std::size_t workspace_bytes() const { return workspace_.total; }
  // c = op(a) op(b), or c += op(a) op(b) when `accumulate`.
  void run(const float* a, const float* b, float* c, bool accumulate, void* workspace, cudaStream_t stream) const;

 private:
  MatmulConfig config_;
  LtGemm gemm_;
  StagedWorkspace workspace_;
};

}  // namespace treadle::cuda

#pragma once
// LtBmm: the core's bmm op as one strided-batched cuBLASLt product, prepared once per shape like
// LtMatmul (lt_gemm.hpp): c (B, M, N) = op(a) op(b) per batch element, a stored (B, M, K), or
// (B, K, M) when trans_a, b stored (B, K, N), or (B, N, K) when trans_b, all row-major and
// contiguous. Math f32 (no TF32) or the exact 16-bit operands of `precision: "bf16"` / "fp16"
// (staged as LtMatmul stages them).
//
// The batch strides need not be multiples of 16 bytes (attention's per-head matrices often are
// not): the heuristic is told the alignment every batch element really has (16, 8 or 4 bytes from
// the base pointers and strides), and the base pointers are checked against it.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/lt_gemm.hpp"

namespace treadle::cuda {

struct BmmConfig {
  int64_t batch = 0, m = 0, k = 0, n = 0;  // c (batch, m, n) = op(a) (m, k) @ op(b) (k, n) per element
  bool trans_a = false, trans_b = false;
  MathMode math = MathMode::f32;
  std::size_t workspace_limit = kDefaultGemmWorkspace;
};

class LtBmm {
 public:
  // Throws ValueError for a bad shape, RuntimeError when cuBLASLt has no algorithm for it.
  LtBmm(cublasLtHandle_t handle, const BmmConfig& config);
  LtBmm(const LtBmm&) = delete;
  LtBmm& operator=(const LtBmm&) = delete;
  const BmmConfig& config() const { return config_; }
  std::size_t workspace_bytes() const { return staged_.total; }
  // c = op(a) op(b) per batch element; k == 0 or an empty batch writes zeros (or nothing).
  void run(const float* a, const float* b, float* c, void* workspace, cudaStream_t stream) const;

 private:
  BmmConfig config_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatrixLayoutOpaque_t a_{}, b_{}, c_{};  // the column-major view: A' = b, B' = a
  cublasLtMatmulAlgo_t algo_{};
  std::size_t gemm_workspace_ = 0;
  StagedWorkspace staged_;
  uint32_t align_a_ = 16, align_b_ = 16, align_c_ = 16;  // bytes, of every batch element
  bool empty_ = true;                                     // nothing to multiply (zeros or nothing)
};

}  // namespace treadle::cuda

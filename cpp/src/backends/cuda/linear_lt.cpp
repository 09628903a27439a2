// cuBLASLt linear: three prepared products (forward with the bias epilogue, dX, dW).
#include "backends/cuda/linear_lt.hpp"

#include <algorithm>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

LtLinear::LtLinear(cublasLtHandle_t handle, const LinearConfig& c) : config_(c) {
  if (handle == nullptr) throw_value_error("linear: null cuBLASLt handle");
  if (c.batch < 0 || c.in_features < 1 || c.out_features < 1)
    throw_value_error("linear: expected batch >= 0 and in, out >= 1, got batch ", c.batch, ", in ", c.in_features,
                      ", out ", c.out_features);
  if (c.batch == 0) return;  // nothing to multiply; backward_weight only zero-fills
  const auto n = static_cast<uint64_t>(c.batch), in = static_cast<uint64_t>(c.in_features),
             out = static_cast<uint64_t>(c.out_features);
  const cublasLtEpilogue_t epi = c.epilogue == LinearEpilogue::bias_relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                 : c.epilogue == LinearEpilogue::bias    ? CUBLASLT_EPILOGUE_BIAS
                                                                         : CUBLASLT_EPILOGUE_DEFAULT;
  forward_.prepare(handle, GemmShape{CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, epi}, c.math, c.workspace_limit,
                   "linear forward");
  backward_input_.prepare(handle, GemmShape{CUBLAS_OP_N, CUBLAS_OP_N, in, n, out}, c.math, c.workspace_limit,
                          "linear backward_input");
  backward_weight_.prepare(handle, GemmShape{CUBLAS_OP_N, CUBLAS_OP_T, in, out, n}, c.math, c.workspace_limit,
                           "linear backward_weight");
  // Operand element counts per product (first operand, second), for bf16 copies in the workspace.
  const int64_t nx = c.batch * c.in_features, nw = c.out_features * c.in_features, ndy = c.batch * c.out_features;
  forward_ws_ = staged_workspace(c.math, forward_.workspace_bytes(), nw, nx);
  backward_input_ws_ = staged_workspace(c.math, backward_input_.workspace_bytes(), nw, ndy);
  backward_weight_ws_ = staged_workspace(c.math, backward_weight_.workspace_bytes(), nx, ndy);
  workspace_bytes_ = std::max({forward_ws_.total, backward_input_ws_.total, backward_weight_ws_.total});
}

void LtLinear::forward(const float* x, const float* w, const float* b, float* y, void* workspace,
                       cudaStream_t stream) const {
  if (config_.batch == 0) return;
  check_gemm_pointer("linear forward", "x", x);
  check_gemm_pointer("linear forward", "weight", w);
  check_gemm_pointer("linear forward", "y", y);
  if (config_.epilogue != LinearEpilogue::none) check_gemm_pointer("linear forward", "bias", b);
  const int64_t nx = config_.batch * config_.in_features, nw = config_.out_features * config_.in_features;
  const StagedOperands op = stage_operands(config_.math, forward_ws_, w, nw, x, nx, workspace, stream);
  forward_.run(op.a, op.b, y, 0.0f, b, workspace, forward_ws_.gemm, stream, "linear forward: cublasLtMatmul");
}

void LtLinear::backward_input(const float* dy, const float* w, float* dx, void* workspace, cudaStream_t stream) const {
  if (config_.batch == 0) return;
  check_gemm_pointer("linear backward_input", "dy", dy);
  check_gemm_pointer("linear backward_input", "weight", w);
  check_gemm_pointer("linear backward_input", "dx", dx);
  const int64_t nw = config_.out_features * config_.in_features, ndy = config_.batch * config_.out_features;
  const StagedOperands op = stage_operands(config_.math, backward_input_ws_, w, nw, dy, ndy, workspace, stream);
  backward_input_.run(op.a, op.b, dx, 0.0f, nullptr, workspace, backward_input_ws_.gemm, stream,
                      "linear backward_input: cublasLtMatmul");
}

void LtLinear::backward_weight(const float* dy, const float* x, float* dw, bool accumulate, void* workspace,
                               cudaStream_t stream) const {
  check_gemm_pointer("linear backward_weight", "dW", dw);
  if (config_.batch == 0) {  // an empty batch contributes nothing
    const auto bytes = static_cast<std::size_t>(config_.in_features * config_.out_features) * sizeof(float);
    if (!accumulate) check_cuda(cudaMemsetAsync(dw, 0, bytes, stream), "linear backward_weight: cudaMemsetAsync");
    return;
  }
  check_gemm_pointer("linear backward_weight", "dy", dy);
  check_gemm_pointer("linear backward_weight", "x", x);
  const int64_t nx = config_.batch * config_.in_features, ndy = config_.batch * config_.out_features;
  const StagedOperands op = stage_operands(config_.math, backward_weight_ws_, x, nx, dy, ndy, workspace, stream);
  backward_weight_.run(op.a, op.b, dw, accumulate ? 1.0f : 0.0f, nullptr, workspace, backward_weight_ws_.gemm, stream,
                       "linear backward_weight: cublasLtMatmul");
}

}  // namespace treadle::cuda

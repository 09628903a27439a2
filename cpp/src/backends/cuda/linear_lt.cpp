// cuBLASLt linear: layouts and algorithms chosen once per shape, then launches only.
#include "backends/cuda/linear_lt.hpp"

#include <cstdint>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr uint32_t kAlignment = 16;
// Heuristics read the bias pointer's value only for its alignment; any 16-byte aligned address will do.
const void* const kAlignedPlaceholder = reinterpret_cast<const void*>(uintptr_t{256});

cublasComputeType_t compute_type(MathMode m) {
  return m == MathMode::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

const char* math_name(MathMode m) { return m == MathMode::bf16 ? "bf16" : "f32"; }

void check_aligned(const char* fn, const char* name, const void* p) {
  if (p == nullptr) throw_value_error("linear ", fn, ": ", name, " is a null device pointer");
  if (reinterpret_cast<uintptr_t>(p) % kAlignment != 0)
    throw_value_error("linear ", fn, ": ", name, " at ", p, " is not ", kAlignment, "-byte aligned");
}

template <typename T>
void set_desc(cublasLtMatmulDescOpaque_t& d, cublasLtMatmulDescAttributes_t attr, const T& value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(&d, attr, &value, sizeof(value)), what);
}

// cublasLtMatmul takes layouts through non-const pointers but only reads them (inputs).
cublasLtMatrixLayout_t input_layout(const cublasLtMatrixLayoutOpaque_t& l) {
  return const_cast<cublasLtMatrixLayout_t>(&l);
}

}  // namespace

LtLinear::LtLinear(cublasLtHandle_t handle, const LinearConfig& c) : handle_(handle), config_(c) {
  if (handle == nullptr) throw_value_error("linear: null cuBLASLt handle");
  if (c.batch < 0 || c.in_features < 1 || c.out_features < 1)
    throw_value_error("linear: expected batch >= 0 and in, out >= 1, got batch ", c.batch, ", in ", c.in_features,
                      ", out ", c.out_features);
  const auto n = static_cast<uint64_t>(c.batch), in = static_cast<uint64_t>(c.in_features),
             out = static_cast<uint64_t>(c.out_features);
  const cublasLtEpilogue_t epi = c.epilogue == LinearEpilogue::bias_relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                 : c.epilogue == LinearEpilogue::bias    ? CUBLASLT_EPILOGUE_BIAS
                                                                         : CUBLASLT_EPILOGUE_DEFAULT;
  if (n == 0) return;  // nothing to multiply; backward_weight only zero-fills
  prepare(forward_, "forward", CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, epi);
  prepare(backward_input_, "backward_input", CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, CUBLASLT_EPILOGUE_DEFAULT);
  prepare(backward_weight_, "backward_weight", CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, CUBLASLT_EPILOGUE_DEFAULT);
}

void LtLinear::init_desc(cublasLtMatmulDescOpaque_t& desc, const Gemm& g, const void* bias) const {
  check_cublas(cublasLtMatmulDescInit(&desc, compute_type(config_.math), CUDA_R_32F), "linear: cublasLtMatmulDescInit");
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, g.trans_a, "linear: set TRANSA");
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, g.trans_b, "linear: set TRANSB");
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue, "linear: set EPILOGUE");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F, "linear: set BIAS_DATA_TYPE");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "linear: set BIAS_POINTER");
  }
}

// Stored shapes: A is (k x m) when transposed else (m x k); B is (n x k) when transposed else (k x n).
void LtLinear::prepare(Gemm& g, const char* what, cublasOperation_t ta, cublasOperation_t tb, uint64_t m, uint64_t n,
                       uint64_t k, cublasLtEpilogue_t epilogue) {
  g.trans_a = ta;
  g.trans_b = tb;
  g.epilogue = epilogue;
  const uint64_t a_rows = ta == CUBLAS_OP_T ? k : m, a_cols = ta == CUBLAS_OP_T ? m : k;
  const uint64_t b_rows = tb == CUBLAS_OP_T ? n : k, b_cols = tb == CUBLAS_OP_T ? k : n;
  check_cublas(cublasLtMatrixLayoutInit(&g.a, CUDA_R_32F, a_rows, a_cols, static_cast<int64_t>(a_rows)),
               "linear: cublasLtMatrixLayoutInit(A)");
  check_cublas(cublasLtMatrixLayoutInit(&g.b, CUDA_R_32F, b_rows, b_cols, static_cast<int64_t>(b_rows)),
               "linear: cublasLtMatrixLayoutInit(B)");
  check_cublas(cublasLtMatrixLayoutInit(&g.c, CUDA_R_32F, m, n, static_cast<int64_t>(m)),
               "linear: cublasLtMatrixLayoutInit(C)");

  cublasLtMatmulDescOpaque_t desc;
  init_desc(desc, g, kAlignedPlaceholder);
  cublasLtMatmulPreferenceOpaque_t pref;
  check_cublas(cublasLtMatmulPreferenceInit(&pref), "linear: cublasLtMatmulPreferenceInit");
  const std::size_t limit = config_.workspace_limit;
  check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit,
                                                    sizeof(limit)),
               "linear: set MAX_WORKSPACE_BYTES");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attr, &kAlignment, sizeof(kAlignment)),
                 "linear: set MIN_ALIGNMENT");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(handle_, &desc, &g.a, &g.b, &g.c, &g.c, &pref, 1, &result, &found),
               "linear: cublasLtMatmulAlgoGetHeuristic");
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    throw RuntimeError(detail::concat("linear ", what, ": cuBLASLt has no algorithm for m=", m, ", n=", n, ", k=", k,
                                      " (batch ", config_.batch, ", in ", config_.in_features, ", out ",
                                      config_.out_features, ", math ", math_name(config_.math), ", workspace limit ",
                                      limit, " bytes)"));
  g.algo = result.algo;
  if (result.workspaceSize > workspace_bytes_) workspace_bytes_ = result.workspaceSize;
}

void LtLinear::run(const Gemm& g, const char* what, const void* a, const void* b, void* c, float beta,
                   const void* bias, void* workspace, cudaStream_t stream) const {
  if (workspace_bytes_ > 0 && workspace == nullptr)
    throw_value_error("linear ", what, ": needs a device workspace of ", workspace_bytes_, " bytes, got null");
  cublasLtMatmulDescOpaque_t desc;  // on the stack: concurrent calls share nothing mutable
  init_desc(desc, g, bias);
  const float alpha = 1.0f;
  cublasLtMatrixLayout_t lc = input_layout(g.c);
  check_cublas(cublasLtMatmul(handle_, &desc, &alpha, a, input_layout(g.a), b, input_layout(g.b), &beta, c, lc, c, lc,
                              &g.algo, workspace, workspace_bytes_, stream),
               what);
}

void LtLinear::forward(const float* x, const float* w, const float* b, float* y, void* workspace,
                       cudaStream_t stream) const {
  if (config_.batch == 0) return;
  check_aligned("forward", "x", x);
  check_aligned("forward", "weight", w);
  check_aligned("forward", "y", y);
  if (config_.epilogue != LinearEpilogue::none) check_aligned("forward", "bias", b);
  run(forward_, "linear forward: cublasLtMatmul", w, x, y, 0.0f, b, workspace, stream);
}

void LtLinear::backward_input(const float* dy, const float* w, float* dx, void* workspace, cudaStream_t stream) const {
  if (config_.batch == 0) return;
  check_aligned("backward_input", "dy", dy);
  check_aligned("backward_input", "weight", w);
  check_aligned("backward_input", "dx", dx);
  run(backward_input_, "linear backward_input: cublasLtMatmul", w, dy, dx, 0.0f, nullptr, workspace, stream);
}

void LtLinear::backward_weight(const float* dy, const float* x, float* dw, bool accumulate, void* workspace,
                               cudaStream_t stream) const {
  check_aligned("backward_weight", "dW", dw);
  if (config_.batch == 0) {  // an empty batch contributes nothing
    if (!accumulate)
      check_cuda(cudaMemsetAsync(dw, 0, static_cast<std::size_t>(config_.in_features * config_.out_features) * 4, stream),
                 "linear backward_weight: cudaMemsetAsync");
    return;
  }
  check_aligned("backward_weight", "dy", dy);
  check_aligned("backward_weight", "x", x);
  run(backward_weight_, "linear backward_weight: cublasLtMatmul", x, dy, dw, accumulate ? 1.0f : 0.0f, nullptr,
      workspace, stream);
}

}  // namespace treadle::cuda

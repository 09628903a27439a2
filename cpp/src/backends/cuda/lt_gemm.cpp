// cuBLASLt products: layouts and algorithm chosen once, then launches only.
#include "backends/cuda/lt_gemm.hpp"

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/loss_scale.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr uint32_t kAlignment = 16;
// Heuristics read the bias pointer only for its alignment; any 16-byte aligned address will do.
const void* const kAlignedPlaceholder = reinterpret_cast<const void*>(uintptr_t{256});

cublasComputeType_t compute_type(MathMode m) {
  return m == MathMode::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

bool staged(MathMode m) { return m == MathMode::bf16_operands || m == MathMode::fp16_operands; }

template <typename T>
void set_desc(cublasLtMatmulDescOpaque_t& d, cublasLtMatmulDescAttributes_t attr, const T& value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(&d, attr, &value, sizeof(value)), what);
}

// cublasLtMatmul takes layouts through non-const pointers but only reads them.
cublasLtMatrixLayout_t input_layout(const cublasLtMatrixLayoutOpaque_t& l) {
  return const_cast<cublasLtMatrixLayout_t>(&l);
}

}  // namespace

const char* math_name(MathMode m) {
  switch (m) {
    case MathMode::f32: return "f32";
    case MathMode::bf16: return "bf16";
    case MathMode::bf16_operands: return "bf16_operands";
    case MathMode::fp16_operands: return "fp16_operands";
  }
  return "unknown";
}

cudaDataType_t operand_type(MathMode m) {
  return m == MathMode::bf16_operands ? CUDA_R_16BF : m == MathMode::fp16_operands ? CUDA_R_16F : CUDA_R_32F;
}

StagedWorkspace staged_workspace(MathMode math, std::size_t gemm_bytes, int64_t a_elements, int64_t b_elements) {
  StagedWorkspace w;
  w.gemm = gemm_bytes;
  if (!staged(math)) {
    w.total = gemm_bytes;
    return w;
  }
  w.a_offset = align256(gemm_bytes);
  w.b_offset = w.a_offset + align256(static_cast<std::size_t>(a_elements) * 2);
  w.total = w.b_offset + align256(static_cast<std::size_t>(b_elements) * 2);
  return w;
}

StagedOperands stage_operands(MathMode math, const StagedWorkspace& layout, const float* a, int64_t a_elements,
                              const float* b, int64_t b_elements, void* workspace, cudaStream_t stream) {
  if (!staged(math)) return {a, b};
  if (workspace == nullptr)
    throw_value_error(math_name(math), ": need a device workspace of ", layout.total, " bytes, got null");
  auto* base = static_cast<char*>(workspace);
  auto* a16 = reinterpret_cast<uint16_t*>(base + layout.a_offset);
  auto* b16 = reinterpret_cast<uint16_t*>(base + layout.b_offset);
  if (math == MathMode::bf16_operands) {
    round_to_bf16(a, a16, a_elements, stream);
    round_to_bf16(b, b16, b_elements, stream);
  } else {
    float_to_fp16(a, a16, a_elements, stream);
    float_to_fp16(b, b16, b_elements, stream);
  }
  return {a16, b16};
}

void check_gemm_pointer(const char* who, const char* name, const void* p) {
  if (p == nullptr) throw_value_error(who, ": ", name, " is a null device pointer");
  if (reinterpret_cast<uintptr_t>(p) % kAlignment != 0)
    throw_value_error(who, ": ", name, " at ", p, " is not ", kAlignment, "-byte aligned");
}

void LtGemm::init_desc(cublasLtMatmulDescOpaque_t& desc, const void* bias) const {
  check_cublas(cublasLtMatmulDescInit(&desc, compute_type(math_), CUDA_R_32F), "cublasLtMatmulDescInit");
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, shape_.trans_a, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, shape_.trans_b, "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (shape_.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, shape_.epilogue, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F, "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
}

// Stored shapes: A is (k x m) when transposed else (m x k); B is (n x k) when transposed else (k x n).
void LtGemm::prepare(cublasLtHandle_t handle, const GemmShape& s, MathMode math, std::size_t workspace_limit,
                     const char* who) {
  if (handle == nullptr) throw_value_error(who, ": null cuBLASLt handle");
  shape_ = s;
  math_ = math;
  const bool ta = s.trans_a == CUBLAS_OP_T, tb = s.trans_b == CUBLAS_OP_T;
  const uint64_t a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
  const uint64_t b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
  const cudaDataType_t ab = operand_type(math);
  check_cublas(cublasLtMatrixLayoutInit(&a_, ab, a_rows, a_cols, static_cast<int64_t>(a_rows)),
               "cublasLtMatrixLayoutInit(A)");
  check_cublas(cublasLtMatrixLayoutInit(&b_, ab, b_rows, b_cols, static_cast<int64_t>(b_rows)),
               "cublasLtMatrixLayoutInit(B)");
  check_cublas(cublasLtMatrixLayoutInit(&c_, CUDA_R_32F, s.m, s.n, static_cast<int64_t>(s.m)),
               "cublasLtMatrixLayoutInit(C)");
  cublasLtMatmulDescOpaque_t desc;
  init_desc(desc, kAlignedPlaceholder);
  cublasLtMatmulPreferenceOpaque_t pref;
  check_cublas(cublasLtMatmulPreferenceInit(&pref), "cublasLtMatmulPreferenceInit");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_limit,
                                                    sizeof(workspace_limit)),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attr, &kAlignment, sizeof(kAlignment)),
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(handle, &desc, &a_, &b_, &c_, &c_, &pref, 1, &result, &found),
               "cublasLtMatmulAlgoGetHeuristic");
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    throw RuntimeError(detail::concat(who, ": cuBLASLt has no algorithm for m=", s.m, ", n=", s.n, ", k=", s.k,
                                      ta ? " (A transposed)" : "", tb ? " (B transposed)" : "", ", math ",
                                      math_name(math), ", epilogue ", static_cast<int>(s.epilogue),
                                      ", workspace limit ", workspace_limit, " bytes"));
  algo_ = result.algo;
  workspace_ = result.workspaceSize;
  handle_ = handle;
}

void LtGemm::run(const void* a, const void* b, void* c, float beta, const void* bias, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream, const char* who) const {
  if (workspace_ > 0 && (workspace == nullptr || workspace_bytes < workspace_))
    throw_value_error(who, ": needs a device workspace of ", workspace_, " bytes, got ", workspace_bytes, " at ",
                      workspace);
  cublasLtMatmulDescOpaque_t desc;  // on the stack: concurrent calls share nothing mutable
  init_desc(desc, bias);
  const float alpha = 1.0f;
  cublasLtMatrixLayout_t lc = input_layout(c_);
  check_cublas(cublasLtMatmul(handle_, &desc, &alpha, a, input_layout(a_), b, input_layout(b_), &beta, c, lc, c, lc,
                              &algo_, workspace, workspace_bytes, stream),
               who);
}

// Row-major c (M, N) is the column-major (N x M) matrix c^T = op(b)^T op(a)^T: a column-major
// product with the operands swapped, m' = N, n' = M, k' = K. A row-major (r, c) array read
// column-major is its transpose, so b as stored is op(b)^T when not trans_b, and its transpose when
// trans_b; likewise a.
LtMatmul::LtMatmul(cublasLtHandle_t handle, const MatmulConfig& c) : config_(c) {
  if (c.m < 0 || c.n < 0 || c.k < 1)
    throw_value_error("matmul: expected m, n >= 0 and k >= 1, got m ", c.m, ", k ", c.k, ", n ", c.n);
  if (c.m == 0 || c.n == 0) return;
  GemmShape s;
  s.trans_a = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.trans_b = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.m = static_cast<uint64_t>(c.n);
  s.n = static_cast<uint64_t>(c.m);
  s.k = static_cast<uint64_t>(c.k);
  gemm_.prepare(handle, s, c.math, c.workspace_limit, "matmul");
  workspace_ = staged_workspace(c.math, gemm_.workspace_bytes(), c.k * c.n, c.m * c.k);
}

void LtMatmul::run(const float* a, const float* b, float* c, bool accumulate, void* workspace,
                   cudaStream_t stream) const {
  if (!gemm_.prepared()) return;  // an empty product
  check_gemm_pointer("matmul", "a", a);
  check_gemm_pointer("matmul", "b", b);
  check_gemm_pointer("matmul", "c", c);
  // The product's first operand is b (see the constructor).
  const StagedOperands op = stage_operands(config_.math, workspace_, b, config_.k * config_.n, a,
                                           config_.m * config_.k, workspace, stream);
  gemm_.run(op.a, op.b, c, accumulate ? 1.0f : 0.0f, nullptr, workspace, workspace_.gemm, stream,
            "matmul: cublasLtMatmul");
}

}  // namespace treadle::cuda

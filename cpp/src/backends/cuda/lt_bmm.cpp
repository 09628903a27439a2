// The batched product of the core's bmm op through cuBLASLt's strided batches.
#include "backends/cuda/lt_bmm.hpp"

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// The largest of 16, 8, 4 bytes dividing a batch stride of `elements` values of `bytes` each.
uint32_t stride_alignment(int64_t elements, std::size_t bytes) {
  const auto stride = static_cast<uint64_t>(elements) * bytes;
  for (uint32_t a : {16u, 8u, 4u})
    if (stride % a == 0) return a;
  return static_cast<uint32_t>(bytes);  // 16-bit operands' strides of odd length: 2 bytes
}

void init_layout(cublasLtMatrixLayoutOpaque_t& l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t batch,
                 int64_t stride, const char* what) {
  check_cublas(cublasLtMatrixLayoutInit(&l, type, rows, cols, static_cast<int64_t>(rows)), what);
  const auto count = static_cast<int32_t>(batch);
  check_cublas(cublasLtMatrixLayoutSetAttribute(&l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), what);
  check_cublas(cublasLtMatrixLayoutSetAttribute(&l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof(stride)),
               what);
}

void init_desc(cublasLtMatmulDescOpaque_t& desc, cublasOperation_t ta, cublasOperation_t tb) {
  check_cublas(cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "bmm: cublasLtMatmulDescInit");
  check_cublas(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
               "bmm: cublasLtMatmulDescSetAttribute(TRANSA)");
  check_cublas(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
               "bmm: cublasLtMatmulDescSetAttribute(TRANSB)");
}

void check_aligned(const char* name, const void* p, uint32_t alignment) {
  if (p == nullptr) throw_value_error("bmm: ", name, " is a null device pointer");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    throw_value_error("bmm: ", name, " at ", p, " is not ", alignment, "-byte aligned");
}

}  // namespace

// As LtMatmul: row-major c (M, N) is the column-major product c^T = op(b)^T op(a)^T, so the
// column-major operands are A' = b (m' = N) and B' = a (n' = M), with the transposes swapped.
LtBmm::LtBmm(cublasLtHandle_t handle, const BmmConfig& c) : config_(c) {
  if (c.batch < 0 || c.m < 0 || c.n < 0 || c.k < 0)
    throw_value_error("bmm: expected non-negative sizes, got batch ", c.batch, ", m ", c.m, ", k ", c.k, ", n ", c.n);
  if (c.batch > INT32_MAX) throw_value_error("bmm: batch ", c.batch, " exceeds cuBLASLt's 32-bit batch count");
  if (handle == nullptr) throw_value_error("bmm: null cuBLASLt handle");
  empty_ = c.batch == 0 || c.m == 0 || c.n == 0 || c.k == 0;
  if (empty_) return;
  const cublasOperation_t ta = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto m = static_cast<uint64_t>(c.n), n = static_cast<uint64_t>(c.m), k = static_cast<uint64_t>(c.k);
  const cudaDataType_t ab = operand_type(c.math);
  const std::size_t ab_bytes = operand_type(c.math) == CUDA_R_32F ? 4 : 2;
  init_layout(a_, ab, ta == CUBLAS_OP_T ? k : m, ta == CUBLAS_OP_T ? m : k, c.batch, c.k * c.n, "bmm: layout A");
  init_layout(b_, ab, tb == CUBLAS_OP_T ? n : k, tb == CUBLAS_OP_T ? k : n, c.batch, c.m * c.k, "bmm: layout B");
  init_layout(c_, CUDA_R_32F, m, n, c.batch, c.m * c.n, "bmm: layout C");
  align_a_ = stride_alignment(c.k * c.n, ab_bytes);
  align_b_ = stride_alignment(c.m * c.k, ab_bytes);
  align_c_ = stride_alignment(c.m * c.n, 4);

  cublasLtMatmulDescOpaque_t desc;
  init_desc(desc, ta, tb);
  cublasLtMatmulPreferenceOpaque_t pref;
  check_cublas(cublasLtMatmulPreferenceInit(&pref), "bmm: cublasLtMatmulPreferenceInit");
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* value, std::size_t size) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attr, value, size),
                 "bmm: cublasLtMatmulPreferenceSetAttribute");
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c.workspace_limit, sizeof(c.workspace_limit));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a_, sizeof(align_a_));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b_, sizeof(align_b_));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c_, sizeof(align_c_));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c_, sizeof(align_c_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(handle, &desc, &a_, &b_, &c_, &c_, &pref, 1, &result, &found),
               "bmm: cublasLtMatmulAlgoGetHeuristic");
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    throw RuntimeError(detail::concat("bmm: cuBLASLt has no algorithm for batch ", c.batch, ", m=", c.m, ", n=", c.n,
                                      ", k=", c.k, c.trans_a ? " (a transposed)" : "",
                                      c.trans_b ? " (b transposed)" : "", ", math ", math_name(c.math)));
  algo_ = result.algo;
  gemm_workspace_ = result.workspaceSize;
  staged_ = staged_workspace(c.math, gemm_workspace_, c.batch * c.k * c.n, c.batch * c.m * c.k);
  handle_ = handle;
}

void LtBmm::run(const float* a, const float* b, float* c, void* workspace, cudaStream_t stream) const {
  const BmmConfig& k = config_;
  const int64_t c_elements = k.batch * k.m * k.n;
  if (empty_) {  // k == 0: every product is an empty sum
    if (c_elements > 0)
      check_cuda(cudaMemsetAsync(c, 0, static_cast<std::size_t>(c_elements) * sizeof(float), stream),
                 "bmm: cudaMemsetAsync(c)");
    return;
  }
  if (staged_.total > 0 && workspace == nullptr)
    throw_value_error("bmm: needs a device workspace of ", staged_.total, " bytes, got null");
  const StagedOperands op =
      stage_operands(k.math, staged_, b, k.batch * k.k * k.n, a, k.batch * k.m * k.k, workspace, stream);
  check_aligned("b", op.a, align_a_);
  check_aligned("a", op.b, align_b_);
  check_aligned("c", c, align_c_);
  cublasLtMatmulDescOpaque_t desc;  // on the stack: concurrent calls share nothing mutable
  init_desc(desc, k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  const float alpha = 1.0f, beta = 0.0f;
  auto layout = [](const cublasLtMatrixLayoutOpaque_t& l) { return const_cast<cublasLtMatrixLayout_t>(&l); };
  check_cublas(cublasLtMatmul(handle_, &desc, &alpha, op.a, layout(a_), op.b, layout(b_), &beta, c, layout(c_), c,
                              layout(c_), &algo_, workspace, staged_.gemm, stream),
               "bmm: cublasLtMatmul");
}

}  // namespace treadle::cuda

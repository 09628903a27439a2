// Reference GEMM kernels. Rows of the output are split over the host's executor; each row is
// computed by exactly one chunk, so the result does not depend on how the executor chunks. With bf16
// or fp16 compute the GEMMs read rounded copies of the operands (rounded_operands.hpp).
#include "backends/eigen/rounded_operands.hpp"
#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/epilogue.hpp"
#include "backends/eigen/small_gemm.hpp"

namespace treadle {
namespace {
using namespace eigen;

// Rows per chunk: at least 128 (so each chunk is an efficient GEMM) and enough work per chunk
// (~64k multiply-adds) to amortise dispatch. Depends on the problem only, never on the workers.
int64_t row_grain(int64_t flops_per_row) {
  return std::max<int64_t>(128, (1 << 16) / std::max<int64_t>(1, flops_per_row));
}

// Products of at least 16 rows and 16 columns run on small_gemm where it beats Eigen's GEMM (CPUs
// with FMA; B packed per chunk): on AMD Zen 3 1.1-1.3x at 32 x 32 x 32, 1.25-1.5x at 128 x 128 x 128,
// 1.8x at 256^3 (forward, dx and dW shapes alike). Below 16 either way Eigen's kernels are as fast or
// faster (0.76x at 12 x 32 x 32, 0.85x with 8 output columns).
bool small_gemm_pays(int64_t rows, int64_t cols) {
  return small_gemm::kBeatsEigen && rows >= 16 && cols >= 16;
}

template <typename T>
void linear_kernel(const KernelArgs& a) {
  const TensorRef &x = a.in[0], &w = a.in[1], &y = a.out[0];
  const int64_t in = w.dim(1), out = w.dim(0), rows = x.numel / in;
  const T *px, *pw;
  std::tie(px, pw) = product_operands<T>(a);
  ConstMapR<T> W(pw, out, in);
  const T* b = a.num_in == 3 ? a.in[2].ptr<T>() : nullptr;
  const Epilogue epilogue = epilogue_of(a.attrs());
  const bool small = small_gemm_pays(rows, out);
  parallel_chunks(a.exec, rows, row_grain(in * out), [&](int64_t r0, int64_t r1) {
    ConstMapR<T> X(px + r0 * in, r1 - r0, in);
    MapR<T> Y(y.ptr<T>() + r0 * out, r1 - r0, out);
    if (small)
      small_gemm::multiply<T>({px + r0 * in, in}, r1 - r0, {pw, in, /*transposed=*/true}, in, out, Y.data(), out);
    else
      Y.noalias() = X * W.transpose();
    if (b) Y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b, out);
    apply_epilogue(epilogue, Y.data(), (r1 - r0) * out);
  });
}

// A weight gradient of a network's 1- to 4-wide input or output layer, C = A^T B with C of at most
// kThin columns and a long inner dimension (the batch), spends most of a blocked GEMM's time packing
// the transposed operand. Here each row of A (contiguous in C's row index) is read once, as rank-1
// updates into a small column-major block. Rows of C are independent and each element sums over
// the inner index in order, so the result does not depend on the chunking.
constexpr int64_t kThin = 4;

template <typename T>
void thin_weight_gradient_rows(const T* a, int64_t lda, const T* b, int64_t ldb, bool tb, int64_t n, int64_t k, T* c,
                               int64_t r0, int64_t r1) {
  constexpr int64_t kBlock = 256;
  T acc[kThin][kBlock];
  for (int64_t i0 = r0; i0 < r1; i0 += kBlock) {
    const int64_t len = std::min(kBlock, r1 - i0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < len; ++i) acc[j][i] = T(0);
    for (int64_t r = 0; r < k; ++r) {
      const T* __restrict ar = a + r * lda + i0;
      for (int64_t j = 0; j < n; ++j) {
        const T brj = tb ? b[j * ldb + r] : b[r * ldb + j];
        T* __restrict accj = acc[j];
        for (int64_t i = 0; i < len; ++i) accj[i] += ar[i] * brj;
      }
    }
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j < n; ++j) c[(i0 + i) * n + j] = acc[j][i];
  }
}

template <typename T>
void matmul_kernel(const KernelArgs& a) {
  const bool ta = a.attrs().i_or("trans_a", 0), tb = a.attrs().i_or("trans_b", 0);
  const TensorRef &A = a.in[0], &B = a.in[1], &C = a.out[0];
  const int64_t m = C.dim(0), n = C.dim(1), k = ta ? A.dim(0) : A.dim(1);
  const T *pa, *pb;
  std::tie(pa, pb) = product_operands<T>(a);
  if (ta && n <= kThin && k > kThin) {
    parallel_chunks(a.exec, m, row_grain(n * k), [&](int64_t r0, int64_t r1) {
      thin_weight_gradient_rows(pa, A.dim(1), pb, B.dim(1), tb, n, k, C.ptr<T>(), r0, r1);
    });
    return;
  }
  const bool small = small_gemm_pays(m, n);
  const small_gemm::View<T> bv{pb, B.dim(1), tb};
  parallel_chunks(a.exec, m, row_grain(n * k), [&](int64_t r0, int64_t r1) {
    // Rows r0.. of op(A): A's rows, or with trans_a its columns.
    const small_gemm::View<T> av{ta ? pa + r0 : pa + r0 * A.dim(1), A.dim(1), ta};
    T* c = C.ptr<T>() + r0 * n;
    if (small) small_gemm::multiply<T>(av, r1 - r0, bv, k, n, c, n);
    else small_gemm::eigen_product<T>(av, r1 - r0, bv, k, n, c, n);
  });
}

}  // namespace

void register_eigen_linear(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "linear", linear_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "matmul", matmul_kernel);
}

}  // namespace treadle

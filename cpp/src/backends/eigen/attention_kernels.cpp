// Reference kernels for batched matmul, permute and the causal mask.
#include <limits>
#include <vector>

#include "backends/eigen/rounded_operands.hpp"
#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace {
using namespace eigen;

// Batch elements are independent, so splitting over them keeps results chunking-independent. With
// bf16 or fp16 compute the GEMMs read rounded copies of the operands (rounded_operands.hpp).
template <typename T>
void bmm_kernel(const KernelArgs& a) {
  const bool ta = a.attrs().i_or("trans_a", 0), tb = a.attrs().i_or("trans_b", 0);
  const TensorRef &A = a.in[0], &B = a.in[1], &C = a.out[0];
  const int64_t batch = A.dim(0), ar = A.dim(1), ac = A.dim(2), br = B.dim(1), bc = B.dim(2);
  const int64_t m = C.dim(1), n = C.dim(2);
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, m * n * (ta ? ar : ac)));
  const T *pa, *pb;
  std::tie(pa, pb) = product_operands<T>(a);
  parallel_chunks(a.exec, batch, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      ConstMapR<T> Am(pa + i * ar * ac, ar, ac);
      ConstMapR<T> Bm(pb + i * br * bc, br, bc);
      MapR<T> Cm(C.ptr<T>() + i * m * n, m, n);
      if (!ta && !tb) Cm.noalias() = Am * Bm;
      else if (!ta && tb) Cm.noalias() = Am * Bm.transpose();
      else if (ta && !tb) Cm.noalias() = Am.transpose() * Bm;
      else Cm.noalias() = Am.transpose() * Bm.transpose();
    }
  });
}

// Output-ordered copy: each output element is read from its permuted input position.
template <typename T>
void permute_kernel(const KernelArgs& a) {
  const TensorRef &X = a.in[0], &Y = a.out[0];
  const std::vector<int64_t>& dims = a.attrs().ints("dims");
  const int nd = Y.ndim();
  std::vector<int64_t> in_strides(nd), step(nd);
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; --d) {
    in_strides[d] = s;
    s *= X.dim(d);
  }
  for (int d = 0; d < nd; ++d) step[d] = in_strides[dims[d]];
  const T* px = X.ptr<T>();
  T* py = Y.ptr<T>();
  const int64_t inner = nd ? Y.dim(nd - 1) : 1, inner_step = nd ? step[nd - 1] : 1;
  const int64_t outer = Y.numel / std::max<int64_t>(1, inner);
  parallel_chunks(a.exec, outer, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, inner)),
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      int64_t rem = r, base = 0;
                      for (int d = nd - 2; d >= 0; --d) {
                        base += (rem % Y.dim(d)) * step[d];
                        rem /= Y.dim(d);
                      }
                      T* dst = py + r * inner;
                      for (int64_t j = 0; j < inner; ++j) dst[j] = px[base + j * inner_step];
                    }
                  });
}

template <typename T>
void causal_mask_kernel(const KernelArgs& a) {
  const int64_t rows = a.out[0].dim(0), cols = a.out[0].dim(1);
  T* p = a.out[0].ptr<T>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) p[i * cols + j] = j > i ? -std::numeric_limits<T>::infinity() : T(0);
}

}  // namespace

void register_eigen_attention(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "bmm", bmm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "permute", permute_kernel);
  t.add("permute", DType::i64, &permute_kernel<int64_t>);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "causal_mask", causal_mask_kernel);
}

}  // namespace treadle

// Eigen kernels for where, gather / gather_backward (torch.gather and its scatter-add gradient) and
// max_unpool.
#include <algorithm>
#include <array>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace eigen {
namespace {

// (a, b, cond) of one shape -> cond != 0 ? a : b. A selection, not arithmetic: inf or NaN in the
// branch not taken never reaches the result.
template <typename T, typename C>
void where_rows(const KernelArgs& a) {
  const T *pa = a.in[0].ptr<T>(), *pb = a.in[1].ptr<T>();
  const C* pc = a.in[2].ptr<C>();
  T* py = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.out[0].numel, kElementGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) py[i] = pc[i] != C(0) ? pa[i] : pb[i];
  });
}

template <typename T>
void where_kernel(const KernelArgs& a) {
  switch (a.in[2].dtype) {
    case DType::f32: return where_rows<T, float>(a);
    case DType::f64: return where_rows<T, double>(a);
    case DType::i64: return where_rows<T, int64_t>(a);
    default: throw_type_error("where: unsupported condition dtype ", dtype_name(a.in[2].dtype));
  }
}

constexpr int kMaxGatherDims = 8;  // the op refuses more (ops/select.cpp)

template <typename I>
int64_t checked_index(const char* op, I raw, int64_t size) {
  const int64_t k = static_cast<int64_t>(raw);
  if (k < 0 || k >= size)
    throw_value_error(op, ": index ", k, " is out of range for a dimension of size ", size);
  return k;
}

// Calls f(index_offset, input_offset) for every element of index, in order.
template <typename I, typename F>
void for_each_gathered(const char* op, const TensorRef& input_like, const TensorRef& index, int dim, F&& f) {
  const Shape& is = *index.shape;
  const Shape& xs = *input_like.shape;
  const int nd = static_cast<int>(is.size());
  std::array<int64_t, kMaxGatherDims> xstride{}, pos{};  // on the stack: kernels never allocate
  if (nd > 0) xstride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; --d) xstride[d] = xstride[d + 1] * xs[d + 1];
  const I* idx = index.ptr<I>();
  for (int64_t o = 0; o < index.numel; ++o) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d)
      off += (d == dim ? checked_index(op, idx[o], xs[d]) : pos[d]) * xstride[d];
    f(o, off);
    for (int d = nd - 1; d >= 0 && ++pos[d] == is[d]; --d) pos[d] = 0;
  }
}

template <typename T, typename I>
void gather_typed(const KernelArgs& a) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  for_each_gathered<I>("gather", a.in[0], a.in[1], static_cast<int>(a.attrs().i("dim")),
                       [&](int64_t o, int64_t src) { y[o] = x[src]; });
}

template <typename T>
void gather_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64) return gather_typed<T, int64_t>(a);
  gather_typed<T, int32_t>(a);
}

// Zeros, then dy added where it was gathered from (repeated indices accumulate, in index order:
// deterministic; serial because two index elements may hit one place).
template <typename T, typename I>
void gather_backward_typed(const KernelArgs& a) {
  const T* dy = a.in[0].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  for (int64_t i = 0; i < a.out[0].numel; ++i) dx[i] = T(0);
  for_each_gathered<I>("gather_backward", a.out[0], a.in[1], static_cast<int>(a.attrs().i("dim")),
                       [&](int64_t o, int64_t dst) { dx[dst] += dy[o]; });
}

template <typename T>
void gather_backward_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64) return gather_backward_typed<T, int64_t>(a);
  gather_backward_typed<T, int32_t>(a);
}

// Per plane: zeros, then each value written at its index (in input order; a repeated index carries
// one input element's value, so the order does not change the result). Indices are checked first.
template <typename T, typename I>
void max_unpool_typed(const KernelArgs& a) {
  const int64_t planes = a.in[0].dim(0) * a.in[0].dim(1), in_len = a.in[0].dim(2), out_len = a.out[0].dim(2);
  const T* x = a.in[0].ptr<T>();
  const I* idx = a.in[1].ptr<I>();
  T* y = a.out[0].ptr<T>();
  for (int64_t i = 0; i < planes * in_len; ++i) checked_index("max_unpool", idx[i], out_len);
  parallel_chunks(a.exec, planes, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, out_len)),
                  [&](int64_t p0, int64_t p1) {
                    for (int64_t p = p0; p < p1; ++p) {
                      T* yp = y + p * out_len;
                      std::fill(yp, yp + out_len, T(0));
                      for (int64_t i = 0; i < in_len; ++i) yp[static_cast<int64_t>(idx[p * in_len + i])] = x[p * in_len + i];
                    }
                  });
}

template <typename T>
void max_unpool_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64) return max_unpool_typed<T, int64_t>(a);
  max_unpool_typed<T, int32_t>(a);
}

}  // namespace
}  // namespace eigen

void register_eigen_select(KernelTable& t) {
  using namespace eigen;
  TREADLE_EIGEN_REGISTER_FLOATS(t, "where", where_kernel);
  t.add("where", DType::i64, &where_kernel<int64_t>);  // e.g. labels with the ignored ones replaced
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gather", gather_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gather_backward", gather_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "max_unpool", max_unpool_kernel);
}

}  // namespace treadle

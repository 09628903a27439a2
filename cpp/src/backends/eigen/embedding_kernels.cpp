// Reference kernels for embedding: a row gather, and its gradient as a scatter-add split over the
// embedding columns (each column range is summed by one chunk in index order, so the result does not
// depend on the executor's chunking).
#include <algorithm>
#include <cstring>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

using eigen::kElementGrain;
using eigen::parallel_chunks;

// Rejects an out-of-range index before any work (a data error, so it is checked at run time).
template <typename I>
void check_range(const KernelArgs& a, const I* idx, int64_t n, int64_t num) {
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= num) {
      const std::string where = a.node.scope.empty() ? "" : " (module '" + a.node.scope + "')";
      throw_value_error("Embedding", where, ": index ", static_cast<int64_t>(idx[i]), " is out of range for ", num,
                        " embeddings (position ", i, " of indices of shape ", shape_str(*a.in[1].shape), ")");
    }
}

template <typename T, typename I>
void gather(const KernelArgs& a) {
  const int64_t num = a.in[0].dim(0), dim = a.in[0].dim(1), n = a.in[1].numel;
  const T* w = a.in[0].ptr<T>();
  const I* idx = a.in[1].ptr<I>();
  T* y = a.out[0].ptr<T>();
  check_range(a, idx, n, num);
  const int64_t rows_per_chunk = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, dim));
  parallel_chunks(a.exec, n, rows_per_chunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(y + i * dim, w + static_cast<int64_t>(idx[i]) * dim, sizeof(T) * dim);
  });
}

template <typename T>
void embedding_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64)
    gather<T, int64_t>(a);
  else
    gather<T, int32_t>(a);
}

template <typename T, typename I>
void scatter_add(const KernelArgs& a) {
  const int64_t num = a.attrs().i("num_embeddings"), pad = a.attrs().i_or("padding_idx", -1);
  const int64_t dim = a.out[0].dim(1), n = a.in[1].numel;
  const T* dy = a.in[0].ptr<T>();
  const I* idx = a.in[1].ptr<I>();
  T* dw = a.out[0].ptr<T>();
  check_range(a, idx, n, num);
  const int64_t cols_per_chunk = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n));
  parallel_chunks(a.exec, dim, cols_per_chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < num; ++r) std::fill(dw + r * dim + c0, dw + r * dim + c1, T(0));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = idx[i];
      if (row == pad) continue;
      for (int64_t c = c0; c < c1; ++c) dw[row * dim + c] += dy[i * dim + c];
    }
  });
}

template <typename T>
void embedding_backward_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64)
    scatter_add<T, int64_t>(a);
  else
    scatter_add<T, int32_t>(a);
}

}  // namespace

// one_hot: each index row of num_classes zeros with a 1 at the index, checked like an embedding lookup.
template <typename I>
void one_hot_kernel(const KernelArgs& a) {
  const int64_t classes = a.attrs().i("num_classes"), n = a.in[0].numel;
  const I* idx = a.in[0].ptr<I>();
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= classes) {
      const std::string where = a.node.scope.empty() ? "" : " (module '" + a.node.scope + "')";
      throw_value_error("one_hot", where, ": class value ", static_cast<int64_t>(idx[i]), " is out of range [0, ",
                        classes, ") (position ", i, " of indices of shape ", shape_str(*a.in[0].shape), ")");
    }
  auto fill = [&](auto* y) {
    std::fill(y, y + n * classes, 0);
    for (int64_t i = 0; i < n; ++i) y[i * classes + static_cast<int64_t>(idx[i])] = 1;
  };
  if (a.out[0].dtype == DType::f64)
    fill(a.out[0].ptr<double>());
  else
    fill(a.out[0].ptr<float>());
}

void register_eigen_embedding(KernelTable& t) {
  t.add("one_hot", DType::i64, &one_hot_kernel<int64_t>);
  t.add("one_hot", DType::i32, &one_hot_kernel<int32_t>);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "embedding", embedding_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "embedding_backward", embedding_backward_kernel);
}

}  // namespace treadle

// Reference kernels for embedding: a row gather, and its gradient as a scatter-add split over the
// embedding columns (each column range is summed by one chunk in index order, so the result does not
// depend on the executor's chunking).
#include <algorithm>
#include <cmath>
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
  // scale_grad_by_freq: torch's add of dy * (1 / count), the factor rounded to T.
  int64_t* counts = a.attrs().i_or("scale_grad_by_freq", 0) ? static_cast<int64_t*>(a.workspace) : nullptr;
  if (counts) {
    std::fill(counts, counts + num, int64_t{0});
    for (int64_t i = 0; i < n; ++i) ++counts[idx[i]];
  }
  const int64_t cols_per_chunk = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n));
  parallel_chunks(a.exec, dim, cols_per_chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < num; ++r) std::fill(dw + r * dim + c0, dw + r * dim + c1, T(0));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = idx[i];
      if (row == pad) continue;
      if (counts) {
        const T f = static_cast<T>(1.0 / static_cast<double>(counts[row]));
        for (int64_t c = c0; c < c1; ++c) dw[row * dim + c] += dy[i * dim + c] * f;
      } else {
        for (int64_t c = c0; c < c1; ++c) dw[row * dim + c] += dy[i * dim + c];
      }
    }
  });
}

// torch's embedding_renorm_ rule for one row: its norm_type-norm (accumulated in double; p = inf: the
// largest magnitude), and the factor max_norm / (norm + 1e-7) when the norm exceeds max_norm, else 1.
template <typename T>
double renorm_factor(const T* row, int64_t dim, double max_norm, double p) {
  double norm = 0;
  if (std::isinf(p)) {
    for (int64_t c = 0; c < dim; ++c) norm = std::max(norm, std::abs(static_cast<double>(row[c])));
  } else if (p == 2.0) {
    for (int64_t c = 0; c < dim; ++c) norm += static_cast<double>(row[c]) * row[c];
    norm = std::sqrt(norm);
  } else {
    for (int64_t c = 0; c < dim; ++c) norm += std::pow(std::abs(static_cast<double>(row[c])), p);
    norm = std::pow(norm, 1.0 / p);
  }
  return norm > max_norm ? max_norm / (norm + 1e-7) : 1.0;
}

// Serial: a row may be looked up more than once (rescaling it again leaves it unchanged, its norm is
// then below max_norm), and two chunks must not scale the same row at once.
template <typename T, typename I>
void renorm_rows(const KernelArgs& a) {
  const int64_t num = a.in[0].dim(0), dim = a.in[0].dim(1), n = a.in[1].numel;
  const double max_norm = a.attrs().f("max_norm"), p = a.attrs().f_or("norm_type", 2.0);
  T* w = a.in[0].ptr<T>();  // written in place (the op's writes_inputs)
  const I* idx = a.in[1].ptr<I>();
  check_range(a, idx, n, num);
  for (int64_t i = 0; i < n; ++i) {
    T* row = w + static_cast<int64_t>(idx[i]) * dim;
    const double f = renorm_factor(row, dim, max_norm, p);
    if (f != 1.0)
      for (int64_t c = 0; c < dim; ++c) row[c] = static_cast<T>(row[c] * static_cast<T>(f));
  }
}

template <typename T>
void embedding_renorm_kernel(const KernelArgs& a) {
  if (a.in[1].dtype == DType::i64)
    renorm_rows<T, int64_t>(a);
  else
    renorm_rows<T, int32_t>(a);
}

template <typename T>
void row_renorm_kernel(const KernelArgs& a) {
  const int64_t dim = a.in[0].shape->back(), rows = a.in[0].numel / std::max<int64_t>(1, dim);
  const double max_norm = a.attrs().f("max_norm"), p = a.attrs().f_or("norm_type", 2.0);
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, dim)),
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const T f = static_cast<T>(renorm_factor(x + r * dim, dim, max_norm, p));
                      for (int64_t c = 0; c < dim; ++c) y[r * dim + c] = f == T(1) ? x[r * dim + c] : x[r * dim + c] * f;
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
  TREADLE_EIGEN_REGISTER_FLOATS(t, "embedding_renorm", embedding_renorm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "row_renorm", row_renorm_kernel);
}

}  // namespace treadle

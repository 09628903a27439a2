// Eigen reference kernels for softmax, log_softmax and their backward ops.
// The tensor is viewed as (outer, n, inner) around the axis; each "line" (o, j) holds the n
// elements x[o, :, j] at stride `inner`. Lines are independent and each is reduced sequentially by
// one chunk, so results never depend on how the executor chunks. Every line subtracts its maximum
// before exponentiating, so large logits neither overflow nor lose the small entries. exp is the
// C library's (exact 0 for -inf logits, which a masked softmax relies on).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace eigen {
namespace {

struct Lines {
  int64_t n = 1;      // length of a line (size of the axis)
  int64_t inner = 1;  // stride between a line's elements
  int64_t count = 0;  // outer * inner
  int64_t start(int64_t line) const { return (line / inner) * n * inner + line % inner; }
};

Lines lines_of(const KernelArgs& a) {
  const TensorRef& t = a.in[0];
  const int axis = static_cast<int>(a.attrs().i("axis"));
  Lines l;
  int64_t outer = 1;
  for (int d = 0; d < t.ndim(); ++d) {
    if (d < axis) outer *= t.dim(d);
    if (d > axis) l.inner *= t.dim(d);
  }
  l.n = t.dim(axis);
  l.count = outer * l.inner;
  return l;
}

// Runs body(first_element, stride, n) for every line, lines split over the executor.
template <typename F>
void for_each_line(const KernelArgs& a, F&& body) {
  const Lines l = lines_of(a);
  if (l.n == 0) return;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / l.n);
  parallel_chunks(a.exec, l.count, grain, [&](int64_t b, int64_t e) {
    for (int64_t line = b; line < e; ++line) body(l.start(line), l.inner, l.n);
  });
}

template <typename T>
T line_max(const T* x, int64_t s, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t k = 0; k < n; ++k) m = std::max(m, x[k * s]);
  return m;
}

template <typename T>
void softmax_kernel(const KernelArgs& a) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  for_each_line(a, [&](int64_t i0, int64_t s, int64_t n) {
    const T m = line_max(x + i0, s, n);
    T sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const T e = std::exp(x[i0 + k * s] - m);
      y[i0 + k * s] = e;
      sum += e;
    }
    const T inv = T(1) / sum;
    for (int64_t k = 0; k < n; ++k) y[i0 + k * s] *= inv;
  });
}

template <typename T>
void log_softmax_kernel(const KernelArgs& a) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  for_each_line(a, [&](int64_t i0, int64_t s, int64_t n) {
    const T m = line_max(x + i0, s, n);
    T sum = 0;
    for (int64_t k = 0; k < n; ++k) sum += std::exp(x[i0 + k * s] - m);
    const T log_sum = std::log(sum);
    for (int64_t k = 0; k < n; ++k) y[i0 + k * s] = (x[i0 + k * s] - m) - log_sum;
  });
}

// (y, dy) -> y * (dy - sum(dy * y))
template <typename T>
void softmax_backward_kernel(const KernelArgs& a) {
  const T* y = a.in[0].ptr<T>();
  const T* dy = a.in[1].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  for_each_line(a, [&](int64_t i0, int64_t s, int64_t n) {
    T dot = 0;
    for (int64_t k = 0; k < n; ++k) dot += dy[i0 + k * s] * y[i0 + k * s];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = i0 + k * s;
      dx[i] = y[i] * (dy[i] - dot);
    }
  });
}

// (y, dy) -> dy - exp(y) * sum(dy)
template <typename T>
void log_softmax_backward_kernel(const KernelArgs& a) {
  const T* y = a.in[0].ptr<T>();
  const T* dy = a.in[1].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  for_each_line(a, [&](int64_t i0, int64_t s, int64_t n) {
    T sum = 0;
    for (int64_t k = 0; k < n; ++k) sum += dy[i0 + k * s];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = i0 + k * s;
      dx[i] = dy[i] - std::exp(y[i]) * sum;
    }
  });
}

}  // namespace
}  // namespace eigen

void register_eigen_softmax(KernelTable& t) {
  using namespace eigen;
  TREADLE_EIGEN_REGISTER_FLOATS(t, "softmax", softmax_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "log_softmax", log_softmax_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "softmax_backward", softmax_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "log_softmax_backward", log_softmax_backward_kernel);
}

}  // namespace treadle

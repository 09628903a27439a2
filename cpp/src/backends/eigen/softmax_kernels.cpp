// Eigen reference kernels for softmax, log_softmax and their backward ops.
// The tensor is viewed as (outer, n, inner) around the axis; each "line" (o, j) holds the n
// elements x[o, :, j] at stride `inner`. Lines are independent and each is reduced sequentially by
// one chunk, so results never depend on how the executor chunks. Every line subtracts its maximum
// before exponentiating, so large logits neither overflow nor lose the small entries. In double, exp
// is the C library's; float lines of consecutive elements (the last axis) take the vectorised
// exp_nonpositive (every argument is x - max <= 0), which falls back to the C library's expf below
// -87, so -inf logits still give exactly 0 (a masked softmax relies on it) and tiny probabilities
// stay exact. The scalar expf of each element took most of a softmax's time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/transcendental.hpp"

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

// ---- float lines of consecutive elements (the last axis): vectorised exp and lane sums
//
// A single running sum waits on each add's latency (~1.6 ns per element, most of a softmax once
// the exponentials are vectorised). LaneSum keeps 16 partial sums, element k of the line in lane
// k mod 16, combined pairwise at the end: a fixed order for a given line length (any chunking,
// any vector width), and a smaller rounding error than the running sum.
// Blocks added one after another must be whole multiples of kLanes, but for the last.
struct LaneSum {
  static constexpr int kLanes = 16;
  alignas(64) float lane[kLanes] = {};  // explicit: see lane_max

  void add(const float* v, int64_t n) {
    int64_t k = 0;
    for (; k + kLanes <= n; k += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += v[k + j];
    for (int j = 0; k + j < n; ++j) lane[j] += v[k + j];
  }
  void add_products(const float* a, const float* b, int64_t n) {
    int64_t k = 0;
    for (; k + kLanes <= n; k += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += a[k + j] * b[k + j];
    for (int j = 0; k + j < n; ++j) lane[j] += a[k + j] * b[k + j];
  }
  float total() const {
    alignas(64) float t[kLanes];
    std::copy(lane, lane + kLanes, t);
    for (int w = kLanes / 2; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) t[j] += t[j + w];
    return t[0];
  }
};

// The maximum of a float line in kLanes running maxima (one running maximum waits on each max's
// latency, as a running sum does); max is exact, so the order does not change the result. NaN is
// skipped, as line_max does (std::max keeps its first argument when the second is NaN).
inline float lane_max(const float* x, int64_t n) {
  constexpr int kLanes = LaneSum::kLanes;
  // Explicitly aligned, as every scratch array here: GCC stores into a 64-byte local array with
  // aligned vector moves, and ASan's fake stack frames (detect_stack_use_after_return) honour only
  // the alignment written in the source, so an implicit one faulted in the sanitizer build.
  alignas(64) float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], x[k + j]);
  for (int j = 0; k + j < n; ++j) lane[j] = std::max(lane[j], x[k + j]);
  float m = lane[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, lane[j]);
  return m;
}

// exp(x[k] - m) for k < n into e (which may be x), on the vectorised exp.
inline void shifted_exp(const float* x, float m, int64_t n, float* e) {
  for (int64_t k = 0; k < n; ++k) e[k] = x[k] - m;
  Eigen::Map<Eigen::ArrayXf> shifted(e, n);
  exp_nonpositive(shifted);
}

void softmax_row(const float* x, float* y, int64_t n) {
  const float m = lane_max(x, n);
  shifted_exp(x, m, n, y);
  LaneSum sum;
  sum.add(y, n);
  const float inv = 1.0f / sum.total();
  for (int64_t k = 0; k < n; ++k) y[k] *= inv;
}

// The exponentials are not the output: summed from scratch blocks, so y may be x (out=x).
void log_softmax_row(const float* x, float* y, int64_t n) {
  const float m = lane_max(x, n);
  alignas(64) float e[kMathBlock];
  static_assert(kMathBlock % LaneSum::kLanes == 0);
  LaneSum sum;
  for (int64_t k0 = 0; k0 < n; k0 += kMathBlock) {
    const int64_t len = std::min(kMathBlock, n - k0);
    shifted_exp(x + k0, m, len, e);
    sum.add(e, len);
  }
  const float log_sum = std::log(sum.total());
  for (int64_t k = 0; k < n; ++k) y[k] = (x[k] - m) - log_sum;
}

void softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n) {
  LaneSum dot;
  dot.add_products(dy, y, n);
  const float d = dot.total();
  for (int64_t k = 0; k < n; ++k) dx[k] = y[k] * (dy[k] - d);
}

// exp(y) by blocks into scratch (dx may be y or dy).
void log_softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n) {
  LaneSum sum;
  sum.add(dy, n);
  const float s = sum.total();
  alignas(64) float e[kMathBlock];
  for (int64_t k0 = 0; k0 < n; k0 += kMathBlock) {
    const int64_t len = std::min(kMathBlock, n - k0);
    shifted_exp(y + k0, 0.0f, len, e);  // y <= 0: log-probabilities
    for (int64_t k = 0; k < len; ++k) dx[k0 + k] = dy[k0 + k] - e[k] * s;
  }
}

// ---- any dtype and stride: one element at a time, the C library's exp

template <typename T>
void softmax_kernel(const KernelArgs& a) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  for_each_line(a, [&](int64_t i0, int64_t s, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      if (s == 1) return softmax_row(x + i0, y + i0, n);
    }
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
    if constexpr (std::is_same_v<T, float>) {
      if (s == 1) return log_softmax_row(x + i0, y + i0, n);
    }
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
    if constexpr (std::is_same_v<T, float>) {
      if (s == 1) return softmax_backward_row(y + i0, dy + i0, dx + i0, n);
    }
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
    if constexpr (std::is_same_v<T, float>) {
      if (s == 1) return log_softmax_backward_row(y + i0, dy + i0, dx + i0, n);
    }
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

// Eigen reference kernels for the loss ops (float32/float64, keyed by the prediction's dtype).
// Per-element terms are computed in the prediction's dtype, as torch does; the reduction sums
// them in double over fixed chunks whose partials are added in chunk order, so the result is the
// same whatever executor runs it (and needs no workspace: there are at most kMaxPartials chunks).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/transcendental.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

using eigen::kElementGrain;
using eigen::parallel_chunks;

constexpr int64_t kMaxPartials = 64;

bool is_mean(const KernelArgs& a) { return a.attrs().s("reduction") == "mean"; }

// Items per chunk for work over `n` items of `cost` elements each. Depends only on the shape.
int64_t item_grain(int64_t n, int64_t cost) {
  const int64_t g = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, cost));
  return std::max(g, (n + kMaxPartials - 1) / kMaxPartials);
}

// Sum of partial(begin, end) over [0, n) in chunks of `grain`, combined in chunk order.
template <typename F>
double ordered_sum(Executor& exec, int64_t n, int64_t grain, const F& partial) {
  const int64_t chunks = n > 0 ? (n + grain - 1) / grain : 0;
  std::array<double, kMaxPartials> sums{};
  auto run = [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) sums[c] = partial(c * grain, std::min(n, (c + 1) * grain));
  };
  if (chunks > 1 && exec.num_workers() > 1) {
    exec.parallel_for(chunks, run);
  } else {
    run(0, chunks);
  }
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += sums[c];
  return total;
}

// The scale every element of d/dpred carries: the upstream scalar, over n for "mean".
template <typename T>
T grad_scale(const KernelArgs& a, int64_t n) {
  const double g = static_cast<double>(*a.in[2].ptr<T>());
  return static_cast<T>(is_mean(a) ? g / static_cast<double>(n) : g);
}

// ---- elementwise losses: (pred, target) of one shape -------------------------------------------

template <typename T, typename Term>
void elementwise_forward(const KernelArgs& a, const Term& term) {
  const T* p = a.in[0].ptr<T>();
  const T* t = a.in[1].ptr<T>();
  const int64_t n = a.in[0].numel;
  const double sum = ordered_sum(a.exec, n, item_grain(n, 1), [&](int64_t b, int64_t e) {
    double s = 0.0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(term(p[i], t[i]));
    return s;
  });
  // A mean over no elements is NaN, as in torch.
  *a.out[0].ptr<T>() = static_cast<T>(is_mean(a) ? sum / static_cast<double>(n) : sum);
}

template <typename T, typename Deriv>
void elementwise_backward(const KernelArgs& a, const Deriv& deriv) {
  const T* p = a.in[0].ptr<T>();
  const T* t = a.in[1].ptr<T>();
  T* out = a.out[0].ptr<T>();
  const int64_t n = a.in[0].numel;
  const T scale = grad_scale<T>(a, n);
  parallel_chunks(a.exec, n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = deriv(p[i], t[i]) * scale;
  });
}

template <typename T>
T sign_of(T v) {
  return static_cast<T>((v > T(0)) - (v < T(0)));  // 0 at 0, as torch's sign
}

template <typename T>
void mse_forward(const KernelArgs& a) {
  elementwise_forward<T>(a, [](T p, T t) { return (p - t) * (p - t); });
}
template <typename T>
void mse_backward(const KernelArgs& a) {
  elementwise_backward<T>(a, [](T p, T t) { return T(2) * (p - t); });
}

template <typename T>
void l1_forward(const KernelArgs& a) {
  elementwise_forward<T>(a, [](T p, T t) { return std::abs(p - t); });
}
template <typename T>
void l1_backward(const KernelArgs& a) {
  elementwise_backward<T>(a, [](T p, T t) { return sign_of(p - t); });
}

// Quadratic within delta of the target, linear (slope delta) beyond.
template <typename T>
void huber_forward(const KernelArgs& a) {
  const T delta = static_cast<T>(a.attrs().f("delta"));
  elementwise_forward<T>(a, [delta](T p, T t) {
    const T d = std::abs(p - t);
    return d < delta ? T(0.5) * d * d : delta * (d - T(0.5) * delta);
  });
}
template <typename T>
void huber_backward(const KernelArgs& a) {
  const T delta = static_cast<T>(a.attrs().f("delta"));
  elementwise_backward<T>(a, [delta](T p, T t) {
    const T d = p - t;
    return d < -delta ? -delta : (d > delta ? delta : d);
  });
}

// log(1 + exp(-x)) + (1 - t) x written as (1 - t) x + max(-x, 0) + log1p(exp(-|x|)): no overflow for
// any x, and torch's grouping, so x = +inf gives +inf (not inf - inf) and the NaN cases are torch's.
template <typename T>
void bce_forward(const KernelArgs& a) {
  elementwise_forward<T>(a, [](T x, T t) {
    return (T(1) - t) * x + std::max(-x, T(0)) + std::log1p(std::exp(-std::abs(x)));
  });
}
template <typename T>
void bce_backward(const KernelArgs& a) {
  elementwise_backward<T>(a, [](T x, T t) {
    const T z = std::exp(-std::abs(x));  // in (0, 1]: the sigmoid without overflow
    const T sig = x >= T(0) ? T(1) / (T(1) + z) : z / (T(1) + z);
    return sig - t;
  });
}

// ---- cross entropy: logits (C) or (N, C, d...), labels (N, d...) --------------------------------

struct ClassLayout {
  int64_t outer = 1;  // N (1 for unbatched logits)
  int64_t classes = 0;
  int64_t inner = 1;  // product of d1, d2, ...: classes of one position are `inner` apart
  int64_t positions() const { return outer * inner; }
};

ClassLayout class_layout(const TensorRef& logits) {
  ClassLayout l;
  const int nd = logits.ndim();
  const int cdim = nd == 1 ? 0 : 1;
  l.outer = cdim == 0 ? 1 : logits.dim(0);
  l.classes = logits.dim(cdim);
  for (int k = cdim + 1; k < nd; ++k) l.inner *= logits.dim(k);
  return l;
}

std::string index_str(int64_t flat, const Shape& shape) {
  if (shape.size() == 1) return std::to_string(flat);
  Shape idx(shape.size());
  for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
    idx[k] = shape[k] > 0 ? flat % shape[k] : 0;
    flat = shape[k] > 0 ? flat / shape[k] : 0;
  }
  return shape_str(idx);
}

// Every label must name a class; checked before any output is written.
void check_labels(const TensorRef& labels, int64_t classes) {
  const int64_t* l = labels.ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel; ++i)
    if (l[i] < 0 || l[i] >= classes)
      throw_value_error("cross_entropy: label ", l[i], " out of range [0, ", classes, ") at index ",
                        index_str(i, *labels.shape));
}

// log(sum_c exp(x_c)) shifted by the position's maximum; returns {max, sum of exp(x - max)}.
template <typename T>
std::pair<T, T> shifted_exp_sum(const T* x, int64_t classes, int64_t stride) {
  T mx = x[0];
  for (int64_t c = 1; c < classes; ++c) mx = std::max(mx, x[c * stride]);
  T s = T(0);
  for (int64_t c = 0; c < classes; ++c) s += std::exp(x[c * stride] - mx);
  return {mx, s};
}

// Float logits of rows of classes (inner 1): the exponentials of a block of rows at once on the
// vectorised exp (exp_nonpositive: every argument is x - max <= 0), where std::exp one element at
// a time took ~6 ns each, most of a small classifier's loss. e[r * C + c] = exp(x - max_r), with
// max_r and the row sums (in class order, as shifted_exp_sum) in mx and se.
constexpr int64_t kRowBlock = 2048;  // elements of e per block

void shifted_exp_rows(const float* x, int64_t rows, int64_t classes, float* e, float* mx, float* se) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * classes;
    float m = row[0];
    for (int64_t c = 1; c < classes; ++c) m = std::max(m, row[c]);
    mx[r] = m;
    for (int64_t c = 0; c < classes; ++c) e[r * classes + c] = row[c] - m;
  }
  Eigen::Map<Eigen::ArrayXf> shifted(e, rows * classes);
  eigen::exp_nonpositive(shifted);
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += e[r * classes + c];
    se[r] = sum;
  }
}

// Rows [b, e) by blocks of whole rows that fit kRowBlock: f(first row, rows, exps, maxima, sums).
template <typename F>
void for_row_blocks(const float* x, int64_t classes, int64_t b, int64_t e, F&& f) {
  alignas(64) float exps[kRowBlock];
  alignas(64) float mx[kRowBlock];  // explicit alignment: see lane_max in softmax_kernels.cpp
  alignas(64) float se[kRowBlock];
  const int64_t per_block = kRowBlock / classes;
  for (int64_t r0 = b; r0 < e; r0 += per_block) {
    const int64_t rows = std::min(per_block, e - r0);
    shifted_exp_rows(x + r0 * classes, rows, classes, exps, mx, se);
    f(r0, rows, static_cast<const float*>(exps), static_cast<const float*>(mx), static_cast<const float*>(se));
  }
}

template <typename T>
bool vector_rows(const ClassLayout& l) {
  return std::is_same_v<T, float> && l.inner == 1 && l.classes >= 1 && l.classes <= kRowBlock;
}

template <typename T>
void cross_entropy_forward(const KernelArgs& a) {
  const ClassLayout l = class_layout(a.in[0]);
  check_labels(a.in[1], l.classes);
  const T* x = a.in[0].ptr<T>();
  const int64_t* labels = a.in[1].ptr<int64_t>();
  const int64_t n = l.positions();
  const double sum = ordered_sum(a.exec, n, item_grain(n, l.classes), [&](int64_t b, int64_t e) {
    double s = 0.0;
    if constexpr (std::is_same_v<T, float>) {
      if (vector_rows<T>(l)) {
        for_row_blocks(x, l.classes, b, e, [&](int64_t r0, int64_t rows, const float*, const float* mx, const float* se) {
          for (int64_t r = 0; r < rows; ++r)
            s -= static_cast<double>((x[(r0 + r) * l.classes + labels[r0 + r]] - mx[r]) - std::log(se[r]));
        });
        return s;
      }
    }
    for (int64_t p = b; p < e; ++p) {
      const T* row = x + (p / l.inner) * l.classes * l.inner + p % l.inner;
      const auto [mx, se] = shifted_exp_sum(row, l.classes, l.inner);
      // -log_softmax at the label, rounded in the order torch's log_softmax uses.
      s -= static_cast<double>((row[labels[p] * l.inner] - mx) - std::log(se));
    }
    return s;
  });
  *a.out[0].ptr<T>() = static_cast<T>(is_mean(a) ? sum / static_cast<double>(n) : sum);
}

// d/dlogits = scale * (softmax - onehot(label)) at every position.
template <typename T>
void cross_entropy_backward(const KernelArgs& a) {
  const ClassLayout l = class_layout(a.in[0]);
  check_labels(a.in[1], l.classes);
  const T* x = a.in[0].ptr<T>();
  const int64_t* labels = a.in[1].ptr<int64_t>();
  T* out = a.out[0].ptr<T>();
  const int64_t n = l.positions();
  const T scale = grad_scale<T>(a, n);
  parallel_chunks(a.exec, n, item_grain(n, l.classes), [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      if (vector_rows<T>(l)) {
        const int64_t C = l.classes;
        for_row_blocks(x, C, b, e, [&](int64_t r0, int64_t rows, const float* ex, const float*, const float* se) {
          for (int64_t r = 0; r < rows; ++r) {
            const float* er = ex + r * C;
            float* o = out + (r0 + r) * C;
            const float sr = se[r];
            for (int64_t c = 0; c < C; ++c) o[c] = er[c] / sr * scale;
            const int64_t label = labels[r0 + r];
            o[label] = (er[label] / sr - 1.0f) * scale;
          }
        });
        return;
      }
    }
    for (int64_t p = b; p < e; ++p) {
      const int64_t base = (p / l.inner) * l.classes * l.inner + p % l.inner;
      const auto [mx, se] = shifted_exp_sum(x + base, l.classes, l.inner);
      for (int64_t c = 0; c < l.classes; ++c) {
        const int64_t i = base + c * l.inner;
        const T prob = std::exp(x[i] - mx) / se;
        out[i] = (c == labels[p] ? prob - T(1) : prob) * scale;
      }
    }
  });
}

}  // namespace

void register_eigen_loss(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "mse_loss", mse_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "mse_loss_backward", mse_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "l1_loss", l1_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "l1_loss_backward", l1_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "huber_loss", huber_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "huber_loss_backward", huber_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "cross_entropy", cross_entropy_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "cross_entropy_backward", cross_entropy_backward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "bce_with_logits", bce_forward);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "bce_with_logits_backward", bce_backward);
}

}  // namespace treadle

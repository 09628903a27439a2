// Eigen reference kernels for the elementwise math ops (exp, log, log1p, sqrt, abs, pow, clamp) and
// the backward ops of the piecewise ones. Transcendental maps call the C library per element: this
// backend is the accuracy reference, and Eigen's packet exp/log are not correctly rounded. sqrt and
// abs are exact in IEEE arithmetic, so their vectorised forms lose nothing. NaN flows through
// every forward as in PyTorch (comparisons with NaN are false, so clamp keeps it).
#include <cmath>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace eigen {
namespace {

template <typename T, typename F>
void map_each(const KernelArgs& a, F&& f) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}

// (x, dy) -> dx, elementwise.
template <typename T, typename F>
void map_pairs(const KernelArgs& a, F&& f) {
  const T* x = a.in[0].ptr<T>();
  const T* dy = a.in[1].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = f(x[i], dy[i]);
  });
}

template <typename T>
void exp_kernel(const KernelArgs& a) {
  map_each<T>(a, [](T x) { return std::exp(x); });
}

template <typename T>
void log_kernel(const KernelArgs& a) {
  map_each<T>(a, [](T x) { return std::log(x); });
}

template <typename T>
void log1p_kernel(const KernelArgs& a) {
  map_each<T>(a, [](T x) { return std::log1p(x); });
}

template <typename T>
void sqrt_kernel(const KernelArgs& a) {
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    VecMap<T>(a.out[0].ptr<T>() + b, e - b) = ConstVecMap<T>(a.in[0].ptr<T>() + b, e - b).sqrt();
  });
}

template <typename T>
void abs_kernel(const KernelArgs& a) {
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    VecMap<T>(a.out[0].ptr<T>() + b, e - b) = ConstVecMap<T>(a.in[0].ptr<T>() + b, e - b).abs();
  });
}

// sign(x) * dy with sign(0) = 0, as torch's abs backward.
template <typename T>
void abs_backward_kernel(const KernelArgs& a) {
  map_pairs<T>(a, [](T x, T dy) { return x > T(0) ? dy : x < T(0) ? -dy : T(0) * dy; });
}

// std::pow is correctly rounded in glibc's double and within an ulp in float, integer exponents
// included. The small integer exponents and +-0.5 take torch's own shortcuts (x*x, x*x*x, 1/x,
// 1/(x*x), sqrt, 1/sqrt), which are also an order of magnitude faster than a pow call per element
// (squares are everywhere in losses). x*x is correctly rounded, so it equals pow(x, 2) exactly;
// +-0.5 as a square root differs from C's pow only at -inf (pow(-inf, 0.5) is +inf, sqrt NaN).
template <typename T>
void pow_kernel(const KernelArgs& a) {
  const double e = a.attrs().f("exponent");
  const T p = static_cast<T>(e);
  if (e == 2.0) return map_each<T>(a, [](T x) { return x * x; });
  if (e == 3.0) return map_each<T>(a, [](T x) { return x * x * x; });
  if (e == -1.0) return map_each<T>(a, [](T x) { return T(1) / x; });
  if (e == -2.0) return map_each<T>(a, [](T x) { return T(1) / (x * x); });
  if (e == 0.5) return map_each<T>(a, [](T x) { return std::sqrt(x); });
  if (e == -0.5) return map_each<T>(a, [](T x) { return T(1) / std::sqrt(x); });
  map_each<T>(a, [p](T x) { return std::pow(x, p); });
}

struct ClampBounds {
  bool has_min, has_max;
  double min, max;
  explicit ClampBounds(const Attrs& at)
      : has_min(at.has("min")), has_max(at.has("max")), min(at.f_or("min", 0.0)), max(at.f_or("max", 0.0)) {}
};

// torch's order: max(x, min) then min(., max), so min > max gives max everywhere.
template <typename T>
void clamp_kernel(const KernelArgs& a) {
  const ClampBounds c(a.attrs());
  const T lo = static_cast<T>(c.min), hi = static_cast<T>(c.max);
  map_each<T>(a, [&](T x) {
    if (c.has_min && x < lo) x = lo;
    if (c.has_max && x > hi) x = hi;
    return x;
  });
}

// dy where min <= x <= max (both ends included, as torch), 0 elsewhere and at NaN.
template <typename T>
void clamp_backward_kernel(const KernelArgs& a) {
  const ClampBounds c(a.attrs());
  const T lo = static_cast<T>(c.min), hi = static_cast<T>(c.max);
  map_pairs<T>(a, [&](T x, T dy) {
    const bool inside = (!c.has_min || x >= lo) && (!c.has_max || x <= hi) && x == x;
    return inside ? dy : T(0);
  });
}

}  // namespace
}  // namespace eigen

void register_eigen_math(KernelTable& t) {
  using namespace eigen;
  TREADLE_EIGEN_REGISTER_FLOATS(t, "exp", exp_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "log", log_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "log1p", log1p_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "sqrt", sqrt_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "abs", abs_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "abs_backward", abs_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "pow", pow_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "clamp", clamp_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "clamp_backward", clamp_backward_kernel);
}

}  // namespace treadle

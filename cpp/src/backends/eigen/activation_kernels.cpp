// Eigen reference kernels for the activation ops and their backward ops.
// Piecewise-linear and algebraic maps use Eigen array expressions (vectorised); transcendental maps
// use the C library's exp/erf per element, because this backend is the accuracy reference and
// Eigen's fast packet approximations (e.g. float tanh saturating at |x| ~ 7.9) are not; float tanh
// and sigmoid use the checked vectorised forms of transcendental.hpp.
// Forms are chosen to avoid cancellation: 0.5 * (1 + erf(z)) is computed as 0.5 * erfc(-z), and
// 0.5 * (1 + tanh(u)) as sigmoid(2u).
#include <algorithm>
#include <cmath>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/transcendental.hpp"

namespace treadle {
namespace eigen {
namespace {

// Runs f(x_chunk, y_chunk) over chunks of the single input.
template <typename T, typename F>
void unary_chunks(const KernelArgs& a, F&& f) {
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    ConstVecMap<T> xs(x + b, e - b);
    VecMap<T> ys(y + b, e - b);
    f(xs, ys);
  });
}

// Runs f(saved_chunk, dy_chunk, dx_chunk) over chunks of a backward op's inputs (saved, dy).
template <typename T, typename F>
void binary_chunks(const KernelArgs& a, F&& f) {
  const T* s = a.in[0].ptr<T>();
  const T* dy = a.in[1].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  parallel_chunks(a.exec, a.in[0].numel, kElementGrain, [&](int64_t b, int64_t e) {
    ConstVecMap<T> ss(s + b, e - b);
    ConstVecMap<T> dys(dy + b, e - b);
    VecMap<T> dxs(dx + b, e - b);
    f(ss, dys, dxs);
  });
}

// Per-element versions for maps that call into libm.
template <typename T, typename F>
void unary_each(const KernelArgs& a, F&& f) {
  unary_chunks<T>(a, [&](const ConstVecMap<T>& x, VecMap<T>& y) {
    for (Eigen::Index i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  });
}

template <typename T, typename F>
void binary_each(const KernelArgs& a, F&& f) {
  binary_chunks<T>(a, [&](const ConstVecMap<T>& s, const ConstVecMap<T>& dy, VecMap<T>& dx) {
    for (Eigen::Index i = 0; i < s.size(); ++i) dx[i] = f(s[i], dy[i]);
  });
}

// Accurate over the whole range: exp(-x) overflowing to inf gives the correct limit 0.
template <typename T>
T sigmoid_of(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
T attr(const KernelArgs& a, const char* name) {
  return static_cast<T>(a.attrs().f(name));
}

// --- relu, leaky_relu: piecewise linear. x < 0 tests keep NaN flowing through as PyTorch does.
template <typename T>
void relu_kernel(const KernelArgs& a) {
  unary_chunks<T>(a, [](const auto& x, auto& y) { y = (x < T(0)).select(T(0), x); });
}

template <typename T>
void relu_backward_kernel(const KernelArgs& a) {  // (y, dy)
  binary_chunks<T>(a, [](const auto& y, const auto& dy, auto& dx) { dx = (y > T(0)).select(dy, T(0)); });
}

template <typename T>
void leaky_relu_kernel(const KernelArgs& a) {
  const T slope = attr<T>(a, "negative_slope");
  unary_chunks<T>(a, [slope](const auto& x, auto& y) { y = (x > T(0)).select(x, x * slope); });
}

template <typename T>
void leaky_relu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  const T slope = attr<T>(a, "negative_slope");
  binary_chunks<T>(a, [slope](const auto& x, const auto& dy, auto& dx) { dx = (x > T(0)).select(dy, dy * slope); });
}

// --- elu: alpha * (exp(x) - 1) for x <= 0, via expm1 for accuracy near 0.
template <typename T>
void elu_kernel(const KernelArgs& a) {
  const T alpha = attr<T>(a, "alpha");
  unary_each<T>(a, [alpha](T x) { return x > T(0) ? x : alpha * std::expm1(x); });
}

template <typename T>
void elu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  const T alpha = attr<T>(a, "alpha");
  binary_each<T>(a, [alpha](T x, T dy) { return x > T(0) ? dy : dy * alpha * std::exp(x); });
}

// --- gelu: exact x * Phi(x), or the tanh approximation.
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

template <typename T>
void gelu_kernel(const KernelArgs& a) {
  if (a.attrs().s("approximate") == "tanh") {
    unary_each<T>(a, [](T x) {
      const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      return x * sigmoid_of(T(2) * u);
    });
  } else {
    unary_each<T>(a, [](T x) { return T(0.5) * x * std::erfc(-x * T(kInvSqrt2)); });
  }
}

template <typename T>
void gelu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  if (a.attrs().s("approximate") == "tanh") {
    binary_each<T>(a, [](T x, T dy) {
      const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
      const T s = sigmoid_of(T(2) * u);  // 0.5 * (1 + tanh(u)); 1 - tanh(u)^2 = 4 s (1 - s)
      return dy * (s + T(2) * x * s * (T(1) - s) * du);
    });
  } else {
    binary_each<T>(a, [](T x, T dy) {
      const T cdf = T(0.5) * std::erfc(-x * T(kInvSqrt2));
      const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
      return dy * (cdf + x * pdf);
    });
  }
}

// --- silu: x * sigmoid(x).
template <typename T>
void silu_kernel(const KernelArgs& a) {
  unary_each<T>(a, [](T x) { return x * sigmoid_of(x); });
}

template <typename T>
void silu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  binary_each<T>(a, [](T x, T dy) {
    const T s = sigmoid_of(x);
    return dy * s * (T(1) + x * (T(1) - s));
  });
}

// --- tanh, sigmoid: backward from the output.
template <typename T>
void tanh_kernel(const KernelArgs& a) {
  unary_chunks<T>(a, [](const ConstVecMap<T>& x, VecMap<T>& y) { tanh_to(x.data(), y.data(), x.size()); });
}

template <typename T>
void tanh_backward_kernel(const KernelArgs& a) {  // (y, dy)
  binary_chunks<T>(a, [](const auto& y, const auto& dy, auto& dx) { dx = dy * (T(1) - y * y); });
}

template <typename T>
void sigmoid_kernel(const KernelArgs& a) {
  unary_chunks<T>(a, [](const ConstVecMap<T>& x, VecMap<T>& y) { sigmoid_to(x.data(), y.data(), x.size()); });
}

template <typename T>
void sigmoid_backward_kernel(const KernelArgs& a) {  // (y, dy)
  binary_chunks<T>(a, [](const auto& y, const auto& dy, auto& dx) { dx = dy * y * (T(1) - y); });
}

// --- softplus: log(1 + exp(beta x)) / beta, linear (= x) where beta x > threshold (PyTorch).
// Below the threshold, max(z, 0) + log1p(exp(-|z|)) stays finite for any z.
template <typename T>
void softplus_kernel(const KernelArgs& a) {
  const T beta = attr<T>(a, "beta");
  const T threshold = attr<T>(a, "threshold");
  unary_each<T>(a, [beta, threshold](T x) {
    const T z = beta * x;
    if (z > threshold) return x;
    return (std::max(z, T(0)) + std::log1p(std::exp(-std::abs(z)))) / beta;
  });
}

template <typename T>
void softplus_backward_kernel(const KernelArgs& a) {  // (x, dy)
  const T beta = attr<T>(a, "beta");
  const T threshold = attr<T>(a, "threshold");
  binary_each<T>(a, [beta, threshold](T x, T dy) {
    const T z = beta * x;
    return z > threshold ? dy : dy * sigmoid_of(z);
  });
}

}  // namespace
}  // namespace eigen

void register_eigen_activation(KernelTable& t) {
  using namespace eigen;
  TREADLE_EIGEN_REGISTER_FLOATS(t, "relu", relu_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "relu_backward", relu_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "leaky_relu", leaky_relu_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "leaky_relu_backward", leaky_relu_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "elu", elu_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "elu_backward", elu_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gelu", gelu_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "gelu_backward", gelu_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "silu", silu_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "silu_backward", silu_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "tanh", tanh_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "tanh_backward", tanh_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "sigmoid", sigmoid_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "sigmoid_backward", sigmoid_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "softplus", softplus_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "softplus_backward", softplus_backward_kernel);
}

}  // namespace treadle

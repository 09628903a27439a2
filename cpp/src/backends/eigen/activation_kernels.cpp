// Eigen reference kernels for the activation ops and their backward ops.
// Piecewise-linear and algebraic maps use Eigen array expressions (vectorised). In double,
// transcendental maps use the C library per element: this backend is the accuracy reference, and
// Eigen's fast packet approximations (e.g. float tanh saturating at |x| ~ 7.9) are not. In float,
// tanh, sigmoid, softplus, silu, elu and both GELUs are vectorised on Eigen's accurate float exp,
// log1p and expm1 and the checked sigmoid of transcendental.hpp, with formulas that neither
// overflow nor cancel; tests/test_activation_accuracy.py holds each to its ulp bound against the
// double kernels over the whole float range; exact GELU uses a vectorised erfc (erfc_to below).
// Forms are chosen to avoid cancellation: 0.5 * (1 + erf(z)) is computed as 0.5 * erfc(-z), and
// 0.5 * (1 + tanh(u)) as sigmoid(2u).
#include <algorithm>
#include <cmath>
#include <type_traits>

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

using ArrayF = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayF = Eigen::Map<const Eigen::ArrayXf>;

// Float maps in blocks of kMathBlock with scratch blocks: f(x, y, scratch) for a forward op,
// f(x, dy, dx, scratch, scratch2) for a backward one (x the saved input).
template <typename F>
void float_unary_blocks(const KernelArgs& a, F&& f) {
  unary_chunks<float>(a, [&](const ConstVecMap<float>& x, VecMap<float>& y) {
    alignas(64) float scratch[kMathBlock];
    for (Eigen::Index i0 = 0; i0 < x.size(); i0 += kMathBlock) {
      const Eigen::Index m = std::min<Eigen::Index>(kMathBlock, x.size() - i0);
      ArrayF ys(y.data() + i0, m), ss(scratch, m);
      f(ConstArrayF(x.data() + i0, m), ys, ss);
    }
  });
}

template <typename F>
void float_binary_blocks(const KernelArgs& a, F&& f) {
  binary_chunks<float>(a, [&](const ConstVecMap<float>& x, const ConstVecMap<float>& dy, VecMap<float>& dx) {
    alignas(64) float scratch[2][kMathBlock];
    for (Eigen::Index i0 = 0; i0 < x.size(); i0 += kMathBlock) {
      const Eigen::Index m = std::min<Eigen::Index>(kMathBlock, x.size() - i0);
      ArrayF dxs(dx.data() + i0, m), s1(scratch[0], m), s2(scratch[1], m);
      f(ConstArrayF(x.data() + i0, m), ConstArrayF(dy.data() + i0, m), dxs, s1, s2);
    }
  });
}

// sigmoid(z) and 1 - sigmoid(z) into s and c, both to a few ulp: from e = exp(-|z|), s = 1 / (1 + e)
// and c = e / (1 + e) for z >= 0 (mirrored below), so neither is found by cancelling 1 - s.
inline void sigmoid_and_complement(const ArrayF& z, ArrayF& s, ArrayF& c) {
  c = -z.abs();
  exp_nonpositive(c);
  const float* zp = z.data();
  float *sp = s.data(), *cp = c.data();
  for (Eigen::Index i = 0; i < z.size(); ++i) {  // one vectorised loop (Eigen's select is scalar)
    const bool up = zp[i] >= 0.0f;
    const float e = cp[i], d = 1.0f + e;
    sp[i] = blend(up, 1.0f, e) / d;
    cp[i] = blend(up, e, 1.0f) / d;
  }
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
  if constexpr (std::is_same_v<T, float>) {
    float_unary_blocks(a, [alpha](const ConstArrayF& x, ArrayF& y, ArrayF& e) {
      e = x.min(0.0f);  // min: no overflow on the branch that is not taken
      expm1_nonpositive_to(e.data(), e.data(), e.size());
      y = (x > 0.0f).select(x, alpha * e);
    });
  } else {
    unary_each<T>(a, [alpha](T x) { return x > T(0) ? x : alpha * std::expm1(x); });
  }
}

template <typename T>
void elu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  const T alpha = attr<T>(a, "alpha");
  if constexpr (std::is_same_v<T, float>) {
    float_binary_blocks(a, [alpha](const ConstArrayF& x, const ConstArrayF& dy, ArrayF& dx, ArrayF& e, ArrayF&) {
      e = x.min(0.0f);
      exp_nonpositive(e);
      dx = (x > 0.0f).select(dy, dy * alpha * e);
    });
  } else {
    binary_each<T>(a, [alpha](T x, T dy) { return x > T(0) ? dy : dy * alpha * std::exp(x); });
  }
}

// --- gelu: exact x * Phi(x), or the tanh approximation.
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

// The tanh approximation's sigmoid and its derivative terms saturate long before |x| = 30 (the
// sigmoid of 2u is 1 or 0 and s (1 - s) is 0 in double as in float), so they are computed at x
// clamped to [-30, 30]: x^3 would overflow a float from |x| ~ 7e12 and turn 0 * inf into NaN.
constexpr double kGeluClamp = 30.0;

// x clamped to [-kGeluClamp, kGeluClamp], for float arrays.
template <typename X>
auto gelu_clamped_array(const X& x) {
  return x.max(-float(kGeluClamp)).min(float(kGeluClamp));
}

// u of the tanh approximation, sqrt(2 / pi) (x + 0.044715 x^3), at x clamped.
template <typename X>
auto gelu_u(const X& x) {
  const auto xc = gelu_clamped_array(x);
  return float(kSqrt2OverPi) * (xc + float(kGeluCubic) * xc * xc * xc);
}

template <typename T>
T gelu_clamped(T x) {
  return std::clamp(x, T(-kGeluClamp), T(kGeluClamp));
}

// erfc(w) for float arrays, vectorised: t exp(-w^2 + P(t)) with t = 1 / (1 + |w| / 2), a Chebyshev
// fit with relative error below 1.2e-7 over the whole line (W. H. Press et al., Numerical Recipes,
// erfcc), mirrored as 2 - erfc(|w|) for w < 0. Relative accuracy in the tail is what GELU needs:
// 0.5 x (1 + erf(x / sqrt 2)) would cancel there. `e` is scratch. The polynomial is one loop per
// element that the compiler vectorises (as Eigen array expressions it was nine passes over the
// block: 3.4 ns per element on AMD Zen 3, now 1.4).
inline void erfc_to(const ArrayF& w, ArrayF& out, ArrayF& e) {
  static constexpr float kP[] = {-1.26551223f, 1.00002368f, 0.37409196f, 0.09678418f, -0.18628806f,
                                 0.27886807f,  -1.13520398f, 1.48851587f, -0.82215223f, 0.17087277f};
  const int64_t m = w.size();
  const float* wp = w.data();
  float *tp = out.data(), *ep = e.data();
  for (int64_t i = 0; i < m; ++i) {
    const float t = 1.0f / (1.0f + 0.5f * std::abs(wp[i]));
    float p = kP[9];
#pragma GCC unroll 8
    for (int k = 8; k >= 1; --k) p = p * t + kP[k];
    tp[i] = t;
    ep[i] = p * t + (kP[0] - wp[i] * wp[i]);
  }
  exp_nonpositive(e);  // the argument is at most P(1) = 3e-8 (at w = 0)
  for (int64_t i = 0; i < m; ++i) {
    const float v = ep[i] * tp[i];  // erfc(|w|)
    tp[i] = blend(wp[i] >= 0.0f, v, 2.0f - v);
  }
}

#ifdef EIGEN_VECTORIZE
// erfc_to's formulas for one packet, in registers (|w| above ~9.3: erfc under FLT_MIN, its
// exponential from expf).
template <typename Packet>
Packet perfc(const Packet& w) {
  using namespace Eigen::internal;
  static constexpr float kP[] = {-1.26551223f, 1.00002368f, 0.37409196f, 0.09678418f, -0.18628806f,
                                 0.27886807f,  -1.13520398f, 1.48851587f, -0.82215223f, 0.17087277f};
  const Packet one = pset1<Packet>(1.0f);
  const Packet t = pdiv(one, pmadd(pset1<Packet>(0.5f), pabs(w), one));
  Packet p = pset1<Packet>(kP[9]);
  for (int k = 8; k >= 1; --k) p = pmadd(p, t, pset1<Packet>(kP[k]));
  const Packet e = pexp_nonpositive(pmadd(p, t, psub(pset1<Packet>(kP[0]), pmul(w, w))));
  const Packet v = pmul(e, t);  // erfc(|w|)
  return pselect(pcmp_le(pzero(w), w), v, psub(pset1<Packet>(2.0f), v));
}
#endif

template <typename T>
void gelu_kernel(const KernelArgs& a) {
  if constexpr (std::is_same_v<T, float>) {
#ifdef EIGEN_VECTORIZE
    if (a.attrs().s("approximate") != "tanh") {  // 0.5 x erfc(-x / sqrt 2), a packet at a time
      unary_chunks<float>(a, [](const ConstVecMap<float>& x, VecMap<float>& y) {
        map_packets(x.data(), y.data(), x.size(), [](const auto& v) {
          using namespace Eigen::internal;
          using P = std::decay_t<decltype(v)>;
          const P c = perfc(pmul(v, pset1<P>(float(-kInvSqrt2))));
          return pmul(pmul(pset1<P>(0.5f), v), c);
        });
      });
      return;
    }
#endif
    if (a.attrs().s("approximate") != "tanh") {
      float_unary_blocks(a, [](const ConstArrayF& x, ArrayF& y, ArrayF& e) {
        alignas(64) float w[kMathBlock];
        ArrayF ws(w, x.size());
        ws = x * float(-kInvSqrt2);
        erfc_to(ws, y, e);
        y = 0.5f * x * y;
      });
    } else {
      float_unary_blocks(a, [](const ConstArrayF& x, ArrayF& y, ArrayF& s) {
        s = 2.0f * gelu_u(x);
        sigmoid_to(s.data(), s.data(), s.size());
        y = x * s;
      });
    }
    return;
  }
  if (a.attrs().s("approximate") == "tanh") {
    unary_each<T>(a, [](T x) {
      const T xc = gelu_clamped(x), u = T(kSqrt2OverPi) * (xc + T(kGeluCubic) * xc * xc * xc);
      return x * sigmoid_of(T(2) * u);
    });
  } else {
    unary_each<T>(a, [](T x) { return T(0.5) * x * std::erfc(-x * T(kInvSqrt2)); });
  }
}

template <typename T>
void gelu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  if constexpr (std::is_same_v<T, float>) {
#ifdef EIGEN_VECTORIZE
    if (a.attrs().s("approximate") != "tanh") {  // dy (Phi(x) + x phi(x)), a packet at a time
      binary_chunks<float>(a, [](const ConstVecMap<float>& x, const ConstVecMap<float>& dy, VecMap<float>& dx) {
        using namespace Eigen::internal;
        using P = packet_traits<float>::type;
        constexpr int64_t S = packet_traits<float>::size;
        const auto f = [](const P& v, const P& g) {
          const P cdf = perfc(pmul(v, pset1<P>(float(-kInvSqrt2))));
          const P pdf = pexp_nonpositive(pmul(pmul(pset1<P>(-0.5f), v), v));
          return pmul(g, pmadd(pmul(v, pset1<P>(float(kInvSqrt2Pi))), pdf, pmul(pset1<P>(0.5f), cdf)));
        };
        const int64_t n = x.size();
        int64_t i = 0;
        for (; i + S <= n; i += S) pstoreu(dx.data() + i, f(ploadu<P>(x.data() + i), ploadu<P>(dy.data() + i)));
        if (i == n) return;
        alignas(64) float xt[S] = {}, gt[S] = {};
        std::copy(x.data() + i, x.data() + n, xt);
        std::copy(dy.data() + i, dy.data() + n, gt);
        pstore(xt, f(pload<P>(xt), pload<P>(gt)));
        std::copy(xt, xt + (n - i), dx.data() + i);
      });
      return;
    }
#endif
    if (a.attrs().s("approximate") != "tanh") {
      float_binary_blocks(a, [](const ConstArrayF& x, const ConstArrayF& dy, ArrayF& dx, ArrayF& cdf, ArrayF& e) {
        dx = x * float(-kInvSqrt2);  // dx holds -x / sqrt 2 until the last line
        erfc_to(dx, cdf, e);
        e = -0.5f * x * x;
        exp_nonpositive(e);
        dx = dy * (0.5f * cdf + x * float(kInvSqrt2Pi) * e);
      });
    } else {
      float_binary_blocks(a, [](const ConstArrayF& x, const ConstArrayF& dy, ArrayF& dx, ArrayF& s, ArrayF& c) {
        dx = 2.0f * gelu_u(x);  // dx holds 2u until the last line
        sigmoid_and_complement(dx, s, c);
        const auto xc = gelu_clamped_array(x);
        const auto du = float(kSqrt2OverPi) * (1.0f + float(3 * kGeluCubic) * xc * xc);
        dx = dy * (s + 2.0f * xc * s * c * du);
      });
    }
    return;
  }
  if (a.attrs().s("approximate") == "tanh") {
    binary_each<T>(a, [](T x, T dy) {
      const T xc = gelu_clamped(x), u = T(kSqrt2OverPi) * (xc + T(kGeluCubic) * xc * xc * xc);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * xc * xc);
      const T s = sigmoid_of(T(2) * u);  // 0.5 * (1 + tanh(u)); 1 - tanh(u)^2 = 4 s (1 - s)
      return dy * (s + T(2) * xc * s * (T(1) - s) * du);
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
  if constexpr (std::is_same_v<T, float>) {
    float_unary_blocks(a, [](const ConstArrayF& x, ArrayF& y, ArrayF& s) {
      sigmoid_to(x.data(), s.data(), x.size());
      y = x * s;
    });
  } else {
    unary_each<T>(a, [](T x) { return x * sigmoid_of(x); });
  }
}

template <typename T>
void silu_backward_kernel(const KernelArgs& a) {  // (x, dy)
  if constexpr (std::is_same_v<T, float>) {
    float_binary_blocks(a, [](const ConstArrayF& x, const ConstArrayF& dy, ArrayF& dx, ArrayF& s, ArrayF& c) {
      dx = x;
      sigmoid_and_complement(dx, s, c);
      dx = dy * s * (1.0f + x * c);
    });
  } else {
    binary_each<T>(a, [](T x, T dy) {
      const T s = sigmoid_of(x);
      return dy * s * (T(1) + x * (T(1) - s));
    });
  }
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
  if constexpr (std::is_same_v<T, float>) {
    float_unary_blocks(a, [beta, threshold](const ConstArrayF& x, ArrayF& y, ArrayF& l) {
      l = -(beta * x).abs();
      exp_nonpositive(l);
      l = l.log1p();
      y = (beta * x > threshold).select(x, ((beta * x).max(0.0f) + l) / beta);
    });
    return;
  }
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
  if constexpr (std::is_same_v<T, float>) {
    float_binary_blocks(a, [beta, threshold](const ConstArrayF& x, const ConstArrayF& dy, ArrayF& dx, ArrayF& s,
                                             ArrayF&) {
      s = beta * x;
      sigmoid_to(s.data(), s.data(), s.size());
      dx = (beta * x > threshold).select(dy, dy * s);
    });
    return;
  }
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

#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <Eigen/Core>

namespace treadle::eigen {

// Vectorised tanh and sigmoid over arrays (out may equal in), shared by the activation and
// recurrent kernels. This backend is the accuracy reference: double uses the
// C library per element; float is vectorised on Eigen's float exp (accurate; not one of the fast
// approximations EIGEN_FAST_MATH enables) with formulas that neither overflow nor cancel. Checked
// over every float: tanh within 1 ulp of the correctly rounded result on [-20, 20] (glibc's tanhf:
// 2 ulp), sigmoid within 2 ulp on [-100, 100] (1 / (1 + expf(-x)): wrong below -87), at 1/30 of
// tanhf's cost, which would otherwise dominate the layer.
constexpr int64_t kMathBlock = 128;

inline void sigmoid_to(const double* in, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::exp(-std::abs(in[i]));
    out[i] = (in[i] >= 0.0 ? 1.0 : e) / (1.0 + e);
  }
}

inline void tanh_to(const double* in, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(in[i]);
}

// exp(t), in place, for float arguments t <= 0 (t > 0 and NaN take Eigen's exp as they are),
// right where it underflows. Eigen's float exp clamps its argument at -88.72 on some instruction
// sets (AVX2, not AVX-512): any t below gives ~3e-39 where exp(-1e30) is 0, and a factor as large as
// x (x * exp(-x) in SiLU's or GELU's derivative) turns that into an O(1) error. Arguments below -87
// (results under FLT_MIN: subnormal or 0) are rare; they are recomputed one by one with the C
// library's expf, each from its own argument only, so a result never depends on its neighbours
// (or on how the work was chunked). Eigen 3.4's Select is not vectorised: the test is kept apart
// from the exp, which stays vectorised.
inline void exp_nonpositive(Eigen::Map<Eigen::ArrayXf>& t) {
  for (Eigen::Index i0 = 0; i0 < t.size(); i0 += kMathBlock) {
    const Eigen::Index m = std::min<Eigen::Index>(kMathBlock, t.size() - i0);
    auto block = t.segment(i0, m);
    if (!(block.minCoeff<Eigen::PropagateNumbers>() < -87.0f)) {  // vectorised; NaN never hides a number
      block = block.exp();
      continue;
    }
    alignas(64) float arg[kMathBlock];
    Eigen::Map<Eigen::ArrayXf>(arg, m) = block;
    block = block.exp();
    for (Eigen::Index i = 0; i < m; ++i)
      if (arg[i] < -87.0f) block[i] = std::exp(arg[i]);
  }
}

// sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below, with e = exp(-|x|) in [0, 1].
inline void sigmoid_to(const float* in, float* out, int64_t n) {
  alignas(64) float e[kMathBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    Eigen::Map<const Eigen::ArrayXf> x(in + i0, m);
    Eigen::Map<Eigen::ArrayXf> em(e, m);
    em = -x.abs();
    exp_nonpositive(em);
    Eigen::Map<Eigen::ArrayXf>(out + i0, m) = (x >= 0.0f).select(1.0f, em) / (1.0f + em);
  }
}

// Taylor coefficients of tanh(x) / x in powers of x^2; through x^19 the series is exact to float
// precision for |x| < 0.55.
constexpr float kTanhSeries[] = {1.0f, -1.0f / 3, 2.0f / 15, -17.0f / 315, 62.0f / 2835, -1382.0f / 155925,
                                 21844.0f / 6081075, -929569.0f / 638512875, 6404582.0f / 10854718875.0f,
                                 -443861162.0f / 1856156927625.0f};

// `a` where `keep`, else `b`, as a blend of bits. A ?: between floats is not if-converted under
// -ftrapping-math (GCC's default), so a loop choosing between two computed values would not
// vectorise; this form does.
inline float blend(bool keep, float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  const uint32_t mask = 0u - static_cast<uint32_t>(keep);
  const uint32_t r = (ua & mask) | (ub & ~mask);
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// tanh|x| = 1 - 2 / (exp(2|x|) + 1) for |x| >= 0.55 (no cancellation: the result is >= 0.5), the
// series below. exp is Eigen's (vectorised); the series and the choice are one loop that the
// compiler vectorises, into a scratch block (out may be in; a separate block keeps that loop free of
// a run-time alias check).
inline void tanh_to(const float* in, float* out, int64_t n) {
  alignas(64) float block[kMathBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    const float* x = in + i0;
    Eigen::Map<Eigen::ArrayXf> e(block, m);
    e = (2.0f * Eigen::Map<const Eigen::ArrayXf>(x, m).abs()).exp();
    for (int64_t i = 0; i < m; ++i) {
      const float z = x[i] * x[i];
      float p = kTanhSeries[9];
#pragma GCC unroll 9
      for (int k = 8; k >= 0; --k) p = p * z + kTanhSeries[k];
      const float series = x[i] * p, large = std::copysign(1.0f - 2.0f / (block[i] + 1.0f), x[i]);
      block[i] = blend(std::abs(x[i]) < 0.55f, series, large);
    }
    std::memcpy(out + i0, block, static_cast<std::size_t>(m) * sizeof(float));
  }
}

// Taylor coefficients of (exp(t) - 1 - t) / t^2: 1/2!, 1/3!, ..., 1/10!. Through 1/10! the
// truncation is under 1e-8 of expm1(t) for |t| <= ln 2.
constexpr float kExpm1Series[] = {1.0f / 2, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040,
                                  1.0f / 40320, 1.0f / 362880, 1.0f / 3628800};

// expm1(t) for float t <= 0 (NaN passes through), into out (which may be t). Eigen's float expm1
// is not vectorised on every instruction set (it ran ~10 ns per element on AVX2, 8x ELU's
// backward). Below -ln 2, exp(t) - 1: exp(t) <= 1/2, so the difference is exact and a 1-ulp exp
// stays within 1 ulp of the result; from -ln 2 to 0, t + t^2 P(t) with P the series above, where
// t is exact and the correction is at most 0.28 of the result: within 1.001 ulp over every float
// near the switch and 10^6 log-spaced arguments (tests/test_activation_accuracy.py). Eigen's exp
// may clamp below -88.72 (AVX2): that still gives -1.
inline void expm1_nonpositive_to(const float* t, float* out, int64_t n) {
  alignas(64) float block[kMathBlock];
  constexpr float kLn2 = 0.693147180559945f;
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    const float* x = t + i0;
    Eigen::Map<Eigen::ArrayXf> e(block, m);
    e = Eigen::Map<const Eigen::ArrayXf>(x, m).exp() - 1.0f;
    for (int64_t i = 0; i < m; ++i) {
      float p = kExpm1Series[8];
#pragma GCC unroll 8
      for (int k = 7; k >= 0; --k) p = p * x[i] + kExpm1Series[k];
      const float series = blend(x[i] == 0.0f, x[i], x[i] + x[i] * x[i] * p);  // expm1(-0) = -0
      block[i] = blend(x[i] > -kLn2, series, block[i]);
    }
    std::memcpy(out + i0, block, static_cast<std::size_t>(m) * sizeof(float));
  }
}

}  // namespace treadle::eigen

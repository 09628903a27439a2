#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

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

// exp(t), in place, for float arguments t <= 0 (NaN stays NaN; t > 0 takes Eigen's exp as it is),
// right where it underflows. Eigen's float exp clamps its argument at -88.72 on some instruction
// sets (AVX2, not AVX-512): any t below gives ~3e-39 where exp(-1e30) is 0, and a factor as large as
// x (x * exp(-x) in SiLU's or GELU's derivative) turns that into an O(1) error. Below -87 (results
// under FLT_MIN) the argument is raised by 64 ln 2 (the sum is exact there) and the result scaled by
// 2^-64, one rounding into the subnormals; below -104, where exp(t) rounds to 0 in float, it is 0.
inline void exp_nonpositive(Eigen::Map<Eigen::ArrayXf>& t) {
  using Const = Eigen::ArrayXf;  // Constant(): an expression, nothing allocated
  const auto lift = Const::Constant(t.size(), 44.3614196f), drop = Const::Constant(t.size(), 5.42101086e-20f);
  const auto tiny = t < -87.0f;
  t = (t < -104.0f).select(0.0f, (t + tiny.select(lift, 0.0f)).exp() * tiny.select(drop, 1.0f));  // 64 ln 2, 2^-64
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

// tanh|x| = 1 - 2 / (exp(2|x|) + 1) for |x| >= 0.55 (no cancellation: the result is >= 0.5), the
// series below.
inline void tanh_to(const float* in, float* out, int64_t n) {
  alignas(64) float e[kMathBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    Eigen::Map<Eigen::ArrayXf>(e, m) = (2.0f * Eigen::Map<const Eigen::ArrayXf>(in + i0, m).abs()).exp();
    for (int64_t i = 0; i < m; ++i) {
      const float x = in[i0 + i], z = x * x;
      float p = kTanhSeries[9];
      for (int k = 8; k >= 0; --k) p = p * z + kTanhSeries[k];
      const float large = std::copysign(1.0f - 2.0f / (e[i] + 1.0f), x);
      out[i0 + i] = std::abs(x) < 0.55f ? x * p : large;
    }
  }
}



}  // namespace treadle::eigen

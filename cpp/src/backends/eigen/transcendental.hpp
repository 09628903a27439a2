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

// exp(x) for float x, with Eigen's float exp in the normal range: the same Cephes reduction and
// polynomial in the same order, so the same results, but 2^m is written into the exponent bits
// (Eigen's pldexp_fast_impl) where Eigen's generic ldexp, which also covers exponents outside the
// normal range, took about 2/3 of its time on AVX2. x is clamped to [-87.3, 88.3], where 2^m is a
// normal float: below, the result is exp(-87.3) (callers needing less recompute those), above,
// exp(88.3); +inf gives +inf and NaN gives NaN (the last max with x, as Eigen's).
constexpr float kExpLo = -87.3f, kExpHi = 88.3f;

#ifdef EIGEN_VECTORIZE
template <typename Packet>
Packet pexp_normal_range(const Packet& x_in) {
  using namespace Eigen::internal;
  const Packet x = pmax(pmin(x_in, pset1<Packet>(kExpHi)), pset1<Packet>(kExpLo));
  const Packet m = pfloor(pmadd(x, pset1<Packet>(1.44269504088896341f), pset1<Packet>(0.5f)));
  Packet r = pmadd(m, pset1<Packet>(-0.693359375f), x);
  r = pmadd(m, pset1<Packet>(2.12194440e-4f), r);
  const Packet r2 = pmul(r, r), r3 = pmul(r2, r);
  Packet y = pmadd(pset1<Packet>(1.9875691500E-4f), r, pset1<Packet>(1.3981999507E-3f));
  Packet y1 = pmadd(pset1<Packet>(4.1665795894E-2f), r, pset1<Packet>(1.6666665459E-1f));
  const Packet y2 = padd(r, pset1<Packet>(1.0f));
  y = pmadd(y, r, pset1<Packet>(8.3334519073E-3f));
  y1 = pmadd(y1, r, pset1<Packet>(5.0000001201E-1f));
  y = pmadd(y, r3, y1);
  y = pmadd(y, r2, y2);
  return pmax(pldexp_fast_impl<Packet>::run(y, m), x_in);
}
#endif

// out = exp(in) as above, over arrays (out may be in).
inline void exp_to(const float* in, float* out, int64_t n) {
#ifdef EIGEN_VECTORIZE
  using Packet = Eigen::internal::packet_traits<float>::type;
  constexpr int64_t S = Eigen::internal::packet_traits<float>::size;
  int64_t i = 0;
  for (; i + S <= n; i += S)
    Eigen::internal::pstoreu(out + i, pexp_normal_range(Eigen::internal::ploadu<Packet>(in + i)));
  if (i == n) return;
  alignas(64) float tail[S] = {};
  std::copy(in + i, in + n, tail);
  Eigen::internal::pstoreu(tail, pexp_normal_range(Eigen::internal::ploadu<Packet>(tail)));
  std::copy(tail, tail + (n - i), out + i);
#else
  Eigen::Map<Eigen::ArrayXf>(out, n) = Eigen::Map<const Eigen::ArrayXf>(in, n).max(kExpLo).min(kExpHi).exp();
#endif
}

// exp(t), in place, for float arguments t <= 0 (t > 0 and NaN take exp_to as they are), right
// where it underflows. A vectorised exp clamps its argument (exp_to at -87.3; Eigen's at -88.72 on
// AVX2): any t below gives ~1e-38 where exp(-1e30) is 0, and a factor as large as x (x * exp(-x) in
// SiLU's or GELU's derivative) turns that into an O(1) error. Arguments below -87 (results under
// FLT_MIN: subnormal or 0) are rare; they are recomputed one by one with the C library's expf, each
// from its own argument only, so a result never depends on its neighbours (or on how the work was
// chunked). Eigen 3.4's Select is not vectorised: the test is kept apart from the exp.
inline void exp_nonpositive(Eigen::Map<Eigen::ArrayXf>& t) {
  for (Eigen::Index i0 = 0; i0 < t.size(); i0 += kMathBlock) {
    const int64_t m = std::min<int64_t>(kMathBlock, t.size() - i0);
    float* block = t.data() + i0;
    int low = 0;  // a loop the compiler vectorises; NaN compares false and takes exp_to
    for (int64_t i = 0; i < m; ++i) low |= block[i] < -87.0f;
    if (!low) {
      exp_to(block, block, m);
      continue;
    }
    alignas(64) float arg[kMathBlock];
    std::copy(block, block + m, arg);
    exp_to(block, block, m);
    for (int64_t i = 0; i < m; ++i)
      if (arg[i] < -87.0f) block[i] = std::exp(arg[i]);
  }
}

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

// sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below, with e = exp(-|x|) in [0, 1]. With
// vector instructions a packet at a time in registers (as tanh below): the same bits as the block
// version, which took the exp over a block into scratch and the choice and division in a second loop
// (checked over all 2^32 floats with AVX-512 and AVX2 code; 0.80 -> 0.52 ns per element with AVX2,
// 0.47 -> 0.44 with AVX-512, in a C++ loop over 65,536 cached floats on a Xeon).
#ifdef EIGEN_VECTORIZE
// exp_nonpositive for one packet: lanes below -87 (results under FLT_MIN, where the vectorised exp
// clamps) recomputed with the C library's expf, each from its own argument.
template <typename Packet>
Packet pexp_nonpositive(const Packet& arg) {
  using namespace Eigen::internal;
  const Packet e = pexp_normal_range(arg);
  if (!predux_any(pcmp_lt(arg, pset1<Packet>(-87.0f)))) return e;
  constexpr int S = unpacket_traits<Packet>::size;
  alignas(64) float a[S], v[S];
  pstore(a, arg);
  pstore(v, e);
  for (int j = 0; j < S; ++j)
    if (a[j] < -87.0f) v[j] = std::exp(a[j]);
  return pload<Packet>(v);
}

template <typename Packet>
Packet psigmoid_accurate(const Packet& x) {
  using namespace Eigen::internal;
  const Packet one = pset1<Packet>(1.0f);
  const Packet e = pexp_nonpositive(pnegate(pabs(x)));
  return pdiv(pselect(pcmp_le(pzero(x), x), one, e), padd(one, e));
}
#endif

// Taylor coefficients of tanh(x) / x in powers of x^2; through x^19 the series is exact to float
// precision for |x| < 0.55.
constexpr float kTanhSeries[] = {1.0f, -1.0f / 3, 2.0f / 15, -17.0f / 315, 62.0f / 2835, -1382.0f / 155925,
                                 21844.0f / 6081075, -929569.0f / 638512875, 6404582.0f / 10854718875.0f,
                                 -443861162.0f / 1856156927625.0f};

// tanh|x| = 1 - 2 / (exp(2|x|) + 1) for |x| >= 0.55 (no cancellation: the result is >= 0.5), the
// series below, with the sign of x put back. With vector instructions each packet goes through
// exp, the series, the division and the choice in registers, two packets per iteration: 1.5x the
// speed of computing exp over a block and then the rest in a second loop (0.77 -> 0.5 ns per
// element with AVX-512, 1.1 -> 0.73 with AVX2), with the same results bit for bit.
#ifdef EIGEN_VECTORIZE
template <typename Packet>
Packet ptanh_accurate(const Packet& x) {
  using namespace Eigen::internal;
  const Packet a = pabs(x), z = pmul(x, x), one = pset1<Packet>(1.0f);
  Packet p = pset1<Packet>(kTanhSeries[9]);
  for (int k = 8; k >= 0; --k) p = pmadd(p, z, pset1<Packet>(kTanhSeries[k]));
  const Packet e = pexp_normal_range(padd(a, a));  // clamped at exp(88.3), where tanh is 1 already
  const Packet large = por(psub(one, pdiv(pset1<Packet>(2.0f), padd(e, one))), pand(x, pset1<Packet>(-0.0f)));
  return pselect(pcmp_lt(a, pset1<Packet>(0.55f)), pmul(x, p), large);
}

// out[i] = f(in[i]) a packet at a time (out may be in), two packets per iteration: two independent
// chains keep the FMA units busy. The last partial packet is computed on a zero-padded copy.
template <typename F>
inline void map_packets(const float* in, float* out, int64_t n, F&& f) {
  using namespace Eigen::internal;
  using Packet = packet_traits<float>::type;
  constexpr int64_t S = packet_traits<float>::size;
  int64_t i = 0;
  for (; i + 2 * S <= n; i += 2 * S) {
    const Packet x0 = ploadu<Packet>(in + i), x1 = ploadu<Packet>(in + i + S);
    pstoreu(out + i, f(x0));
    pstoreu(out + i + S, f(x1));
  }
  for (; i < n; i += S) {
    const int64_t m = std::min(S, n - i);
    alignas(64) float tail[S] = {};
    std::copy(in + i, in + i + m, tail);
    pstoreu(tail, f(ploadu<Packet>(tail)));
    std::copy(tail, tail + m, out + i);
  }
}

inline void tanh_to(const float* in, float* out, int64_t n) {
  map_packets(in, out, n, [](const auto& x) { return ptanh_accurate(x); });
}

inline void sigmoid_to(const float* in, float* out, int64_t n) {
  map_packets(in, out, n, [](const auto& x) { return psigmoid_accurate(x); });
}
#else
// Without vector instructions: exp over a block into scratch (out may be in), then the choice and
// the division in one loop.
inline void sigmoid_to(const float* in, float* out, int64_t n) {
  alignas(64) float e[kMathBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    Eigen::Map<const Eigen::ArrayXf> x(in + i0, m);
    Eigen::Map<Eigen::ArrayXf> em(e, m);
    em = -x.abs();
    exp_nonpositive(em);
    const float* xi = in + i0;
    for (int64_t i = 0; i < m; ++i) e[i] = blend(xi[i] >= 0.0f, 1.0f, e[i]) / (1.0f + e[i]);
    std::memcpy(out + i0, e, static_cast<std::size_t>(m) * sizeof(float));
  }
}

// Without vector instructions: exp over a block into scratch (out may be in), then the series and
// the choice in one loop.
inline void tanh_to(const float* in, float* out, int64_t n) {
  alignas(64) float block[kMathBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kMathBlock) {
    const int64_t m = std::min(kMathBlock, n - i0);
    const float* x = in + i0;
    Eigen::Map<Eigen::ArrayXf>(block, m) = 2.0f * Eigen::Map<const Eigen::ArrayXf>(x, m).abs();
    exp_to(block, block, m);  // clamped at exp(88.3), where tanh is 1 already
    for (int64_t i = 0; i < m; ++i) {
      const float z = x[i] * x[i];
      float p = kTanhSeries[9];
      for (int k = 8; k >= 0; --k) p = p * z + kTanhSeries[k];
      const float series = x[i] * p, large = std::copysign(1.0f - 2.0f / (block[i] + 1.0f), x[i]);
      block[i] = blend(std::abs(x[i]) < 0.55f, series, large);
    }
    std::memcpy(out + i0, block, static_cast<std::size_t>(m) * sizeof(float));
  }
}
#endif

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

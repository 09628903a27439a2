// Tests of mixed-precision support: the loss scaler's step rule and an independent host model of
// IEEE fp16 rounding (host checks, no device), then the device kernels: fp16 conversion over every
// fp16 value and rounding ties, gradient scaling/unscaling with the non-finite flag (Inf and NaN
// injected), and the device scale update against the host scaler.
#include <cmath>
#include <cstring>

#include "backends/cuda/loss_scale.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> binary16, round to nearest even, written from the formats' definitions.
uint16_t host_to_half(float f) {
  const uint32_t u = bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN (payload not compared)
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 = halfway above 65504 rounds (to even) to Inf
  if (a < 0x38800000u) {                         // below 2^-14: a multiple of 2^-24, rounded to even
    const double units = std::nearbyint(static_cast<double>(from_bits(a)) * 16777216.0);
    return sign | static_cast<uint16_t>(units);  // 1024 units is the smallest normal's encoding
  }
  const uint32_t exp = (a >> 23) - 127 + 15, mant = a & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return sign | static_cast<uint16_t>(h);
}

float host_from_half(uint16_t h) {
  const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(1.0f + mant / 1024.0f, exp - 15);
}

// Bitwise equality, except that NaN matches any NaN.
bool same_half(uint16_t a, uint16_t b) {
  const bool na = (a & 0x7c00u) == 0x7c00u && (a & 0x3ffu), nb = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
  return na || nb ? na == nb : a == b;
}

bool same_float(float a, float b) { return std::isnan(a) || std::isnan(b) ? std::isnan(a) && std::isnan(b) : bits(a) == bits(b); }

// ---- device tests ------------------------------------------------------------------------------

std::string fp16_conversion(Env& env) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  DeviceArray<uint16_t> dh(env, all), back(env, all.size());
  DeviceArray<float> df(env, all.size());
  fp16_to_float(dh.get(), df.get(), static_cast<int64_t>(all.size()), env.s());
  const std::vector<float> f = df.download();
  for (uint32_t i = 0; i < 65536; ++i)
    expect(same_float(f[i], host_from_half(all[i])), "fp16_to_float(0x", std::hex, i, ") = ", f[i]);
  float_to_fp16(df.get(), back.get(), static_cast<int64_t>(all.size()), env.s());
  const std::vector<uint16_t> rt = back.download();
  for (uint32_t i = 0; i < 65536; ++i) expect(same_half(rt[i], all[i]), "round trip of 0x", std::hex, i);
  // Random floats over the whole fp16 range and beyond, plus exact ties between neighbours.
  std::vector<float> x = uniform(env, 1 << 18, -1, 1);
  std::uniform_int_distribution<int> e(-30, 18);
  for (float& v : x) v = std::ldexp(v, e(env.rng));
  for (uint32_t i = 0; i < 0x7bffu; i += 7) {
    const float lo = host_from_half(static_cast<uint16_t>(i)), hi = host_from_half(static_cast<uint16_t>(i + 1));
    x.push_back((lo + hi) / 2);  // exact in float32; must round to the even neighbour
    x.push_back(-(lo + hi) / 2);
  }
  for (float v : {65504.0f, 65519.99f, 65520.0f, 1e10f, 6e-8f, 2.9802322e-08f, INFINITY, -INFINITY, NAN}) x.push_back(v);
  DeviceArray<float> dx(env, x);
  DeviceArray<uint16_t> dx16(env, x.size());
  float_to_fp16(dx.get(), dx16.get(), static_cast<int64_t>(x.size()), env.s());
  const std::vector<uint16_t> got = dx16.download();
  for (std::size_t i = 0; i < x.size(); ++i)
    expect(same_half(got[i], host_to_half(x[i])), "float_to_fp16(", x[i], ") = 0x", std::hex, got[i], ", expected 0x",
           host_to_half(x[i]));
  return detail::concat("all 65536 fp16 values both ways, ", x.size(), " floats incl. ties: bitwise");
}

// Scale, unscale (in place too) and the flag, on `n` values with optional injected non-finites.
int32_t run_scaling(Env& env, std::vector<float> g, float scale, const std::vector<std::pair<std::size_t, float>>& bad) {
  for (auto [i, v] : bad) g[i] = v;
  DeviceArray<float> dg(env, g), scaled(env, g.size()), ds(env, std::vector<float>{scale});
  DeviceArray<int32_t> flag(env, std::vector<int32_t>{7});
  const int64_t n = static_cast<int64_t>(g.size());
  clear_nonfinite_flag(flag.get(), env.s());
  scale_gradients(dg.get(), scaled.get(), n, ds.get(), ScaleDirection::multiply, flag.get(), env.s());
  const std::vector<float> up = scaled.download();
  scale_gradients(scaled.get(), scaled.get(), n, ds.get(), ScaleDirection::divide, flag.get(), env.s());
  const std::vector<float> down = scaled.download();
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < g.size(); ++i) {
    expect(same_float(up[i], g[i] * scale), "scaled[", i, "] = ", up[i], ", expected ", g[i] * scale);
    expect(same_float(down[i], up[i] * inv), "unscaled[", i, "] = ", down[i], ", expected ", up[i] * inv);
  }
  return flag.download()[0];
}

std::string loss_scaling(Env& env) {
  const std::size_t n = (1 << 20) + 7;  // a tail past the last full block
  const std::vector<float> g = uniform(env, n, -1e-3f, 1e-3f);
  expect(run_scaling(env, g, 1024.0f, {}) == 0, "finite gradients set the flag");
  expect(run_scaling(env, g, 1024.0f, {{n - 1, INFINITY}}) == 1, "an Inf in the last element was missed");
  expect(run_scaling(env, g, 1024.0f, {{12345, NAN}}) == 1, "a NaN was missed");
  // Finite inputs whose scaled value overflows float32 are flagged as well.
  expect(run_scaling(env, g, 3e38f, {{0, 1e3f}}) == 1, "an overflow of the scaled value was missed");
  // fp16 gradients unscaled into float32.
  std::vector<uint16_t> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = host_to_half(g[i] * 1024.0f);
  DeviceArray<uint16_t> dh(env, h);
  DeviceArray<float> out(env, n), ds(env, std::vector<float>{1024.0f});
  DeviceArray<int32_t> flag(env, 1);
  clear_nonfinite_flag(flag.get(), env.s());
  unscale_fp16_gradients(dh.get(), out.get(), static_cast<int64_t>(n), ds.get(), flag.get(), env.s());
  const std::vector<float> o = out.download();
  for (std::size_t i = 0; i < n; ++i)
    expect(same_float(o[i], host_from_half(h[i]) * (1.0f / 1024.0f)), "fp16 unscale [", i, "]");
  expect(flag.download()[0] == 0, "finite fp16 gradients set the flag");
  h[n / 2] = 0x7c00u;  // +Inf: what an fp16 backward produces on overflow
  dh.upload(h);
  unscale_fp16_gradients(dh.get(), out.get(), static_cast<int64_t>(n), ds.get(), flag.get(), env.s());
  expect(flag.download()[0] == 1, "an Inf among fp16 gradients was missed");
  return detail::concat(n, " values: scale/unscale bitwise, flag for Inf (tail), NaN, overflow; fp16 unscale");
}

std::string loss_scale_device_update(Env& env) {
  LossScaleOptions o;
  o.init_scale = 1024.0f, o.growth_interval = 3;
  DynamicLossScaler host(o);
  DeviceArray<float> scale(env, std::vector<float>{o.init_scale});
  DeviceArray<int32_t> good(env, std::vector<int32_t>{0}), flag(env, 1);
  const int pattern[] = {0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int f : pattern) {
    flag.upload(std::vector<int32_t>{f});
    loss_scale_update(scale.get(), good.get(), flag.get(), o, env.s());
    host.update(f != 0);
    const float s = scale.download()[0];
    const int32_t k = good.download()[0];
    expect(s == host.scale() && k == host.good_steps(), "device scale ", s, " / count ", k, " vs host ", host.scale(),
           " / ", host.good_steps());
  }
  return detail::concat("16 steps with overflows: device scale and count equal the host scaler's (scale ", host.scale(), ")");
}

}  // namespace

// ---- host checks -----------------------------------------------------------------------------------

std::string loss_scaler_logic() {
  LossScaleOptions o;
  o.init_scale = 8.0f, o.growth_interval = 3;
  DynamicLossScaler s(o);
  expect(s.update(false) && s.update(false) && s.scale() == 8.0f && s.good_steps() == 2, "no growth before 3 good steps");
  expect(s.update(false) && s.scale() == 16.0f && s.good_steps() == 0, "growth after 3 good steps: ", s.scale());
  expect(s.update(false) && !s.update(true), "an overflow must skip the step");
  expect(s.scale() == 8.0f && s.good_steps() == 0 && s.skipped_steps() == 1, "backoff to ", s.scale());
  expect(!s.update(true) && s.scale() == 4.0f && s.skipped_steps() == 2, "second backoff");
  LossScaleOptions big = o;
  big.init_scale = 3e38f, big.growth_interval = 1;
  DynamicLossScaler b(big);
  expect(b.update(false) && b.scale() == 3e38f && b.good_steps() == 0, "growth to Inf must be refused");
  expect_throw<ValueError>("factor", [] { LossScaleOptions x; x.growth_factor = 1.0f; DynamicLossScaler{x}; },
                           "loss_scale: growth_factor must be > 1");
  expect_throw<ValueError>("backoff", [] { LossScaleOptions x; x.backoff_factor = 1.0f; DynamicLossScaler{x}; },
                           "loss_scale: backoff_factor must be in (0, 1), got 1");
  expect_throw<ValueError>("interval", [] { LossScaleOptions x; x.growth_interval = 0; DynamicLossScaler{x}; },
                           "growth_interval must be in [1, 2^31 - 1], got 0");
  expect_throw<ValueError>("scale", [] { LossScaleOptions x; x.init_scale = INFINITY; DynamicLossScaler{x}; },
                           "init_scale must be positive and finite");
  expect_throw<ValueError>("kernel null", [] { scale_gradients(nullptr, nullptr, 4, nullptr, ScaleDirection::divide, nullptr, nullptr); },
                           "scale_gradients: null device pointer for 4 elements");
  expect_throw<ValueError>("fp16 n<0", [] { float_to_fp16(nullptr, nullptr, -1, nullptr); },
                           "float_to_fp16: negative element count -1");
  // The host fp16 model used by the device tests, on values whose encodings are known.
  const std::pair<float, uint16_t> known[] = {{1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.99f, 0x7bff},
                                              {65520.0f, 0x7c00}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},
                                              {0x3p-25f, 0x0002}, {0x1p-14f, 0x0400}, {0.1f, 0x2e66},
                                              {0x1.002p0f, 0x3c00}, {0x1.006p0f, 0x3c02}};
  for (auto [f, h] : known) {
    expect(host_to_half(f) == h, "host fp16 model: ", f, " -> 0x", std::hex, host_to_half(f), ", expected 0x", h);
    if (h != 0x7c00) expect(host_from_half(h) == host_from_half(host_to_half(f)), "host fp16 back");
  }
  for (uint32_t i = 0; i < 0x7c00u; ++i)
    expect(host_to_half(host_from_half(static_cast<uint16_t>(i))) == i, "host fp16 round trip of 0x", std::hex, i);
  return "grow after K good steps, halve + skip on overflow, no growth to Inf, option checks; host fp16 model";
}

void add_loss_scale_tests(std::vector<TestCase>& out) {
  out.push_back({"fp16_conversion", fp16_conversion});
  out.push_back({"loss_scaling", loss_scaling});
  out.push_back({"loss_scale_device_update", loss_scale_device_update});
}

}  // namespace treadle::cuda::test

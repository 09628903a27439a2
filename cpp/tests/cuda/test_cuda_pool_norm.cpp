// Device tests of cuDNN pooling (max, average with and without the padding counted), of max pooling
// with the core's int64 indices (our kernels: dilation and ceil mode too), and of batch
// normalisation (training with running statistics, inference, backward, without affine parameters,
// large-mean inputs) against float64 host computations of the core's definitions.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/cudnn_norm.hpp"
#include "backends/cuda/cudnn_pool.hpp"
#include "backends/cuda/max_pool_kernels.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

// ---- pooling ------------------------------------------------------------------------------------

struct PoolRef {
  std::vector<double> y, dx;
};

// PyTorch's windows: start = o * s - p, end = min(start + k, in + p) (the divisor with padding),
// then clipped to the input; max takes the first maximum of the in-range positions.
PoolRef pool_reference(const Pool2dConfig& c, int64_t oh_n, int64_t ow_n, const std::vector<float>& x,
                       const std::vector<float>& dy) {
  const Hw s = c.stride ? *c.stride : c.kernel;
  PoolRef r{std::vector<double>(dy.size()), std::vector<double>(x.size(), 0.0)};
  for (int64_t plane = 0; plane < c.batch * c.channels; ++plane)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        int64_t h0 = oh * s.h - c.padding.h, w0 = ow * s.w - c.padding.w;
        int64_t h1 = std::min(h0 + c.kernel.h, c.height + c.padding.h), w1 = std::min(w0 + c.kernel.w, c.width + c.padding.w);
        const int64_t padded_count = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, c.height), w1 = std::min(w1, c.width);
        const int64_t yi = (plane * oh_n + oh) * ow_n + ow;
        const int64_t base = plane * c.height * c.width;
        if (c.mode == PoolMode::max) {
          int64_t best = -1;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w)
              if (best < 0 || x[base + h * c.width + w] > x[best]) best = base + h * c.width + w;
          r.y[yi] = x[best];
          r.dx[best] += dy[yi];
          continue;
        }
        const int64_t count = c.mode == PoolMode::avg_include_pad ? padded_count : (h1 - h0) * (w1 - w0);
        double sum = 0.0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            sum += x[base + h * c.width + w];
            r.dx[base + h * c.width + w] += double(dy[yi]) / count;
          }
        r.y[yi] = sum / count;
      }
  return r;
}

Pool2dConfig pool_cfg(PoolMode mode, int64_t n, int64_t c, int64_t h, int64_t w, Hw k, Hw s, Hw p) {
  Pool2dConfig x;
  x.batch = n, x.channels = c, x.height = h, x.width = w, x.mode = mode, x.kernel = k, x.stride = s, x.padding = p;
  return x;
}

double check_pool(Env& env, cudnnHandle_t dnn, const char* name, const Pool2dConfig& c, float lo, float hi) {
  CudnnPool2d pool(c);
  const int64_t nx = c.batch * c.channels * c.height * c.width;
  const int64_t ny = c.batch * c.channels * pool.out_height() * pool.out_width();
  const std::vector<float> x = uniform(env, nx, lo, hi), dy = uniform(env, ny, -1, 1);
  DeviceArray<float> dx_in(env, x), ddy(env, dy), dyo(env, ny), ddx(env, nx), again(env, nx);
  pool.forward(dnn, dx_in.get(), dyo.get());
  const bool avg = c.mode != PoolMode::max;
  // The average modes need neither x nor y in the backward.
  pool.backward(dnn, avg ? nullptr : dx_in.get(), avg ? nullptr : dyo.get(), ddy.get(), ddx.get());
  const PoolRef r = pool_reference(c, pool.out_height(), pool.out_width(), x, dy);
  const std::string what = detail::concat(name, " ", pool_mode_name(c.mode));
  const std::vector<float> y = dyo.download(), dx = ddx.download();
  compare(what + " y", y, r.y, 1e-5);
  compare(what + " dx", dx, r.dx, 1e-5);
  pool.backward(dnn, dx_in.get(), dyo.get(), ddy.get(), again.get());
  const std::vector<float> dx2 = again.download();
  expect(std::memcmp(dx2.data(), dx.data(), dx.size() * sizeof(float)) == 0, what, ": backward not bitwise repeatable");
  return std::max(relative_error(y, r.y), relative_error(dx, r.dx));
}

std::string pooling(Env& env) {
  CudnnHandle dnn(env.s());
  double worst = 0.0;
  using M = PoolMode;
  struct Case { const char* name; Pool2dConfig c; float lo, hi; };
  std::vector<Case> cases = {
      {"2x2 s2", pool_cfg(M::max, 2, 3, 8, 8, {2, 2}, {2, 2}, {0, 0}), -1, 1},
      {"3x3 s2 p1 negative", pool_cfg(M::max, 2, 4, 9, 11, {3, 3}, {2, 2}, {1, 1}), -2, -1},
      {"3x3 s1 p1 overlapping", pool_cfg(M::max, 1, 5, 7, 6, {3, 3}, {1, 1}, {1, 1}), -1, 1},
      {"3x3 s2 p1", pool_cfg(M::avg_include_pad, 2, 3, 9, 10, {3, 3}, {2, 2}, {1, 1}), -1, 1},
      {"3x3 s2 p1", pool_cfg(M::avg_exclude_pad, 2, 3, 9, 10, {3, 3}, {2, 2}, {1, 1}), -1, 1},
      {"2x3 s(2,1) p1", pool_cfg(M::avg_include_pad, 1, 2, 7, 8, {2, 3}, {2, 1}, {1, 1}), -1, 1},
      {"2x3 s(2,1) p1", pool_cfg(M::avg_exclude_pad, 1, 2, 7, 8, {2, 3}, {2, 1}, {1, 1}), -1, 1},
      {"2x3 s(2,1) p1", pool_cfg(M::max, 1, 2, 7, 8, {2, 3}, {2, 1}, {1, 1}), -1, 1},
      {"large 3x3 s2", pool_cfg(M::max, 8, 64, 56, 56, {3, 3}, {2, 2}, {1, 1}), -1, 1}};
  Pool2dConfig ceil_same = pool_cfg(M::avg_exclude_pad, 2, 3, 8, 8, {2, 2}, {2, 2}, {0, 0});
  ceil_same.ceil_mode = true;  // ceil and floor agree here: accepted
  cases.push_back({"ceil_mode (same size)", ceil_same, -1, 1});
  for (const Case& k : cases) worst = std::max(worst, check_pool(env, dnn.get(), k.name, k.c, k.lo, k.hi));
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%zu cases (max, avg +/- pad; y, dx, repeat), worst rel.err %.2e (tol 1e-05)",
                cases.size(), worst);
  return buf;
}

// ---- max pooling with indices (own kernels) --------------------------------------------------------

struct IndexPoolRef {
  std::vector<float> y, dx;
  std::vector<int64_t> idx;
};

// The core's Eigen reference, literally: running first maximum where a NaN always takes over; the
// backward adds dy at the index in increasing output order (float, as the kernel's gather).
IndexPoolRef index_pool_reference(const MaxPoolGeometry& g, const std::vector<float>& x, const std::vector<float>& dy) {
  const int64_t iv = g.in_h * g.in_w, ov = g.out_h * g.out_w;
  IndexPoolRef r{std::vector<float>(g.planes * ov), std::vector<float>(x.size(), 0.0f), std::vector<int64_t>(g.planes * ov)};
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        float best = -INFINITY;
        int64_t arg = -1;
        for (int64_t kh = 0; kh < g.kernel_h; ++kh)
          for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
            const int64_t h = oh * g.stride_h - g.pad_h + kh * g.dilation_h, w = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
            if (h < 0 || h >= g.in_h || w < 0 || w >= g.in_w) continue;
            const float v = x[p * iv + h * g.in_w + w];
            if (arg < 0 || v > best || v != v) best = v, arg = h * g.in_w + w;
          }
        const int64_t o = p * ov + oh * g.out_w + ow;
        r.y[o] = best, r.idx[o] = arg;
        if (arg >= 0) r.dx[p * iv + arg] += dy[o];
      }
  return r;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string max_pool_indices(Env& env) {
  using M = PoolMode;
  struct Case { const char* name; Pool2dConfig c; int inputs; };  // inputs: 0 uniform, 1 negative, 2 NaN, 3 ties
  auto with = [](Pool2dConfig c, Hw dilation, bool ceil) { c.dilation = dilation, c.ceil_mode = ceil; return c; };
  const std::vector<Case> cases = {
      {"3x3 s2 p1", pool_cfg(M::max, 2, 3, 9, 11, {3, 3}, {2, 2}, {1, 1}), 0},
      {"3x3 s1 p1 NaN", pool_cfg(M::max, 2, 2, 8, 7, {3, 3}, {1, 1}, {1, 1}), 2},
      {"2x2 s2 ceil", with(pool_cfg(M::max, 1, 3, 7, 7, {2, 2}, {2, 2}, {0, 0}), {1, 1}, true), 0},
      {"3x3 s1 p1 dilation 2", with(pool_cfg(M::max, 2, 2, 10, 9, {3, 3}, {1, 1}, {1, 1}), {2, 2}, false), 0},
      {"3x3 s2 p1 d2 ceil", with(pool_cfg(M::max, 1, 4, 11, 12, {3, 3}, {2, 2}, {1, 1}), {2, 2}, true), 1},
      {"3x2 s(1,2) negative", pool_cfg(M::max, 2, 3, 9, 8, {3, 2}, {1, 2}, {1, 1}), 1},
      {"3x3 s1 ties", pool_cfg(M::max, 2, 3, 9, 9, {3, 3}, {1, 1}, {1, 1}), 3},
      {"large 3x3 s2 p1", pool_cfg(M::max, 8, 64, 56, 56, {3, 3}, {2, 2}, {1, 1}), 0}};
  for (const Case& k : cases) {
    const MaxPoolGeometry g = max_pool_geometry(k.c);
    const int64_t nx = g.planes * g.in_h * g.in_w, ny = g.planes * g.out_h * g.out_w;
    std::vector<float> x = uniform(env, nx, k.inputs == 1 ? -2.0f : -1.0f, k.inputs == 1 ? -1.0f : 1.0f);
    if (k.inputs == 2) for (int64_t i = 0; i < nx; i += 17) x[i] = NAN;
    if (k.inputs == 3) for (float& v : x) v = std::floor(v * 1.5f);  // values in {-2, -1, 0, 1}: many ties
    const std::vector<float> dy = uniform(env, ny, -1, 1);
    DeviceArray<float> dxin(env, x), ddy(env, dy), y(env, ny), dx(env, nx);
    DeviceArray<int64_t> idx(env, ny);
    max_pool2d_with_indices(dxin.get(), y.get(), idx.get(), g, env.s());
    max_pool2d_backward_indices(ddy.get(), idx.get(), dx.get(), g, env.s());
    const IndexPoolRef r = index_pool_reference(g, x, dy);
    expect(idx.download() == r.idx, k.name, ": indices differ from the reference");
    expect(same_floats(y.download(), r.y), k.name, ": y differs from the reference");
    expect(same_floats(dx.download(), r.dx), k.name, ": dx differs from the reference (same summation order)");
  }
  return detail::concat(cases.size(), " cases (padding, NaN, ceil mode, dilation, ties): y, indices, dx bitwise");
}

// ---- batch norm -----------------------------------------------------------------------------------

struct BnRef {
  std::vector<double> y, mean, rstd, run_mean, run_var, dx, dw, db;
};

// The core's definitions: biased batch variance for y and rstd, unbiased in the running update.
BnRef bn_reference(const BatchNormConfig& c, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>& b, const std::vector<float>& dy, const std::vector<float>& rm,
                   const std::vector<float>& rv, double f) {
  const int64_t C = c.channels, S = c.spatial, M = c.batch * S;
  BnRef r{std::vector<double>(x.size()), std::vector<double>(C), std::vector<double>(C), std::vector<double>(C),
          std::vector<double>(C), std::vector<double>(x.size()), std::vector<double>(C), std::vector<double>(C)};
  auto at = [&](int64_t n, int64_t ch, int64_t s) { return (n * C + ch) * S + s; };
  for (int64_t ch = 0; ch < C; ++ch) {
    double mean = 0, var = 0, sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < c.batch; ++n)
      for (int64_t s = 0; s < S; ++s) mean += x[at(n, ch, s)];
    mean /= M;
    for (int64_t n = 0; n < c.batch; ++n)
      for (int64_t s = 0; s < S; ++s) var += (x[at(n, ch, s)] - mean) * (x[at(n, ch, s)] - mean);
    const double rstd = 1.0 / std::sqrt(var / M + c.eps);
    const double wc = w.empty() ? 1.0 : w[ch], bc = b.empty() ? 0.0 : b[ch];
    for (int64_t n = 0; n < c.batch; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = at(n, ch, s);
        const double xhat = (x[i] - mean) * rstd;
        r.y[i] = xhat * wc + bc;
        sdy += dy[i];
        sdyx += dy[i] * xhat;
      }
    for (int64_t n = 0; n < c.batch; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = at(n, ch, s);
        r.dx[i] = wc * rstd / M * (M * double(dy[i]) - sdy - (x[i] - mean) * rstd * sdyx);
      }
    r.mean[ch] = mean, r.rstd[ch] = rstd, r.dw[ch] = sdyx, r.db[ch] = sdy;
    if (!rm.empty()) {
      r.run_mean[ch] = (1 - f) * rm[ch] + f * mean;
      r.run_var[ch] = (1 - f) * rv[ch] + f * var / (M - 1);
    }
  }
  return r;
}

std::vector<float> normal(Env& env, std::size_t n, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(env.rng);
  return v;
}

// Training forward (with the running update), backward, then inference with the updated running
// statistics; `tol` for y/dx (the large-mean case gets a looser one, reported).
double check_bn(Env& env, cudnnHandle_t dnn, const char* name, const BatchNormConfig& c, const std::vector<float>& x,
                double f, double tol) {
  const int64_t C = c.channels;
  const std::vector<float> dy = uniform(env, x.size(), -1, 1);
  const std::vector<float> w = c.affine ? uniform(env, C, 0.5f, 1.5f) : std::vector<float>{};
  const std::vector<float> b = c.affine ? uniform(env, C, -1, 1) : std::vector<float>{};
  const std::vector<float> rm = uniform(env, C, -1, 1), rv = uniform(env, C, 0.5f, 2);
  CudnnBatchNorm bn(c);
  DeviceArray<float> dxin(env, x), ddy(env, dy), dw(env, c.affine ? w : std::vector<float>(1)),
      db(env, c.affine ? b : std::vector<float>(1)), drm(env, rm), drv(env, rv), y(env, x.size()), mean(env, C),
      rstd(env, C), ddx(env, x.size()), ddw(env, C), ddb(env, C), yi(env, x.size());
  DeviceBuffer ws = env.alloc.buffer(std::max<std::size_t>(bn.workspace_bytes(), 256), env.s());
  const float* wp = c.affine ? dw.get() : nullptr;
  const float* bp = c.affine ? db.get() : nullptr;
  bn.forward_training(dnn, dxin.get(), wp, bp, y.get(), mean.get(), rstd.get(), drm.get(), drv.get(), f, ws.data());
  bn.backward(dnn, dxin.get(), ddy.get(), wp, mean.get(), rstd.get(), ddx.get(), c.affine ? ddw.get() : nullptr,
              c.affine ? ddb.get() : nullptr, false, ws.data());
  bn.forward_inference(dnn, dxin.get(), wp, bp, drm.get(), drv.get(), yi.get(), ws.data());
  const BnRef r = bn_reference(c, x, w, b, dy, rm, rv, f);
  const std::string what = detail::concat("batch_norm ", name);
  const std::vector<float> got_y = y.download(), got_dx = ddx.download();
  compare(what + " y", got_y, r.y, tol);
  compare(what + " mean", mean.download(), r.mean, tol);
  compare(what + " rstd", rstd.download(), r.rstd, tol);
  compare(what + " running_mean", drm.download(), r.run_mean, tol);
  compare(what + " running_var (unbiased)", drv.download(), r.run_var, tol);
  compare(what + " dx", got_dx, r.dx, tol);
  if (c.affine) {
    compare(what + " dweight", ddw.download(), r.dw, tol);
    compare(what + " dbias", ddb.download(), r.db, 1e-5);
  }
  // Inference from the updated running statistics, computed from the downloaded float32 values.
  const std::vector<float> nrm = drm.download(), nrv = drv.download();
  std::vector<double> ref_inf(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int64_t ch = static_cast<int64_t>(i) / c.spatial % C;
    const double xhat = (x[i] - double(nrm[ch])) / std::sqrt(double(nrv[ch]) + c.eps);
    ref_inf[i] = xhat * (c.affine ? w[ch] : 1.0) + (c.affine ? b[ch] : 0.0);
  }
  compare(what + " inference y", yi.download(), ref_inf, tol);
  return std::max(relative_error(got_y, r.y), relative_error(got_dx, r.dx));
}

std::string batch_norm(Env& env) {
  CudnnHandle dnn(env.s());
  char buf[200];
  double worst = 0.0;
  BatchNormConfig c{8, 16, 7 * 5, 1e-5, true};
  worst = std::max(worst, check_bn(env, dnn.get(), "(8, 16, 7, 5) momentum 0.1", c, uniform(env, 8 * 16 * 35, -2, 3),
                                   batch_norm_average_factor(0.1, 1), 1e-5));
  // The cumulative average at its third batch: f = 1/3.
  worst = std::max(worst, check_bn(env, dnn.get(), "(8, 16, 7, 5) cumulative", c, uniform(env, 8 * 16 * 35, -2, 3),
                                   batch_norm_average_factor(-1.0, 3), 1e-5));
  BatchNormConfig flat{64, 10, 1, 1e-3, false};  // (N, C) input, no affine parameters
  worst = std::max(worst, check_bn(env, dnn.get(), "(64, 10) no affine", flat, uniform(env, 640, -1, 1), 0.5, 1e-5));
  BatchNormConfig big{16, 32, 32 * 32, 1e-5, true};
  worst = std::max(worst, check_bn(env, dnn.get(), "(16, 32, 32, 32)", big, uniform(env, 16 * 32 * 1024, -1, 1), 0.1, 1e-5));
  // Large mean, unit variance: a one-pass E[x^2] - E[x]^2 in float32 would lose most digits here.
  // x itself is exact in float32; its spacing near 100 (7.6e-6) bounds what any float32 kernel can do.
  BatchNormConfig shifted{32, 8, 64, 1e-5, true};
  const double large = check_bn(env, dnn.get(), "N(100, 1)", shifted, normal(env, 32 * 8 * 64, 100.0f, 1.0f), 0.1, 1e-4);
  std::snprintf(buf, sizeof(buf),
                "5 cases (train + running stats, backward, inference), worst rel.err %.2e (tol 1e-05); "
                "N(100, 1) inputs %.2e (tol 1e-04)",
                worst, large);
  return buf;
}

}  // namespace

std::string pool_norm_validation() {
  Pool2dConfig c = pool_cfg(PoolMode::max, 2, 3, 7, 7, {2, 2}, {2, 2}, {0, 0});
  c.ceil_mode = true;  // 7 -> ceil 4, floor 3
  expect_throw<ValueError>("ceil", [&] { validate_pool2d(c); },
                           "pool2d_cudnn: ceil_mode gives output (4, 4) where cuDNN's floor division gives (3, 3)");
  c.ceil_mode = false;
  c.dilation = {2, 1};
  expect_throw<ValueError>("dilation", [&] { validate_pool2d(c); }, "cuDNN pooling has no dilation, got dilation (2, 1)");
  c.dilation = {1, 1};
  c.padding = {2, 0};
  expect_throw<ValueError>("padding", [&] { validate_pool2d(c); }, "padding should be at most half of kernel size");
  c.padding = {0, 0};
  c.mode = PoolMode::avg_include_pad;
  c.divisor_override = 3;
  expect_throw<ValueError>("divisor", [&] { validate_pool2d(c); }, "no divisor_override, got 3");
  c.divisor_override = 0;
  c.stride.reset();
  c.kernel = {8, 8};
  expect_throw<ValueError>("too small", [&] { validate_pool2d(c); }, "input (7, 7) is too small for kernel (8, 8)");
  // PyTorch's sizes: ceil mode drops a window that would start in the right padding.
  expect(pool_window_output_size(7, 2, 2, 0, 1, true) == 4 && pool_window_output_size(6, 3, 2, 1, 1, true) == 4 &&
             pool_window_output_size(5, 2, 2, 1, 1, true) == 3 && pool_window_output_size(7, 2, 2, 0, 1, false) == 3,
         "pool_window_output_size");
  expect_throw<ValueError>("bn eps", [] { validate_batch_norm(BatchNormConfig{2, 3, 4, 0.0, true}); },
                           "batch_norm_cudnn: eps must be positive and finite, got 0");
  expect_throw<ValueError>("bn size", [] { validate_batch_norm(BatchNormConfig{2, 0, 4, 1e-5, true}); },
                           "batch_norm_cudnn: input (N, C, S, 1) (2, 0, 4, 1) must have sizes in");
  expect(batch_norm_average_factor(0.1, 7) == 0.1 && batch_norm_average_factor(-1, 4) == 0.25, "average factor");
  expect_throw<ValueError>("bn momentum", [] { batch_norm_average_factor(1.5, 1); }, "momentum must be in [0, 1]");
  expect_throw<ValueError>("bn count", [] { batch_norm_average_factor(-1, 0); }, "num_batches_tracked >= 1");
  Pool2dConfig m = pool_cfg(PoolMode::max, 1, 2, 7, 7, {2, 2}, {2, 2}, {0, 0});
  m.ceil_mode = true;
  m.dilation = {1, 2};
  const MaxPoolGeometry g = max_pool_geometry(m);  // our own kernels take both
  expect(g.out_h == 4 && g.out_w == 3 && g.planes == 2, "max_pool_geometry (", g.out_h, ", ", g.out_w, ")");
  m.mode = PoolMode::avg_include_pad;
  expect_throw<ValueError>("not max", [&] { max_pool_geometry(m); }, "max_pool2d_indices: the configuration is not max pooling");
  expect_throw<ValueError>("bad geometry", [] { max_pool2d_with_indices(nullptr, nullptr, nullptr, MaxPoolGeometry{}, nullptr); },
                           "max_pool2d_with_indices: invalid geometry");
  return "pool: ceil_mode, dilation, padding, divisor_override, too small; max pool indices geometry; batch norm: "
         "eps, sizes, momentum";
}

void add_pool_norm_tests(std::vector<TestCase>& out) {
  out.push_back({"pool2d", pooling});
  out.push_back({"max_pool_indices", max_pool_indices});
  out.push_back({"batch_norm", batch_norm});
}

}  // namespace treadle::cuda::test

// Device tests of the elementwise, softmax, cross-entropy, Adam and column-sum kernels against
// float64 host computations of the same formulas (float32 kernels: 1e-5 norm-wise relative).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ios>

#include "backends/cuda/cuda_kernels.hpp"
#include "test_cuda_common.hpp"

namespace treadle::cuda::test {
namespace {

constexpr double kTolF32 = 1e-5;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double act_forward(Activation a, double x) {
  switch (a) {
    case Activation::relu: return x < 0 ? 0.0 : x;
    case Activation::tanh: return std::tanh(x);
    case Activation::sigmoid: return sigmoid(x);
    case Activation::gelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::gelu_tanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::silu: return x * sigmoid(x);
  }
  return NAN;
}

// d act / dx at x (the reference differentiates in x even where the kernel reads y).
double act_derivative(Activation a, double x) {
  switch (a) {
    case Activation::relu: return x > 0 ? 1.0 : 0.0;
    case Activation::tanh: return 1 - std::tanh(x) * std::tanh(x);
    case Activation::sigmoid: return sigmoid(x) * (1 - sigmoid(x));
    case Activation::gelu: return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Activation::gelu_tanh: {
      const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
      const double du = std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
      const double t = std::tanh(u);
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du;
    }
    case Activation::silu: return sigmoid(x) * (1 + x * (1 - sigmoid(x)));
  }
  return NAN;
}

std::string activations(Env& env) {
  const std::size_t n = (1 << 20) + 3;  // not a multiple of the block: the tail is covered
  std::vector<float> x = uniform(env, n, -6.0f, 6.0f), dy = uniform(env, n, -1.0f, 1.0f);
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 20.0f, -20.0f, 90.0f, -90.0f};
  std::copy(std::begin(edges), std::end(edges), x.begin());
  DeviceArray<float> dx_in(env, x), ddy(env, dy), dout(env, n), dgrad(env, n);
  double worst = 0.0;
  for (Activation a : {Activation::relu, Activation::tanh, Activation::sigmoid, Activation::gelu, Activation::gelu_tanh,
                       Activation::silu}) {
    activation_forward(a, dx_in.get(), dout.get(), static_cast<int64_t>(n), env.s());
    const std::vector<float> y = dout.download();
    std::vector<double> ry(n), rdx(n);
    for (std::size_t i = 0; i < n; ++i) {
      ry[i] = act_forward(a, x[i]);
      rdx[i] = dy[i] * act_derivative(a, x[i]);
    }
    compare(detail::concat(activation_name(a), " forward"), y, ry, kTolF32);
    const float* saved = activation_backward_uses_output(a) ? dout.get() : dx_in.get();
    activation_backward(a, saved, ddy.get(), dgrad.get(), static_cast<int64_t>(n), env.s());
    // From y the derivative carries y's float rounding (tanh, sigmoid): still well inside 1e-5.
    compare(detail::concat(activation_name(a), " backward"), dgrad.download(), rdx, kTolF32);
    worst = std::max({worst, relative_error(y, ry), relative_error(dgrad.download(), rdx)});
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "6 activations x 2 directions, worst rel.err %.2e", worst);
  return buf;
}

// (outer, axis, inner) layouts: contiguous rows of several widths (<= 1024 and beyond), and strided.
struct Layout {
  int64_t outer, axis, inner;
};
const Layout kLayouts[] = {{64, 1000, 1}, {7, 1, 1}, {3, 3001, 1}, {257, 10, 1}, {4, 10, 33}, {2, 129, 7}};

std::string softmax(Env& env) {
  double worst = 0.0;
  for (const Layout& l : kLayouts) {
    const std::size_t n = static_cast<std::size_t>(l.outer * l.axis * l.inner);
    std::vector<float> x = uniform(env, n, -30.0f, 30.0f), dy = uniform(env, n, -1.0f, 1.0f);
    DeviceArray<float> dxin(env, x), ddy(env, dy), dy_out(env, n), ddx(env, n);
    softmax_forward(dxin.get(), dy_out.get(), l.outer, l.axis, l.inner, env.s());
    softmax_backward(dy_out.get(), ddy.get(), ddx.get(), l.outer, l.axis, l.inner, env.s());
    std::vector<double> ry(n), rdx(n);
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t base = o * l.axis * l.inner + i;
        double mx = -INFINITY, s = 0, dot = 0;
        for (int64_t c = 0; c < l.axis; ++c) mx = std::max(mx, double(x[base + c * l.inner]));
        for (int64_t c = 0; c < l.axis; ++c) s += std::exp(x[base + c * l.inner] - mx);
        for (int64_t c = 0; c < l.axis; ++c) ry[base + c * l.inner] = std::exp(x[base + c * l.inner] - mx) / s;
        for (int64_t c = 0; c < l.axis; ++c) dot += ry[base + c * l.inner] * dy[base + c * l.inner];
        for (int64_t c = 0; c < l.axis; ++c) rdx[base + c * l.inner] = ry[base + c * l.inner] * (dy[base + c * l.inner] - dot);
      }
    const std::string shape = detail::concat("(", l.outer, ", ", l.axis, ", ", l.inner, ")");
    compare("softmax forward " + shape, dy_out.download(), ry, kTolF32);
    compare("softmax backward " + shape, ddx.download(), rdx, kTolF32);
    worst = std::max({worst, relative_error(dy_out.download(), ry), relative_error(ddx.download(), rdx)});
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%zu layouts, worst rel.err %.2e", std::size(kLayouts), worst);
  return buf;
}

std::string cross_entropy(Env& env) {
  double worst = 0.0;
  for (const Layout& l : kLayouts) {
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      const int64_t positions = l.outer * l.inner, n = positions * l.axis;
      std::vector<float> x = uniform(env, n, -10.0f, 10.0f);
      std::vector<int64_t> labels(positions);
      for (int64_t& t : labels) t = static_cast<int64_t>(env.rng() % l.axis);
      const std::vector<float> g = {0.75f};
      DeviceArray<float> dxin(env, x), dloss(env, 1), dg(env, g), ddx(env, n);
      DeviceArray<int64_t> dlab(env, labels);
      DeviceBuffer ws = env.alloc.buffer(cross_entropy_workspace_bytes(l.outer, l.inner), env.s());
      cross_entropy_forward(dxin.get(), dlab.get(), dloss.get(), l.outer, l.axis, l.inner, red, ws.data(), env.s());
      cross_entropy_backward(dxin.get(), dlab.get(), dg.get(), ddx.get(), l.outer, l.axis, l.inner, red, env.s());
      double total = 0;
      std::vector<double> rdx(n);
      const double scale = (red == Reduction::mean ? 1.0 / positions : 1.0) * g[0];
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t base = (p / l.inner) * l.axis * l.inner + p % l.inner;
        double mx = -INFINITY, s = 0;
        for (int64_t c = 0; c < l.axis; ++c) mx = std::max(mx, double(x[base + c * l.inner]));
        for (int64_t c = 0; c < l.axis; ++c) s += std::exp(x[base + c * l.inner] - mx);
        total -= (x[base + labels[p] * l.inner] - mx) - std::log(s);
        for (int64_t c = 0; c < l.axis; ++c)
          rdx[base + c * l.inner] = (std::exp(x[base + c * l.inner] - mx) / s - (c == labels[p] ? 1 : 0)) * scale;
      }
      if (red == Reduction::mean) total /= positions;
      const std::string what = detail::concat("cross_entropy (", l.outer, ", ", l.axis, ", ", l.inner, ") ",
                                              red == Reduction::mean ? "mean" : "sum");
      compare(what + " loss", dloss.download(), {total}, kTolF32);
      compare(what + " grad", ddx.download(), rdx, kTolF32);
      worst = std::max({worst, relative_error(dloss.download(), {total}), relative_error(ddx.download(), rdx)});
    }
  }
  // A label out of range: NaN loss and a NaN gradient row, not a fault.
  std::vector<int64_t> bad = {1, 5, -1};
  DeviceArray<float> x(env, uniform(env, 12, -1, 1)), loss(env, 1), g(env, std::vector<float>{1.0f}), dx(env, 12);
  DeviceArray<int64_t> lab(env, bad);
  DeviceBuffer ws = env.alloc.buffer(cross_entropy_workspace_bytes(3, 1), env.s());
  cross_entropy_forward(x.get(), lab.get(), loss.get(), 3, 4, 1, Reduction::mean, ws.data(), env.s());
  cross_entropy_backward(x.get(), lab.get(), g.get(), dx.get(), 3, 4, 1, Reduction::mean, env.s());
  const std::vector<float> gx = dx.download();
  expect(std::isnan(loss.download()[0]), "out-of-range label: loss ", loss.download()[0]);
  expect(std::isfinite(gx[0]) && std::isnan(gx[4]) && std::isnan(gx[11]), "out-of-range label: gradient rows");
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%zu layouts x mean/sum, worst rel.err %.2e; bad labels give NaN",
                std::size(kLayouts), worst);
  return buf;
}

std::string adam(Env& env) {
  const int64_t n = 300001;
  double worst = 0.0;
  struct Variant { const char* name; bool decoupled, amsgrad; double wd; };
  for (const Variant& v : {Variant{"adam", false, false, 0.0}, Variant{"adam+wd", false, false, 0.01},
                           Variant{"adamw", true, false, 0.05}, Variant{"amsgrad", false, true, 0.0}}) {
    std::vector<float> p = uniform(env, n, -1, 1), m(n, 0.0f), s(n, 0.0f), vmax(n, 0.0f);
    DeviceArray<float> dp(env, p), dm(env, m), dv(env, s), dvmax(env, vmax), dgrad(env, n);
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0), rvmax(n, 0.0);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int64_t t = 1; t <= 3; ++t) {
      const std::vector<float> g = uniform(env, n, -2, 2);
      dgrad.upload(g);
      const AdamCoefficients k = adam_coefficients(lr, b1, b2, eps, v.wd, t, v.decoupled, v.amsgrad);
      adam_update(dp.get(), dgrad.get(), dm.get(), dv.get(), v.amsgrad ? dvmax.get() : nullptr, n, k, env.s());
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      for (int64_t i = 0; i < n; ++i) {  // torch.optim.Adam / AdamW
        double gi = g[i];
        if (v.decoupled) rp[i] *= 1 - lr * v.wd;
        else gi += v.wd * rp[i];
        rm[i] = b1 * rm[i] + (1 - b1) * gi;
        rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
        rvmax[i] = std::max(rvmax[i], rv[i]);
        const double second = v.amsgrad ? rvmax[i] : rv[i];
        rp[i] -= lr / bc1 * rm[i] / (std::sqrt(second) / std::sqrt(bc2) + eps);
      }
    }
    // Compare the update (p - p0), not p: the parameters themselves hide errors of the small step.
    std::vector<float> got = dp.download();
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) {
      got[i] -= p[i];
      ref[i] = rp[i] - p[i];
    }
    compare(std::string(v.name) + " update", got, ref, 1e-4);
    compare(std::string(v.name) + " exp_avg", dm.download(), rm, kTolF32);
    compare(std::string(v.name) + " exp_avg_sq", dv.download(), rv, kTolF32);
    worst = std::max(worst, relative_error(got, ref));
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "adam, adam+wd, adamw, amsgrad x 3 steps, update rel.err %.2e", worst);
  return buf;
}

std::string column_sums(Env& env) {
  double worst = 0.0;
  const std::initializer_list<std::pair<int64_t, int64_t>> shapes = {{5000, 37}, {7, 1000}, {100000, 3}, {1, 1}, {0, 5}};
  for (auto [rows, cols] : shapes) {
    const std::vector<float> x = uniform(env, rows * cols, -1, 1);
    DeviceArray<float> dx(env, std::max<std::size_t>(x.size(), 1)), out(env, cols);
    if (!x.empty()) dx.upload(x);
    DeviceBuffer ws = env.alloc.buffer(column_sum_workspace_bytes(rows, cols), env.s());
    column_sum(dx.get(), out.get(), rows, cols, ws.data(), env.s());
    std::vector<double> ref(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ref[c] += x[r * cols + c];
    const std::vector<float> got = out.download();
    compare(detail::concat("column_sum (", rows, ", ", cols, ")"), got, ref, kTolF32);
    worst = std::max(worst, relative_error(got, ref));
    // Deterministic: a second run gives the same bits.
    column_sum(dx.get(), out.get(), rows, cols, ws.data(), env.s());
    expect(out.download() == got, "column_sum is not deterministic for (", rows, ", ", cols, ")");
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "5 shapes (multi-chunk, empty), bitwise repeatable, rel.err %.2e", worst);
  return buf;
}

// round_to_bf16 against the host's round-to-nearest-even, bit for bit (ties, denormals, inf, NaN).
std::string bf16_rounding(Env& env) {
  std::vector<float> x = uniform(env, 100000, -1e4f, 1e4f);
  const float specials[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-9f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 0x1p-140f,
                            3.0e38f, INFINITY, -INFINITY, 0.0f, -0.0f};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  DeviceArray<float> dx(env, x);
  DeviceArray<uint16_t> dy(env, x.size());
  round_to_bf16(dx.get(), dy.get(), static_cast<int64_t>(x.size()), env.s());
  const std::vector<uint16_t> got = dy.download();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float r = round_bf16(x[i]);
    uint32_t bits;
    std::memcpy(&bits, &r, 4);
    expect(got[i] == static_cast<uint16_t>(bits >> 16), "round_to_bf16(", x[i], ") = 0x", std::hex, got[i],
           ", expected 0x", bits >> 16);
  }
  std::vector<float> nan = {NAN};
  DeviceArray<float> dn(env, nan);
  round_to_bf16(dn.get(), dy.get(), 1, env.s());
  expect((dy.download()[0] & 0x7fffu) > 0x7f80u, "NaN did not stay NaN: 0x", std::hex, dy.download()[0]);
  return "100000 values + ties/denormal/inf/NaN, bitwise equal to round-to-nearest-even";
}

}  // namespace

void add_kernel_tests(std::vector<TestCase>& out) {
  out.push_back({"activations", activations});
  out.push_back({"softmax", softmax});
  out.push_back({"cross_entropy", cross_entropy});
  out.push_back({"adam", adam});
  out.push_back({"column_sum", column_sums});
  out.push_back({"bf16_rounding", bf16_rounding});
}

}  // namespace treadle::cuda::test

// Device tests of the cuDNN convolution (forward + bias, backward data, backward filter, backward
// bias) against a float64 host convolution with the core's semantics, on shapes covering stride,
// padding, dilation, groups (incl. depthwise), 1x1 kernels, batch 1 and non-square windows; plus
// bitwise repeatability of the deterministic algorithms and gradient accumulation.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cudnn_conv.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

struct ConvRef {
  std::vector<double> y, dx, dw, db;
};

int64_t numel_x(const Conv2dConfig& c) { return c.batch * c.in_channels * c.height * c.width; }
int64_t numel_w(const Conv2dConfig& c) { return c.out_channels * (c.in_channels / c.groups) * c.kernel.h * c.kernel.w; }

// One loop nest over (n, k, oh, ow, ci, kh, kw) accumulates y, dx and dw together: every term is
// x[n, g*cg + ci, ih, iw] * w[k, ci, kh, kw] for in-range input positions (zero padding elsewhere).
ConvRef conv_reference(const Conv2dConfig& c, int64_t oh_n, int64_t ow_n, const std::vector<float>& x,
                       const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& dy) {
  const int64_t cg = c.in_channels / c.groups, kg = c.out_channels / c.groups;
  const int64_t ny = c.batch * c.out_channels * oh_n * ow_n;
  ConvRef r{std::vector<double>(ny, 0.0), std::vector<double>(x.size(), 0.0), std::vector<double>(w.size(), 0.0),
            std::vector<double>(c.out_channels, 0.0)};
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t k = 0; k < c.out_channels; ++k) {
      const int64_t g = k / kg;
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const int64_t yi = ((n * c.out_channels + k) * oh_n + oh) * ow_n + ow;
          double s = b.empty() ? 0.0 : b[k];
          const double g_out = dy[yi];
          r.db[k] += g_out;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t kh = 0; kh < c.kernel.h; ++kh) {
              const int64_t ih = oh * c.stride.h - c.padding.h + kh * c.dilation.h;
              if (ih < 0 || ih >= c.height) continue;
              for (int64_t kw = 0; kw < c.kernel.w; ++kw) {
                const int64_t iw = ow * c.stride.w - c.padding.w + kw * c.dilation.w;
                if (iw < 0 || iw >= c.width) continue;
                const int64_t xi = ((n * c.in_channels + g * cg + ci) * c.height + ih) * c.width + iw;
                const int64_t wi = ((k * cg + ci) * c.kernel.h + kh) * c.kernel.w + kw;
                s += double(x[xi]) * w[wi];
                r.dx[xi] += g_out * w[wi];
                r.dw[wi] += g_out * x[xi];
              }
            }
          r.y[yi] = s;
        }
    }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<double> doubled(std::vector<double> v) {
  for (double& x : v) x *= 2;
  return v;
}

struct ConvCase {
  const char* name;
  Conv2dConfig c;
  bool bias;
};

// Runs one case; returns its worst relative error and appends the algorithms to `algos`.
double check_conv(Env& env, cudnnHandle_t dnn, const ConvCase& k, double tol, std::string& algos) {
  const Conv2dConfig& c = k.c;
  CudnnConv2d conv(dnn, c);
  const int64_t ny = c.batch * c.out_channels * conv.out_height() * conv.out_width();
  const std::vector<float> x = uniform(env, numel_x(c), -1, 1), w = uniform(env, numel_w(c), -1, 1),
                           dy = uniform(env, ny, -1, 1);
  const std::vector<float> b = k.bias ? uniform(env, c.out_channels, -1, 1) : std::vector<float>{};
  DeviceArray<float> dx_in(env, x), dw_in(env, w), ddy(env, dy), dy_out(env, ny), ddx(env, x.size()),
      ddw(env, w.size()), ddb(env, c.out_channels), again(env, std::max<std::size_t>(x.size(), w.size()) + ny);
  DeviceArray<float> db_in(env, k.bias ? b : std::vector<float>(1, 0.0f));
  DeviceBuffer ws = env.alloc.buffer(std::max<std::size_t>(conv.workspace_bytes(), 256), env.s());
  conv.forward(dnn, dx_in.get(), dw_in.get(), k.bias ? db_in.get() : nullptr, dy_out.get(), ws.data());
  conv.backward_data(dnn, ddy.get(), dw_in.get(), ddx.get(), false, ws.data());
  conv.backward_filter(dnn, dx_in.get(), ddy.get(), ddw.get(), false, ws.data());
  conv.backward_bias(dnn, ddy.get(), ddb.get(), false);
  const ConvRef r = conv_reference(c, conv.out_height(), conv.out_width(), x, w, b, dy);
  const std::string what = detail::concat(k.name, " ", conv_math_name(c.math));
  const std::vector<float> y = dy_out.download(), dx = ddx.download(), dw = ddw.download(), db = ddb.download();
  compare(what + " y", y, r.y, tol);
  compare(what + " dx", dx, r.dx, tol);
  compare(what + " dw", dw, r.dw, tol);
  compare(what + " db", db, r.db, 1e-5);
  if (c.deterministic) {  // the same call again gives the same bits
    auto head = [&](std::size_t n) {
      const std::vector<float> a = again.download();
      return std::vector<float>(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n));
    };
    conv.forward(dnn, dx_in.get(), dw_in.get(), k.bias ? db_in.get() : nullptr, again.get(), ws.data());
    expect(same_bits(head(y.size()), y), what, ": forward not bitwise repeatable (", conv.describe(), ")");
    conv.backward_data(dnn, ddy.get(), dw_in.get(), again.get(), false, ws.data());
    expect(same_bits(head(dx.size()), dx), what, ": backward data not bitwise repeatable (", conv.describe(), ")");
    conv.backward_filter(dnn, dx_in.get(), ddy.get(), again.get(), false, ws.data());
    expect(same_bits(head(dw.size()), dw), what, ": backward filter not bitwise repeatable (", conv.describe(), ")");
  }
  // Accumulation: a second backward pass with accumulate adds onto the first.
  conv.backward_filter(dnn, dx_in.get(), ddy.get(), ddw.get(), true, ws.data());
  conv.backward_data(dnn, ddy.get(), dw_in.get(), ddx.get(), true, ws.data());
  conv.backward_bias(dnn, ddy.get(), ddb.get(), true);
  compare(what + " dw+=", ddw.download(), doubled(r.dw), tol);
  compare(what + " dx+=", ddx.download(), doubled(r.dx), tol);
  compare(what + " db+=", ddb.download(), doubled(r.db), 1e-5);
  algos += detail::concat(" [", k.name, ": ", conv.describe(), "]");
  return std::max({relative_error(y, r.y), relative_error(dx, r.dx), relative_error(dw, r.dw)});
}

Conv2dConfig cfg(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, Hw kernel, Hw stride, Hw pad, Hw dil,
                 int64_t groups) {
  Conv2dConfig x;
  x.batch = n, x.in_channels = c, x.height = h, x.width = w, x.out_channels = k;
  x.kernel = kernel, x.stride = stride, x.padding = pad, x.dilation = dil, x.groups = groups;
  return x;
}

std::vector<ConvCase> conv_cases() {
  return {{"3x3 pad 1", cfg(2, 3, 9, 9, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1), true},
          {"3x3 stride 2", cfg(3, 8, 16, 15, 16, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1), true},
          {"dilation 2", cfg(2, 4, 13, 11, 6, {3, 3}, {1, 1}, {2, 2}, {2, 2}, 1), false},
          {"groups 2", cfg(2, 8, 10, 10, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 2), true},
          {"depthwise", cfg(2, 8, 12, 12, 8, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 8), true},
          {"1x1 batch 1", cfg(1, 32, 7, 7, 16, {1, 1}, {1, 1}, {0, 0}, {1, 1}, 1), false},
          {"5x3 stride (2,1)", cfg(1, 5, 17, 9, 7, {5, 3}, {2, 1}, {2, 1}, {1, 1}, 1), true},
          {"no padding 4x4 s3", cfg(4, 6, 20, 20, 10, {4, 4}, {3, 3}, {0, 0}, {1, 1}, 1), true},
          {"resnet-like", cfg(4, 32, 28, 28, 64, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1), true},
          // The core's 1-d convolution as a 2-d one of height 1.
          {"1-d k5 s2 p2", cfg(2, 4, 1, 30, 6, {1, 5}, {1, 2}, {0, 2}, {1, 1}, 1), true}};
}

std::string conv_math(Env& env, ConvMath math, double tol) {
  CudnnHandle dnn(env.s());
  double worst = 0.0;
  std::string algos;
  for (ConvCase k : conv_cases()) {
    k.c.math = math;
    worst = std::max(worst, check_conv(env, dnn.get(), k, tol, algos));
  }
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%zu shapes x (y, dx, dw, db, repeat, +=), worst rel.err %.2e (tol %.0e);",
                conv_cases().size(), worst, tol);
  return buf + algos;
}

std::string conv_edges(Env& env) {
  CudnnHandle dnn(env.s());
  Conv2dConfig c = cfg(2, 4, 8, 8, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  // Only algorithms that need no workspace; determinism is not required here, since the
  // workspace-free backward algorithms (ALGO_0) are the non-deterministic ones.
  c.workspace_limit = 0;
  c.deterministic = false;
  CudnnConv2d conv(dnn.get(), c);
  expect(conv.workspace_bytes() == 0, "workspace limit 0 gave ", conv.workspace_bytes(), " bytes");
  std::string algos;
  check_conv(env, dnn.get(), ConvCase{"no workspace", c, true}, 1e-5, algos);
  expect_throw<ValueError>("null x", [&] { conv.forward(dnn.get(), nullptr, nullptr, nullptr, nullptr, nullptr); },
                           "conv2d_cudnn forward: x is a null device pointer");
  return "workspace limit 0 (determinism not required):" + algos;
}

}  // namespace

// Host-side checks (no device): the configuration is validated before cuDNN is called.
std::string conv_validation() {
  Conv2dConfig c = cfg(2, 4, 8, 8, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  c.padding_end = Hw{2, 1};
  expect_throw<ValueError>("asymmetric", [&] { validate_conv2d(c); },
                           "conv2d_cudnn: cuDNN pads both sides equally; padding (1, 1) with padding_end (2, 1)");
  c.padding_end = Hw{1, 1};
  validate_conv2d(c);
  c.groups = 4;
  expect_throw<ValueError>("groups", [&] { validate_conv2d(c); },
                           "groups=4 must divide the input channels (4) and the output channels (6)");
  c.groups = 1;
  c.kernel = {11, 3};
  expect_throw<ValueError>("too small", [&] { validate_conv2d(c); }, "spatial size (8, 8) with padding (1, 1) is too small");
  c.kernel = {3, 3};
  c.stride = {0, 1};
  expect_throw<ValueError>("stride", [&] { validate_conv2d(c); }, "conv2d_cudnn: stride must be in [1,");
  c.stride = {1, 1};
  c.batch = int64_t{1} << 32;
  expect_throw<ValueError>("32-bit", [&] { validate_conv2d(c); }, "sizes in [1, 2^31 - 1]");
  c.batch = 4096, c.in_channels = 1024, c.height = c.width = 32;
  expect_throw<ValueError>("elements", [&] { validate_conv2d(c); }, "more than 2^31 - 1 elements");
  c = cfg(2, 4, 8, 8, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  expect_throw<ValueError>("handle", [&] { CudnnConv2d(nullptr, c); }, "conv2d_cudnn: null cuDNN handle");
  expect(conv_output_size(16, 3, 2, 1, 1) == 8 && conv_output_size(13, 3, 1, 2, 2) == 13 &&
             conv_output_size(2, 5, 1, 0, 1) == 0,
         "conv_output_size");
  return "asymmetric padding, groups, window too small, stride, 32-bit sizes, null handle";
}

void add_conv_tests(std::vector<TestCase>& out) {
  out.push_back({"conv2d_fp32", [](Env& e) { return conv_math(e, ConvMath::fp32, 1e-5); }});
  out.push_back({"conv2d_tensor_op", [](Env& e) { return conv_math(e, ConvMath::tensor_op, 1e-2); }});
  out.push_back({"conv2d_edges", conv_edges});
}

}  // namespace treadle::cuda::test

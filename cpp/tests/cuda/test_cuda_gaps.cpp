// The layer catalog's last pieces on the device: average pooling of our own (divisor_override,
// size-changing ceil_mode, 3-d), 3-d max pooling with indices, and the padding copies behind
// asymmetric convolution padding, each against a host computation in the reference's order
// (bitwise). The host checks cover their argument validation, 3-d convolution configurations and
// the plain RNN cells. The ops themselves (with cuDNN around these kernels) are checked by the
// Python op suite against torch under TREADLE_TEST_BACKENDS=cuda.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backends/cuda/avg_pool_kernels.hpp"
#include "backends/cuda/conv_pad_kernels.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cudnn_rnn.hpp"
#include "backends/cuda/max_pool_kernels.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int64_t volume(const int64_t* d) { return d[0] * d[1] * d[2]; }

// The reference's avg pool: float sums in scan order, its divisor rule, the backward's scatter in
// output order.
int64_t ref_divisor(const AvgPoolGeometry& g, const int64_t* start) {
  if (g.divisor_override > 0) return g.divisor_override;
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t end = std::min(start[i] + g.kernel[i], g.in[i] + g.pad[i]);
    n *= g.include_pad ? end - start[i] : std::min(end, g.in[i]) - std::max<int64_t>(start[i], 0);
  }
  return n;
}

void avg_reference(const AvgPoolGeometry& g, const std::vector<float>& x, const std::vector<float>& dy,
                   std::vector<float>& y, std::vector<float>& dx) {
  const int64_t iv = volume(g.in), ov = volume(g.out);
  y.assign(static_cast<std::size_t>(g.planes * ov), 0.0f);
  dx.assign(static_cast<std::size_t>(g.planes * iv), 0.0f);
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t o = 0; o < ov; ++o) {
      const int64_t oc[3] = {o / (g.out[1] * g.out[2]), (o / g.out[2]) % g.out[1], o % g.out[2]};
      int64_t start[3];
      for (int i = 0; i < 3; ++i) start[i] = oc[i] * g.stride[i] - g.pad[i];
      std::vector<int64_t> taps;
      for (int64_t d = std::max<int64_t>(start[0], 0); d < std::min(start[0] + g.kernel[0], g.in[0]); ++d)
        for (int64_t h = std::max<int64_t>(start[1], 0); h < std::min(start[1] + g.kernel[1], g.in[1]); ++h)
          for (int64_t w = std::max<int64_t>(start[2], 0); w < std::min(start[2] + g.kernel[2], g.in[2]); ++w)
            taps.push_back((d * g.in[1] + h) * g.in[2] + w);
      float sum = 0.0f;
      for (int64_t i : taps) sum += x[p * iv + i];
      const auto div = static_cast<float>(ref_divisor(g, start));
      y[p * ov + o] = taps.empty() ? 0.0f : sum / div;
      const float gval = dy[p * ov + o] / div;
      for (int64_t i : taps) dx[p * iv + i] += gval;
    }
}

// 1-d of a pool dimension: PyTorch's output size (ceil mode drops a window starting in the right padding).
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  return pool_window_output_size(in, k, s, p, 1, ceil_mode);
}

AvgPoolGeometry avg_geo(int64_t planes, std::array<int64_t, 3> in, std::array<int64_t, 3> k, std::array<int64_t, 3> s,
                        std::array<int64_t, 3> p, bool ceil_mode, bool include_pad, int64_t divisor) {
  AvgPoolGeometry g;
  g.planes = planes;
  for (int i = 0; i < 3; ++i) {
    g.in[i] = in[i], g.kernel[i] = k[i], g.stride[i] = s[i], g.pad[i] = p[i];
    g.out[i] = pool_out(in[i], k[i], s[i], p[i], ceil_mode);
  }
  g.include_pad = include_pad;
  g.divisor_override = divisor;
  return g;
}

std::string avg_pool_own(Env& env) {
  struct Case {
    const char* name;
    AvgPoolGeometry g;
  };
  const Case cases[] = {
      {"2-d divisor_override 5", avg_geo(4, {1, 7, 7}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1}, false, true, 5)},
      {"2-d ceil include pad", avg_geo(4, {1, 7, 7}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1}, true, true, 0)},
      {"2-d ceil exclude pad", avg_geo(4, {1, 7, 7}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1}, true, false, 0)},
      {"1-d ceil", avg_geo(2, {1, 1, 10}, {1, 1, 4}, {1, 1, 3}, {0, 0, 2}, true, true, 0)},
      {"3-d ceil", avg_geo(2, {5, 6, 5}, {2, 3, 2}, {2, 2, 2}, {1, 1, 0}, true, true, 0)},
      {"3-d exclude pad divisor 7", avg_geo(3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}, {1, 1, 1}, false, false, 7)}};
  for (const Case& k : cases) {
    const AvgPoolGeometry& g = k.g;
    const std::vector<float> x = uniform(env, static_cast<std::size_t>(g.planes * volume(g.in)), -1, 1);
    const std::vector<float> dy = uniform(env, static_cast<std::size_t>(g.planes * volume(g.out)), -1, 1);
    std::vector<float> y_ref, dx_ref;
    avg_reference(g, x, dy, y_ref, dx_ref);
    DeviceArray<float> dx_in(env, x), ddy(env, dy), y(env, y_ref.size()), dx(env, dx_ref.size());
    avg_pool_forward(dx_in.get(), y.get(), g, env.s());
    avg_pool_backward(ddy.get(), dx.get(), g, env.s());
    expect(bitwise_equal(y.download(), y_ref), k.name, ": y differs from the reference");
    expect(bitwise_equal(dx.download(), dx_ref), k.name, ": dx differs from the reference (same summation order)");
  }
  return detail::concat(std::size(cases), " cases (divisor_override, ceil mode, count_include_pad, 1-d, 3-d): y, dx bitwise");
}

// 3-d max pooling: the reference's running first maximum over (d, h, w), flat indices per plane.
std::string max_pool_3d(Env& env) {
  MaxPoolGeometry g;
  g.planes = 3, g.in_d = 5, g.in_h = 6, g.in_w = 5;
  g.kernel_d = 2, g.kernel_h = 3, g.kernel_w = 2, g.stride_d = 1, g.stride_h = 2, g.stride_w = 2;
  g.pad_d = 1, g.pad_h = 1, g.pad_w = 0, g.dilation_d = 2, g.dilation_h = 1, g.dilation_w = 1;
  g.out_d = pool_window_output_size(g.in_d, g.kernel_d, g.stride_d, g.pad_d, g.dilation_d, true);
  g.out_h = pool_window_output_size(g.in_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h, true);
  g.out_w = pool_window_output_size(g.in_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w, true);
  const int64_t iv = g.in_d * g.in_h * g.in_w, ov = g.out_d * g.out_h * g.out_w;
  std::vector<float> x = uniform(env, static_cast<std::size_t>(g.planes * iv), -1, 1);
  for (std::size_t i = 0; i < x.size(); i += 23) x[i] = NAN;
  for (std::size_t i = 5; i < x.size(); i += 7) x[i] = 0.5f;  // ties
  const std::vector<float> dy = uniform(env, static_cast<std::size_t>(g.planes * ov), -1, 1);
  std::vector<float> y_ref(dy.size()), dx_ref(x.size(), 0.0f);
  std::vector<int64_t> idx_ref(dy.size());
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t o = 0; o < ov; ++o) {
      const int64_t od = o / (g.out_h * g.out_w), oh = (o / g.out_w) % g.out_h, ow = o % g.out_w;
      float best = -INFINITY;
      int64_t arg = -1;
      for (int64_t kd = 0; kd < g.kernel_d; ++kd)
        for (int64_t kh = 0; kh < g.kernel_h; ++kh)
          for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
            const int64_t d = od * g.stride_d - g.pad_d + kd * g.dilation_d;
            const int64_t h = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
            const int64_t w = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
            if (d < 0 || d >= g.in_d || h < 0 || h >= g.in_h || w < 0 || w >= g.in_w) continue;
            const int64_t at = (d * g.in_h + h) * g.in_w + w;
            const float v = x[p * iv + at];
            if (arg < 0 || v > best || std::isnan(v)) best = v, arg = at;
          }
      y_ref[p * ov + o] = best;
      idx_ref[p * ov + o] = arg;
      dx_ref[p * iv + arg] += dy[p * ov + o];
    }
  DeviceArray<float> dxin(env, x), ddy(env, dy), y(env, y_ref.size()), dx(env, x.size());
  DeviceArray<int64_t> idx(env, idx_ref.size());
  max_pool2d_with_indices(dxin.get(), y.get(), idx.get(), g, env.s());
  max_pool2d_backward_indices(ddy.get(), idx.get(), dx.get(), g, env.s());
  expect(idx.download() == idx_ref, "3-d max pool: indices differ from the reference");
  expect(bitwise_equal(y.download(), y_ref), "3-d max pool: y differs from the reference");
  expect(bitwise_equal(dx.download(), dx_ref), "3-d max pool: dx differs from the reference");
  return detail::concat("(", g.in_d, ", ", g.in_h, ", ", g.in_w, ") -> (", g.out_d, ", ", g.out_h, ", ", g.out_w,
                        "), dilation, ceil mode, NaN, ties: y, indices, dx bitwise");
}

// pad_volume then crop_volume (with a bias) against the host; a negative end padding crops.
std::string pad_and_crop(Env& env) {
  PadGeometry g;
  g.planes = 6;  // 2 samples x 3 channels
  g.in[0] = 3, g.in[1] = 4, g.in[2] = 5;
  g.pad_begin[0] = 1, g.pad_begin[1] = 0, g.pad_begin[2] = 2;
  g.pad_end[0] = 0, g.pad_end[1] = 2, g.pad_end[2] = -1;
  const int64_t channels = 3;
  const std::vector<float> x = uniform(env, static_cast<std::size_t>(g.planes * volume(g.in)), -1, 1);
  const std::vector<float> bias = uniform(env, static_cast<std::size_t>(channels), -1, 1);
  const int64_t pd = g.padded(0), ph = g.padded(1), pw = g.padded(2);
  std::vector<float> xp_ref(static_cast<std::size_t>(g.padded_elements()), 0.0f);
  std::vector<float> back_ref(x.size());
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t d = 0; d < g.in[0]; ++d)
      for (int64_t h = 0; h < g.in[1]; ++h)
        for (int64_t w = 0; w < g.in[2]; ++w) {
          const int64_t i = ((p * g.in[0] + d) * g.in[1] + h) * g.in[2] + w;
          const int64_t qd = d + g.pad_begin[0], qh = h + g.pad_begin[1], qw = w + g.pad_begin[2];
          const bool kept = qd < pd && qh < ph && qw < pw;
          if (kept) xp_ref[((p * pd + qd) * ph + qh) * pw + qw] = x[i];
          back_ref[i] = (kept ? x[i] : 0.0f) + bias[p % channels];
        }
  DeviceArray<float> dx(env, x), db(env, bias), xp(env, xp_ref.size()), back(env, x.size());
  pad_volume(dx.get(), xp.get(), g, env.s());
  crop_volume(xp.get(), back.get(), g, db.get(), channels, env.s());
  expect(bitwise_equal(xp.download(), xp_ref), "pad_volume differs from the host");
  expect(bitwise_equal(back.download(), back_ref), "crop_volume differs from the host");
  return "begin padding (1, 0, 2), end padding (0, 2, -1): padded copy and crop + bias exact";
}

}  // namespace

std::string layer_gap_validation() {
  PadGeometry p;
  p.planes = 1;
  p.pad_begin[1] = -1;
  expect_throw<ValueError>("pad begin", [&] { pad_volume(nullptr, nullptr, p, nullptr); },
                           "pad_volume: dimension 1 has size 1, padding -1");
  p.pad_begin[1] = 0;
  p.pad_end[2] = -1;  // padded size 0
  expect_throw<ValueError>("crop empty", [&] { crop_volume(nullptr, nullptr, p, nullptr, 1, nullptr); },
                           "crop_volume: dimension 2 has size 1");
  AvgPoolGeometry a = avg_geo(1, {1, 4, 4}, {1, 2, 2}, {1, 2, 2}, {0, 0, 0}, false, true, 0);
  a.pad[2] = 2;
  expect_throw<ValueError>("avg pad", [&] { avg_pool_forward(nullptr, nullptr, a, nullptr); },
                           "avg_pool_forward: dimension 2 has input 4, output 2, kernel 2, stride 2, padding 2");
  a.pad[2] = 0;
  a.divisor_override = -1;
  expect_throw<ValueError>("avg divisor", [&] { avg_pool_backward(nullptr, nullptr, a, nullptr); },
                           "divisor_override must be >= 0");
  MaxPoolGeometry m;
  m.planes = 1, m.in_h = m.in_w = m.out_h = m.out_w = 1, m.kernel_d = 0;
  expect_throw<ValueError>("max depth", [&] { max_pool2d_with_indices(nullptr, nullptr, nullptr, m, nullptr); },
                           "max_pool2d_with_indices: invalid geometry (planes 1, in (1, 1, 1)");
  Conv2dConfig c;
  c.batch = 1, c.in_channels = 2, c.height = 5, c.width = 5, c.out_channels = 3, c.kernel = {3, 3};
  c.depth = 2, c.kernel_d = 3;
  expect_throw<ValueError>("conv depth", [&] { validate_conv2d(c); },
                           "conv2d_cudnn: depth 2 with padding 0 is too small for kernel 3 with dilation 1");
  c.padding_d = 1;
  validate_conv2d(c);  // fits with padding
  expect(rnn_cell_gates(RnnCell::rnn_tanh) == 1 && rnn_cell_gates(RnnCell::rnn_relu) == 1 &&
             rnn_cell_gates(RnnCell::gru) == 3 && rnn_cell_gates(RnnCell::lstm) == 4,
         "rnn_cell_gates");
  expect(std::string(rnn_cell_name(RnnCell::rnn_relu)) == "rnn_relu", "rnn_cell_name");
  RnnConfig r;
  r.cell = RnnCell::rnn_relu, r.seq_len = 3, r.batch = 2, r.input_size = 4, r.hidden_size = 0;
  expect_throw<ValueError>("rnn size", [&] { validate_rnn(r); }, "rnn_cudnn: seq_len, batch, input_size and hidden_size");
  return "pad / crop geometry, own avg pool geometry and divisor, 3-d max pool geometry, 3-d conv depth window, "
         "plain RNN cells";
}

void add_gap_tests(std::vector<TestCase>& out) {
  out.push_back({"avg_pool_own_kernels", avg_pool_own});
  out.push_back({"max_pool_3d_indices", max_pool_3d});
  out.push_back({"conv_pad_and_crop", pad_and_crop});
}

}  // namespace treadle::cuda::test

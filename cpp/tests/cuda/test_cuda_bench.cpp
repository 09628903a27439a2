// test_cuda --bench: each kernel at a size that runs well past launch overhead, timed with CUDA
// events on the test's stream (3 warm-up calls, then the mean of 20). Prints a table and writes
// JSON records {name, op, shape, ms, metric, unit} that bench/gpu_check.sh compares with torch.
#include <cstdio>
#include <fstream>
#include <functional>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cudnn_rnn.hpp"
#include "backends/cuda/linear_lt.hpp"
#include "backends/cuda/lt_gemm.hpp"
#include "test_cuda_common.hpp"

namespace treadle::cuda::test {
namespace {

struct Record {
  std::string name, op, shape;
  double ms, metric;
  const char* unit;
};

double time_ms(Env& env, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  CudaEvent start, stop;
  start.record(env.s());
  constexpr int kReps = 20;
  for (int i = 0; i < kReps; ++i) fn();
  stop.record(env.s());
  stop.synchronize();
  return CudaEvent::elapsed_ms(start, stop) / kReps;
}

void add(std::vector<Record>& out, Record r) {
  std::printf("BENCH %-22s %-22s %9.4f ms %10.1f %s\n", r.name.c_str(), r.shape.c_str(), r.ms, r.metric, r.unit);
  std::fflush(stdout);
  out.push_back(std::move(r));
}

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

void bench_elementwise(Env& env, std::vector<Record>& out) {
  const int64_t n = int64_t{1} << 26;
  DeviceArray<float> x(env, uniform(env, n, -3, 3)), y(env, n), dy(env, uniform(env, n, -1, 1)), dx(env, n);
  const std::string shape = detail::concat("(", n, ")");
  for (Activation a : {Activation::relu, Activation::gelu, Activation::silu, Activation::tanh}) {
    const double f = time_ms(env, [&] { activation_forward(a, x.get(), y.get(), n, env.s()); });
    add(out, {detail::concat(activation_name(a), "_forward"), activation_name(a), shape, f, gbps(8.0 * n, f), "GB/s"});
    const float* saved = activation_backward_uses_output(a) ? y.get() : x.get();
    const double b = time_ms(env, [&] { activation_backward(a, saved, dy.get(), dx.get(), n, env.s()); });
    add(out, {detail::concat(activation_name(a), "_backward"), std::string(activation_name(a)) + "_backward", shape, b,
              gbps(12.0 * n, b), "GB/s"});
  }
  std::vector<float> zeros(n, 0.0f);
  DeviceArray<float> m(env, zeros), v(env, zeros);
  const AdamCoefficients k = adam_coefficients(1e-3, 0.9, 0.999, 1e-8, 0.01, 1, true, false);
  const double t = time_ms(env, [&] { adam_update(x.get(), dy.get(), m.get(), v.get(), nullptr, n, k, env.s()); });
  add(out, {"adamw_update", "adamw", shape, t, gbps(28.0 * n, t), "GB/s"});
}

void bench_rows(Env& env, std::vector<Record>& out) {
  const int64_t rows = 8192, cols = 4096, n = rows * cols;
  DeviceArray<float> x(env, uniform(env, n, -5, 5)), y(env, n), dy(env, uniform(env, n, -1, 1)), dx(env, n);
  const std::string shape = detail::concat("(", rows, ", ", cols, ")");
  const double f = time_ms(env, [&] { softmax_forward(x.get(), y.get(), rows, cols, 1, env.s()); });
  add(out, {"softmax_forward", "softmax", shape, f, gbps(8.0 * n, f), "GB/s"});
  const double b = time_ms(env, [&] { softmax_backward(y.get(), dy.get(), dx.get(), rows, cols, 1, env.s()); });
  add(out, {"softmax_backward", "softmax_backward", shape, b, gbps(12.0 * n, b), "GB/s"});
  std::vector<int64_t> labels(rows);
  for (int64_t i = 0; i < rows; ++i) labels[i] = static_cast<int64_t>(env.rng() % cols);
  DeviceArray<int64_t> lab(env, labels);
  DeviceArray<float> loss(env, 1), g(env, std::vector<float>{1.0f});
  DeviceBuffer ws = env.alloc.buffer(cross_entropy_workspace_bytes(rows, 1), env.s());
  const double cf = time_ms(env, [&] {
    cross_entropy_forward(x.get(), lab.get(), loss.get(), rows, cols, 1, Reduction::mean, ws.data(), env.s());
  });
  add(out, {"cross_entropy_forward", "cross_entropy", shape, cf, gbps(4.0 * n, cf), "GB/s"});
  const double cb = time_ms(env, [&] {
    cross_entropy_backward(x.get(), lab.get(), g.get(), dx.get(), rows, cols, 1, Reduction::mean, env.s());
  });
  add(out, {"cross_entropy_backward", "cross_entropy_backward", shape, cb, gbps(8.0 * n, cb), "GB/s"});
  DeviceArray<float> col(env, cols);
  DeviceBuffer cws = env.alloc.buffer(column_sum_workspace_bytes(rows, cols), env.s());
  const double cs = time_ms(env, [&] { column_sum(x.get(), col.get(), rows, cols, cws.data(), env.s()); });
  add(out, {"column_sum", "column_sum", shape, cs, gbps(4.0 * n, cs), "GB/s"});
}

void bench_linear(Env& env, std::vector<Record>& out) {
  const int64_t n = 8192, in = 4096, o = 4096;
  DeviceArray<float> x(env, uniform(env, n * in, -1, 1)), w(env, uniform(env, o * in, -1, 1)),
      b(env, uniform(env, o, -1, 1)), y(env, n * o), dy(env, uniform(env, n * o, -1, 1)), dx(env, n * in),
      dw(env, o * in);
  const double flops = 2.0 * n * in * o;
  const std::string shape = detail::concat("(", n, ", ", in, ", ", o, ")");
  for (MathMode math : {MathMode::f32, MathMode::bf16, MathMode::bf16_operands}) {
    const char* tag = math_name(math);
    LtLinear lin(env.lt.get(), LinearConfig{n, in, o, LinearEpilogue::bias_relu, math});
    DeviceBuffer ws = env.alloc.buffer(lin.workspace_bytes(), env.s());
    const double f = time_ms(env, [&] { lin.forward(x.get(), w.get(), b.get(), y.get(), ws.data(), env.s()); });
    add(out, {detail::concat("linear_relu_fwd_", tag), detail::concat("linear_relu_", tag), shape, f,
              flops / (f * 1e-3) / 1e12, "TFLOP/s"});
    const double bi = time_ms(env, [&] { lin.backward_input(dy.get(), w.get(), dx.get(), ws.data(), env.s()); });
    add(out, {detail::concat("linear_dx_", tag), detail::concat("linear_dx_", tag), shape, bi, flops / (bi * 1e-3) / 1e12,
              "TFLOP/s"});
    const double bw = time_ms(env, [&] { lin.backward_weight(dy.get(), x.get(), dw.get(), false, ws.data(), env.s()); });
    add(out, {detail::concat("linear_dw_", tag), detail::concat("linear_dw_", tag), shape, bw, flops / (bw * 1e-3) / 1e12,
              "TFLOP/s"});
  }
}

// A ResNet stage's 3x3 convolution (stride 1, padding 1) through cuDNN with the deterministic
// algorithms the tests use: forward (+ bias), backward data, backward filter, in both math modes.
// The shape string carries (N, C, H, W, K, kH, kW, stride, padding) for the torch comparison.
void bench_conv(Env& env, std::vector<Record>& out) {
  const int64_t n = 32, c = 64, hw = 56, k = 64;
  CudnnHandle dnn(env.s());
  DeviceArray<float> x(env, uniform(env, n * c * hw * hw, -1, 1)), w(env, uniform(env, k * c * 9, -1, 1)),
      b(env, uniform(env, k, -1, 1)), y(env, n * k * hw * hw), dy(env, uniform(env, n * k * hw * hw, -1, 1)),
      dx(env, n * c * hw * hw), dw(env, k * c * 9);
  const double flops = 2.0 * n * k * hw * hw * c * 9;
  const std::string shape = detail::concat("(", n, ", ", c, ", ", hw, ", ", hw, ", ", k, ", 3, 3, 1, 1)");
  for (ConvMath math : {ConvMath::fp32, ConvMath::tensor_op}) {
    Conv2dConfig cfg;
    cfg.batch = n, cfg.in_channels = c, cfg.height = cfg.width = hw, cfg.out_channels = k;
    cfg.kernel = {3, 3}, cfg.padding = {1, 1}, cfg.math = math;
    CudnnConv2d conv(dnn.get(), cfg);
    std::printf("BENCH conv2d %s algorithms: %s\n", conv_math_name(math), conv.describe().c_str());
    DeviceBuffer ws = env.alloc.buffer(std::max<std::size_t>(conv.workspace_bytes(), 256), env.s());
    const std::string tag = conv_math_name(math);
    const double f = time_ms(env, [&] { conv.forward(dnn.get(), x.get(), w.get(), b.get(), y.get(), ws.data()); });
    add(out, {"conv2d_fwd_" + tag, "conv2d_fwd_" + tag, shape, f, flops / (f * 1e-3) / 1e12, "TFLOP/s"});
    const double d = time_ms(env, [&] { conv.backward_data(dnn.get(), dy.get(), w.get(), dx.get(), false, ws.data()); });
    add(out, {"conv2d_bwd_data_" + tag, "conv2d_bwd_data_" + tag, shape, d, flops / (d * 1e-3) / 1e12, "TFLOP/s"});
    const double g = time_ms(env, [&] { conv.backward_filter(dnn.get(), x.get(), dy.get(), dw.get(), false, ws.data()); });
    add(out, {"conv2d_bwd_filter_" + tag, "conv2d_bwd_filter_" + tag, shape, g, flops / (g * 1e-3) / 1e12, "TFLOP/s"});
  }
}

// One LSTM layer (T=50, N=64, F=H=512, float32 FMA math): the forward alone, and a whole training
// pass (forward, backward data, backward weights). The shape string is (T, N, F, H).
void bench_lstm(Env& env, std::vector<Record>& out) {
  const int64_t t = 50, n = 64, f = 512, h = 512;
  CudnnHandle dnn(env.s());
  RnnConfig cfg;
  cfg.seq_len = t, cfg.batch = n, cfg.input_size = f, cfg.hidden_size = h;
  CudnnRnn rnn(dnn.get(), cfg);
  DeviceArray<float> x(env, uniform(env, t * n * f, -1, 1)), w_ih(env, uniform(env, 4 * h * f, -0.04f, 0.04f)),
      w_hh(env, uniform(env, 4 * h * h, -0.04f, 0.04f)), b(env, uniform(env, 4 * h, -0.04f, 0.04f)),
      h0(env, uniform(env, n * h, -1, 1)), c0(env, uniform(env, n * h, -1, 1)), y(env, t * n * h),
      dy(env, uniform(env, t * n * h, -1, 1)), hn(env, n * h), cn(env, n * h), dx(env, t * n * f), dh0(env, n * h),
      dc0(env, n * h);
  DeviceBuffer space = env.alloc.buffer(rnn.weight_space_bytes(), env.s()),
               dspace = env.alloc.buffer(rnn.weight_space_bytes(), env.s()),
               ws = env.alloc.buffer(rnn.workspace_bytes(), env.s()),
               reserve = env.alloc.buffer(std::max<std::size_t>(rnn.reserve_bytes(), 256), env.s());
  rnn.pack_weights(dnn.get(), w_ih.get(), w_hh.get(), b.get(), b.get(), space.data());
  auto forward = [&] {
    rnn.forward_training(dnn.get(), x.get(), h0.get(), c0.get(), space.data(), y.get(), hn.get(), cn.get(), ws.data(),
                         reserve.data());
  };
  const double flops = 2.0 * t * n * 4 * h * (f + h);  // the forward's products
  const std::string shape = detail::concat("(", t, ", ", n, ", ", f, ", ", h, ")");
  const double fw = time_ms(env, forward);
  add(out, {"lstm_fwd_fp32", "lstm_fwd_fp32", shape, fw, flops / (fw * 1e-3) / 1e12, "TFLOP/s"});
  const double all = time_ms(env, [&] {
    forward();
    rnn.backward_data(dnn.get(), y.get(), dy.get(), nullptr, nullptr, h0.get(), c0.get(), space.data(), dx.get(),
                      dh0.get(), dc0.get(), ws.data(), reserve.data());
    rnn.backward_weights(dnn.get(), x.get(), h0.get(), y.get(), dspace.data(), false, ws.data(), reserve.data());
  });
  add(out, {"lstm_fwd_bwd_fp32", "lstm_fwd_bwd_fp32", shape, all, 3 * flops / (all * 1e-3) / 1e12, "TFLOP/s"});
}

}  // namespace

int run_benchmarks(Env& env, const std::string& json_path) {
  std::vector<Record> out;
  try {
    bench_elementwise(env, out);
    bench_rows(env, out);
    bench_linear(env, out);
    bench_conv(env, out);
    bench_lstm(env, out);
  } catch (const std::exception& e) {
    std::printf("FAIL bench: %s\n", e.what());
    return 1;
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "[\n";
    for (std::size_t i = 0; i < out.size(); ++i) {
      const Record& r = out[i];
      f << "  {\"name\": \"" << r.name << "\", \"op\": \"" << r.op << "\", \"shape\": \"" << r.shape
        << "\", \"ms\": " << r.ms << ", \"metric\": " << r.metric << ", \"unit\": \"" << r.unit << "\"}"
        << (i + 1 < out.size() ? ",\n" : "\n");
    }
    f << "]\n";
  }
  std::printf("bench: %zu kernels timed\n", out.size());
  return 0;
}

}  // namespace treadle::cuda::test

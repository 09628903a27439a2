// Device tests of the cuDNN LSTM / GRU layer (forward training, backward data, backward weights,
// weight packing) against a float64 host implementation of the core's lstm_layer / gru_layer
// (PyTorch's gate order and formulas) with backpropagation through time: full-length and
// variable-length sequences, forward and reversed layers, both layouts; and the calls captured in a
// CUDA graph and replayed.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_graph.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cudnn_rnn.hpp"
#include "test_cuda_cudnn.hpp"

namespace treadle::cuda::test {
namespace {

struct RnnData {
  std::vector<float> x, h0, c0, w_ih, w_hh, b_ih, b_hh, dy, dh_n, dc_n;  // empty: absent (zeros)
};

struct RnnRef {
  std::vector<double> y, h_n, c_n, dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh;
};

double sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double at_or_zero(const std::vector<float>& v, std::size_t i) { return v.empty() ? 0.0 : v[i]; }

struct Geometry {
  int64_t T, N, F, H, G;
  bool batch_first;
  std::size_t xi(int64_t t, int64_t n, int64_t f) const { return (batch_first ? (n * T + t) : (t * N + n)) * F + f; }
  std::size_t yi(int64_t t, int64_t n, int64_t h) const { return (batch_first ? (n * T + t) : (t * N + n)) * H + h; }
};

// One time step's saved values for one sample: gate activations (LSTM i f g o; GRU r z n), the
// hidden-side n pre-activation W_hn h + b_hn (GRU), the cell state and the previous states.
struct Step {
  std::vector<double> act, hn, c, h_prev, c_prev;
};

// pre[j] = sum_k w[j * cols + k] v[k] for rows j of one side.
std::vector<double> affine(const std::vector<float>& w, const std::vector<float>& b, const std::vector<double>& v,
                           int64_t rows) {
  const int64_t cols = static_cast<int64_t>(v.size());
  std::vector<double> out(rows);
  for (int64_t j = 0; j < rows; ++j) {
    double s = at_or_zero(b, j);
    for (int64_t k = 0; k < cols; ++k) s += double(w[j * cols + k]) * v[k];
    out[j] = s;
  }
  return out;
}

Step forward_step(const Geometry& g, bool lstm, const RnnData& d, const std::vector<double>& x,
                  const std::vector<double>& h, const std::vector<double>& c) {
  const int64_t H = g.H;
  const std::vector<double> ai = affine(d.w_ih, d.b_ih, x, g.G * H), ah = affine(d.w_hh, d.b_hh, h, g.G * H);
  Step s{std::vector<double>(g.G * H), std::vector<double>(H), std::vector<double>(H), h, c};
  for (int64_t j = 0; j < H; ++j) {
    if (lstm) {
      const double i = sig(ai[j] + ah[j]), f = sig(ai[H + j] + ah[H + j]), gg = std::tanh(ai[2 * H + j] + ah[2 * H + j]),
                   o = sig(ai[3 * H + j] + ah[3 * H + j]);
      s.act[j] = i, s.act[H + j] = f, s.act[2 * H + j] = gg, s.act[3 * H + j] = o;
      s.c[j] = f * c[j] + i * gg;
    } else {
      const double r = sig(ai[j] + ah[j]), z = sig(ai[H + j] + ah[H + j]);
      s.hn[j] = ah[2 * H + j];
      s.act[j] = r, s.act[H + j] = z, s.act[2 * H + j] = std::tanh(ai[2 * H + j] + r * s.hn[j]);
    }
  }
  return s;
}

double step_output(const Step& s, bool lstm, int64_t H, int64_t j) {
  return lstm ? s.act[3 * H + j] * std::tanh(s.c[j]) : (1 - s.act[H + j]) * s.act[2 * H + j] + s.act[H + j] * s.h_prev[j];
}

// Backward through one step: given dh (and dc) at its outputs, accumulates the weight and bias
// gradients into r, writes the input-side pre-activation gradients to `dai` (dx = W_ih^T dai), and
// turns dh / dc into the previous step's.
void backward_step(const Geometry& g, bool lstm, const RnnData& d, const Step& s, const std::vector<double>& x,
                   RnnRef& r, std::vector<double>& dh, std::vector<double>& dc, std::vector<double>& dai) {
  const int64_t H = g.H;
  std::vector<double> dah(g.G * H), dh_prev(H, 0.0);
  for (int64_t j = 0; j < H; ++j) {
    if (lstm) {
      const double i = s.act[j], f = s.act[H + j], gg = s.act[2 * H + j], o = s.act[3 * H + j], tc = std::tanh(s.c[j]);
      const double dct = dc[j] + dh[j] * o * (1 - tc * tc);
      dai[j] = dct * gg * i * (1 - i), dai[H + j] = dct * s.c_prev[j] * f * (1 - f);
      dai[2 * H + j] = dct * i * (1 - gg * gg), dai[3 * H + j] = dh[j] * tc * o * (1 - o);
      for (int64_t q = 0; q < 4; ++q) dah[q * H + j] = dai[q * H + j];
      dc[j] = dct * f;
    } else {
      const double rr = s.act[j], z = s.act[H + j], n = s.act[2 * H + j];
      const double dan = dh[j] * (1 - z) * (1 - n * n);
      dai[j] = dan * s.hn[j] * rr * (1 - rr), dai[H + j] = dh[j] * (s.h_prev[j] - n) * z * (1 - z), dai[2 * H + j] = dan;
      dah[j] = dai[j], dah[H + j] = dai[H + j], dah[2 * H + j] = dan * rr;
      dh_prev[j] = dh[j] * z;
    }
  }
  for (int64_t row = 0; row < g.G * H; ++row) {
    if (!r.db_ih.empty()) r.db_ih[row] += dai[row], r.db_hh[row] += dah[row];
    for (int64_t k = 0; k < g.F; ++k) r.dw_ih[row * g.F + k] += dai[row] * x[k];
    for (int64_t k = 0; k < H; ++k) {
      r.dw_hh[row * H + k] += dah[row] * s.h_prev[k];
      dh_prev[k] += dah[row] * d.w_hh[row * H + k];
    }
  }
  dh.swap(dh_prev);
}

// `lengths` empty: every sequence T long. Sample n runs its steps s = 0 .. L-1 at times t = s, or
// t = L-1-s with `reverse`; y and dx are zero past L, dy there is ignored (the core's definition).
RnnRef rnn_reference(const RnnConfig& c, const RnnData& d, const std::vector<int32_t>& lengths) {
  const bool lstm = c.cell == RnnCell::lstm;
  const Geometry g{c.seq_len, c.batch, c.input_size, c.hidden_size, lstm ? 4 : 3, c.batch_first};
  const int64_t T = g.T, N = g.N, F = g.F, H = g.H, G = g.G;
  RnnRef r;
  r.y.assign(T * N * H, 0.0), r.h_n.assign(N * H, 0.0), r.c_n.assign(N * H, 0.0), r.dx.assign(T * N * F, 0.0);
  r.dh0.assign(N * H, 0.0), r.dc0.assign(N * H, 0.0), r.dw_ih.assign(G * H * F, 0.0), r.dw_hh.assign(G * H * H, 0.0);
  if (c.bias) r.db_ih.assign(G * H, 0.0), r.db_hh.assign(G * H, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t L = lengths.empty() ? T : lengths[n];
    auto time = [&](int64_t step) { return c.reverse ? L - 1 - step : step; };
    std::vector<double> h(H), cs(H);
    for (int64_t j = 0; j < H; ++j) h[j] = at_or_zero(d.h0, n * H + j), cs[j] = at_or_zero(d.c0, n * H + j);
    std::vector<Step> steps;
    std::vector<std::vector<double>> xs(L, std::vector<double>(F));
    for (int64_t step = 0; step < L; ++step) {
      const int64_t t = time(step);
      for (int64_t f = 0; f < F; ++f) xs[step][f] = d.x[g.xi(t, n, f)];
      steps.push_back(forward_step(g, lstm, d, xs[step], h, cs));
      for (int64_t j = 0; j < H; ++j) h[j] = step_output(steps.back(), lstm, H, j), r.y[g.yi(t, n, j)] = h[j];
      if (lstm) cs = steps.back().c;
    }
    std::vector<double> dh(H), dc(H), dai(G * H);
    for (int64_t j = 0; j < H; ++j) {
      r.h_n[n * H + j] = h[j], r.c_n[n * H + j] = lstm ? cs[j] : 0.0;
      dh[j] = at_or_zero(d.dh_n, n * H + j), dc[j] = at_or_zero(d.dc_n, n * H + j);
    }
    for (int64_t step = L - 1; step >= 0; --step) {
      const int64_t t = time(step);
      for (int64_t j = 0; j < H; ++j) dh[j] += d.dy[g.yi(t, n, j)];
      backward_step(g, lstm, d, steps[step], xs[step], r, dh, dc, dai);
      for (int64_t f = 0; f < F; ++f) {
        double v = 0;
        for (int64_t row = 0; row < G * H; ++row) v += dai[row] * d.w_ih[row * F + f];
        r.dx[g.xi(t, n, f)] = v;
      }
    }
    for (int64_t j = 0; j < H; ++j) r.dh0[n * H + j] = dh[j], r.dc0[n * H + j] = dc[j];
  }
  return r;
}

struct RnnCase {
  const char* name;
  RnnConfig c;
  bool states;  // h0/c0 and dh_n/dc_n given (else null: zeros)
  double tol;
};

// Unsorted, one full-length sequence, the rest in [1, T]: cuDNN's unpacked layouts need no order.
std::vector<int32_t> case_lengths(const RnnConfig& c) {
  if (!c.variable_lengths) return {};
  std::vector<int32_t> l(static_cast<std::size_t>(c.batch));
  for (int64_t n = 0; n < c.batch; ++n) l[n] = static_cast<int32_t>(n == 0 ? c.seq_len : 1 + (n * 5 + 2) % c.seq_len);
  return l;
}

RnnData make_data(Env& env, const RnnConfig& c, bool states) {
  const int64_t G = c.cell == RnnCell::lstm ? 4 : 3, H = c.hidden_size, N = c.batch;
  const float k = 1.0f / std::sqrt(static_cast<float>(H));  // torch's initialisation range
  const bool lstm = c.cell == RnnCell::lstm;
  RnnData d;
  d.x = uniform(env, c.seq_len * N * c.input_size, -1, 1);
  d.w_ih = uniform(env, G * H * c.input_size, -k, k), d.w_hh = uniform(env, G * H * H, -k, k);
  if (c.bias) d.b_ih = uniform(env, G * H, -k, k), d.b_hh = uniform(env, G * H, -k, k);
  d.dy = uniform(env, c.seq_len * N * H, -1, 1);  // non-zero past the lengths too: must be ignored there
  if (states) {
    d.h0 = uniform(env, N * H, -1, 1), d.dh_n = uniform(env, N * H, -1, 1);
    if (lstm) d.c0 = uniform(env, N * H, -1, 1), d.dc_n = uniform(env, N * H, -1, 1);
  }
  return d;
}

// A device copy of v, or of one zero when v is empty (the pointer is then not passed).
DeviceArray<float> device_or_dummy(Env& env, const std::vector<float>& v) {
  return v.empty() ? DeviceArray<float>(env, std::vector<float>{0.0f}) : DeviceArray<float>(env, v);
}

float* ptr_if(const std::vector<float>& v, DeviceArray<float>& a) { return v.empty() ? nullptr : a.get(); }

// Every device buffer of one layer's forward and backward.
struct RnnBuffers {
  RnnBuffers(Env& env, const CudnnRnn& rnn, const RnnData& d, const std::vector<int32_t>& lengths)
      : x(env, d.x), w_ih(env, d.w_ih), w_hh(env, d.w_hh), dy(env, d.dy), b_ih(device_or_dummy(env, d.b_ih)),
        b_hh(device_or_dummy(env, d.b_hh)), h0(device_or_dummy(env, d.h0)), c0(device_or_dummy(env, d.c0)),
        dh_n(device_or_dummy(env, d.dh_n)), dc_n(device_or_dummy(env, d.dc_n)), y(env, d.dy.size()),
        h_n(env, rnn.config().batch * rnn.config().hidden_size), c_n(env, h_n.size()), dx(env, d.x.size()),
        dh0(env, h_n.size()), dc0(env, h_n.size()), dw_ih(env, d.w_ih.size()), dw_hh(env, d.w_hh.size()),
        db_ih(env, rnn.gates() * rnn.config().hidden_size), db_hh(env, db_ih.size()),
        len(env, lengths.empty() ? std::vector<int32_t>{0} : lengths),
        space(env.alloc.buffer(rnn.weight_space_bytes(), env.s())),
        dspace(env.alloc.buffer(rnn.weight_space_bytes(), env.s())),
        ws(env.alloc.buffer(rnn.workspace_bytes(), env.s())),
        reserve(env.alloc.buffer(std::max<std::size_t>(rnn.reserve_bytes(), 256), env.s())) {
    if (!lengths.empty()) host_lengths = lengths;
  }
  RnnLengths lengths() const {
    return host_lengths.empty() ? RnnLengths{} : RnnLengths{host_lengths.data(), len.get()};
  }
  DeviceArray<float> x, w_ih, w_hh, dy, b_ih, b_hh, h0, c0, dh_n, dc_n, y, h_n, c_n, dx, dh0, dc0, dw_ih, dw_hh, db_ih,
      db_hh;
  DeviceArray<int32_t> len;
  std::vector<int32_t> host_lengths;
  DeviceBuffer space, dspace, ws, reserve;
};

// Forward, backward data, backward weights (set, or accumulated), unpacked gradients.
void run_layer(cudnnHandle_t dnn, const CudnnRnn& rnn, const RnnData& d, RnnBuffers& b, bool accumulate) {
  const bool lstm = rnn.config().cell == RnnCell::lstm, bias = rnn.config().bias;
  rnn.forward_training(dnn, b.x.get(), ptr_if(d.h0, b.h0), lstm ? ptr_if(d.c0, b.c0) : nullptr, b.space.data(),
                       b.y.get(), b.h_n.get(), lstm ? b.c_n.get() : nullptr, b.ws.data(), b.reserve.data(),
                       b.lengths());
  rnn.backward_data(dnn, b.y.get(), b.dy.get(), ptr_if(d.dh_n, b.dh_n), lstm ? ptr_if(d.dc_n, b.dc_n) : nullptr,
                    ptr_if(d.h0, b.h0), lstm ? ptr_if(d.c0, b.c0) : nullptr, b.space.data(), b.dx.get(), b.dh0.get(),
                    lstm ? b.dc0.get() : nullptr, b.ws.data(), b.reserve.data(), b.lengths());
  rnn.backward_weights(dnn, b.x.get(), ptr_if(d.h0, b.h0), b.y.get(), b.dspace.data(), accumulate, b.ws.data(),
                       b.reserve.data(), b.lengths());
  rnn.unpack_weight_grads(dnn, b.dspace.data(), b.dw_ih.get(), b.dw_hh.get(), bias ? b.db_ih.get() : nullptr,
                          bias ? b.db_hh.get() : nullptr);
}

// Positions past each length must be exactly zero (y, dx), not merely small.
void expect_zero_padding(const std::string& what, const std::vector<float>& got, const RnnConfig& c, int64_t width,
                         const std::vector<int32_t>& lengths) {
  for (int64_t n = 0; n < static_cast<int64_t>(lengths.size()); ++n)
    for (int64_t t = lengths[n]; t < c.seq_len; ++t)
      for (int64_t w = 0; w < width; ++w) {
        const int64_t row = c.batch_first ? n * c.seq_len + t : t * c.batch + n;
        expect(got[row * width + w] == 0.0f, what, ": ", got[row * width + w], " at t=", t, " n=", n, " (length ",
               lengths[n], ")");
      }
}

double check_rnn(Env& env, cudnnHandle_t dnn, const RnnCase& k) {
  const RnnConfig& c = k.c;
  const bool lstm = c.cell == RnnCell::lstm;
  const RnnData d = make_data(env, c, k.states);
  const std::vector<int32_t> lengths = case_lengths(c);
  CudnnRnn rnn(dnn, c);
  RnnBuffers b(env, rnn, d, lengths);
  rnn.pack_weights(dnn, b.w_ih.get(), b.w_hh.get(), ptr_if(d.b_ih, b.b_ih), ptr_if(d.b_hh, b.b_hh), b.space.data());
  // Packing then unpacking the weights themselves must give them back bit for bit.
  rnn.unpack_weight_grads(dnn, b.space.data(), b.dw_ih.get(), b.dw_hh.get(), c.bias ? b.db_ih.get() : nullptr,
                          c.bias ? b.db_hh.get() : nullptr);
  expect(b.dw_ih.download() == d.w_ih && b.dw_hh.download() == d.w_hh, k.name,
         ": weight pack/unpack round trip differs");
  run_layer(dnn, rnn, d, b, false);
  const RnnRef r = rnn_reference(c, d, lengths);
  const std::string what = detail::concat(rnn_cell_name(c.cell), " ", k.name);
  const std::vector<float> gy = b.y.download(), gdx = b.dx.download(), gdw = b.dw_hh.download();
  compare(what + " y", gy, r.y, k.tol);
  compare(what + " h_n", b.h_n.download(), r.h_n, k.tol);
  compare(what + " dx", gdx, r.dx, k.tol);
  compare(what + " dh0", b.dh0.download(), r.dh0, k.tol);
  compare(what + " dw_ih", b.dw_ih.download(), r.dw_ih, k.tol);
  compare(what + " dw_hh", gdw, r.dw_hh, k.tol);
  expect_zero_padding(what + " y", gy, c, c.hidden_size, lengths);
  expect_zero_padding(what + " dx", gdx, c, c.input_size, lengths);
  if (lstm) {
    compare(what + " c_n", b.c_n.download(), r.c_n, k.tol);
    compare(what + " dc0", b.dc0.download(), r.dc0, k.tol);
  }
  if (c.bias) {
    compare(what + " db_ih", b.db_ih.download(), r.db_ih, k.tol);
    compare(what + " db_hh", b.db_hh.download(), r.db_hh, k.tol);
  }
  // Accumulation: a second weight-gradient pass adds onto the first.
  rnn.backward_weights(dnn, b.x.get(), ptr_if(d.h0, b.h0), b.y.get(), b.dspace.data(), true, b.ws.data(),
                       b.reserve.data(), b.lengths());
  rnn.unpack_weight_grads(dnn, b.dspace.data(), b.dw_ih.get(), b.dw_hh.get(), c.bias ? b.db_ih.get() : nullptr,
                          c.bias ? b.db_hh.get() : nullptr);
  std::vector<double> twice = r.dw_hh;
  for (double& v : twice) v *= 2;
  compare(what + " dw_hh+=", b.dw_hh.download(), twice, k.tol);
  return std::max({relative_error(gy, r.y), relative_error(gdx, r.dx), relative_error(gdw, r.dw_hh)});
}

RnnConfig rnn_cfg(RnnCell cell, int64_t t, int64_t n, int64_t f, int64_t h, bool batch_first, bool bias,
                  bool reverse = false, bool variable = false) {
  RnnConfig c;
  c.cell = cell, c.seq_len = t, c.batch = n, c.input_size = f, c.hidden_size = h, c.batch_first = batch_first,
  c.bias = bias, c.reverse = reverse, c.variable_lengths = variable;
  return c;
}

constexpr bool kRev = true, kVar = true;

std::vector<RnnCase> rnn_cases() {
  RnnConfig big_tf32 = rnn_cfg(RnnCell::lstm, 20, 16, 64, 128, false, true);
  big_tf32.tensor_op = true;
  const RnnCell L = RnnCell::lstm, G = RnnCell::gru;
  return {{"T5 N3 F7 H8", rnn_cfg(L, 5, 3, 7, 8, false, true), true, 1e-5},
          {"batch_first no bias, zero states", rnn_cfg(L, 4, 2, 16, 32, true, false), false, 1e-5},
          {"T6 N4 F5 H9", rnn_cfg(G, 6, 4, 5, 9, false, true), true, 1e-5},
          {"batch_first T3 N5 F12 H16", rnn_cfg(G, 3, 5, 12, 16, true, true), true, 1e-5},
          {"no bias, zero states", rnn_cfg(G, 4, 3, 6, 8, false, false), false, 1e-5},
          {"reversed T5 N3 F7 H8", rnn_cfg(L, 5, 3, 7, 8, false, true, kRev), true, 1e-5},
          {"reversed batch_first T6 N4 F5 H9", rnn_cfg(G, 6, 4, 5, 9, true, true, kRev), true, 1e-5},
          {"lengths T7 N5 F6 H8", rnn_cfg(L, 7, 5, 6, 8, false, true, false, kVar), true, 1e-5},
          {"lengths batch_first no bias T6 N4 F5 H9", rnn_cfg(G, 6, 4, 5, 9, true, false, false, kVar), true, 1e-5},
          {"reversed lengths batch_first T7 N6 F5 H8", rnn_cfg(L, 7, 6, 5, 8, true, true, kRev, kVar), true, 1e-5},
          {"reversed lengths zero states T6 N5 F7 H9", rnn_cfg(G, 6, 5, 7, 9, false, true, kRev, kVar), false, 1e-5},
          {"T20 N16 F64 H128", rnn_cfg(L, 20, 16, 64, 128, false, true), true, 5e-5},
          {"T20 N16 F64 H128 GRU", rnn_cfg(G, 20, 16, 64, 128, false, true), true, 5e-5},
          {"reversed lengths T20 N16 F64 H128", rnn_cfg(L, 20, 16, 64, 128, false, true, kRev, kVar), true, 5e-5},
          {"T20 N16 F64 H128 tensor-op", big_tf32, true, 1e-2}};
}

std::string rnn_layers(Env& env) {
  CudnnHandle dnn(env.s());
  double worst = 0.0;
  for (const RnnCase& k : rnn_cases())
    if (!k.c.tensor_op) worst = std::max(worst, check_rnn(env, dnn.get(), k));
  const double tf32 = check_rnn(env, dnn.get(), rnn_cases().back());
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%zu LSTM/GRU cases (forward and reversed, full and variable lengths; y, h_n, c_n, "
                "dx, dh0, dc0, dW, db, dW+=), worst rel.err %.2e; tensor-op %.2e (tol 1e-02)", rnn_cases().size() - 1,
                worst, tf32);
  return buf;
}

// The layer's calls captured once in a CUDA graph and replayed on new inputs: a full-length
// reversed LSTM (the lengths come from the layer's own device copy) and a variable-length GRU (the
// caller's device lengths; the wrapper copies nothing from the host either way), against the same
// calls launched directly and the float64 reference.
std::string rnn_graph_capture(Env& env) {
  CudnnHandle dnn(env.s());
  std::string detail;
  double worst = 0;
  const RnnCase cases[] = {{"reversed LSTM", rnn_cfg(RnnCell::lstm, 6, 4, 8, 16, false, true, kRev), true, 0},
                           {"lengths GRU", rnn_cfg(RnnCell::gru, 6, 4, 8, 16, true, true, false, kVar), true, 0}};
  for (const RnnCase& k : cases) {
    const RnnConfig& c = k.c;
    RnnData d = make_data(env, c, true);
    const std::vector<int32_t> lengths = case_lengths(c);
    CudnnRnn rnn(dnn.get(), c);
    RnnBuffers b(env, rnn, d, lengths);
    rnn.pack_weights(dnn.get(), b.w_ih.get(), b.w_hh.get(), b.b_ih.get(), b.b_hh.get(), b.space.data());
    run_layer(dnn.get(), rnn, d, b, false);  // first use outside the capture (cuDNN's lazy set-up)
    GraphExec graph;
    {
      StreamCapture capture(env.s());
      run_layer(dnn.get(), rnn, d, b, false);
      graph = GraphExec(capture.finish("rnn_graph_capture"), "rnn_graph_capture");
    }
    for (int replay = 0; replay < 3; ++replay) {
      d.x = uniform(env, d.x.size(), -1, 1);
      d.dy = uniform(env, d.dy.size(), -1, 1);
      b.x.upload(d.x);
      b.dy.upload(d.dy);
      graph.launch(env.s());
      const std::vector<float> gy = b.y.download(), gdx = b.dx.download(), gdw = b.dw_hh.download();
      run_layer(dnn.get(), rnn, d, b, false);
      // Not required bitwise: cuDNN does not promise repeatable RNN gradients (expected 0 all the same).
      const auto wide = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
      worst = std::max({worst, relative_error(gy, wide(b.y.download())), relative_error(gdx, wide(b.dx.download())),
                        relative_error(gdw, wide(b.dw_hh.download()))});
      expect(worst <= 1e-6, k.name, ": replay ", replay + 1, " differs from the launched calls by ", worst);
      const RnnRef r = rnn_reference(c, d, lengths);
      compare(std::string(k.name) + " replay y", gy, r.y, 1e-5);
      compare(std::string(k.name) + " replay dw_hh", gdw, r.dw_hh, 1e-5);
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    expect(cudaStreamIsCapturing(env.s(), &status) == cudaSuccess && status == cudaStreamCaptureStatusNone,
           "the stream is still capturing");
    detail += std::string(detail.empty() ? "" : ", ") + k.name;
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), ": forward + backward data + backward weights captured, 3 replays each; "
                "graph vs launched rel.diff %.1e (tol 1e-6), vs reference <= 1e-5", worst);
  return detail + buf;
}

}  // namespace

std::string rnn_validation() {
  expect_throw<ValueError>("hidden", [] { validate_rnn(rnn_cfg(RnnCell::lstm, 5, 2, 3, 0, false, true)); },
                           "rnn_cudnn: seq_len, batch, input_size and hidden_size must be in [1, 2^31 - 1], got (5, 2, 3, 0)");
  expect_throw<ValueError>("elements", [] { validate_rnn(rnn_cfg(RnnCell::gru, 1 << 16, 1 << 10, 1 << 6, 8, false, true)); },
                           "rnn_cudnn: x (T, N, F) (65536, 1024, 64, 1) has more than 2^31 - 1 elements");
  expect_throw<ValueError>("handle", [] { CudnnRnn(nullptr, rnn_cfg(RnnCell::lstm, 5, 2, 3, 4, false, true)); },
                           "rnn_cudnn: null cuDNN handle");
  // The sequence kernels check their arguments before any launch.
  float buf[4] = {};
  expect_throw<ValueError>("sequence_copy sizes",
                           [&] { sequence_copy(buf, buf + 2, 0, 1, 1, nullptr, false, true, nullptr); },
                           "sequence_copy: expected T, N, W >= 1, got (0, 1, 1)");
  expect_throw<ValueError>("sequence_copy in place",
                           [&] { sequence_copy(buf, buf, 1, 1, 1, nullptr, false, true, nullptr); },
                           "sequence_copy: src and dst must not overlap");
  expect_throw<ValueError>("sequence_copy null",
                           [&] { sequence_copy(nullptr, buf, 1, 1, 1, nullptr, true, false, nullptr); },
                           "sequence_copy: null device pointer");
  expect_throw<ValueError>("zero padding without lengths",
                           [&] { sequence_zero_padding(buf, 2, 2, 1, nullptr, false, nullptr); },
                           "sequence_zero_padding: null device pointer");
  int64_t l64 = 1;
  int32_t l32 = 0;
  expect_throw<ValueError>("lengths_to_int32", [&] { lengths_to_int32(&l64, &l32, 0, nullptr); },
                           "lengths_to_int32: expected n >= 1, got 0");
  return "sizes, 32-bit limits, null handle; sequence kernels' arguments";
}

void add_rnn_tests(std::vector<TestCase>& out) {
  out.push_back({"rnn_layers", rnn_layers});
  out.push_back({"rnn_graph_capture", rnn_graph_capture});
}

}  // namespace treadle::cuda::test

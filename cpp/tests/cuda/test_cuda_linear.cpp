// Device tests of the cuBLASLt linear (float32 and bf16 math, each epilogue, dX, dW, accumulation)
// against float64 products, and of a whole training step of a small MLP built from the kernels:
// its loss must fall, and after the first step the allocator must not call cudaMalloc again.
#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/linear_lt.hpp"
#include "backends/cuda/lt_gemm.hpp"
#include "test_cuda_common.hpp"

namespace treadle::cuda::test {
namespace {

struct LinearRef {
  std::vector<double> y, dx, dw, db;
};

LinearRef reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                    const std::vector<float>& dy, const std::vector<float>& dw0, const LinearConfig& c) {
  const int64_t n = c.batch, in = c.in_features, out = c.out_features;
  LinearRef r{std::vector<double>(n * out), std::vector<double>(n * in), std::vector<double>(out * in),
              std::vector<double>(out, 0.0)};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = c.epilogue == LinearEpilogue::none ? 0.0 : b[o];
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w[o * in + k];
      r.y[i * out + o] = c.epilogue == LinearEpilogue::bias_relu ? std::max(s, 0.0) : s;
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0;
      for (int64_t o = 0; o < out; ++o) s += double(dy[i * out + o]) * w[o * in + k];
      r.dx[i * in + k] = s;
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      double s = dw0.empty() ? 0.0 : dw0[o * in + k];
      for (int64_t i = 0; i < n; ++i) s += double(dy[i * out + o]) * x[i * in + k];
      r.dw[o * in + k] = s;
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) r.db[o] += dy[i * out + o];
  return r;
}

double check_linear(Env& env, const LinearConfig& c, bool accumulate, double tol) {
  const int64_t n = c.batch, in = c.in_features, out = c.out_features;
  const std::vector<float> x = uniform(env, n * in, -1, 1), w = uniform(env, out * in, -1, 1),
                           b = uniform(env, out, -1, 1), dy = uniform(env, n * out, -1, 1);
  const std::vector<float> dw0 = accumulate ? uniform(env, out * in, -1, 1) : std::vector<float>{};
  LtLinear lin(env.lt.get(), c);
  DeviceArray<float> dx_in(env, x), dw_in(env, w), db_in(env, b), ddy(env, dy), dyout(env, n * out), ddx(env, n * in),
      ddw(env, out * in), ddb(env, out);
  if (accumulate) ddw.upload(dw0);
  DeviceBuffer ws = env.alloc.buffer(std::max(lin.workspace_bytes(), column_sum_workspace_bytes(n, out)), env.s());
  lin.forward(dx_in.get(), dw_in.get(), db_in.get(), dyout.get(), ws.data(), env.s());
  lin.backward_input(ddy.get(), dw_in.get(), ddx.get(), ws.data(), env.s());
  lin.backward_weight(ddy.get(), dx_in.get(), ddw.get(), accumulate, ws.data(), env.s());
  column_sum(ddy.get(), ddb.get(), n, out, ws.data(), env.s());
  // bf16_operands is defined exactly: the reference multiplies the rounded operands (the bias and
  // its gradient stay float32).
  const bool exact16 = c.math == MathMode::bf16_operands;
  LinearRef r = exact16 ? reference(round_bf16(x), round_bf16(w), b, round_bf16(dy), dw0, c)
                        : reference(x, w, b, dy, dw0, c);
  if (exact16) r.db = reference(x, w, b, dy, dw0, c).db;
  const std::string shape = detail::concat("linear (", n, ", ", in, ", ", out, ") ", math_name(c.math));
  compare(shape + " y", dyout.download(), r.y, tol);
  compare(shape + " dx", ddx.download(), r.dx, tol);
  compare(shape + (accumulate ? " dW+=" : " dW"), ddw.download(), r.dw, tol);
  compare(shape + " db", ddb.download(), r.db, 1e-5);
  return std::max({relative_error(dyout.download(), r.y), relative_error(ddx.download(), r.dx),
                   relative_error(ddw.download(), r.dw)});
}

std::string linear_math(Env& env, MathMode math, double tol) {
  double worst = 0.0;
  struct Case { int64_t n, in, out; LinearEpilogue epi; bool acc; };
  for (const Case& k : {Case{64, 96, 40, LinearEpilogue::bias, false}, Case{64, 96, 40, LinearEpilogue::none, true},
                        Case{33, 17, 5, LinearEpilogue::bias_relu, false}, Case{1, 8, 3, LinearEpilogue::bias, true},
                        Case{1024, 512, 256, LinearEpilogue::bias_relu, false}}) {
    LinearConfig c{k.n, k.in, k.out, k.epi, math};
    worst = std::max(worst, check_linear(env, c, k.acc, tol));
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "5 shapes x (y, dx, dW, db), worst rel.err %.2e (tol %.0e)", worst, tol);
  return buf;
}

// The core's matmul op: c = op(a) op(b) on row-major tensors, every transpose combination.
std::string matmul(Env& env) {
  double worst = 0.0;
  struct Case { int64_t m, k, n; };
  for (const Case& s : {Case{37, 53, 29}, Case{1, 1, 1}, Case{256, 128, 64}}) {
    for (int t = 0; t < 8; ++t) {
      const bool ta = t & 1, tb = t & 2, acc = t & 4;
      const MathMode math = t % 3 == 0 ? MathMode::bf16 : t % 3 == 1 ? MathMode::bf16_operands : MathMode::f32;
      const std::vector<float> a0 = uniform(env, s.m * s.k, -1, 1), b0 = uniform(env, s.k * s.n, -1, 1),
                               c0 = uniform(env, s.m * s.n, -1, 1);
      // The reference multiplies what the product is defined on: rounded operands for bf16_operands.
      const bool exact16 = math == MathMode::bf16_operands;
      const std::vector<float> a = exact16 ? round_bf16(a0) : a0, b = exact16 ? round_bf16(b0) : b0;
      LtMatmul mm(env.lt.get(), MatmulConfig{s.m, s.k, s.n, ta, tb, math});
      DeviceArray<float> da(env, a0), db(env, b0), dc(env, c0);
      DeviceBuffer ws = env.alloc.buffer(mm.workspace_bytes(), env.s());
      mm.run(da.get(), db.get(), dc.get(), acc, ws.data(), env.s());
      std::vector<double> ref(s.m * s.n);
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double v = acc ? c0[i * s.n + j] : 0.0;
          for (int64_t p = 0; p < s.k; ++p)
            v += double(ta ? a[p * s.m + i] : a[i * s.k + p]) * (tb ? b[j * s.k + p] : b[p * s.n + j]);
          ref[i * s.n + j] = v;
        }
      const std::vector<float> got = dc.download();
      compare(detail::concat("matmul (", s.m, ", ", s.k, ", ", s.n, ")", ta ? " a^T" : "", tb ? " b^T" : "",
                             acc ? " +=" : "", " ", math_name(math)),
              got, ref, math == MathMode::bf16 ? 1e-2 : 1e-5);
      if (math == MathMode::f32) worst = std::max(worst, relative_error(got, ref));
    }
  }
  LtMatmul empty(env.lt.get(), MatmulConfig{0, 4, 3});
  empty.run(nullptr, nullptr, nullptr, false, nullptr, env.s());
  char buf[96];
  std::snprintf(buf, sizeof(buf), "3 shapes x trans_a x trans_b x accumulate x math, f32 rel.err %.2e", worst);
  return buf;
}

std::string linear_edges(Env& env) {
  expect_throw<ValueError>("shape", [&] { LtLinear(env.lt.get(), LinearConfig{4, 0, 2}); }, "in, out >= 1");
  LtLinear lin(env.lt.get(), LinearConfig{8, 8, 4});
  DeviceBuffer buf = env.alloc.buffer(1024, env.s());
  const float* odd = reinterpret_cast<const float*>(buf.ptr<char>() + 4);
  expect_throw<ValueError>("alignment", [&] { lin.forward(odd, buf.ptr<float>(), buf.ptr<float>(), buf.ptr<float>(), nullptr, env.s()); },
                           "is not 16-byte aligned");
  LtLinear empty(env.lt.get(), LinearConfig{0, 8, 4});
  DeviceArray<float> dw(env, std::vector<float>(32, 1.0f));
  empty.backward_weight(nullptr, nullptr, dw.get(), false, nullptr, env.s());
  const std::vector<float> z = dw.download();
  expect(std::all_of(z.begin(), z.end(), [](float v) { return v == 0.0f; }), "empty batch dW not zero");
  return "bad shape, misaligned pointer, empty batch";
}

// A learnable task: the label of row i is the argmax of the fixed linear map t (cls, in) of x_i.
std::vector<int64_t> argmax_labels(const std::vector<float>& x, const std::vector<float>& t, int64_t n, int64_t in,
                                   int64_t cls) {
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    double best = -INFINITY;
    for (int64_t c = 0; c < cls; ++c) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * t[c * in + k];
      if (s > best) best = s, labels[i] = c;
    }
  }
  return labels;
}

// A 2-layer MLP classifier trained with Adam, every buffer of a step from a fresh allocator.
std::string mlp_steady_state(Env& env) {
  const int64_t n = 256, in = 64, hid = 128, cls = 10;
  CachingDeviceAllocator alloc;
  LtLinear l1(env.lt.get(), LinearConfig{n, in, hid, LinearEpilogue::bias_relu});
  LtLinear l2(env.lt.get(), LinearConfig{n, hid, cls, LinearEpilogue::bias});
  const int64_t o_w1 = 0, o_b1 = hid * in, o_w2 = o_b1 + hid, o_b2 = o_w2 + cls * hid, total = o_b2 + cls;
  std::vector<float> p0 = uniform(env, total, -0.1f, 0.1f);
  DeviceArray<float> params(env, p0), grads(env, total), m(env, total), v(env, total);
  const std::vector<float> x = uniform(env, n * in, -1, 1);
  const std::vector<int64_t> labels = argmax_labels(x, uniform(env, cls * in, -1, 1), n, in, cls);
  DeviceArray<float> dx(env, x);
  DeviceArray<int64_t> dlab(env, labels);
  DeviceArray<float> one(env, std::vector<float>{1.0f});
  float* P = params.get();
  float* G = grads.get();
  uint64_t misses_after_first = 0;
  float first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    const std::size_t ws_bytes = std::max({l1.workspace_bytes(), l2.workspace_bytes(), column_sum_workspace_bytes(n, hid),
                                           cross_entropy_workspace_bytes(n, 1)});
    DeviceBuffer h = alloc.buffer(n * hid * 4, env.s()), logits = alloc.buffer(n * cls * 4, env.s()),
                 loss = alloc.buffer(4, env.s()), dlogits = alloc.buffer(n * cls * 4, env.s()),
                 dh = alloc.buffer(n * hid * 4, env.s()), dpre = alloc.buffer(n * hid * 4, env.s()),
                 ws = alloc.buffer(ws_bytes, env.s());
    l1.forward(dx.get(), P + o_w1, P + o_b1, h.ptr<float>(), ws.data(), env.s());
    l2.forward(h.ptr<float>(), P + o_w2, P + o_b2, logits.ptr<float>(), ws.data(), env.s());
    cross_entropy_forward(logits.ptr<float>(), dlab.get(), loss.ptr<float>(), n, cls, 1, Reduction::mean, ws.data(), env.s());
    cross_entropy_backward(logits.ptr<float>(), dlab.get(), one.get(), dlogits.ptr<float>(), n, cls, 1, Reduction::mean, env.s());
    l2.backward_weight(dlogits.ptr<float>(), h.ptr<float>(), G + o_w2, false, ws.data(), env.s());
    column_sum(dlogits.ptr<float>(), G + o_b2, n, cls, ws.data(), env.s());
    l2.backward_input(dlogits.ptr<float>(), P + o_w2, dh.ptr<float>(), ws.data(), env.s());
    // relu'(z) = [y > 0]: the fused epilogue's backward masks with the output.
    activation_backward(Activation::relu, h.ptr<float>(), dh.ptr<float>(), dpre.ptr<float>(), n * hid, env.s());
    l1.backward_weight(dpre.ptr<float>(), dx.get(), G + o_w1, false, ws.data(), env.s());
    column_sum(dpre.ptr<float>(), G + o_b1, n, hid, ws.data(), env.s());
    adam_update(P, G, m.get(), v.get(), nullptr, total, adam_coefficients(1e-2, 0.9, 0.999, 1e-8, 0, step, false, false),
                env.s());
    float l = 0;
    copy_to_host(&l, loss.data(), 4, env.s());
    expect(std::isfinite(l), "loss at step ", step, " is ", l);
    if (step == 1) first = l, misses_after_first = alloc.stats().misses;
    last = l;
  }
  const AllocatorStats st = alloc.stats();
  expect(st.misses == misses_after_first, "cudaMalloc after the first step: ", st.misses, " vs ", misses_after_first);
  expect(last < 0.5f * first, "loss did not fall: ", first, " -> ", last);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "loss %.3f -> %.3f in 30 steps; %llu cudaMalloc, all in step 1; %llu hits", first, last,
                (unsigned long long)st.misses, (unsigned long long)st.hits);
  return buf;
}

}  // namespace

void add_linear_tests(std::vector<TestCase>& out) {
  out.push_back({"linear_f32", [](Env& e) { return linear_math(e, MathMode::f32, 1e-5); }});
  out.push_back({"linear_bf16", [](Env& e) { return linear_math(e, MathMode::bf16, 1e-2); }});
  out.push_back({"linear_bf16_operands", [](Env& e) { return linear_math(e, MathMode::bf16_operands, 1e-5); }});
  out.push_back({"matmul", matmul});
  out.push_back({"linear_edges", linear_edges});
  out.push_back({"mlp_steady_state", mlp_steady_state});
}

}  // namespace treadle::cuda::test

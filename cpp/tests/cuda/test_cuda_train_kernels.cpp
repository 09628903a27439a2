// Device tests of the step kernels: gradient accumulation, the non-finite count, SGD (against the
// CPU optimizer's float arithmetic, replayed on the host), the updates reading their coefficients
// from device memory (bitwise equal to the launched ones) and a CUDA graph of such an update replayed
// with the step count changing between replays.
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_graph.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/train_kernels.hpp"
#include "test_cuda_train.hpp"

namespace treadle::cuda::test {
namespace {

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// clip_grad_norm's scratch: the partial sums (256-byte rounded), then the coefficient and the norm.
std::size_t align_scratch(int64_t n) { return (clip_workspace_bytes(n) + 255) / 256 * 256 + 256; }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The two forms run the same arithmetic, so the same bits are expected; the check allows float
// rounding (a compiler contracting one form differently) and the detail says which it was.
const char* same_or_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  compare(what, got, widen(want), 1e-6);
  return bitwise_equal(got, want) ? "bitwise" : "within 1e-6 (not bitwise)";
}

std::string accumulate_and_count(Env& env) {
  const std::size_t n = (1 << 20) + 3;
  std::vector<float> dst = uniform(env, n, -1.f, 1.f), src = uniform(env, n, -1.f, 1.f);
  DeviceArray<float> ddst(env, dst), dsrc(env, src);
  add_into(ddst.get(), dsrc.get(), static_cast<int64_t>(n), env.s());
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = static_cast<double>(dst[i] + src[i]);  // one float addition
  const std::vector<float> got = ddst.download();
  expect(relative_error(got, want) == 0, "add_into differs from float addition");

  DeviceArray<NonfiniteStats> stats(env, 1);
  auto count = [&](const std::vector<float>& x) {
    DeviceArray<float> dx(env, x);
    nonfinite_stats(dx.get(), static_cast<int64_t>(x.size()), stats.get(), env.s());
    return stats.download().at(0);
  };
  NonfiniteStats clean = count(src);
  expect(clean.count == 0 && clean.first == static_cast<long long>(n), "clean: ", clean.count, " at ", clean.first);
  std::vector<float> bad = src;
  bad[n - 1] = INFINITY;
  bad[777777] = NAN;
  bad[5] = -INFINITY;
  NonfiniteStats found = count(bad);
  expect(found.count == 3 && found.first == 5, "bad: ", found.count, " at ", found.first);
  nonfinite_stats(nullptr, 0, stats.get(), env.s());
  const NonfiniteStats empty = stats.download().at(0);
  expect(empty.count == 0 && empty.first == 0, "empty: ", empty.count, " at ", empty.first);
  return "add_into exact on 2^20+3 values; nonfinite_stats: 0 / 3 (first at 5) / empty";
}

struct SgdCase {
  const char* name;
  double momentum, dampening, wd;
  bool nesterov;
};

// The CPU optimizer's element loop (optimizers_basic.cpp) in float.
void sgd_host(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& buf, const SgdCoefficients& k) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    float d = g[i];
    if (k.decay) d = d + k.wd * p[i];
    if (k.use_momentum) {
      const float bi = k.first ? d : buf[i] * k.momentum + k.keep * d;
      buf[i] = bi;
      d = k.nesterov ? d + k.momentum * bi : bi;
    }
    p[i] = p[i] - k.lr * d;
  }
}

std::string sgd(Env& env) {
  const std::size_t n = 100003;
  double worst = 0;
  for (const SgdCase& c : {SgdCase{"plain", 0, 0, 0, false}, SgdCase{"momentum+dampening", 0.9, 0.1, 0, false},
                           SgdCase{"nesterov+wd", 0.9, 0, 1e-2, true}, SgdCase{"wd", 0, 0, 1e-3, false}}) {
    std::vector<float> p = uniform(env, n, -1.f, 1.f), buf(n, 0.f);
    DeviceArray<float> dp(env, p), dbuf(env, n);
    for (int64_t t = 1; t <= 3; ++t) {
      const std::vector<float> g = uniform(env, n, -1.f, 1.f);
      DeviceArray<float> dg(env, g);
      const SgdCoefficients k = sgd_coefficients(0.05, c.momentum, c.dampening, c.wd, c.nesterov, t);
      sgd_update(dp.get(), dg.get(), k.use_momentum ? dbuf.get() : nullptr, static_cast<int64_t>(n), k, env.s());
      sgd_host(p, g, buf, k);
    }
    // Contraction into fused multiply-adds may differ from the host's: a few float ulps.
    compare(std::string("sgd ") + c.name, dp.download(), widen(p), 1e-6);
    worst = std::max(worst, relative_error(dp.download(), widen(p)));
  }
  char detail[96];
  std::snprintf(detail, sizeof(detail), "4 variants x 3 steps against host float arithmetic, rel.err %.2e", worst);
  return detail;
}

// clip_grad_norm on the device against the host's rule (optim.hpp): norm in double, the coefficient
// in float, no scaling when it is 1, NaN gradients all NaN.
std::string clip(Env& env) {
  const int64_t n = 300001;
  std::vector<float> g = uniform(env, n, -1.f, 1.f);
  DeviceArray<char> scratch(env, align_scratch(n));
  char* base = scratch.get();
  const std::size_t partial = (clip_workspace_bytes(n) + 255) / 256 * 256;
  auto* coef = reinterpret_cast<float*>(base + partial);
  auto* norm = reinterpret_cast<double*>(base + partial + 128);
  double sum = 0;
  for (float v : g) sum += static_cast<double>(v) * v;
  const double want_norm = std::sqrt(sum);
  std::string detail;
  for (double max_norm : {1.0, 1e6}) {
    DeviceArray<float> dg(env, g);
    clip_grad_norm(dg.get(), n, max_norm, base, coef, norm, env.s());
    double got_norm = 0;
    copy_to_host(&got_norm, norm, sizeof(got_norm), env.s());
    expect(std::abs(got_norm - want_norm) <= 1e-12 * want_norm, "norm ", got_norm, " vs ", want_norm);
    // From the device's norm: the same double gives the same float coefficient.
    const float c = static_cast<float>(std::min(max_norm / (got_norm + 1e-6), 1.0));
    std::vector<float> want = g;
    if (c != 1.0f)
      for (float& v : want) v = v * c;
    const std::vector<float> got = dg.download();
    expect(bitwise_equal(got, want), "clip to ", max_norm, ": gradients differ from the host's rule");
    detail += (detail.empty() ? "" : ", ") + std::string(c == 1.0f ? "unclipped" : "clipped") + " bitwise";
  }
  std::vector<float> bad = g;
  bad[12345] = NAN;
  DeviceArray<float> dbad(env, bad);
  clip_grad_norm(dbad.get(), n, 1.0, base, coef, norm, env.s());
  for (float v : dbad.download()) expect(std::isnan(v), "a NaN gradient must make every gradient NaN");
  return detail + "; norm within 1e-12; a NaN spreads to all " + std::to_string(n) + " gradients";
}

// adam_update_indirect / sgd_update_indirect (coefficients in device memory) against adam_update /
// sgd_update: the same bits after 3 steps.
std::string indirect_updates(Env& env) {
  const int64_t n = 65537;
  const std::vector<float> p0 = uniform(env, n, -1.f, 1.f);
  std::string detail = "3 steps against the launched kernels: ";
  for (bool amsgrad : {false, true}) {
    DeviceArray<float> pa(env, p0), pb(env, p0), ma(env, n), mb(env, n), va(env, n), vb(env, n), xa(env, n), xb(env, n);
    DeviceArray<AdamCoefficients> dk(env, 1);
    for (int64_t t = 1; t <= 3; ++t) {
      DeviceArray<float> g(env, uniform(env, n, -1.f, 1.f));
      const AdamCoefficients k = adam_coefficients(1e-3, 0.9, 0.999, 1e-8, 1e-2, t, !amsgrad, amsgrad);
      dk.upload({k});
      adam_update(pa.get(), g.get(), ma.get(), va.get(), xa.get(), n, k, env.s());
      adam_update_indirect(pb.get(), g.get(), mb.get(), vb.get(), xb.get(), n, k, dk.get(), env.s());
    }
    const std::string name = amsgrad ? "amsgrad" : "adamw";
    detail += name + " " + same_or_close(name + " p", pb.download(), pa.download()) + ", ";
    same_or_close(name + " m", mb.download(), ma.download());
    same_or_close(name + " v", vb.download(), va.download());
  }
  DeviceArray<float> pa(env, p0), pb(env, p0), ba(env, n), bb(env, n);
  DeviceArray<SgdCoefficients> dk(env, 1);
  for (int64_t t = 1; t <= 3; ++t) {
    DeviceArray<float> g(env, uniform(env, n, -1.f, 1.f));
    const SgdCoefficients k = sgd_coefficients(0.05, 0.9, 0, 1e-3, true, t);
    dk.upload({k});
    sgd_update(pa.get(), g.get(), ba.get(), n, k, env.s());
    sgd_update_indirect(pb.get(), g.get(), bb.get(), n, k, dk.get(), env.s());
  }
  detail += std::string("nesterov sgd ") + same_or_close("sgd p", pb.download(), pa.download());
  same_or_close("sgd buffer", bb.download(), ba.download());
  return detail;
}

// A captured graph (gradient accumulation + an update reading its coefficients from device memory)
// replayed 4 times with the coefficients rewritten between replays, against the launched kernels.
std::string graph_replay(Env& env) {
  const int64_t n = 4099;
  const std::vector<float> p0 = uniform(env, n, -1.f, 1.f), g1 = uniform(env, n, -1.f, 1.f);
  DeviceArray<float> pa(env, p0), pb(env, p0), ga(env, n), gb(env, n), src(env, g1), ma(env, n), mb(env, n),
      va(env, n), vb(env, n);
  DeviceArray<AdamCoefficients> dk(env, 1);
  AdamCoefficients shape = adam_coefficients(1e-2, 0.9, 0.999, 1e-8, 0, 1, false, false);
  GraphExec exec;
  {
    StreamCapture capture(env.s());
    add_into(gb.get(), src.get(), n, env.s());
    adam_update_indirect(pb.get(), gb.get(), mb.get(), vb.get(), nullptr, n, shape, dk.get(), env.s());
    exec = GraphExec(capture.finish("graph_replay"), "graph_replay");
  }
  for (int64_t t = 1; t <= 4; ++t) {
    const AdamCoefficients k = adam_coefficients(1e-2 / t, 0.9, 0.999, 1e-8, 0, t, false, false);
    add_into(ga.get(), src.get(), n, env.s());
    adam_update(pa.get(), ga.get(), ma.get(), va.get(), nullptr, n, k, env.s());
    dk.upload({k});  // synchronous: the previous replay is done
    exec.launch(env.s());
  }
  expect(bitwise_equal(ga.download(), gb.download()), "the replayed accumulation differs from the launched one");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  check_cuda(cudaStreamIsCapturing(env.s(), &status), "cudaStreamIsCapturing");
  expect(status == cudaStreamCaptureStatusNone, "the stream is still capturing");
  return std::string("4 replays with changing step and rate against the launched kernels: ") +
         same_or_close("graph p", pb.download(), pa.download());
}

}  // namespace

std::string train_kernel_validation() {
  expect_throw<ValueError>("add_into n<0", [] { add_into(nullptr, nullptr, -1, nullptr); },
                           "add_into: negative element count -1");
  expect_throw<ValueError>("add_into null", [] { add_into(nullptr, nullptr, 4, nullptr); },
                           "add_into: null device pointer for 4 elements");
  expect_throw<ValueError>("nonfinite null", [] { nonfinite_stats(nullptr, 3, nullptr, nullptr); },
                           "nonfinite_stats: null device pointer (3 elements)");
  expect_throw<ValueError>("sgd nesterov", [] { sgd_coefficients(0.1, 0, 0, 0, true, 1); },
                           "sgd: nesterov needs momentum > 0 and dampening 0");
  expect_throw<ValueError>("sgd step", [] { sgd_coefficients(0.1, 0.9, 0, 0, false, 0); }, "sgd: step must be >= 1");
  expect_throw<ValueError>("sgd lr", [] { sgd_coefficients(-1, 0.9, 0, 0, false, 1); }, "sgd: lr must be >= 0, got -1");
  const SgdCoefficients k = sgd_coefficients(0.1, 0.9, 0.5, 0, false, 1);
  expect(k.first && k.use_momentum && !k.decay && k.keep == 0.5f, "sgd coefficients");
  expect_throw<ValueError>("sgd momentum null", [&] { sgd_update(nullptr, nullptr, nullptr, 8, k, nullptr); },
                           "sgd_update: null device pointer for 8 elements (momentum on)");
  expect_throw<ValueError>(
      "sgd indirect null", [&] { sgd_update_indirect(nullptr, nullptr, nullptr, 8, k, nullptr, nullptr); },
      "sgd_update_indirect: null device pointer");
  const AdamCoefficients a = adam_coefficients(1e-3, 0.9, 0.999, 1e-8, 0, 1, false, true);
  expect_throw<ValueError>(
      "adam indirect null",
      [&] { adam_update_indirect(nullptr, nullptr, nullptr, nullptr, nullptr, 8, a, nullptr, nullptr); },
      "adam_update_indirect: null device pointer for 8 elements (amsgrad on)");
  expect_throw<ValueError>("clip max_norm", [] { clip_grad_norm(nullptr, 0, -1, nullptr, nullptr, nullptr, nullptr); },
                           "clip_grad_norm: max_norm must be >= 0, got -1");
  expect_throw<ValueError>("clip null", [] { clip_grad_norm(nullptr, 5, 1, nullptr, nullptr, nullptr, nullptr); },
                           "clip_grad_norm: null device pointer (5 elements)");
  expect_throw<ValueError>("capture stream 0", [] { StreamCapture c(nullptr); },
                           "StreamCapture: the legacy default stream cannot be captured");
  return "step kernels and graph capture check their arguments on the host";
}

void add_train_kernel_tests(std::vector<TestCase>& out) {
  out.push_back({"step_accumulate_count", accumulate_and_count});
  out.push_back({"step_sgd", sgd});
  out.push_back({"step_clip_grad_norm", clip});
  out.push_back({"step_indirect_updates", indirect_updates});
  out.push_back({"step_graph_replay", graph_replay});
}

}  // namespace treadle::cuda::test

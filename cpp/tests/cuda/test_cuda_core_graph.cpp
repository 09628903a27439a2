// The pieces that let a CUDA graph replay a training step with dropout and loss scaling: the
// dropout kernel reading the RNG state from device memory (bitwise the launched kernel's mask for
// each counter, across replays of one graph), the update kernels skipping on loss scaling's flag,
// and the loss-scale rule on the device agreeing with the trainer's host rule (treadle::LossScaler)
// step for step. Host checks: the rule's host form against LossScaler, the RNG slot's scoping, the
// argument checks.
#include <cfloat>
#include <cstring>
#include <random>
#include <thread>

#include "backends/cuda/cuda_graph.hpp"
#include "backends/cuda/device_rng.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "backends/cuda/loss_scale.hpp"
#include "backends/cuda/train_kernels.hpp"
#include "test_cuda_core.hpp"
#include "test_cuda_core_models.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"
#include "treadle/optim.hpp"
#include "treadle/trainer.hpp"

namespace treadle::cuda::test {
namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The indirect and launched updates run the same arithmetic; as in step_indirect_updates a compiler
// may contract the two forms differently, so 1e-6 is allowed and the detail says which it was.
bool same_or_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  compare(what, got, std::vector<double>(want.begin(), want.end()), 1e-6);
  return bitwise_equal(got, want);
}

// Option sets of the rule: torch's defaults, factors float32 cannot represent (the products must be
// rounded once from double on both sides), a scale near FLT_MAX (growth refused), interval 1.
std::vector<LossScaling> rule_cases() {
  return {LossScaling::dynamic(), LossScaling::dynamic(1000.3, 1.7, 0.3, 3),
          LossScaling::dynamic(3e38, 2.0, 0.5, 1), LossScaling::dynamic(0x1p-100, 1.1, 0.9, 2),
          LossScaling::dynamic(16777216.0, 2.0, 0.5, 4)};
}

LossScaleRule rule_of(const LossScaling& o) {
  return {o.growth_factor, o.backoff_factor, static_cast<int32_t>(o.growth_interval)};
}

// The trainer's host rule (treadle::LossScaler, internal to the library) driven through the public
// API: a one-parameter model on Eigen whose gradients are set to 1 or Inf before Trainer::update.
class HostRule {
 public:
  explicit HostRule(const LossScaling& o) {
    std::mt19937_64 rng(1);
    std::vector<NamedParameter> p = {{"w", uniform_parameter(rng, {4})}};
    model_ = std::make_shared<Model>([p](Graph& g, const std::vector<Value>& in) {
      return std::vector<Value>{ops::mul(in[0], g.add_parameter(p[0].second))};
    }, p);
    model_->set_backend("eigen");
    TrainerOptions options;
    options.loss_scaling = o;
    optim::SGDOptions sgd;
    sgd.lr = 0;
    trainer_ = std::make_unique<Trainer>(model_, loss::mse(), optim::sgd(sgd), options);
  }
  bool update(bool nonfinite) {
    const Tensor& g = model_->flat_gradients();
    for (int64_t i = 0; i < g.numel(); ++i) g.data_as<float>()[i] = nonfinite && i == 2 ? INFINITY : 1.0f;
    const int64_t skipped = trainer_->skipped_steps();
    trainer_->update();
    return trainer_->skipped_steps() == skipped;
  }
  float scale() const { return trainer_->loss_scale(); }
  int64_t growth_tracker() const { return trainer_->loss_scale_growth_tracker(); }

 private:
  std::shared_ptr<Model> model_;
  std::unique_ptr<Trainer> trainer_;
};

// A flag sequence with runs of good steps long enough to grow: 1 in 5 steps overflow.
std::vector<int32_t> flags(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> f(n);
  for (int32_t& x : f) x = rng() % 5 == 0;
  return f;
}

// ---- host checks

std::string loss_scale_rule_matches_host() {
  int64_t checked = 0, changes = 0;
  for (const LossScaling& o : rule_cases()) {
    HostRule host(o);
    float scale = static_cast<float>(o.init_scale);
    int32_t tracker = 0;
    for (int32_t f : flags(7, 400)) {
      const float before = host.scale();
      const bool want = host.update(f != 0);
      const bool got = apply_loss_scale_rule(scale, tracker, f != 0, rule_of(o));
      expect(got == want && scale == host.scale() && tracker == host.growth_tracker(), "rule (growth ",
             o.growth_factor, ", backoff ", o.backoff_factor, ", interval ", o.growth_interval, ") step ", checked,
             ": applied ", got, " scale ", scale, " tracker ", tracker, "; LossScaler ", want, " ", host.scale(), " ",
             host.growth_tracker());
      changes += host.scale() != before;
      ++checked;
    }
  }
  // DynamicLossScaler (the kernel layer's own host scaler) runs the same rule.
  LossScaleOptions lo;
  lo.init_scale = 1024.0f, lo.growth_interval = 3;
  DynamicLossScaler k(lo);
  HostRule t(LossScaling::dynamic(1024.0, 2.0, 0.5, 3));
  for (int32_t f : flags(9, 200)) {
    expect(k.update(f != 0) == t.update(f != 0) && k.scale() == t.scale() && k.good_steps() == t.growth_tracker(),
           "DynamicLossScaler vs LossScaler: ", k.scale(), " vs ", t.scale());
  }
  expect_throw<ValueError>("rule growth", [] { validate_loss_scale_rule({1.0, 0.5, 4}); },
                           "loss_scale_update: growth_factor must be > 1 and finite, got 1");
  expect_throw<ValueError>("rule backoff", [] { validate_loss_scale_rule({2.0, 0.0, 4}); },
                           "loss_scale_update: backoff_factor must be in (0, 1), got 0");
  expect_throw<ValueError>("rule interval", [] { validate_loss_scale_rule({2.0, 0.5, 0}); },
                           "loss_scale_update: growth_interval must be >= 1, got 0");
  expect_throw<ValueError>(
      "rule null", [] { loss_scale_update(nullptr, nullptr, nullptr, LossScaleRule{}, nullptr); },
      "loss_scale_update: null device pointer for the scale, the step count or the flag");
  return detail::concat(checked, " steps of ", rule_cases().size(), " option sets (", changes,
                        " scale changes) equal to LossScaler's, DynamicLossScaler too; rule checks");
}

std::string rng_slot_scoping() {
  auto* a = reinterpret_cast<cudaStream_t>(0x100);
  auto* b = reinterpret_cast<cudaStream_t>(0x200);
  const auto* s1 = reinterpret_cast<const DeviceRngState*>(0x1000);
  const auto* s2 = reinterpret_cast<const DeviceRngState*>(0x2000);
  expect(device_rng_for(a) == nullptr, "a slot without a scope");
  {
    DeviceRngScope outer(a, s1);
    expect(device_rng_for(a) == s1 && device_rng_for(b) == nullptr, "the scope names stream a only");
    const DeviceRngState* other = s1;
    std::thread([&] { other = device_rng_for(a); }).join();
    expect(other == nullptr, "another thread sees the scope");
    {
      DeviceRngScope inner(b, s2);
      expect(device_rng_for(b) == s2 && device_rng_for(a) == nullptr, "the inner scope");
    }
    expect(device_rng_for(a) == s1 && device_rng_for(b) == nullptr, "the outer scope after the inner one");
  }
  expect(device_rng_for(a) == nullptr, "a slot after the scope");
  expect_throw<ValueError>(
      "indirect null", [] { dropout_forward_indirect(nullptr, nullptr, nullptr, 4, nullptr, 0, 0.5, nullptr); },
      "dropout_forward_indirect: null device pointer for the RNG state");
  expect_throw<ValueError>(
      "indirect p", [&] { dropout_forward_indirect(nullptr, nullptr, nullptr, 0, s1, 0, 1.5, nullptr); },
      "dropout_forward_indirect: p must be in [0, 1], got 1.5");
  return "per stream and thread, nested scopes restore; dropout_forward_indirect's checks";
}

// ---- device tests

// dropout_forward_indirect captured once and replayed with counters 0..5 written between replays:
// every replay's mask and output bitwise equal to dropout_forward with that counter's key.
std::string dropout_replays(Env& env) {
  const int64_t n = 100003;
  const uint64_t seed = 77, node_stream = 5;
  const double p = 0.3;
  DeviceArray<float> x(env, uniform(env, n, -1.f, 1.f)), y(env, n), mask(env, n), y_ref(env, n), mask_ref(env, n);
  DeviceArray<DeviceRngState> rng(env, 1);
  GraphExec exec;
  {
    StreamCapture capture(env.s());
    dropout_forward_indirect(x.get(), y.get(), mask.get(), n, rng.get(), node_stream, p, env.s());
    exec = GraphExec(capture.finish("dropout_replays"), "dropout_replays");
  }
  std::vector<float> previous;
  int64_t kept = 0;
  for (uint64_t counter = 0; counter < 6; ++counter) {
    rng.upload({DeviceRngState{seed, counter}});  // synchronous: the last replay is done
    exec.launch(env.s());
    dropout_forward(x.get(), y_ref.get(), mask_ref.get(), n, dropout_key(seed, counter, node_stream), p, env.s());
    const std::vector<float> m = mask.download();
    expect(bitwise_equal(m, mask_ref.download()), "counter ", counter, ": the replayed mask differs");
    expect(bitwise_equal(y.download(), y_ref.download()), "counter ", counter, ": the replayed output differs");
    expect(m != previous, "counter ", counter, ": the same mask as the previous counter");
    previous = m;
    for (float v : m) kept += v != 0;
  }
  const double keep = static_cast<double>(kept) / (6.0 * n);
  expect(std::abs(keep - (1 - p)) < 0.01, "kept fraction ", keep, ", expected ", 1 - p);
  return detail::concat("6 replays, masks and outputs bitwise the launched kernel's, kept ", keep);
}

// The indirect updates with loss scaling's flag: 0 gives the bits of no flag, 1 writes nothing; in
// a graph replayed with the flag flipped between replays as well.
std::string update_skip_flag(Env& env) {
  const int64_t n = 40961;
  const std::vector<float> p0 = uniform(env, n, -1.f, 1.f), g0 = uniform(env, n, -1.f, 1.f);
  DeviceArray<float> g(env, g0), pa(env, p0), pb(env, p0), ma(env, n), mb(env, n), va(env, n), vb(env, n);
  DeviceArray<int32_t> flag(env, 1);
  DeviceArray<AdamCoefficients> ak(env, 1);
  const AdamCoefficients shape = adam_coefficients(1e-2, 0.9, 0.999, 1e-8, 0, 1, true, false);
  GraphExec exec;
  {
    StreamCapture capture(env.s());
    adam_update_indirect(pb.get(), g.get(), mb.get(), vb.get(), nullptr, n, shape, ak.get(), env.s(), flag.get());
    exec = GraphExec(capture.finish("update_skip_flag"), "update_skip_flag");
  }
  const int32_t pattern[] = {0, 1, 1, 0, 1, 0};
  int64_t t = 0;
  bool bitwise = true;
  for (int32_t f : pattern) {
    const std::vector<float> before = pb.download();
    flag.upload({f});
    const AdamCoefficients k = adam_coefficients(1e-2, 0.9, 0.999, 1e-8, 0, t + 1, true, false);
    ak.upload({k});
    exec.launch(env.s());
    if (f == 0) {
      adam_update(pa.get(), g.get(), ma.get(), va.get(), nullptr, n, k, env.s());
      ++t;
    }
    const std::vector<float> after = pb.download();
    expect(f ? bitwise_equal(after, before) : !bitwise_equal(after, before), "adam flag ", f, ": parameters ",
           f ? "changed" : "unchanged");
    // Against the launched updates of the unskipped steps only.
    bitwise &= same_or_close("adam p", after, pa.download());
    bitwise &= same_or_close("adam m", mb.download(), ma.download());
    bitwise &= same_or_close("adam v", vb.download(), va.download());
  }
  DeviceArray<float> sa(env, p0), sb(env, p0), ba(env, n), bb(env, n);
  DeviceArray<SgdCoefficients> sk(env, 1);
  const SgdCoefficients k = sgd_coefficients(0.05, 0.9, 0, 1e-3, true, 1);
  sk.upload({k});
  flag.upload({1});
  sgd_update_indirect(sb.get(), g.get(), bb.get(), n, k, sk.get(), env.s(), flag.get());
  expect(bitwise_equal(sb.download(), p0), "sgd with the flag set changed the parameters");
  flag.upload({0});
  sgd_update_indirect(sb.get(), g.get(), bb.get(), n, k, sk.get(), env.s(), flag.get());
  sgd_update(sa.get(), g.get(), ba.get(), n, k, env.s());
  bitwise &= same_or_close("sgd p", sb.download(), sa.download());
  bitwise &= same_or_close("sgd buffer", bb.download(), ba.download());
  return detail::concat("adam graph replays with flags 0,1,1,0,1,0: parameters and state untouched on 1, ", t,
                        " updates equal to the launched ones (", bitwise ? "bitwise" : "within 1e-6, not bitwise",
                        "); sgd skipped and applied");
}

// loss_scale_update on the device with each rule case against LossScaler over 64 flags: the same
// scale (bits) and tracker after every step.
std::string loss_scale_rule_on_device(Env& env) {
  int64_t steps = 0;
  for (const LossScaling& o : rule_cases()) {
    HostRule host(o);
    DeviceArray<float> scale(env, std::vector<float>{static_cast<float>(o.init_scale)});
    DeviceArray<int32_t> tracker(env, 1), flag(env, 1);
    for (int32_t f : flags(11, 64)) {
      flag.upload({f});
      loss_scale_update(scale.get(), tracker.get(), flag.get(), rule_of(o), env.s());
      host.update(f != 0);
      const float s = scale.download()[0];
      const int32_t c = tracker.download()[0];
      expect(s == host.scale() && c == host.growth_tracker(), "growth ", o.growth_factor, " step ", steps,
             ": device ", s, " / ", c, ", LossScaler ", host.scale(), " / ", host.growth_tracker());
      ++steps;
    }
  }
  return detail::concat(steps, " device rule steps equal to LossScaler's (", rule_cases().size(), " option sets)");
}

}  // namespace

void add_core_graph_host_tests(std::vector<TestCase>& out) {
  out.push_back({"graph_loss_scale_rule_host", [](Env&) { return loss_scale_rule_matches_host(); }});
  out.push_back({"graph_rng_slot_scoping", [](Env&) { return rng_slot_scoping(); }});
}

void add_core_graph_device_tests(std::vector<TestCase>& out) {
  out.push_back({"graph_dropout_replays", dropout_replays});
  out.push_back({"graph_update_skip_flag", update_skip_flag});
  out.push_back({"graph_loss_scale_rule_device", loss_scale_rule_on_device});
}

}  // namespace treadle::cuda::test

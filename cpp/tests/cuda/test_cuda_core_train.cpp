// Training and prediction through the C++ Trainer and Model API on backend "cuda" against the same
// training on "eigen": an MLP (Adam, AdamW with AMSGrad, SGD with Nesterov momentum) and two small
// CNNs (one with batch norm), 20 steps each, with and without CUDA graphs; no device allocation after
// step 1; anomaly mode catching a NaN input on the device; predict on the device against Eigen's;
// dropout and dynamic loss scaling in CUDA graphs against launched steps and Eigen.
// Plus the host-side errors: a "cuda" model without a device, unsupported optimizers and options.
#include <cstring>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "test_cuda_core.hpp"
#include "test_cuda_core_models.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"
#include "treadle/nn_conv.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/nn_recurrent.hpp"
#include "treadle/optim.hpp"
#include "treadle/trainer.hpp"

namespace treadle::cuda::test {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kClasses = 10;

std::shared_ptr<Parameter> weight(std::mt19937_64& rng, const Shape& shape) {
  return uniform_parameter(rng, shape);
}

using Builder = std::shared_ptr<Model> (*)(uint64_t seed);

// x (32, 24) -> linear 64 + relu -> linear 48 + tanh -> linear 10.
std::shared_ptr<Model> mlp(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NamedParameter> p = {{"fc1.weight", weight(rng, {64, 24})}, {"fc1.bias", weight(rng, {64})},
                                   {"fc2.weight", weight(rng, {48, 64})}, {"fc2.bias", weight(rng, {48})},
                                   {"fc3.weight", weight(rng, {kClasses, 48})}, {"fc3.bias", weight(rng, {kClasses})}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    Value h = ops::relu(ops::linear(in[0], w(0), w(1)));
    h = ops::tanh(ops::linear(h, w(2), w(3)));
    return std::vector<Value>{ops::linear(h, w(4), w(5))};
  };
  return std::make_shared<Model>(forward, p);
}

// The same MLP with dropout after both hidden layers (p 0.3 and 0.2): a new mask every step.
std::shared_ptr<Model> dropout_mlp(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NamedParameter> p = {{"fc1.weight", weight(rng, {64, 24})}, {"fc1.bias", weight(rng, {64})},
                                   {"fc2.weight", weight(rng, {48, 64})}, {"fc2.bias", weight(rng, {48})},
                                   {"fc3.weight", weight(rng, {kClasses, 48})}, {"fc3.bias", weight(rng, {kClasses})}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    Value h = ops::dropout(ops::relu(ops::linear(in[0], w(0), w(1))), 0.3);
    h = ops::dropout(ops::tanh(ops::linear(h, w(2), w(3))), 0.2);
    return std::vector<Value>{ops::linear(h, w(4), w(5))};
  };
  return std::make_shared<Model>(forward, p);
}

const Shape kMlpInput{32, 24}, kCnnInput{4, 3, 12, 12};

struct Batches {
  std::vector<Tensor> x, y;
};

// Four batches, cycled: labels from a fixed random linear teacher, so 20 steps learn something.
Batches batches(uint64_t seed, const Shape& x_shape, int count) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const int64_t features = shape_numel(x_shape) / x_shape[0];
  std::vector<float> teacher(static_cast<std::size_t>(kClasses * features));
  for (float& t : teacher) t = u(rng);
  Batches b;
  for (int i = 0; i < count; ++i) {
    if (i >= 4) {
      b.x.push_back(b.x[i % 4]);
      b.y.push_back(b.y[i % 4]);
      continue;
    }
    Tensor x(x_shape, DType::f32), y({x_shape[0]}, DType::i64);
    float* xs = x.data_as<float>();
    for (int64_t k = 0; k < x.numel(); ++k) xs[k] = u(rng);
    for (int64_t n = 0; n < x_shape[0]; ++n) {
      int64_t best = 0;
      double best_score = -INFINITY;
      for (int64_t c = 0; c < kClasses; ++c) {
        double score = 0;
        for (int64_t f = 0; f < features; ++f) score += teacher[c * features + f] * xs[n * features + f];
        if (score > best_score) best_score = score, best = c;
      }
      y.data_as<int64_t>()[n] = best;
    }
    b.x.push_back(x);
    b.y.push_back(y);
  }
  return b;
}

std::vector<float> floats(const Tensor& t) { return {t.data_as<float>(), t.data_as<float>() + t.numel()}; }
std::vector<double> doubles(const Tensor& t) { return {t.data_as<float>(), t.data_as<float>() + t.numel()}; }

struct OptimizerCase {
  const char* name;
  std::shared_ptr<Optimizer> (*make)();
  double clip_grad_norm = 0;  // TrainerOptions::clip_grad_norm
};

const OptimizerCase kAdam{"Adam", [] { return optim::adam({}); }};
const OptimizerCase kAdamW{"AdamW+amsgrad", [] {
  optim::AdamOptions o;
  o.lr = 2e-3;
  o.weight_decay = 1e-2;
  o.amsgrad = true;
  return optim::adamw(o);
}};
std::shared_ptr<Optimizer> nesterov() {
  optim::SGDOptions o;
  o.lr = 5e-2;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  o.nesterov = true;
  return optim::sgd(o);
}
const OptimizerCase kSgd{"SGD+nesterov", nesterov};
// SGD (not Adam, which undoes a uniform scaling) with the gradients clipped to a small norm.
const OptimizerCase kSgdClip{"SGD+clip_grad_norm 0.05", nesterov, 0.05};

struct Trained {
  std::shared_ptr<Model> model;
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
  std::vector<Tensor> optimizer_state;
  uint64_t allocations_after_first = 0;
};

// kSteps steps of `build(seed)` on `backend`; on "cuda" the trainer's device allocations must not
// change after step 1.
Trained train(Builder build, const std::string& backend, const OptimizerCase& opt, bool graph, const Batches& data) {
  Trained r;
  r.model = build(21);
  r.model->set_backend(backend);
  TrainerOptions options;
  options.cuda_graph = graph;
  options.clip_grad_norm = opt.clip_grad_norm;
  Trainer trainer(r.model, loss::cross_entropy(), opt.make(), options);
  for (int i = 0; i < kSteps; ++i) {
    r.losses.push_back(trainer.step(data.x[i], data.y[i]));
    if (backend != "cuda") continue;
    if (i == 0) r.allocations_after_first = trainer.device_allocations();
    expect(trainer.device_allocations() == r.allocations_after_first, backend, " ", opt.name, ": step ", i + 1,
           " made ", trainer.device_allocations() - r.allocations_after_first, " device allocation(s) after step 1");
  }
  r.params = r.model->state_dict();  // read back from the device
  for (auto& [name, t] : trainer.optimizer().state()) r.optimizer_state.push_back(t.clone());
  expect(trainer.steps() == kSteps, "step count ", trainer.steps());
  return r;
}

// Loss curve and final parameters of a device run against the Eigen run, norm-wise relative.
std::string compare_training(const Trained& dev, const Trained& ref, double tol) {
  std::string detail = compare("losses", std::vector<float>(dev.losses.begin(), dev.losses.end()), ref.losses, tol);
  double worst = 0;
  for (const auto& [name, t] : ref.params) {
    const Tensor& got = dev.params.at(name);
    compare(name, floats(got), doubles(t), tol);
    worst = std::max(worst, relative_error(floats(got), doubles(t)));
  }
  for (std::size_t i = 0; i < ref.optimizer_state.size(); ++i)
    compare("optimizer state " + std::to_string(i), floats(dev.optimizer_state[i]), doubles(ref.optimizer_state[i]),
            10 * tol);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "; parameters rel.err <= %.2e", worst);
  const auto mean4 = [](auto first) { return (first[0] + first[1] + first[2] + first[3]) / 4; };
  expect(mean4(ref.losses.end() - 4) < mean4(ref.losses.begin()), "the reference loss did not fall: ",
         mean4(ref.losses.begin()), " -> ", mean4(ref.losses.end() - 4), " (mean of 4 steps)");
  return detail + buf;
}

// The cuda model predicting with parameters loaded from `ref` (a host write, uploaded before the
// prediction) against `ref` itself on Eigen.
std::string predict_vs_eigen(Builder build, const Trained& ref, const Batches& data) {
  auto dev = build(99);
  dev->set_backend("cuda");
  dev->load_state_dict(ref.params);
  ref.model->set_backend("eigen");
  const Tensor got = dev->predict(data.x[0]);
  const Tensor want = ref.model->predict(data.x[0]);
  expect(got.device() == Device{}, "predict returned a tensor on ", device_name(got.device()));
  return compare("predict", floats(got), doubles(want), 1e-5);
}

std::string training_vs_eigen(Builder build, const Shape& x_shape, const std::vector<OptimizerCase>& optimizers) {
  const Batches data = batches(5, x_shape, kSteps);
  std::string detail;
  for (const OptimizerCase& opt : optimizers) {
    const Trained ref = train(build, "eigen", opt, false, data);
    const Trained dev = train(build, "cuda", opt, false, data);
    const Trained graph = train(build, "cuda", opt, true, data);
    detail += std::string(detail.empty() ? "" : "; ") + opt.name + ": " + compare_training(dev, ref, 1e-4);
    compare_training(graph, ref, 1e-4);
    const double graph_vs_launched =
        relative_error(std::vector<float>(graph.losses.begin(), graph.losses.end()), dev.losses);
    char buf[160];
    std::snprintf(buf, sizeof(buf), ", graph vs launched losses %.1e, %llu device allocation(s) in step 1",
                  graph_vs_launched, static_cast<unsigned long long>(dev.allocations_after_first));
    detail += buf;
    if (&opt == &optimizers.front()) detail += ", " + predict_vs_eigen(build, ref, data);
  }
  return detail;
}

// Dropout with CUDA graphs: each replay reads its step's RNG counter from the upload, so the graph
// trainer draws the launched trainer's masks (the reference's, bit for bit) on every step. A frozen
// counter would repeat the captured step's mask and leave Eigen's loss curve at once.
std::string dropout_graph_vs_eigen() {
  const Batches data = batches(5, kMlpInput, kSteps);
  const Trained ref = train(dropout_mlp, "eigen", kAdam, false, data);
  const Trained dev = train(dropout_mlp, "cuda", kAdam, false, data);
  const Trained graph = train(dropout_mlp, "cuda", kAdam, true, data);
  std::string detail = "launched: " + compare_training(dev, ref, 1e-4);
  detail += "; graph: " + compare_training(graph, ref, 1e-4);
  const std::vector<float> graph_losses(graph.losses.begin(), graph.losses.end());
  const double losses = relative_error(graph_losses, dev.losses);
  expect(losses <= 1e-6, "graph vs launched losses differ by ", losses, " (different dropout masks?)");
  double params = 0;
  for (const auto& [name, t] : dev.params) params = std::max(params, relative_error(floats(graph.params.at(name)), doubles(t)));
  expect(params <= 1e-6, "graph vs launched parameters differ by ", params);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "; graph vs launched: losses %.1e%s, parameters %.1e", losses,
                losses == 0 ? " (bitwise)" : "", params);
  return detail + buf;
}

// A NaN in the input: anomaly mode on the device names the first node that produced it, and the
// step changes no parameter; the same for predict with an anomaly-mode context.
std::string anomaly_on_device() {
  auto model = mlp(3);
  model->set_backend("cuda");
  // Unfused, the first node is the product itself: whether a relu epilogue keeps a NaN is cuBLASLt's
  // business, a product with a NaN operand gives NaN.
  model->set_fusion(false);
  Trainer trainer(model, loss::cross_entropy(), optim::adam({}));
  const Batches data = batches(8, kMlpInput, 2);
  trainer.step(data.x[0], data.y[0]);
  const std::map<std::string, Tensor> before = model->state_dict();
  const Tensor predicted_before = model->predict(data.x[0]);  // from the device's parameters
  Tensor bad = data.x[1].clone();
  bad.data_as<float>()[37] = NAN;
  trainer.context().set_check_numerics(true);
  const std::string m = expect_throw<ValueError>("anomaly step", [&] { trainer.step(bad, data.y[1]); },
                                                 "node 0 'linear' in module '<root>' (forward pass) produced NaN");
  expect(m.find("check_numerics: node ") == 0 && m.find("on cuda:0") != std::string::npos, "message: ", m);
  for (const auto& [name, t] : model->state_dict())
    expect(relative_error(floats(t), doubles(before.at(name))) == 0, name, " changed in the failed step");
  // Not bitwise: cuBLASLt may split a product's reduction; an update would move it by ~1e-3.
  expect(relative_error(floats(model->predict(data.x[0])), doubles(predicted_before)) <= 1e-6,
         "the device's parameters changed in the failed step");
  expect(std::isfinite(trainer.step(data.x[1], data.y[1])), "a clean step after the anomaly is not finite");
  Context ctx;
  ctx.set_check_numerics(true);
  expect_throw<ValueError>("anomaly predict", [&] { model->predict(std::vector<Tensor>{bad}, &ctx); },
                           "produced NaN");
  return m;
}

// Per-sample lengths in [1, T] (the first full), as an int64 tensor.
Tensor lengths_tensor(std::mt19937_64& rng, int64_t n, int64_t T) {
  Tensor t({n}, DType::i64);
  std::uniform_int_distribution<int64_t> d(1, T);
  for (int64_t i = 0; i < n; ++i) t.data_as<int64_t>()[i] = i == 0 ? T : d(rng);
  return t;
}

// Variable-length layers read their lengths back to the host on every call, which a CUDA graph
// cannot: with cuda_graph the first (launched) step trains as on Eigen, the second (the capture)
// raises ValueError naming the layer; without cuda_graph the same steps agree with Eigen.
std::string variable_lengths_refuse_graphs() {
  const Batches data = batches(31, kVarGruInput, 4);
  std::mt19937_64 rng(37);
  std::vector<std::array<Tensor, 2>> inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back({data.x[i], lengths_tensor(rng, kVarGruInput[0], kVarGruInput[1])});
  auto trainer_on = [](const std::string& backend, bool graph) {
    auto model = variable_length_gru(41);
    model->set_backend(backend);
    TrainerOptions options;
    options.cuda_graph = graph;
    return std::make_unique<Trainer>(model, loss::cross_entropy(), optim::adam({}), options);
  };
  auto ref = trainer_on("eigen", false), dev = trainer_on("cuda", false), graph = trainer_on("cuda", true);
  std::vector<float> dev_losses;
  std::vector<double> ref_losses;
  for (int i = 0; i < 4; ++i) {
    ref_losses.push_back(ref->step(inputs[i], data.y[i]));
    dev_losses.push_back(static_cast<float>(dev->step(inputs[i], data.y[i])));
  }
  const std::string detail = compare("launched losses", dev_losses, ref_losses, 1e-4);
  compare("graph trainer, launched first step", {static_cast<float>(graph->step(inputs[0], data.y[0]))},
          {ref_losses[0]}, 1e-4);
  const std::string m = expect_throw<ValueError>("captured step", [&] { graph->step(inputs[1], data.y[1]); },
                                                 "GRU (layer 0): variable sequence lengths (the `lengths` input)");
  expect(m.find("cuda_graph off") != std::string::npos, "message: ", m);
  return detail + "; " + m;
}

// The recurrent models of the device tests trained a few steps on Eigen (no device): the harness
// (shapes, two inputs, the lengths check's message) as the device tests use it.
std::string recurrent_models_on_eigen() {
  const Batches bi = batches(43, kBiLstmInput, 3);
  auto lstm = bidirectional_lstm(1);
  lstm->set_backend("eigen");
  Trainer t1(lstm, loss::cross_entropy(), optim::adam({}));
  for (int i = 0; i < 3; ++i) expect(std::isfinite(t1.step(bi.x[i], bi.y[i])), "bidirectional LSTM step ", i);
  const Batches var = batches(47, kVarGruInput, 2);
  std::mt19937_64 rng(5);
  auto gru = variable_length_gru(2);
  gru->set_backend("eigen");
  Trainer t2(gru, loss::cross_entropy(), optim::adam({}));
  std::array<Tensor, 2> in{var.x[0], lengths_tensor(rng, kVarGruInput[0], kVarGruInput[1])};
  expect(std::isfinite(t2.step(in, var.y[0])), "variable-length GRU step");
  in[1].data_as<int64_t>()[3] = kVarGruInput[1] + 1;
  return expect_throw<ValueError>("lengths out of range", [&] { t2.step(in, var.y[1]); },
                                  "GRU (layer 0): lengths must be in [1, 7] (the sequence length), got lengths[3] = 8");
}

// ---- host-side checks (no device needed)
// The dropout model of the device test trained on Eigen (no device): its loss falls over kSteps
// despite the masks, and a second run draws the same masks (the same losses, bit for bit).
std::string dropout_model_on_eigen() {
  const Batches data = batches(5, kMlpInput, kSteps);
  const Trained a = train(dropout_mlp, "eigen", kAdam, false, data);
  const Trained b = train(dropout_mlp, "eigen", kAdam, false, data);
  expect(a.losses == b.losses, "two Eigen runs of the dropout model differ");
  const auto mean4 = [](auto first) { return (first[0] + first[1] + first[2] + first[3]) / 4; };
  expect(mean4(a.losses.end() - 4) < mean4(a.losses.begin()), "the dropout model's loss did not fall: ",
         mean4(a.losses.begin()), " -> ", mean4(a.losses.end() - 4));
  return detail::concat("loss ", mean4(a.losses.begin()), " -> ", mean4(a.losses.end() - 4),
                        " (mean of 4 steps), repeatable");
}

std::string trainer_without_device() {
  if (device_count() > 0) return "a device is present: the device tests train on it";
  auto model = mlp(1);
  model->set_backend("cuda");
  Trainer trainer(model, loss::cross_entropy(), optim::adam({}));  // constructing needs no device
  const Batches data = batches(1, kMlpInput, 1);
  expect_throw<ValueError>("predict", [&] { model->predict(data.x[0]); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  expect_throw<ValueError>("update", [&] { trainer.update(); }, "backend 'cuda' needs a CUDA device for cuda:0");
  return expect_throw<ValueError>("step", [&] { trainer.step(data.x[0], data.y[0]); },
                                  "plan: backend 'cuda' needs a CUDA device for cuda:0");
}

// The device is the backend name's index ("cuda:3"), with or without devices here: a device beyond
// the machine's is named where it is first needed, and a malformed index at the pin.
std::string device_index_from_backend() {
  const std::string name = "cuda:" + std::to_string(device_count() + 2);
  auto model = mlp(1);
  model->set_backend(name);
  Trainer trainer(model, loss::cross_entropy(), optim::adam({}));
  const Batches data = batches(1, kMlpInput, 1);
  expect_throw<ValueError>("predict", [&] { model->predict(data.x[0]); }, "needs a CUDA device for " + name);
  expect_throw<ValueError>("step", [&] { trainer.step(data.x[0], data.y[0]); }, "needs a CUDA device for " + name);
  expect_throw<ValueError>("malformed", [&] { model->set_backend("cuda:one"); }, "a device index follows the ':'");
  expect_throw<ValueError>("cpu backend", [&] { model->set_backend("eigen:0"); }, "takes no device index");
  return "predict and step on " + name + " name it; malformed and CPU indices refused";
}

// fp16 products with dynamic loss scaling whose first steps overflow (the scaled loss gradient is
// beyond fp16's range): the device trainer, launched and as CUDA graphs (the flag skipping the
// update and the rule run on the device, the host mirroring it from the flag read back), skips the
// same steps, follows the same scales, counts the same optimizer steps and ends with the
// parameters of the Eigen run.
struct ScaledRun {
  std::vector<double> losses;
  std::vector<float> scales;
  int64_t skipped = 0, steps = 0;
  std::map<std::string, Tensor> params;
};

ScaledRun scaled_run(const std::string& backend, bool graph, const OptimizerCase& opt, const Batches& data) {
  auto model = mlp(21);
  model->set_precision("fp16");
  model->set_backend(backend);
  TrainerOptions options;
  options.cuda_graph = graph;
  options.loss_scaling = LossScaling::dynamic(16777216.0, 2.0, 0.5, 4);  // 2^24
  Trainer trainer(model, loss::cross_entropy(), opt.make(), options);
  ScaledRun r;
  for (int i = 0; i < kSteps; ++i) {
    r.losses.push_back(trainer.step(data.x[i], data.y[i]));
    r.scales.push_back(trainer.loss_scale());
  }
  r.skipped = trainer.skipped_steps();
  r.steps = trainer.steps();
  r.params = model->state_dict();
  return r;
}

std::string compare_scaled(const std::string& what, const ScaledRun& dev, const ScaledRun& ref) {
  expect(dev.skipped == ref.skipped, what, ": skipped steps ", dev.skipped, ", Eigen ", ref.skipped);
  expect(dev.steps == ref.steps && ref.steps == kSteps - ref.skipped, what, ": optimizer steps ", dev.steps,
         ", Eigen ", ref.steps, " (", kSteps, " steps, ", ref.skipped, " skipped)");
  for (int i = 0; i < kSteps; ++i)
    expect(dev.scales[i] == ref.scales[i], what, ": scale after step ", i + 1, ": ", dev.scales[i], ", Eigen ",
           ref.scales[i]);
  std::string detail =
      compare(what + " losses", std::vector<float>(dev.losses.begin(), dev.losses.end()), ref.losses, 1e-3);
  for (const auto& [name, t] : ref.params) compare(what + " " + name, floats(dev.params.at(name)), doubles(t), 1e-3);
  return detail;
}

std::string loss_scaling_vs_eigen() {
  const Batches data = batches(5, kMlpInput, kSteps);
  std::string detail;
  for (const OptimizerCase* opt : {&kAdam, &kSgd}) {
    const ScaledRun ref = scaled_run("eigen", false, *opt, data);
    expect(ref.skipped > 0 && ref.skipped < kSteps, "the reference skipped ", ref.skipped, " of ", kSteps, " steps");
    detail += std::string(detail.empty() ? "" : "; ") + opt->name + ": launched " +
              compare_scaled("launched", scaled_run("cuda", false, *opt, data), ref) + ", graph " +
              compare_scaled("graph", scaled_run("cuda", true, *opt, data), ref) + ", " +
              std::to_string(ref.skipped) + " steps skipped on all three, final scale " +
              std::to_string(ref.scales.back());
  }
  return detail;
}

// Tensor::to(cuda:0): training from device tensors is bitwise training from host tensors (the same
// bytes reach the same kernels), the copies back are exact, and predict writes a device output.
std::string tensors_on_device() {
  constexpr Device kDev{DeviceKind::cuda, 0};
  const Batches data = batches(5, kMlpInput, 6);
  auto host_model = mlp(21), dev_model = mlp(21);
  host_model->set_backend("cuda");
  dev_model->set_backend("cuda");
  Trainer host(host_model, loss::cross_entropy(), optim::adam({}));
  Trainer dev(dev_model, loss::cross_entropy(), optim::adam({}));
  for (std::size_t i = 0; i < data.x.size(); ++i) {
    const Tensor x = data.x[i].to(kDev), y = data.y[i].to(kDev);
    expect(x.device() == kDev && !y.is_cpu(), "to(cuda:0) gave a tensor on ", device_name(x.device()));
    const double a = host.step(data.x[i], data.y[i]), b = dev.step(x, y);
    expect(a == b, "step ", i + 1, ": host tensors ", a, ", device tensors ", b);
    const Tensor back = x.to(Device{});
    expect(std::memcmp(back.data(), data.x[i].data(), back.nbytes()) == 0, "the copy back differs");
  }
  const Tensor want = host_model->predict(data.x[0]);
  Tensor out = Tensor(want.shape(), want.dtype()).to(kDev);
  dev_model->predict_into({data.x[0].to(kDev)}, {out});
  const Tensor got = out.to(Device{});
  expect(std::memcmp(got.data(), want.data(), got.nbytes()) == 0, "predict into a device tensor differs");
  return std::to_string(data.x.size()) + " steps bitwise equal, copies and predict exact";
}

std::string unsupported_on_device() {
  auto model = mlp(1);
  model->set_backend("cuda");
  const std::string m = expect_throw<ValueError>(
      "rmsprop", [&] { Trainer(model, loss::cross_entropy(), optim::rmsprop({})); },
      "Trainer: optimizer RMSprop has no update on the device (backend 'cuda', cuda:0)");
  expect_throw<ValueError>("adagrad", [&] { Trainer(model, loss::cross_entropy(), optim::adagrad({})); },
                           "optimizer Adagrad has no update on the device");
  TrainerOptions verify;
  verify.verify_parameters = true;
  expect_throw<ValueError>("verify", [&] { Trainer(model, loss::cross_entropy(), optim::adam({}), verify); },
                           "verify_parameters is not implemented for backend 'cuda' on cuda:0");
  TrainerOptions graph;
  graph.cuda_graph = true;
  graph.skip_nonfinite = true;
  expect_throw<ValueError>("graph + skip", [&] { Trainer(model, loss::cross_entropy(), optim::adam({}), graph); },
                           "cuda_graph replays the optimizer in the same graph as the backward pass");
  // Loss scaling runs inside the graph (the flag skips the update on the device): accepted.
  TrainerOptions scaled_graph;
  scaled_graph.cuda_graph = true;
  scaled_graph.loss_scaling = LossScaling::dynamic();
  Trainer scaled(model, loss::cross_entropy(), optim::adam({}), scaled_graph);
  expect(scaled.loss_scale() == 65536.0f, "cuda_graph + loss scaling: scale ", scaled.loss_scale());
  // Host backends of a CUDA build keep every optimizer and option.
  model->set_backend("eigen");
  Trainer host(model, loss::cross_entropy(), optim::rmsprop({}), verify);
  const Batches data = batches(2, kMlpInput, 1);
  expect(std::isfinite(host.step(data.x[0], data.y[0])), "host step with RMSprop");
  return m;
}

}  // namespace

// test_cuda_core_graph.cpp: the pieces of a captured step (the RNG slot, the skip flag, the rule).
void add_core_graph_host_tests(std::vector<TestCase>& out);
void add_core_graph_device_tests(std::vector<TestCase>& out);

void add_core_train_host_tests(std::vector<TestCase>& out) {
  out.push_back({"core_trainer_without_device", [](Env&) { return trainer_without_device(); }});
  out.push_back({"core_device_index_from_backend", [](Env&) { return device_index_from_backend(); }});
  out.push_back({"core_trainer_unsupported", [](Env&) { return unsupported_on_device(); }});
  out.push_back({"core_recurrent_models_on_eigen", [](Env&) { return recurrent_models_on_eigen(); }});
  out.push_back({"core_dropout_model_on_eigen", [](Env&) { return dropout_model_on_eigen(); }});
  add_core_graph_host_tests(out);
}

void add_core_train_device_tests(std::vector<TestCase>& out) {
  out.push_back({"core_trainer_mlp_vs_eigen",
                 [](Env&) { return training_vs_eigen(mlp, kMlpInput, {kAdam, kAdamW, kSgd, kSgdClip}); }});
  out.push_back({"core_trainer_cnn_vs_eigen",
                 [](Env&) { return training_vs_eigen(small_cnn, kCnnInput, {kAdam}); }});
  out.push_back({"core_trainer_bn_cnn_vs_eigen",
                 [](Env&) { return training_vs_eigen(batch_norm_cnn, kCnnInput, {kAdam}); }});
  out.push_back({"core_trainer_anomaly", [](Env&) { return anomaly_on_device(); }});
  out.push_back({"core_tensors_on_device", [](Env&) { return tensors_on_device(); }});
  out.push_back({"core_trainer_loss_scaling_vs_eigen", [](Env&) { return loss_scaling_vs_eigen(); }});
  // Reversed layers, concat / slice / add, captured as CUDA graphs (full lengths: nothing read back).
  out.push_back({"core_trainer_bilstm_vs_eigen",
                 [](Env&) { return training_vs_eigen(bidirectional_lstm, kBiLstmInput, {kAdam}); }});
  out.push_back({"core_trainer_var_gru_graph_refused", [](Env&) { return variable_lengths_refuse_graphs(); }});
  out.push_back({"core_trainer_dropout_graph_vs_eigen", [](Env&) { return dropout_graph_vs_eigen(); }});
  add_core_graph_device_tests(out);
}

}  // namespace treadle::cuda::test

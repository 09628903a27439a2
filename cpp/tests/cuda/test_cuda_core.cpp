// The core's training plans on the device: an MLP and a small CNN built with the C++ API (Model
// over a traced forward), compiled for backend "cuda" and for "eigen", run on the same data,
// compared value by value (loss, logits, every parameter gradient, the input gradient). Plus the
// errors a device plan gives without a device, for an op or dtype the backend does not cover, and
// with host memory bound.
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "core/plan.hpp"
#include "treadle/profile.hpp"
#include "test_cuda_core.hpp"
#include "test_cuda_core_models.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"
#include "treadle/nn_conv.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/nn_recurrent.hpp"

namespace treadle::cuda::test {
namespace {

constexpr int64_t kBatch = 32, kFeatures = 24, kClasses = 10;
constexpr Device kCuda{DeviceKind::cuda, 0};

std::shared_ptr<Parameter> param(std::mt19937_64& rng, const Shape& shape) {
  Tensor t(shape, DType::f32);
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape.back()));
  std::uniform_real_distribution<float> d(static_cast<float>(-bound), static_cast<float>(bound));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return std::make_shared<Parameter>(t);
}

// relu fused into the first product's epilogue, tanh and sigmoid fused after theirs (the second
// one without bias), softmax and gelu and silu as nodes of their own, cross-entropy at the end.
std::shared_ptr<Model> mlp(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NamedParameter> p = {
      {"w1", param(rng, {64, kFeatures})}, {"b1", param(rng, {64})},  {"w2", param(rng, {48, 64})},
      {"b2", param(rng, {48})},            {"w3", param(rng, {32, 48})}, {"b3", param(rng, {32})},
      {"w4", param(rng, {32, 32})},        {"w5", param(rng, {16, 32})}, {"w6", param(rng, {kClasses, 16})},
      {"b6", param(rng, {kClasses})}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    Value h = ops::relu(ops::linear(in[0], w(0), w(1)));
    h = ops::tanh(ops::linear(h, w(2), w(3)));
    h = ops::gelu(ops::softmax(ops::linear(h, w(4), w(5))));
    h = ops::silu(ops::linear(h, w(6), Value()));
    h = ops::sigmoid(ops::linear(h, w(7), Value()));
    return std::vector<Value>{ops::linear(h, w(8), w(9))};
  };
  return std::make_shared<Model>(forward, p);
}

const Shape kCnnInput{4, 3, 12, 12};

// LSTM (biases) -> GRU (no bias) -> flatten -> linear on (kBatch, kSteps, kFeatures), batch_first:
// both recurrent layers run as forward/backward pairs on cuDNN, its weight and reserve spaces in
// each layer's `saved` value (cuda_backend_rnn.cpp).
constexpr int64_t kSteps = 6, kHidden = 32;
const Shape kRnnInput{kBatch, kSteps, kFeatures};

std::shared_ptr<Model> rnn_net(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t H = kHidden;
  std::vector<NamedParameter> p = {{"lstm.w_ih", param(rng, {4 * H, kFeatures})},
                                   {"lstm.w_hh", param(rng, {4 * H, H})},
                                   {"lstm.b_ih", param(rng, {4 * H})},
                                   {"lstm.b_hh", param(rng, {4 * H})},
                                   {"gru.w_ih", param(rng, {3 * H, H})},
                                   {"gru.w_hh", param(rng, {3 * H, H})},
                                   {"fc.weight", param(rng, {kClasses, kSteps * H})},
                                   {"fc.bias", param(rng, {kClasses})}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    auto zeros = [&](int64_t n) {
      const Attrs attrs{{"shape", Shape{n, kHidden}}, {"value", 0.0}, {"dtype", std::string("float32")}};
      return g.apply1("constant", {}, attrs);
    };
    const int64_t n = in[0].dim(0);
    Value h = ops::recurrent_layer("lstm", in[0], zeros(n), zeros(n), w(0), w(1), w(2), w(3), Value(), true).output;
    h = ops::recurrent_layer("gru", h, zeros(n), Value(), w(4), w(5), Value(), Value(), Value(), true).output;
    return std::vector<Value>{ops::linear(ops::flatten(h), w(6), w(7))};
  };
  return std::make_shared<Model>(forward, p);
}

PlanKey training_key(const std::string& backend, const Loss& loss, const Shape& x = {kBatch, kFeatures}) {
  PlanKey key;
  key.input_shapes = {x};
  key.input_dtypes = {DType::f32};
  key.mode = PlanMode::train_loss;
  key.input_grad = true;
  key.loss_key = loss.key();
  key.target_shape = {x[0]};
  key.target_dtype = DType::i64;
  key.backend = backend;
  return key;
}

// Per-sample lengths in [1, T], the first one full: fresh each step (cuDNN's descriptors per call).
std::vector<int64_t> random_lengths(std::mt19937_64& rng, int64_t n, int64_t T) {
  std::uniform_int_distribution<int64_t> d(1, T);
  std::vector<int64_t> l(n);
  for (int64_t& v : l) v = d(rng);
  l[0] = T;
  return l;
}

// A training key with the sequence lengths as a second (int64) input.
PlanKey key_with_lengths(const std::string& backend, const Loss& loss, const Shape& x) {
  PlanKey key = training_key(backend, loss, x);
  key.input_shapes.push_back({x[0]});
  key.input_dtypes.push_back(DType::i64);
  return key;
}

std::vector<int64_t> labels(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<int64_t> d(0, kClasses - 1);
  std::vector<int64_t> y(n);
  for (int64_t& v : y) v = d(rng);
  return y;
}

// ---- host-side checks
// Nodes of `op` in a plan, and how many of them are reversed layers / take sequence lengths.
struct OpCount {
  int nodes = 0, reversed = 0, with_lengths = 0;
};

// The op names come from describe_plan's lines ("<node> <op> [<backend>] ..."): the registry is
// internal to libtreadle.
OpCount count_op(const Plan& plan, const std::string& op) {
  OpCount c;
  std::istringstream lines(describe_plan(plan));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    int id = -1;
    std::string name;
    if (!(fields >> id >> name) || name != op) continue;
    const Node& node = plan.graph.nodes().at(id);
    ++c.nodes;
    c.reversed += node.attrs.i_or("reverse", 0) != 0;
    for (int v : node.inputs) c.with_lengths += plan.graph.info(v).dtype == DType::i64;
  }
  return c;
}

// What the two recurrent models' training plans hold (so that getting past the coverage pass on
// "cuda" means covering these): reversed layers, lengths, concat, slice, slice_backward, add.
std::string recurrent_plans_hold(const Loss& loss) {
  auto bi = bidirectional_lstm(1)->plan(training_key("eigen", loss, kBiLstmInput), &loss);
  const OpCount l = count_op(*bi, "lstm_layer"), lb = count_op(*bi, "lstm_layer_backward");
  expect(l.nodes == 4 && l.reversed == 2 && lb.nodes == 4 && lb.reversed == 2, "bidirectional LSTM: ", l.nodes,
         " layers (", l.reversed, " reversed), ", lb.nodes, " backward (", lb.reversed, " reversed)");
  expect(count_op(*bi, "concat").nodes >= 1 && count_op(*bi, "slice").nodes >= 2 && count_op(*bi, "add").nodes >= 2,
         "bidirectional LSTM: expected concat, slice and add nodes");
  auto var = variable_length_gru(1)->plan(key_with_lengths("eigen", loss, kVarGruInput), &loss);
  const OpCount g = count_op(*var, "gru_layer"), gb = count_op(*var, "gru_layer_backward");
  expect(g.nodes == 2 && g.reversed == 1 && g.with_lengths == 2 && gb.nodes == 2 && gb.with_lengths == 2,
         "variable-length GRU: ", g.nodes, " layers (", g.reversed, " reversed, ", g.with_lengths, " with lengths), ",
         gb.nodes, " backward (", gb.with_lengths, " with lengths)");
  expect(count_op(*var, "slice_backward").nodes == 2, "variable-length GRU: expected 2 slice_backward nodes");
  return "; the recurrent plans hold 4 LSTM layers (2 reversed), 2 GRU layers with lengths (1 reversed), concat, "
         "slice, slice_backward, add";
}

// Kernel coverage is checked for every node before the device is required, so reaching the
// missing-device error shows that every node of both training plans has a CUDA kernel.
std::string cuda_plan_without_device() {
  if (device_count() > 0) return "a device is present: the device tests compile cuda plans";
  Loss loss = loss::cross_entropy();
  expect_throw<ValueError>("cnn on cuda",
                           [&] { small_cnn(1)->plan(training_key("cuda", loss, kCnnInput), &loss); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  expect_throw<ValueError>("bn cnn on cuda",
                           [&] { batch_norm_cnn(1)->plan(training_key("cuda", loss, kCnnInput), &loss); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  expect_throw<ValueError>("lstm/gru on cuda", [&] { rnn_net(1)->plan(training_key("cuda", loss, kRnnInput), &loss); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  expect_throw<ValueError>("bidirectional lstm on cuda",
                           [&] { bidirectional_lstm(1)->plan(training_key("cuda", loss, kBiLstmInput), &loss); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  expect_throw<ValueError>("variable-length gru on cuda",
                           [&] { variable_length_gru(1)->plan(key_with_lengths("cuda", loss, kVarGruInput), &loss); },
                           "plan: backend 'cuda' needs a CUDA device for cuda:0");
  return expect_throw<ValueError>("mlp on cuda", [&] { mlp(1)->plan(training_key("cuda", loss), &loss); },
                                  "plan: backend 'cuda' needs a CUDA device for cuda:0") +
         recurrent_plans_hold(loss);
}

// Checked before the device is needed, so the same error with and without one.
std::string uncovered_op_fails_at_finalize() {
  std::mt19937_64 rng(2);
  PlanKey key = training_key("cuda", loss::cross_entropy());
  key.mode = PlanMode::train_seeded;
  key.loss_key.clear();
  // A float64 plain (tanh) RNN layer: the adapter takes float32 only.
  auto w_ih = std::make_shared<Parameter>(Tensor({kHidden, kFeatures}, DType::f64));
  auto w_hh = std::make_shared<Parameter>(Tensor({kHidden, kHidden}, DType::f64));
  auto h0 = std::make_shared<Parameter>(Tensor({kRnnInput[0], kHidden}, DType::f64));  // the rnn_layer is node 0
  Model rnn([&](Graph& g, const std::vector<Value>& in) {
    return std::vector<Value>{ops::recurrent_layer("rnn_tanh", in[0], g.add_parameter(h0), Value(),
                                                   g.add_parameter(w_ih), g.add_parameter(w_hh), Value(), Value(),
                                                   Value(), true)
                                  .output};
  }, {{"rnn.h0", h0}, {"rnn.w_ih", w_ih}, {"rnn.w_hh", w_hh}});
  PlanKey rnn_key = key;
  rnn_key.input_shapes = {kRnnInput};
  rnn_key.input_dtypes = {DType::f64};
  const std::string m = expect_throw<ValueError>("float64 rnn_layer on cuda", [&] { rnn.plan(rnn_key); },
                                                 "rnn_layer: no CUDA kernel for float64 on cuda:0");
  // A covered op in a dtype the backend has no kernel for.
  auto w = std::make_shared<Parameter>(Tensor({kClasses, kFeatures}, DType::f64));
  Model wide([&](Graph& g, const std::vector<Value>& in) {
    return std::vector<Value>{ops::linear(in[0], g.add_parameter(w), Value())};
  }, {{"weight", w}});
  key.input_dtypes = {DType::f64};
  expect_throw<ValueError>("float64 linear on cuda", [&] { wide.plan(key); },
                           "linear: no CUDA kernel for float64 on cuda:0");
  return m;
}

// In a CUDA build, automatic dispatch of a host plan must never pick the device backend.
std::string host_plans_stay_on_the_host() {
  Loss loss = loss::cross_entropy();
  auto model = mlp(3);
  for (const char* backend : {"", "auto"}) {
    auto plan = model->plan(training_key(backend, loss), &loss);
    const std::string text = describe_plan(*plan);
    expect(plan_device_of(*plan) == Device{}, "backend '", backend, "': plan on ", device_name(plan_device_of(*plan)));
    expect(text.find("[cuda]") == std::string::npos, "backend '", backend, "' took cuda kernels:\n", text);
  }
  return "automatic dispatch and the measured table keep host plans off the device";
}

// ---- device tests
struct Run {
  float loss = 0;
  std::vector<float> logits, dx;
  std::vector<std::vector<float>> grads;  // in Plan::param_grads order
};

std::vector<float> read_floats(const Plan& plan, Context& ctx, const Bindings& b, int value, Env* env) {
  std::vector<float> out(shape_numel(plan.graph.info(value).shape));
  const void* src = plan_value_address(plan, ctx, b, value);
  if (env) copy_to_host(out.data(), src, out.size() * sizeof(float), env->s());
  else std::memcpy(out.data(), src, out.size() * sizeof(float));
  return out;
}

Run collect(const Plan& plan, Context& ctx, const Bindings& b, Env* env) {
  Run r;
  r.loss = read_floats(plan, ctx, b, plan.loss, env).at(0);
  r.logits = read_floats(plan, ctx, b, plan.outputs.at(0), env);
  r.dx = read_floats(plan, ctx, b, plan.input_grads.at(0), env);
  for (const auto& [offset, value] : plan.param_grads) r.grads.push_back(read_floats(plan, ctx, b, value, env));
  return r;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::string compare_runs(const Run& dev, const Run& ref, double tol) {
  std::string worst = compare("loss", {dev.loss}, {static_cast<double>(ref.loss)}, tol);
  compare("logits", dev.logits, widen(ref.logits), tol);
  compare("dx", dev.dx, widen(ref.dx), tol);
  expect(dev.grads.size() == ref.grads.size(), dev.grads.size(), " gradients on the device, ", ref.grads.size(),
         " on Eigen");
  for (std::size_t k = 0; k < dev.grads.size(); ++k)
    compare("grad " + std::to_string(k), dev.grads[k], widen(ref.grads[k]), tol);
  return worst;
}

// A length of T + 1, then of 0: the device plan must raise the core's own message (the layer's
// name, the range, the offending entry), which Eigen raises as well.
template <typename RunDev, typename RunRef>
std::string lengths_out_of_range(Env& env, const Shape& x_shape, std::vector<int64_t>& len, RunDev& run_dev,
                                 RunRef& run_ref) {
  const int64_t T = x_shape[1];
  std::vector<float> x = uniform(env, static_cast<std::size_t>(shape_numel(x_shape)), -2.f, 2.f);
  std::vector<int64_t> y = labels(env.rng, x_shape[0]);
  std::string m;
  for (int64_t bad : {T + 1, int64_t{0}}) {
    len = random_lengths(env.rng, x_shape[0], T);
    len[3] = bad;
    const std::string want = detail::concat("lengths must be in [1, ", T, "] (the sequence length), got lengths[3] = ",
                                            bad);
    const std::string ref = expect_throw<ValueError>("eigen, lengths " + std::to_string(bad), [&] { run_ref(x, y); },
                                                     want);
    m = expect_throw<ValueError>("cuda, lengths " + std::to_string(bad), [&] { run_dev(x, y); }, want);
    expect(m == ref, "cuda raised '", m, "', eigen '", ref, "'");
  }
  return "out-of-range lengths: " + m;
}

// The model's training plan (loss + backward, input gradient included) on "cuda" and on "eigen",
// four steps on fresh inputs: every value compared, no device allocation after the first step, and
// host memory refused by the device plan. `tol`: norm-wise relative (float32: 1e-5; a mixed-precision
// model more, since a value within float32 noise of a rounding midpoint may round either way). With
// `lengths` (batch-first models) a second input holds random sequence lengths, and lengths out of
// range must fail on both alike.
std::string plan_vs_eigen(Env& env, Model& model, const Shape& x_shape, std::size_t num_grads, double tol = 1e-5,
                          bool lengths = false) {
  Loss loss = loss::cross_entropy();
  auto key = [&](const char* backend) {
    return lengths ? key_with_lengths(backend, loss, x_shape) : training_key(backend, loss, x_shape);
  };
  auto dev_plan = model.plan(key("cuda"), &loss);
  auto ref_plan = model.plan(key("eigen"), &loss);
  const std::string text = describe_plan(*dev_plan);
  expect(plan_device_of(*dev_plan) == kCuda, "plan on ", device_name(plan_device_of(*dev_plan)));
  expect(text.find("[eigen]") == std::string::npos, "a device plan ran a node on Eigen:\n", text);
  expect(dev_plan->param_grads.size() == num_grads, "expected ", num_grads, " parameter gradients, got ",
         dev_plan->param_grads.size());

  const Tensor& flat = model.flat_parameters();
  const int64_t n = shape_numel(x_shape), batch = x_shape[0];
  const std::size_t num_in = lengths ? 2 : 1;
  DeviceArray<float> params(env, std::vector<float>(flat.data_as<float>(), flat.data_as<float>() + flat.numel()));
  DeviceArray<float> x_dev(env, static_cast<std::size_t>(n));
  DeviceArray<int64_t> y_dev(env, static_cast<std::size_t>(batch)), len_dev(env, static_cast<std::size_t>(batch));
  void* dev_in[] = {x_dev.get(), len_dev.get()};
  void* dev_tg[] = {y_dev.get()};
  Bindings dev_b{params.get(), std::span<void* const>(dev_in, num_in), dev_tg, {}};
  dev_b.device = kCuda;
  Context dev_ctx, ref_ctx;
  dev_ctx.set_cuda_stream(env.s());  // the host lends its stream

  std::string detail;
  uint64_t mallocs_after_first = 0;
  std::vector<int64_t> len;
  auto run_dev = [&](const std::vector<float>& x, const std::vector<int64_t>& y) {
    x_dev.upload(x);
    y_dev.upload(y);
    if (lengths) len_dev.upload(len);
    run_plan(*dev_plan, dev_ctx, dev_b);
    return collect(*dev_plan, dev_ctx, dev_b, &env);
  };
  auto run_ref = [&](std::vector<float>& x, std::vector<int64_t>& y) {
    void* ref_in[] = {x.data(), len.data()};
    void* ref_tg[] = {y.data()};
    Bindings ref_b{flat.data(), std::span<void* const>(ref_in, num_in), ref_tg, {}};
    run_plan(*ref_plan, ref_ctx, ref_b);
    return collect(*ref_plan, ref_ctx, ref_b, nullptr);
  };
  for (int step = 0; step < 4; ++step) {
    std::vector<float> x = uniform(env, static_cast<std::size_t>(n), -2.f, 2.f);
    std::vector<int64_t> y = labels(env.rng, batch);
    if (lengths) len = random_lengths(env.rng, batch, x_shape[1]);
    detail = compare_runs(run_dev(x, y), run_ref(x, y), tol);
    // Plans may update state in the parameter buffer (batch-norm running statistics): both alike.
    compare("parameters after step " + std::to_string(step + 1), params.download(),
            widen(std::vector<float>(flat.data_as<float>(), flat.data_as<float>() + flat.numel())), tol);
    if (step == 0) mallocs_after_first = dev_ctx.device_allocations();
    expect(dev_ctx.device_allocations() == mallocs_after_first, "step ", step + 1, ": ", dev_ctx.device_allocations(),
           " device allocations, ", mallocs_after_first, " after step 1");
  }
  if (lengths) detail += "; " + lengths_out_of_range(env, x_shape, len, run_dev, run_ref);
  // A device plan refuses host memory instead of handing host pointers to device kernels.
  void* host_in[] = {nullptr, nullptr};
  Bindings host_b{flat.data(), std::span<void* const>(host_in, num_in), host_in, {}};
  expect_throw<ValueError>("host bindings", [&] { run_plan(*dev_plan, dev_ctx, host_b); },
                           "plan: compiled for cuda:0 but run with bindings on cpu");
  return detail + "; 4 steps, " + std::to_string(mallocs_after_first) + " device allocation(s), none after step 1";
}

}  // namespace

void add_core_host_tests(std::vector<TestCase>& out) {
  out.push_back({"core_cuda_plan_without_device", [](Env&) { return cuda_plan_without_device(); }});
  out.push_back({"core_uncovered_op_fails", [](Env&) { return uncovered_op_fails_at_finalize(); }});
  out.push_back({"core_host_plans_stay_on_host", [](Env&) { return host_plans_stay_on_the_host(); }});
}

namespace {

// Per-node device times of a profiled device plan: CUDA events, one entry per non-view node with
// one call per run, backend "cuda", all positive, together no more than the runs took on the host
// clock (which waited for the device).
std::string profile_device_plan(Env& env) {
  Loss loss = loss::cross_entropy();
  auto model = mlp(7);
  auto plan = model->plan(training_key("cuda", loss, {kBatch, kFeatures}), &loss);
  const Tensor& flat = model->flat_parameters();
  DeviceArray<float> params(env, std::vector<float>(flat.data_as<float>(), flat.data_as<float>() + flat.numel()));
  DeviceArray<float> x_dev(env, uniform(env, static_cast<std::size_t>(kBatch * kFeatures), -2.f, 2.f));
  DeviceArray<int64_t> y_dev(env, labels(env.rng, kBatch));
  void* dev_in[] = {x_dev.get()};
  void* dev_tg[] = {y_dev.get()};
  Bindings b{params.get(), dev_in, dev_tg, {}};
  b.device = kCuda;
  Context ctx;
  ctx.set_cuda_stream(env.s());
  run_plan(*plan, ctx, b);  // warm-up: library handles, the arena
  check_cuda(cudaStreamSynchronize(env.s()), "cudaStreamSynchronize");
  Profiler profiler;
  ctx.set_profiler(&profiler);
  constexpr int kRuns = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kRuns; ++r) run_plan(*plan, ctx, b);
  check_cuda(cudaStreamSynchronize(env.s()), "cudaStreamSynchronize");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ctx.set_profiler(nullptr);
  const std::vector<NodeProfile> nodes = profiler.nodes();
  const std::string text = describe_plan(*plan);
  std::size_t kernels = 0;
  for (std::size_t at = text.find("[cuda]"); at != std::string::npos; at = text.find("[cuda]", at + 1)) ++kernels;
  expect(nodes.size() == kernels, nodes.size(), " profiled nodes, ", kernels, " device kernels in the plan");
  for (const NodeProfile& n : nodes) {
    expect(n.calls == kRuns && n.backend == "cuda", n.op, ": ", n.calls, " calls on '", n.backend, "'");
    expect(n.seconds > 0, n.op, ": device time ", n.seconds, " s");
  }
  expect(profiler.total_seconds() <= wall * 1.02 + 1e-4, "device time ", profiler.total_seconds(),
         " s exceeds the host's ", wall, " s");
  return std::to_string(nodes.size()) + " nodes, device " + std::to_string(profiler.total_seconds() * 1e6 / kRuns) +
         " us per run, host " + std::to_string(wall * 1e6 / kRuns) + " us";
}

// Mixed precision on the device against Eigen's definition (operands rounded, float32 sums).
std::string precision_plan_vs_eigen(Env& env, std::shared_ptr<Model> model, const char* precision,
                                    const Shape& x_shape, std::size_t num_grads) {
  model->set_precision(precision);
  return plan_vs_eigen(env, *model, x_shape, num_grads, std::string(precision) == "bf16" ? 5e-3 : 1e-3);
}

}  // namespace

void add_core_device_tests(std::vector<TestCase>& out) {
  out.push_back({"core_profile_device_plan", profile_device_plan});
  for (const char* p : {"bf16", "fp16"}) {
    out.push_back({std::string("core_mlp_plan_") + p + "_vs_eigen",
                   [p](Env& env) { return precision_plan_vs_eigen(env, mlp(7), p, {kBatch, kFeatures}, 10); }});
    out.push_back({std::string("core_cnn_plan_") + p + "_vs_eigen",
                   [p](Env& env) { return precision_plan_vs_eigen(env, small_cnn(11), p, kCnnInput, 5); }});
  }
  out.push_back({"core_mlp_plan_vs_eigen",
                 [](Env& env) { return plan_vs_eigen(env, *mlp(7), {kBatch, kFeatures}, 10); }});
  out.push_back({"core_cnn_plan_vs_eigen", [](Env& env) { return plan_vs_eigen(env, *small_cnn(11), kCnnInput, 5); }});
  out.push_back({"core_bn_cnn_plan_vs_eigen",
                 [](Env& env) { return plan_vs_eigen(env, *batch_norm_cnn(13), kCnnInput, 5); }});
  out.push_back({"core_rnn_plan_vs_eigen", [](Env& env) { return plan_vs_eigen(env, *rnn_net(17), kRnnInput, 8); }});
  // 2 layers x 2 directions x 4 tensors, + linear: reversed layers, concat / slice / add on the device.
  out.push_back({"core_bilstm_plan_vs_eigen",
                 [](Env& env) { return plan_vs_eigen(env, *bidirectional_lstm(19), kBiLstmInput, 18); }});
  // 2 directions x 4 tensors, + linear; fresh random lengths every step, then lengths out of range.
  out.push_back({"core_var_gru_plan_vs_eigen",
                 [](Env& env) { return plan_vs_eigen(env, *variable_length_gru(23), kVarGruInput, 10, 1e-5, true); }});
}

}  // namespace treadle::cuda::test

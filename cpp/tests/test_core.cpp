// The C++ API as a host uses it: build a Sequential MLP, train it with treadle::Trainer, run inference
// on a host executor that chunks work differently from the serial one, and get typed errors for bad
// input. A plain executable: prints one line per check and exits non-zero if any check failed.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <new>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "treadle/executors/work_team.hpp"
#include "treadle/treadle.hpp"

// Every operator new in the process (the library's included) is counted, so a test can prove that
// steady-state steps allocate nothing. oneDNN 3.2's execute builds an argument map (a hash map) on
// every call, a few small allocations inside the library that its C API gives no way to avoid: they
// are counted apart (the wrapper below stands in front of the library's symbol), so the checks hold
// treadle itself to zero and oneDNN to the same count on every step.
namespace {
std::size_t g_allocations = 0;         // by treadle and everything outside oneDNN's execute
std::size_t g_onednn_allocations = 0;  // inside dnnl_primitive_execute
thread_local int g_inside_onednn = 0;
}  // namespace

extern "C" __attribute__((visibility("default"))) int dnnl_primitive_execute(const void* primitive, void* stream, int nargs, const void* args) {
  using Execute = int (*)(const void*, void*, int, const void*);
  static const auto real = reinterpret_cast<Execute>(dlsym(RTLD_NEXT, "dnnl_primitive_execute"));
  ++g_inside_onednn;
  const int status = real(primitive, stream, nargs, args);
  --g_inside_onednn;
  return status;
}

void* operator new(std::size_t n) {
  ++(g_inside_onednn ? g_onednn_allocations : g_allocations);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

// Allocations made by `repeats` runs of `body`: `own` counts those outside oneDNN's execute (held to
// zero), `onednn_per_run` those inside it on the first run, and `onednn_steady` says every run made
// that many (a fixed argument map per execution, never a growing cache).
struct Allocations {
  std::size_t own = 0, onednn_per_run = 0;
  bool onednn_steady = true;
  bool none() const { return own == 0 && onednn_steady; }
  std::string str() const {
    std::string s = std::to_string(own);
    if (onednn_per_run) s += "; oneDNN's execute: " + std::to_string(onednn_per_run) + " per run";
    return onednn_steady ? s : s + ", not the same on every run";
  }
};

Allocations count_allocations(int repeats, const std::function<void()>& body) {
  Allocations a;
  for (int i = 0; i < repeats; ++i) {
    const std::size_t own = g_allocations, onednn = g_onednn_allocations;
    body();
    a.own += g_allocations - own;
    const std::size_t by_onednn = g_onednn_allocations - onednn;
    if (i == 0) a.onednn_per_run = by_onednn;
    a.onednn_steady = a.onednn_steady && by_onednn == a.onednn_per_run;
  }
  return a;
}

// A host executor that splits [0, n) into up to `chunks` pieces and runs them serially in reverse
// order: a stand-in for a worker team whose chunks finish in any order.
class ReverseChunkExecutor final : public treadle::Executor {
 public:
  explicit ReverseChunkExecutor(int chunks) : chunks_(chunks) {}
  int num_workers() const override { return chunks_; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    ++calls_;
    const int64_t pieces = std::min<int64_t>(n, chunks_);
    const int64_t size = (n + pieces - 1) / pieces;
    for (int64_t start = (n - 1) / size * size; start >= 0; start -= size) {
      body(start, std::min(n, start + size));
      ++chunks_run_;
    }
  }
  int calls() const { return calls_; }
  int chunks_run() const { return chunks_run_; }

 private:
  int chunks_;
  int calls_ = 0, chunks_run_ = 0;
};

std::shared_ptr<treadle::Model> make_mlp(uint64_t seed, int64_t width = 64) {
  using namespace treadle;
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(8, width));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(width, width));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(width, 1));
  return std::make_shared<Model>(net);
}

// x ~ U(-1, 1)^(n x 8), y = sin(2 x0) + x1 x2: a smooth target an MLP fits quickly.
void make_data(int64_t n, treadle::Tensor& x, treadle::Tensor& y, uint32_t seed) {
  x = treadle::Tensor({n, 8}, treadle::DType::f32);
  y = treadle::Tensor({n, 1}, treadle::DType::f32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* px = x.data_as<float>();
  for (int64_t i = 0; i < n * 8; ++i) px[i] = u(gen);
  for (int64_t i = 0; i < n; ++i) y.data_as<float>()[i] = std::sin(2 * px[i * 8]) + px[i * 8 + 1] * px[i * 8 + 2];
}

bool bitwise_equal(const treadle::Tensor& a, const treadle::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void test_training_reduces_the_loss() {
  using namespace treadle;
  auto model = make_mlp(1);
  optim::AdamOptions adam;
  adam.lr = 1e-2;
  Trainer trainer(model, loss::mse(), optim::adam(adam));
  Tensor x, y;
  make_data(256, x, y, 7);
  const double first = trainer.step(x, y);
  double last = first;
  for (int i = 0; i < 199; ++i) last = trainer.step(x, y);
  check(std::isfinite(first) && std::isfinite(last), "training losses are finite");
  check(last < 0.2 * first, "200 Adam steps reduce the MSE at least 5x (" + std::to_string(first) + " -> " +
                                std::to_string(last) + ")");
  check(trainer.steps() == 200, "the optimizer counted 200 steps");
  check(std::fabs(trainer.evaluate(x, y) - last) < 0.5 * last + 1e-6, "evaluate agrees with the last step's loss");
}

// What a device trainer asks an optimizer instead of its name: the update rule (family, decoupled
// weight decay, options), present for SGD, Adam and AdamW only, in every build.
void test_update_rules() {
  using namespace treadle;
  using Family = Optimizer::UpdateRule::Family;
  optim::SGDOptions sgd;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  const auto s = optim::sgd(sgd)->update_rule();
  check(s && s->family == Family::sgd && !s->decoupled_weight_decay && s->options.size() == 4 &&
            s->options[0] == std::make_pair(std::string("momentum"), 0.9) && s->options[3].second == 1.0,
        "SGD reports its rule: momentum 0.9, nesterov as 1");
  optim::AdamOptions adam;
  adam.amsgrad = true;
  adam.weight_decay = 0.01;
  const auto a = optim::adam(adam)->update_rule(), w = optim::adamw(adam)->update_rule();
  check(a && a->family == Family::adam && !a->decoupled_weight_decay && a->options.back().second == 1.0,
        "Adam reports its rule, coupled decay, amsgrad as 1");
  check(w && w->family == Family::adam && w->decoupled_weight_decay && w->options[3].second == 0.01,
        "AdamW reports the Adam rule with decoupled decay 0.01");
  check(!optim::rmsprop({})->update_rule(), "RMSprop has no device rule");
}

void test_chunked_executor_predict_is_bitwise_serial() {
  using namespace treadle;
  // Shapes where the kernels split rows over the executor: activations of 64k elements and more,
  // and GEMMs whose chunks are not multiples of Eigen's register panels.
  const std::pair<int64_t, int64_t> shapes[] = {{1024, 64}, {2000, 200}, {300, 700}};
  for (const auto& [batch, width] : shapes) {
    const std::string what = " (batch " + std::to_string(batch) + ", width " + std::to_string(width) + ")";
    auto model = make_mlp(2, width);
    Tensor x, y;
    make_data(batch, x, y, 11);
    Tensor serial = model->predict(x);
    ReverseChunkExecutor exec(5);
    Context ctx(&exec);
    Tensor chunked = model->predict(x, &ctx);
    check(exec.calls() > 0 && exec.chunks_run() > exec.calls(),
          "predict split work over the host executor" + what + ": " + std::to_string(exec.calls()) + " calls, " +
              std::to_string(exec.chunks_run()) + " chunks");
    check(bitwise_equal(serial, chunked), "predict on a reverse-chunking executor is bitwise the serial result" + what);
    Tensor again = model->predict(x, &ctx);
    check(bitwise_equal(chunked, again), "a second run on the same context is bitwise the same" + what);
  }
}

void test_chunked_executor_training_is_bitwise_serial() {
  using namespace treadle;
  auto a = make_mlp(3), b = make_mlp(3);
  check(bitwise_equal(a->flat_parameters(), b->flat_parameters()), "manual_seed reproduces the initial weights");
  ReverseChunkExecutor exec(3);
  Trainer serial(a, loss::mse(), optim::adam({}));
  Trainer chunked(b, loss::mse(), optim::adam({}), TrainerOptions{}, &exec);
  Tensor x, y;
  make_data(512, x, y, 13);
  bool same_losses = true;
  for (int i = 0; i < 20; ++i) same_losses = same_losses && serial.step(x, y) == chunked.step(x, y);
  check(exec.calls() > 0, "training used the host executor");
  check(same_losses, "20 training steps give bitwise the same losses on both executors");
  check(bitwise_equal(a->flat_parameters(), b->flat_parameters()), "and bitwise the same weights");
}

// Checks that f() throws E (or a subclass) whose message contains `words`.
template <typename E, typename F>
void expect_throw(F&& f, const std::string& words, const std::string& what) {
  std::string outcome = "no exception";
  bool ok = false;
  try {
    f();
  } catch (const E& e) {
    outcome = e.what();
    ok = outcome.find(words) != std::string::npos;
  } catch (const std::exception& e) {
    outcome = std::string("wrong exception type: ") + e.what();
  }
  check(ok, what + " [" + outcome + "]");
}

void test_steps_allocate_nothing() {
  using namespace treadle;
  auto model = make_mlp(5);
  optim::AdamOptions adam;
  adam.lr = 1e-3;
  Trainer trainer(model, loss::mse(), optim::adam(adam));
  Tensor x, y;
  make_data(64, x, y, 3);
  std::vector<Tensor> inputs{x};
  auto shapes = model->output_shapes(inputs);
  std::vector<Tensor> outputs{Tensor(shapes[0].first, shapes[0].second)};
  Context ctx;
  for (int i = 0; i < 3; ++i) {  // first calls compile the plans and grow the arenas
    trainer.step(x, y);
    model->predict_into(inputs, outputs, &ctx);
  }
  const Allocations by_steps = count_allocations(50, [&] { trainer.step(x, y); });
  check(by_steps.none(), "50 training steps after warm-up allocate nothing (" + by_steps.str() + ")");
  StepOutputs step_out;
  trainer.step(std::span<const Tensor>(inputs), y, &step_out);  // sizes the output tensors once
  const Allocations by_outputs =
      count_allocations(20, [&] { trainer.step(std::span<const Tensor>(inputs), y, &step_out); });
  check(by_outputs.none(),
        "20 steps that return their outputs into reused tensors allocate nothing (" + by_outputs.str() + ")");
  check(step_out.outputs.size() == 1 && step_out.outputs[0].shape() == shapes[0].first,
        "a step returns the model's output");
  const Allocations by_predict = count_allocations(50, [&] { model->predict_into(inputs, outputs, &ctx); });
  check(by_predict.none(), "50 predict_into calls on a host context allocate nothing (" + by_predict.str() + ")");
  Tensor g(shapes[0].first, shapes[0].second);
  trainer.forward(x);
  trainer.backward(g);
  const Allocations by_phases = count_allocations(20, [&] {
    trainer.zero_grad();
    Tensor out = trainer.forward(x);  // the returned output is the one allocation of this phase
    trainer.backward(g);
    trainer.update();
  });
  // A returned Tensor costs 3 allocations (storage, shape, strides); nothing else may allocate.
  check(by_phases.own <= 20 * 3 && by_phases.onednn_steady,
        "host-driven phases allocate only the returned outputs (" + by_phases.str() + " in 20 steps)");
}

// A model whose forward and backward broadcast a column over rows (mul with a (N, 1) operand and
// its sum_to gradient): the general broadcast kernels must not allocate either.
void test_broadcast_steps_allocate_nothing() {
  using namespace treadle;
  manual_seed(6);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(8, 16)).add(std::make_shared<nn::Activation>("tanh"));
  auto forward = [net](Graph&, const std::vector<Value>& in) -> std::vector<Value> {
    Value h = net->forward(in[0]);
    Value gate = ops::sigmoid(ops::slice(h, 1, 0, 1));  // (N, 1), broadcast over the 16 columns
    return {ops::mul(h, gate)};
  };
  auto model = std::make_shared<Model>(forward, net->named_parameters());
  Trainer trainer(model, loss::mse(), optim::adam({}));
  Tensor x, y1;
  make_data(32, x, y1, 4);
  Tensor y({32, 16}, DType::f32);
  for (int64_t i = 0; i < y.numel(); ++i) y.data_as<float>()[i] = 0.01f * static_cast<float>(i % 13);
  for (int i = 0; i < 3; ++i) trainer.step(x, y);
  double loss = 0;
  const Allocations allocations = count_allocations(30, [&] { loss = trainer.step(x, y); });
  check(allocations.none() && std::isfinite(loss),
        "30 steps of a model with row/column broadcasting allocate nothing (" + allocations.str() + ")");
}

// A model whose forward and backward hold chains of elementwise steps over 32768 elements: they
// run block by block as elementwise runs (core/plan_elementwise.cpp), which must not allocate either.
void test_elementwise_run_steps_allocate_nothing() {
  using namespace treadle;
  manual_seed(7);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(8, 64)).add(std::make_shared<nn::Activation>("tanh"));
  auto forward = [net](Graph&, const std::vector<Value>& in) -> std::vector<Value> {
    Value h = net->forward(in[0]);
    return {ops::scale(ops::add(ops::mul(h, h), h), 0.5)};
  };
  auto model = std::make_shared<Model>(forward, net->named_parameters());
  Trainer trainer(model, loss::mse(), optim::adam({}));
  Tensor x, y1;
  make_data(512, x, y1, 5);
  Tensor y({512, 64}, DType::f32);
  for (int64_t i = 0; i < y.numel(); ++i) y.data_as<float>()[i] = 0.01f * static_cast<float>(i % 17);
  for (int i = 0; i < 3; ++i) trainer.step(x, y);
  check(model->describe_plans().find(" run=") != std::string::npos, "the plan holds elementwise runs");
  double loss = 0;
  const Allocations allocations = count_allocations(30, [&] { loss = trainer.step(x, y); });
  check(allocations.none() && std::isfinite(loss),
        "30 steps of a model with elementwise runs allocate nothing (" + allocations.str() + ")");
}

void test_bad_input_throws_typed_errors() {
  using namespace treadle;
  auto model = make_mlp(4);
  Trainer trainer(model, loss::mse(), optim::sgd({}));
  Tensor before = model->flat_parameters().clone();
  Tensor wrong({4, 7}, DType::f32), x({4, 8}, DType::f32), y_bad({4, 2}, DType::f32), y_f64({4, 1}, DType::f64);
  expect_throw<ValueError>([&] { model->predict(wrong); }, "(4, 7)",
                           "predict with 7 features throws treadle::ValueError naming the shape");
  expect_throw<ValueError>([&] { trainer.step(x, y_bad); }, "(4, 2)",
                           "a target of the wrong shape throws treadle::ValueError");
  expect_throw<TypeError>([&] { trainer.step(x, y_f64); }, "float64",
                          "a float64 target for a float32 model throws treadle::TypeError");
  expect_throw<ValueError>([&] { trainer.backward(Tensor({4, 1}, DType::f32)); }, "forward",
                           "backward before forward throws treadle::ValueError");
  expect_throw<ValueError>([&] { nn::Linear(0, 3); }, "positive", "Linear(0, 3) throws treadle::ValueError");
  expect_throw<std::invalid_argument>([&] { model->predict(wrong); }, "linear",
                                      "treadle::ValueError is a std::invalid_argument");
  check(bitwise_equal(before, model->flat_parameters()) && trainer.steps() == 0,
        "failed calls change neither the weights nor the step count");
  Tensor ok_y({4, 1}, DType::f32);
  check(std::isfinite(trainer.step(x, ok_y)) && trainer.steps() == 1, "the trainer still works afterwards");
}

// Device tensors on the host side: a tensor viewing device memory is refused by everything that
// reads data on the host, a CPU model refuses it as an input, and Tensor::to(cpu) of a host tensor is
// the tensor itself. (Copies to a device need a CUDA build and a GPU: cpp/tests/cuda.)
void test_device_tensors_on_the_host() {
  using namespace treadle;
  const Device cuda0{DeviceKind::cuda, 0};
  static float fake[4];  // never read: every call below must refuse before touching it
  Tensor dev = Tensor::wrap_device(fake, {1, 4}, DType::f32, cuda0);
  check(!dev.is_cpu() && dev.device() == cuda0 && dev.reshape({4}).device() == cuda0,
        "wrap_device keeps its device, through reshape too");
  expect_throw<TypeError>([&] { dev.clone(); }, "expected a cpu tensor, got cuda:0", "clone of a device tensor");
  expect_throw<TypeError>([&] { dev.to(DType::f64); }, "cuda:0", "dtype conversion of a device tensor");
  Tensor host({1, 4}, DType::f32);
  expect_throw<TypeError>([&] { host.copy_from(dev); }, "cuda:0", "copy_from a device tensor");
  check(host.to(Device{}).data() == host.data(), "to(cpu) of a host tensor is the tensor itself");
  auto model = make_mlp(4);
  Trainer trainer(model, loss::mse(), optim::sgd({}));
  Tensor x({1, 8}, DType::f32), y({1, 1}, DType::f32);
  Tensor x_dev = Tensor::wrap_device(fake, {1, 8}, DType::f32, cuda0);
  expect_throw<TypeError>([&] { trainer.step(x_dev, y); }, "on cuda:0 but the model runs on the CPU",
                          "a CPU model refuses a device input");
  expect_throw<TypeError>([&] { model->predict(x_dev); }, "cuda:0", "predict on a CPU model refuses a device input");
#ifndef TREADLE_WITH_CUDA
  expect_throw<ValueError>([&] { host.to(cuda0); }, "needs a build with CUDA", "to(cuda) without CUDA support");
#endif
}

// The opt-in guards of docs/hardening.md through the C++ API: anomaly mode on the trainer's context,
// skip-step on non-finite, the parameter checksum guard and the memory budget.
void test_hardening_guards() {
  using namespace treadle;
  Tensor x, y;
  make_data(16, x, y, 11);
  {
    auto model = make_mlp(5);
    Trainer trainer(model, loss::mse(), optim::sgd({}));
    trainer.context().set_check_numerics(true);
    // NaN rather than Inf: the layer's tanh is fused into it (ops/fusion.hpp), and an Inf
    // pre-activation that tanh saturates to +-1 never appears in a node's output.
    model->flat_parameters().data_as<float>()[model->layout()[2].offset] = NAN;  // "2.weight"[0, 0]
    Tensor before = model->flat_parameters().clone();
    expect_throw<ValueError>([&] { trainer.step(x, y); }, "in module '2' (forward pass) produced",
                             "anomaly mode names the module and pass of the first non-finite node");
    check(bitwise_equal(before, model->flat_parameters()) && trainer.steps() == 0, "and changes nothing");
  }
  {
    TrainerOptions o;
    o.skip_nonfinite = true;
    auto model = make_mlp(6);
    Trainer trainer(model, loss::mse(), optim::adam({}), o);
    trainer.step(x, y);
    Tensor before = model->flat_parameters().clone(), y_nan = y.clone();
    y_nan.data_as<float>()[3] = NAN;
    check(std::isnan(trainer.step(x, y_nan)) && trainer.skipped_steps() == 1 && trainer.steps() == 1 &&
              bitwise_equal(before, model->flat_parameters()),
          "skip_nonfinite skips a NaN loss and leaves the weights");
  }
  {
    TrainerOptions o;
    o.verify_parameters = true;
    auto model = make_mlp(7);
    Trainer trainer(model, loss::mse(), optim::sgd({}), o);
    trainer.step(x, y);
    auto* bits = static_cast<unsigned char*>(model->flat_parameters().data());
    bits[model->layout()[1].offset * 4 + 2] ^= 0x10;  // one bit of "0.bias"
    expect_throw<std::runtime_error>([&] { trainer.step(x, y); }, "mismatch in '0.bias'",
                                     "verify_parameters names the corrupted tensor");
    trainer.reseal_parameters();
    check(std::isfinite(trainer.step(x, y)), "reseal_parameters accepts a deliberate write");
  }
  {
    auto model = make_mlp(8);
    Trainer probe(model, loss::mse(), optim::adam({}));
    MemoryReport r = probe.memory_report({512, 8}, DType::f32, {512, 1}, DType::f32);
    check(r.parameters == model->flat_parameters().nbytes() && r.optimizer_state == 2 * r.parameters &&
              r.activations > 0,
          "memory_report counts parameters, Adam's two moments and the activation arena");
    TrainerOptions o;
    o.memory_budget = r.total() - 1;
    Trainer trainer(model, loss::mse(), optim::adam({}), o);
    Tensor xb, yb;
    make_data(512, xb, yb, 3);
    expect_throw<ValueError>([&] { trainer.step(xb, yb); }, "over the memory_budget",
                             "a plan over the memory budget is refused before it runs");
    check(std::isfinite(trainer.step(x, y)), "a smaller batch still fits");
  }
}

// A training step run as tasks, always picking the last ready task (an order unlike the plan's),
// equals Trainer::step bitwise, and after warm-up the tasked steps allocate nothing either.
void test_tasked_steps() {
  using namespace treadle;
  auto ref_model = make_mlp(5), model = make_mlp(5);
  Trainer ref(ref_model, loss::mse(), optim::adam({}));
  Trainer tasked(model, loss::mse(), optim::adam({}));
  Tensor x, y;
  make_data(48, x, y, 3);
  auto run_tasks = [&] {
    const std::vector<StepTask>& tasks = tasked.begin_step(x, y);
    std::array<char, 64> done{};  // not a vector: the count below must see only the library's allocations
    for (std::size_t left = tasks.size(); left > 0; --left) {
      for (std::size_t k = tasks.size(); k-- > 0;) {
        bool ready = !done[k];
        for (int d : tasks[k].deps) ready = ready && done[d];
        if (ready) {
          tasked.run_task(static_cast<int>(k));
          done[k] = 1;
          break;
        }
      }
    }
    return tasked.finish_step();
  };
  bool same = true;
  for (int i = 0; i < 5; ++i) same = same && ref.step(x, y) == run_tasks();
  check(same && bitwise_equal(ref_model->flat_parameters(), model->flat_parameters()),
        "tasks in last-ready-first order equal Trainer::step bitwise over 5 steps");
  const Allocations allocations = count_allocations(20, [&] { run_tasks(); });
  check(allocations.none(), "20 tasked steps after warm-up allocate nothing (" + allocations.str() + ")");
  bool threw = false;
  try {
    tasked.finish_step();
  } catch (const ValueError&) {
    threw = true;
  }
  check(threw, "finish_step without begin_step throws ValueError");
}


// A physics-informed network from C++: -u'' = pi^2 sin(pi x) on [0, 1] with u(0) = u(1) = 0 (solution
// sin(pi x)), the residual built with ops::grad inside a custom loss that reads the model's input.
// Training reaches the solution, and steps with second derivatives allocate nothing either.
void test_pinn_poisson() {
  using namespace treadle;
  const int64_t interior = 62, n = interior + 2;
  const double pi = 3.141592653589793;
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(1, 32));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(32, 32));
  net->add(std::make_shared<nn::Activation>("tanh"));
  net->add(std::make_shared<nn::Linear>(32, 1));
  auto model = std::make_shared<Model>(net);
  // target[:, 0]: the source term f inside, the boundary value on the two ends; target[:, 1]: 1 on the ends.
  Loss residual = loss::custom(
      [](const std::vector<Value>& out, Value target, const std::vector<Value>& in) {
        const Value u = out[0], x = in[0];
        const Value ux = ops::grad({u}, {x}, {ops::full_like(u, 1.0)})[0];
        const Value uxx = ops::grad({ux}, {x}, {ops::full_like(ux, 1.0)})[0];
        const Value value = ops::slice(target, 1, 0, 1), end = ops::slice(target, 1, 1, 2);
        const Value r = ops::mul(ops::add(uxx, value), ops::sub(ops::scalar_like(end, 1.0), end));
        const Value m = ops::mul(ops::sub(u, value), end);
        return ops::add(ops::mean(ops::mul(r, r), std::vector<int64_t>{}), ops::scale(ops::mean(ops::mul(m, m), std::vector<int64_t>{}), 10.0));
      },
      "poisson residual");
  optim::AdamOptions adam;
  adam.lr = 3e-3;
  Trainer trainer(model, residual, optim::adam(adam));
  Tensor x({n, 1}, DType::f32), y({n, 2}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    const bool end = i >= interior;
    const double xi = end ? double(i - interior) : (i + 1.0) / (interior + 1.0);
    x.data_as<float>()[i] = static_cast<float>(xi);
    y.data_as<float>()[2 * i] = end ? 0.0f : static_cast<float>(pi * pi * std::sin(pi * xi));
    y.data_as<float>()[2 * i + 1] = end ? 1.0f : 0.0f;
  }
  for (int i = 0; i < 3; ++i) trainer.step(x, y);
  const Allocations allocated = count_allocations(2997, [&] { trainer.step(x, y); });
  check(allocated.none(), "steps with second derivatives allocate nothing after warm-up (" + allocated.str() + ")");
  Tensor u = model->predict(x);
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(u.data_as<float>()[i] - std::sin(pi * x.data_as<float>()[i])));
  check(worst < 0.02, "the PINN solves -u'' = pi^2 sin(pi x) within 0.02 everywhere (max error " +
                          std::to_string(worst) + ")");
}
// The job board under the thread pool and the Python PoolExecutor: every chunk runs once whoever
// shows up, errors come back after all chunks ran, and released helpers linger, then leave.
void test_work_team() {
  using treadle::executors::WorkTeam;
  using namespace std::chrono_literals;
  {
    WorkTeam alone;  // no helper ever comes: the caller runs every chunk
    std::vector<int> hits(100, 0);
    alone.run(100, 7, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    check(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }),
          "a team without helpers runs every index once on the caller");
  }
  WorkTeam team(std::chrono::microseconds(50), std::chrono::microseconds(200000));
  std::atomic<bool> left{false};
  std::thread helper([&] {
    team.serve();
    left = true;
  });
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<int> by_helper{0};
  const auto caller = std::this_thread::get_id();
  for (int job = 0; job < 200; ++job)
    team.run(1000, 2, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != caller) ++by_helper;
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
  check(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 200; }),
        "200 jobs with a helper run every index exactly once each");
  // Jobs whose first chunk waits (up to 200 ms) for the second to start: a serving helper takes it.
  for (int job = 0; job < 10; ++job) {
    std::atomic<bool> second{false};
    team.run(2, 2, [&](int64_t b, int64_t) {
      if (b == 1) {
        second = true;
        if (std::this_thread::get_id() != caller) ++by_helper;
        return;
      }
      for (int i = 0; i < 200 && !second.load(); ++i) std::this_thread::sleep_for(1ms);
    });
  }
  check(by_helper.load() > 0, "the helper takes chunks (" + std::to_string(by_helper.load()) + ")");
  std::atomic<int> ran{0};
  bool rethrown = false;
  try {
    team.run(8, 8, [&](int64_t b, int64_t) {
      ++ran;
      if (b == 3) throw std::runtime_error("chunk 3 failed");
    });
  } catch (const std::runtime_error& e) {
    rethrown = std::string(e.what()) == "chunk 3 failed";
  }
  check(rethrown && ran.load() == 8, "a chunk's error is rethrown after all 8 chunks ran");
  team.release();
  std::this_thread::sleep_for(2ms);
  check(team.reopen() && !left.load(), "a helper released 2 ms ago still serves (linger 200 ms)");
  team.release();
  for (int i = 0; i < 2000 && !left.load(); ++i) std::this_thread::sleep_for(1ms);
  check(left.load() && !team.reopen(), "a helper released and idle past its linger goes back to its host");
  helper.join();
  WorkTeam closing;
  std::thread waiter([&] { closing.serve(); });
  closing.close();
  waiter.join();
  check(true, "close() ends serve() on a team that never released");
}

}  // namespace

// Usage: test_core [name...] runs the named groups (all by default); test_core --list names them.
int main(int argc, char** argv) {
  const std::pair<std::string, void (*)()> tests[] = {
      {"training", test_training_reduces_the_loss},
      {"update_rules", test_update_rules},
      {"chunked_predict", test_chunked_executor_predict_is_bitwise_serial},
      {"chunked_training", test_chunked_executor_training_is_bitwise_serial},
      {"bad_input", test_bad_input_throws_typed_errors},
      {"no_alloc", test_steps_allocate_nothing},
      {"no_alloc_broadcast", test_broadcast_steps_allocate_nothing},
      {"no_alloc_runs", test_elementwise_run_steps_allocate_nothing},
      {"hardening", test_hardening_guards},
      {"tasks", test_tasked_steps},
      {"device_tensors", test_device_tensors_on_the_host},
      {"pinn", test_pinn_poisson},
      {"work_team", test_work_team},
  };
  std::vector<std::string> wanted(argv + 1, argv + argc);
  if (wanted.size() == 1 && wanted[0] == "--list") {
    for (const auto& t : tests) std::printf("%s\n", t.first.c_str());
    return 0;
  }
  for (const std::string& w : wanted) {
    bool known = false;
    for (const auto& t : tests) known = known || t.first == w;
    if (!known) {
      std::fprintf(stderr, "test_core: unknown test group '%s' (--list names them)\n", w.c_str());
      return 2;
    }
  }
  for (const auto& [name, fn] : tests) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
    try {
      fn();
    } catch (const std::exception& e) {
      check(false, std::string(name) + ": unexpected exception: " + e.what());
    }
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}

// Training steps of the benchmark workloads (bench_workloads.py's shapes, built with the C++ API) on
// the executors a C++ host lends treadle: none (the calling thread), the host-owned thread pool
// (<treadle/executors/thread_pool.hpp>) and the OpenMP team (<treadle/executors/openmp.hpp>), each
// with W workers. The three run in alternating rounds, so their medians compare like with like on a
// busy machine. After timing, every trainer runs up to the same number of steps and the parameters
// must be bitwise equal (the executor never changes a result).
//
// Usage: executors_cpp [workers=2] [seconds per measurement=1.0]; prints one JSON object per line.
#include <omp.h>
#include <treadle/executors/openmp.hpp>
#include <treadle/executors/thread_pool.hpp>
#include <treadle/treadle.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace treadle;

struct Workload {
  std::string name, title;
  int64_t batch;
  Shape sample;
  int64_t classes;
  std::function<std::shared_ptr<Model>()> build;
};

std::shared_ptr<Model> mlp(const std::vector<int64_t>& widths) {
  auto net = std::make_shared<nn::Sequential>();
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i) net->add(std::make_shared<nn::Activation>("relu"));
    net->add(std::make_shared<nn::Linear>(widths[i], widths[i + 1]));
  }
  return std::make_shared<Model>(net);
}

std::shared_ptr<Model> cnn() {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2d>(1, 32, Shape{3}, Shape{1}, 1)).add(std::make_shared<nn::Activation>("relu"));
  net->add(std::make_shared<nn::MaxPoolNd>(2, Shape{2}));
  net->add(std::make_shared<nn::Conv2d>(32, 64, Shape{3}, Shape{1}, 1)).add(std::make_shared<nn::Activation>("relu"));
  net->add(std::make_shared<nn::MaxPoolNd>(2, Shape{2}));
  net->add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(3136, 128));
  net->add(std::make_shared<nn::Activation>("relu")).add(std::make_shared<nn::Linear>(128, 10));
  return std::make_shared<Model>(net);
}

std::shared_ptr<Model> encoder() {
  auto layer = std::make_shared<nn::TransformerEncoderLayer>(128, 4, 512, 0.0, "relu", 1e-5, true);
  auto head = std::make_shared<nn::Linear>(128, 10);
  auto params = layer->named_parameters();
  for (auto& p : head->named_parameters()) params.emplace_back("head." + p.first, p.second);
  auto forward = [layer, head](Graph&, const std::vector<Value>& in) -> std::vector<Value> {
    return {head->forward(ops::mean(layer->forward(in[0]), 1))};
  };
  return std::make_shared<Model>(forward, params);
}

std::vector<Workload> workloads() {
  return {{"W2", "MLP 64-128-128-10 relu, CE", 128, {64}, 10, [] { return mlp({64, 128, 128, 10}); }},
          {"W3", "MLP 1024-1024x3-10 relu, CE", 256, {1024}, 10, [] { return mlp({1024, 1024, 1024, 1024, 10}); }},
          {"W4", "CNN 1x28x28 conv32-pool-conv64-pool-128-10, CE", 64, {1, 28, 28}, 10, cnn},
          {"W6", "transformer encoder d128 h4 ffn512 seq64, mean-pool -> 10, CE", 16, {64, 128}, 10, encoder}};
}

// One trainer per executor, all from the same initial weights.
struct Contender {
  std::string name;
  Executor* executor;
  std::shared_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> per_step;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run(const Workload& w, int64_t batch, std::vector<std::pair<std::string, Executor*>> executors, double seconds,
         int workers) {
  Shape xs = w.sample;
  xs.insert(xs.begin(), batch);
  Tensor x(xs, DType::f32), y({batch}, DType::i64);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = normal(gen);
  for (int64_t i = 0; i < batch; ++i) y.data_as<int64_t>()[i] = static_cast<int64_t>(gen() % w.classes);
  std::vector<Contender> cs;
  for (auto& [name, ex] : executors) {
    manual_seed(7);  // same initial weights for every contender
    Contender c{name, ex, w.build(), nullptr, {}};
    optim::AdamOptions adam;
    adam.lr = 1e-3;
    c.trainer = std::make_unique<Trainer>(c.model, loss::cross_entropy(), optim::adam(adam), TrainerOptions{}, ex);
    for (int i = 0; i < 3; ++i) c.trainer->step(x, y);  // compile, warm up
    cs.push_back(std::move(c));
  }
  // Steps per round: about 10 ms on the calling thread alone.
  auto t0 = std::chrono::steady_clock::now();
  cs[0].trainer->step(x, y);
  const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int per_round = std::max(1, static_cast<int>(0.01 / std::max(one, 1e-7)));
  double spent = 0;
  while (spent < seconds) {
    for (auto& c : cs) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < per_round; ++i) c.trainer->step(x, y);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      c.per_step.push_back(dt / per_round);
      if (&c == &cs[0]) spent += dt;
    }
  }
  int64_t most = 0;
  for (auto& c : cs) most = std::max(most, c.trainer->steps());
  for (auto& c : cs)
    while (c.trainer->steps() < most) c.trainer->step(x, y);
  bool same = true;
  for (auto& c : cs) {
    const Tensor& a = cs[0].model->flat_parameters();
    const Tensor& b = c.model->flat_parameters();
    same = same && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  }
  std::printf("{\"workload\": \"%s\", \"title\": \"%s\", \"batch\": %lld, \"workers\": %d, \"bitwise_equal\": %s",
              w.name.c_str(), w.title.c_str(), static_cast<long long>(batch), workers, same ? "true" : "false");
  for (auto& c : cs) std::printf(", \"%s_us\": %.1f", c.name.c_str(), median(c.per_step) * 1e6);
  std::printf("}\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int workers = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  if (workers < 2 || !(seconds > 0)) {
    std::fprintf(stderr, "usage: executors_cpp [workers >= 2] [seconds > 0]\n");
    return 2;
  }
  executors::ThreadPool pool(workers);
  executors::OpenMPExecutor omp(workers);
  for (const Workload& w : workloads())
    for (int64_t mult : {1, 4})
      run(w, w.batch * mult, {{"serial", nullptr}, {"thread_pool", &pool}, {"openmp", &omp}}, seconds, workers);
  return 0;
}

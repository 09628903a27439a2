// A C++ simulation with its own OpenMP time steps that trains a surrogate of itself between them,
// lending its OpenMP team to treadle through treadle::executors::OpenMPExecutor.
//
// The simulation: a periodic 1-D reaction-diffusion field u_t = D u_xx + r u (1 - u) (explicit
// Euler, OpenMP over grid points), restarted from fresh random data now and then. The surrogate
// learns one coarse step (kSubsteps solver steps) at a grid point from the kWindow values around it.
//
// The run is done twice: with the OpenMP executor and with treadle's serial executor. The final
// parameters must be bitwise equal (treadle's kernels fix their chunking independently of the
// executor), which this program checks. It also reports the process's thread count at its peak:
// with the OpenMP adapter the only threads are the host's OpenMP team (which includes the main thread).
#include <omp.h>
#include <treadle/executors/openmp.hpp>
#include <treadle/treadle.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

namespace {

constexpr int kGrid = 1024;   // grid points = training rows per step
constexpr int kHalf = 4;      // stencil half-width of the surrogate's input window
constexpr int kWindow = 2 * kHalf + 1;
constexpr int kSubsteps = 4;  // solver steps per coarse (training) step
constexpr double kLambda = 0.2, kReaction = 0.02;  // D dt / dx^2 and r dt
constexpr double kScale = 10.0;                    // targets: kScale * change of u (O(1) numbers)
constexpr int kRestart = 25;                       // coarse steps between restarts

int thread_count() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) n += entry.is_directory() ? 1 : 0;
  return n;
}

std::atomic<int> peak_threads{0};
void sample_threads() {
  int now = thread_count(), seen = peak_threads.load();
  while (now > seen && !peak_threads.compare_exchange_weak(seen, now)) {
  }
}

// Forwards to the OpenMP adapter and counts calls and the OpenMP threads that ran chunks.
class CountingExecutor final : public treadle::Executor {
 public:
  int num_workers() const override { return inner_.num_workers(); }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    ++calls_;
    inner_.parallel_for(n, [&](int64_t b, int64_t e) {
      used_[std::min(omp_get_thread_num(), 63)].store(true);
      body(b, e);
    });
  }
  long calls() const { return calls_; }
  int threads_used() const {
    int k = 0;
    for (const auto& u : used_) k += u.load() ? 1 : 0;
    return k;
  }

 private:
  treadle::executors::OpenMPExecutor inner_;
  long calls_ = 0;
  std::atomic<bool> used_[64] = {};
};

struct Field {
  std::vector<double> u, next;
  std::mt19937_64 rng;
  explicit Field(uint64_t seed) : u(kGrid), next(kGrid), rng(seed) { restart(); }

  // Smoothed random values in [0, 1] (correlation length of a few points).
  void restart() {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (auto& v : next) v = uniform(rng);
    for (int i = 0; i < kGrid; ++i) {
      double s = 0.0;
      for (int k = -2; k <= 2; ++k) s += next[(i + k + kGrid) % kGrid];
      u[i] = s / 5.0;
    }
  }
  // One coarse step: the host's own OpenMP parallelism.
  void advance() {
    for (int s = 0; s < kSubsteps; ++s) {
#pragma omp parallel
      {
#pragma omp single nowait
        sample_threads();
#pragma omp for schedule(static)
        for (int i = 0; i < kGrid; ++i) {
          double l = u[(i + kGrid - 1) % kGrid], c = u[i], r = u[(i + 1) % kGrid];
          next[i] = c + kLambda * (l - 2.0 * c + r) + kReaction * c * (1.0 - c);
        }
      }
      u.swap(next);
    }
  }
  void window(int i, float* row) const {
    for (int k = -kHalf; k <= kHalf; ++k) row[k + kHalf] = static_cast<float>(u[(i + k + kGrid) % kGrid]);
  }
};

struct RunResult {
  std::vector<float> params;
  double first_loss = 0.0, final_loss = 0.0;
};

RunResult run(int steps, treadle::Executor* executor, bool verbose) {
  using namespace treadle::nn;
  treadle::manual_seed(0);
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<treadle::Module>>{
      std::make_shared<Linear>(kWindow, 64), std::make_shared<Activation>("tanh"), std::make_shared<Linear>(64, 64),
      std::make_shared<Activation>("tanh"), std::make_shared<Linear>(64, 1)});
  auto model = std::make_shared<treadle::Model>(net);
  treadle::optim::AdamOptions adam;
  adam.lr = 2e-3;
  treadle::Trainer trainer(model, treadle::loss::mse(), treadle::optim::adam(adam), {}, executor, /*seed=*/0);

  Field field(7);
  std::vector<float> xb(kGrid * kWindow), yb(kGrid);
  std::vector<double> before(kGrid);
  treadle::Tensor x = treadle::Tensor::wrap(xb.data(), {kGrid, kWindow}, treadle::DType::f32);
  treadle::Tensor y = treadle::Tensor::wrap(yb.data(), {kGrid, 1}, treadle::DType::f32);
  RunResult result;
  const int window = 25;
  double recent = 0.0;
  for (int step = 1; step <= steps; ++step) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < kGrid; ++i) field.window(i, &xb[i * kWindow]);
    before = field.u;
    field.advance();
#pragma omp parallel for schedule(static)
    for (int i = 0; i < kGrid; ++i) yb[i] = static_cast<float>(kScale * (field.u[i] - before[i]));
    recent += trainer.step(x, y);  // between two time steps: one training step on the team
    sample_threads();
    if (step % window == 0) {
      recent /= window;
      if (step == window) result.first_loss = recent;
      if (verbose && step % (steps / 4) == 0) std::printf("step %4d  loss %.6e\n", step, recent);
      result.final_loss = recent;
      recent = 0.0;
    }
    if (step % kRestart == 0) field.restart();
  }
  const treadle::Tensor& flat = model->flat_parameters();
  result.params.assign(flat.data_as<float>(), flat.data_as<float>() + flat.numel());
  return result;
}

int run_both(int steps) {
  const int team = omp_get_max_threads();
  std::printf("cpp_openmp_host: %d grid points, OpenMP team size %d\n", kGrid, team);
  CountingExecutor omp_exec;
  RunResult parallel = run(steps, &omp_exec, true);
  std::printf("first loss %.6e\nfinal loss %.6e\n", parallel.first_loss, parallel.final_loss);
  std::printf("parallel_for calls %ld, OpenMP threads that ran chunks %d\n", omp_exec.calls(), omp_exec.threads_used());
  std::printf("peak threads %d (OpenMP team %d, which includes the main thread)\n", peak_threads.load(), team);

  RunResult serial = run(steps, nullptr, false);
  bool same = parallel.params.size() == serial.params.size() &&
              std::memcmp(parallel.params.data(), serial.params.data(), parallel.params.size() * sizeof(float)) == 0;
  std::printf("parameters after training: OpenMP executor %s serial executor (%zu values)\n",
              same ? "bitwise equal to" : "DIFFER from", parallel.params.size());
  return same ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  if (steps < 100 || steps % 100 != 0) {
    std::fprintf(stderr, "usage: cpp_openmp_host [steps]  (a multiple of 100; got %d)\n", steps);
    return 2;
  }
  try {
    return run_both(steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpp_openmp_host: %s\n", e.what());
    return 1;
  }
}

// A C++ "simulation" that trains a neural surrogate of itself inside its own time loop.
//
// The host owns everything: the state, the time loop, the threads (here: just this one) and the
// schedule. treadle is called between two time steps with the newest samples and returns when the
// training step is done; it never starts a thread. To lend workers, a host passes its own
// treadle::Executor (an OpenMP team, a TBB arena) to the Trainer instead of nullptr.
//
// The simulation: a batch of damped, periodically driven oscillators
//   x'' + c x' + w^2 x = cos(W t)
// with a random damping c and frequency w per oscillator, integrated with semi-implicit Euler.
// The network learns one coarse step (kSubsteps solver steps): (x, v, c, w, cos Wt, sin Wt) -> (dx, dv).
#include <treadle/treadle.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <vector>

namespace {

constexpr int kOscillators = 64;  // batch: one sample per oscillator per time step
constexpr int kFeatures = 6, kOutputs = 2;
constexpr int kSubsteps = 10;
constexpr double kDt = 0.005, kDrive = 0.5;
constexpr double kScale = 10.0;  // targets are kScale * (change of state): O(1) numbers

struct Oscillators {
  std::vector<double> x, v, c, w;
  double t = 0.0;
  std::mt19937_64 rng;

  explicit Oscillators(uint64_t seed) : x(kOscillators), v(kOscillators), c(kOscillators), w(kOscillators), rng(seed) {
    for (int i = 0; i < kOscillators; ++i) restart(i);
  }
  void restart(int i) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    x[i] = u(rng);
    v[i] = u(rng);
    c[i] = 0.2 + 0.2 * (u(rng) + 1.0);  // damping in [0.2, 0.6]
    w[i] = 1.5 + 0.5 * u(rng);          // frequency in [1, 2]
  }
  // One coarse step of the solver (kSubsteps semi-implicit Euler steps) for every oscillator.
  void advance() {
    for (int s = 0; s < kSubsteps; ++s) {
      double force = std::cos(kDrive * t);
      for (int i = 0; i < kOscillators; ++i) {
        v[i] += kDt * (force - c[i] * v[i] - w[i] * w[i] * x[i]);
        x[i] += kDt * v[i];
      }
      t += kDt;
    }
  }
  // The network's input row for oscillator i at the current time.
  void features(int i, float* row) const {
    row[0] = static_cast<float>(x[i]);
    row[1] = static_cast<float>(v[i]);
    row[2] = static_cast<float>(c[i]);
    row[3] = static_cast<float>(w[i]);
    row[4] = static_cast<float>(std::cos(kDrive * t));
    row[5] = static_cast<float>(std::sin(kDrive * t));
  }
};

std::shared_ptr<treadle::Model> build_surrogate(int hidden) {
  using namespace treadle::nn;
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<treadle::Module>>{
      std::make_shared<Linear>(kFeatures, hidden), std::make_shared<Activation>("tanh"),
      std::make_shared<Linear>(hidden, hidden), std::make_shared<Activation>("tanh"),
      std::make_shared<Linear>(hidden, kOutputs)});
  return std::make_shared<treadle::Model>(net);
}

int run(int steps) {
  treadle::manual_seed(0);
  auto model = build_surrogate(32);
  treadle::optim::AdamOptions adam;
  adam.lr = 3e-3;
  treadle::Trainer trainer(model, treadle::loss::mse(), treadle::optim::adam(adam), {}, /*executor=*/nullptr,
                           /*seed=*/0);
  std::printf("cpp_host: %d driven oscillators train a %lld-parameter surrogate inside their time loop\n",
              kOscillators, static_cast<long long>(model->num_parameters()));

  Oscillators sim(42);
  // Host-owned batch memory, wrapped (not copied) by treadle tensors.
  std::vector<float> xb(kOscillators * kFeatures), yb(kOscillators * kOutputs);
  treadle::Tensor x = treadle::Tensor::wrap(xb.data(), {kOscillators, kFeatures}, treadle::DType::f32);
  treadle::Tensor y = treadle::Tensor::wrap(yb.data(), {kOscillators, kOutputs}, treadle::DType::f32);

  const int window = 50;  // losses are averaged over this many steps
  double first = 0.0, recent = 0.0;
  for (int step = 1; step <= steps; ++step) {
    // The host's time step: record the state, advance the simulation, record the change.
    for (int i = 0; i < kOscillators; ++i) sim.features(i, &xb[i * kFeatures]);
    std::vector<double> x0 = sim.x, v0 = sim.v;
    sim.advance();
    for (int i = 0; i < kOscillators; ++i) {
      yb[i * kOutputs + 0] = static_cast<float>(kScale * (sim.x[i] - x0[i]));
      yb[i * kOutputs + 1] = static_cast<float>(kScale * (sim.v[i] - v0[i]));
    }
    // Between two time steps: one training step on the newest samples, then back to the simulation.
    recent += trainer.step(x, y);
    if (step % window == 0) {
      recent /= window;
      if (step == window) {
        first = recent;
        std::printf("first loss %.6e (mean of steps 1-%d)\n", first, window);
      } else if (step % (steps / 5) == 0) {
        std::printf("step %5d  loss %.6e\n", step, recent);
      }
      if (step == steps) std::printf("final loss %.6e (mean of the last %d steps)\n", recent, window);
      recent = 0.0;
    }
    // Oscillators restart now and then, so that the data keeps covering the state space.
    if (step % 100 == 0)
      for (int i = step / 100 % 8; i < kOscillators; i += 8) sim.restart(i);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (steps < 100 || steps % 50 != 0) {
    std::fprintf(stderr, "usage: cpp_host [steps]  (a multiple of 50, at least 100; got %d)\n", steps);
    return 2;
  }
  try {
    return run(steps);
  } catch (const std::exception& e) {  // treadle reports errors as exceptions with a clear message
    std::fprintf(stderr, "cpp_host: %s\n", e.what());
    return 1;
  }
}

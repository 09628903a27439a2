#pragma once
// The state of a training step handed to the host as tasks (Trainer::begin_step).
#include <array>
#include <atomic>
#include <memory>

#include "core/plan.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// A float32 or float64 scalar (a loss) as double.
inline double read_scalar(const void* p, DType dt) {
  return dt == DType::f32 ? static_cast<double>(*static_cast<const float*>(p)) : *static_cast<const double*>(p);
}

struct Trainer::TaskedStep {
  std::shared_ptr<const Plan> plan;
  int depth = 0;
  std::vector<PlanTask> plan_tasks;
  std::vector<StepTask> tasks;
  std::unique_ptr<std::atomic<int>[]> state;  // per task: 0 waiting, 1 running, 2 done
  std::array<void*, kMaxInputs> inputs{};
  std::size_t num_inputs = 0;
  Tensor target;
  void* target_ptr[1] = {nullptr};
  void* seed_ptr[1] = {nullptr};  // the loss scale (Trainer::loss_seed), with loss scaling
  uint64_t rng_counter = 0;
  bool active = false;
  bool failed = false;

  Bindings bindings(const Model& m) const {
    return Bindings{m.flat_parameters().data(), std::span<void* const>(inputs.data(), num_inputs),
                    std::span<void* const>(target_ptr, 1), std::span<void* const>(seed_ptr, seed_ptr[0] ? 1 : 0)};
  }
};

}  // namespace treadle

#pragma once
// What a device backend's DeviceTrainer (backends/device_runtime.hpp) reaches of a Trainer: its
// model, optimizer, options, context and step state, and the host half's helpers it shares (plan
// lookup, input checks, the end of a step). Trainer names this struct its friend; nothing else
// uses it.
#include <memory>

#include "core/plan.hpp"
#include "nn/loss_scaler.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

struct TrainerInternals {
  using Inputs = Trainer::Inputs;
  static std::shared_ptr<Model>& model(Trainer& t) { return t.model_; }
  static std::shared_ptr<Optimizer>& optimizer(Trainer& t) { return t.optimizer_; }
  static const TrainerOptions& options(const Trainer& t) { return t.options_; }
  static Context& context(Trainer& t) { return t.ctx_; }
  static const Loss& loss(const Trainer& t) { return t.loss_; }
  static std::unique_ptr<LossScaler>& scaler(Trainer& t) { return t.scaler_; }
  static int64_t& skipped(Trainer& t) { return t.skipped_; }
  static std::shared_ptr<const Plan>& pending(Trainer& t) { return t.pending_; }
  static void end_tasked_step(Trainer& t) { t.end_tasked_step(); }
  static std::shared_ptr<const Plan> plan_for(Trainer& t, PlanMode mode, Inputs xs, const Tensor* y, bool input_grad) {
    return t.plan_for(mode, xs, y, input_grad);
  }
  static void check_input(const Trainer& t, const Tensor& x, const char* what) { t.check_input(x, what); }
  static double finish_with_update(Trainer& t, double loss, const char* who) { return t.finish_with_update(loss, who); }
};

}  // namespace treadle

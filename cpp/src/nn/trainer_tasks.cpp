// A training step handed to the host as tasks (Trainer::begin_step / run_task / finish_step).
#include <cmath>

#include "backends/device_runtime.hpp"
#include "nn/trainer_tasks.hpp"
#include "treadle/error.hpp"

namespace treadle {

namespace {
// The public description of the plan's tasks: names, dependencies and the trainable gradients each
// one completes (by name and element range in the trainable gradient buffer).
std::vector<StepTask> describe_tasks(const Plan& p, const std::vector<PlanTask>& plan_tasks, const Model& m) {
  const std::size_t es = dtype_size(m.dtype());
  std::vector<StepTask> out;
  for (const PlanTask& t : plan_tasks) {
    StepTask st{t.name, t.deps, {}, {}};
    for (int g : t.param_grads) {
      const int64_t offset = p.param_grads[g].first / static_cast<int64_t>(es);
      for (const ParamSlot& slot : m.trainable_layout())
        if (slot.offset == offset) {
          st.params.push_back(slot.name);
          st.grad_ranges.emplace_back(slot.offset, slot.offset + slot.numel);
        }
    }
    out.push_back(std::move(st));
  }
  return out;
}
}  // namespace

const std::vector<StepTask>& Trainer::begin_step(Inputs xs, const Tensor& y, int depth) {
  Model::TrainingCall call(*model_, "Trainer.begin_step");
  if (depth < 1) throw_value_error("Trainer.begin_step: depth must be >= 1, got ", depth);
  if (on_device())
    throw_value_error("Trainer.begin_step: tasked steps are not implemented for backend '", model_->backend(), "' (",
                      device_name(plan_device(model_->backend())), "); use step()");
  for (const Tensor& x : xs) check_input(x, "input");
  check_input(y, "target");
  if (options_.verify_parameters) verify_parameters();
  std::shared_ptr<const Plan> p = plan_for(PlanMode::train_loss, xs, &y, false);
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  loss_.check_target(out.shape, out.dtype, y);
  if (!tasked_) tasked_ = std::make_unique<TaskedStep>();
  TaskedStep& ts = *tasked_;
  for (std::size_t k = 0; ts.active && k < ts.tasks.size(); ++k)
    if (ts.state[k].load(std::memory_order_acquire) == 1)
      throw_value_error("Trainer.begin_step: task ", k, " '", ts.tasks[k].name,
                        "' of the step in progress is still running; wait for it first");
  if (ts.plan != p || ts.depth != depth) {
    ts.plan_tasks = p->partition_tasks(depth);
    ts.tasks = describe_tasks(*p, ts.plan_tasks, *model_);
    ts.state = std::make_unique<std::atomic<int>[]>(ts.tasks.size());
    ts.plan = p;
    ts.depth = depth;
  }
  pending_.reset();
  hold_inputs(xs, ts.inputs);  // the host may reuse its arrays while tasks are pending
  ts.num_inputs = xs.size();
  if (!ts.target.defined() || ts.target.shape() != y.shape() || ts.target.dtype() != y.dtype())
    ts.target = Tensor(y.shape(), y.dtype());
  ts.target.copy_from(y);
  ts.target_ptr[0] = ts.target.data();
  ts.seed_ptr[0] = loss_seed(p->graph.info(p->loss).dtype);
  zero_grad();
  ctx_.arena(p->arena_bytes());  // grown here, so concurrent tasks only read the pointer
  ts.rng_counter = ctx_.next_rng_counter();
  for (std::size_t k = 0; k < ts.tasks.size(); ++k) ts.state[k].store(0);
  ts.active = true;
  ts.failed = false;
  return ts.tasks;
}

void Trainer::run_task(int k) {
  if (!tasked_ || !tasked_->active)
    throw_value_error("Trainer.run_task: no step in progress (call begin_step first; any other training or "
                      "evaluation call in between ends it)");
  TaskedStep& ts = *tasked_;
  const int n = static_cast<int>(ts.tasks.size());
  if (k < 0 || k >= n) throw_value_error("Trainer.run_task: task ", k, " out of range [0, ", n, ")");
  for (int d : ts.tasks[k].deps)
    if (ts.state[d].load(std::memory_order_acquire) != 2)
      throw_value_error("Trainer.run_task: task ", k, " '", ts.tasks[k].name, "' depends on task ", d, " '",
                        ts.tasks[d].name, "', which has not finished");
  int expected = 0;
  if (!ts.state[k].compare_exchange_strong(expected, 1))
    throw_value_error("Trainer.run_task: task ", k, " '", ts.tasks[k].name, "' was already run in this step");
  const PlanTask& t = ts.plan_tasks[k];
  const Bindings b = ts.bindings(*model_);
  try {
    ts.plan->run_with_counter(ctx_, b, t.begin, t.end, ts.rng_counter);
  } catch (...) {
    ts.failed = true;  // the step cannot finish; parameters stay untouched
    throw;
  }
  // Each parameter gradient belongs to exactly one task, so concurrent tasks add disjoint ranges.
  for (int g : t.param_grads) ts.plan->accumulate_param_grad(ctx_, b, g, model_->flat_gradients().data());
  ts.state[k].store(2, std::memory_order_release);
}

double Trainer::finish_step() {
  Model::TrainingCall call(*model_, "Trainer.finish_step");
  if (!tasked_ || !tasked_->active) throw_value_error("Trainer.finish_step: no step in progress (call begin_step)");
  TaskedStep& ts = *tasked_;
  if (ts.failed) {
    ts.active = false;
    throw_value_error("Trainer.finish_step: a task of this step raised; the step is abandoned and the parameters "
                      "are unchanged");
  }
  for (std::size_t k = 0; k < ts.tasks.size(); ++k)
    if (ts.state[k].load(std::memory_order_acquire) != 2)
      throw_value_error("Trainer.finish_step: task ", k, " '", ts.tasks[k].name, "' has not run");
  ts.active = false;
  const Bindings b = ts.bindings(*model_);
  const double loss = read_scalar(ts.plan->address(ctx_, b, ts.plan->loss), ts.plan->graph.info(ts.plan->loss).dtype);
  if (options_.verify_parameters) reseal_frozen();  // the forward updated running statistics
  return finish_with_update(loss, "Trainer.finish_step");
}

void Trainer::end_tasked_step() {
  if (!tasked_ || !tasked_->active) return;
  TaskedStep& ts = *tasked_;
  for (std::size_t k = 0; k < ts.tasks.size(); ++k)
    if (ts.state[k].load(std::memory_order_acquire) == 1)
      throw_value_error("Trainer: task ", k, " '", ts.tasks[k].name,
                        "' of the step in progress is still running; wait for it before another training call");
  ts.active = false;
}

}  // namespace treadle

#pragma once
// Training: a model, a loss and an optimizer driven step by step by the host.
// step() does everything in one call; forward/backward/zero_grad/update let an external scheduler
// interleave its own work (an allreduce, a policy-gradient objective) between the phases.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "treadle/context.hpp"
#include "treadle/loss.hpp"
#include "treadle/model.hpp"
#include "treadle/optim.hpp"

namespace treadle {

class LossScaler;     // nn/loss_scaler.hpp
class DeviceTrainer;  // a device backend's training step (internal: backends/device_runtime.hpp)
class UpdateSteps;    // an update's pieces on the host or a device (internal: backends/device_runtime.hpp)

// Loss scaling for mixed-precision training (Model::set_precision("fp16"), whose rounded gradient
// operands flush small values to zero), as torch.amp.GradScaler does it. The backward pass is seeded
// with the scale instead of 1; update() multiplies the gradients by the float32 reciprocal of the
// scale before clipping and the optimizer and skips the update (parameters, optimizer state and its
// step count untouched; counted in skipped_steps()) when any gradient is not finite. A dynamic scale
// is then multiplied by backoff_factor; after growth_interval consecutive finite steps it is
// multiplied by growth_factor. The loss that step() returns is the unscaled one.
struct LossScaling {
  enum class Mode : uint8_t { off, fixed, dynamic };
  Mode mode = Mode::off;
  double init_scale = 65536.0;  // the fixed scale, or where a dynamic one starts (a float32 value)
  double growth_factor = 2.0;   // dynamic only
  double backoff_factor = 0.5;  // dynamic only
  int64_t growth_interval = 2000;  // dynamic only
  static LossScaling fixed(double scale) { return {Mode::fixed, scale}; }
  static LossScaling dynamic(double init_scale = 65536.0, double growth_factor = 2.0, double backoff_factor = 0.5,
                             int64_t growth_interval = 2000) {
    return {Mode::dynamic, init_scale, growth_factor, backoff_factor, growth_interval};
  }
};

struct TrainerOptions {
  double clip_grad_norm = 0.0;  // 0: off
  bool check_finite = false;    // reject NaN/Inf in inputs and targets
  // Skip the update (parameters and optimizer state untouched) when the loss or the global
  // gradient norm is not finite; skipped_steps() counts them. For mixed precision and bad batches.
  bool skip_nonfinite = false;
  // Silent-data-corruption guard: checksum every parameter slot after each update and verify it
  // before the next step; a mismatch throws std::runtime_error naming the parameters.
  bool verify_parameters = false;
  // Bytes for parameters + gradients + optimizer state + activations (0: none); a plan that would
  // exceed it is refused with ValueError before it runs.
  std::size_t memory_budget = 0;
  // Off by default; validated (ValueError naming the field) and fixed when the trainer is built.
  // With it, skip_nonfinite's gradient check is the scaler's (its loss check still comes first and
  // leaves the scale alone). Host trainers only for now: a step on backend "cuda" raises ValueError.
  LossScaling loss_scaling;
  // Backend "cuda" (CUDA builds): step() runs as a CUDA graph, captured once per input signature
  // on its second step (the first runs as launched kernels) and replayed: forward, loss, backward,
  // gradient accumulation and the optimizer in one launch. Not with skip_nonfinite, check_finite or
  // anomaly mode (the update cannot wait for a value read back mid-step): ValueError. Host backends
  // ignore it.
  bool cuda_graph = false;
};

// One task of a training step split for a host scheduler (Trainer::begin_step).
struct StepTask {
  std::string name;        // "forward fc1", "loss", "backward fc1" (module path and pass)
  std::vector<int> deps;   // tasks that must have finished before this one starts
  // Trainable parameters whose gradient is final once this task has run: their names and their
  // [offset, offset + numel) element ranges in trainable_gradients(), e.g. to start an allreduce.
  std::vector<std::string> params;
  std::vector<std::pair<int64_t, int64_t>> grad_ranges;
};

struct Bindings;  // a run's buffers (core/plan.hpp)

// What a step can hand back besides the loss, without a second forward: copies of the model's
// outputs (as that step computed them: training mode, its dropout and noise) and of the named
// values the loss or the forward observed (Graph::observe; e.g. a VAE's KL and reconstruction
// terms). Tensors of the right shape are reused, so a steady loop allocates nothing.
struct StepOutputs {
  std::vector<Tensor> outputs;
  std::vector<std::pair<std::string, Tensor>> values;
};

class TREADLE_API Trainer {
 public:
  // A model's inputs, in order (models with one input take a single Tensor below).
  using Inputs = std::span<const Tensor>;
  static constexpr std::size_t kMaxInputs = 8;

  Trainer(std::shared_ptr<Model> model, Loss loss, std::shared_ptr<Optimizer> optimizer,
          TrainerOptions options = {}, Executor* executor = nullptr, uint64_t seed = 0);
  ~Trainer();

  // zero_grad + forward + loss + backward + (clip) + update. Returns the loss.
  double step(const Tensor& x, const Tensor& y) { return step(Inputs(&x, 1), y); }
  double step(Inputs xs, const Tensor& y) { return step(xs, y, nullptr); }
  // The same, also filling `out` (when not null) with the step's outputs and observed values.
  double step(Inputs xs, const Tensor& y, StepOutputs* out);
  // forward (eval mode: no dropout) + loss; touches no gradient or parameter. Returns the loss.
  double evaluate(const Tensor& x, const Tensor& y) { return evaluate(Inputs(&x, 1), y); }
  double evaluate(Inputs xs, const Tensor& y, StepOutputs* out = nullptr);
  // forward + loss + backward, accumulating into the gradients; no update. Returns the loss.
  double compute_gradients(const Tensor& x, const Tensor& y) { return compute_gradients(Inputs(&x, 1), y); }
  double compute_gradients(Inputs xs, const Tensor& y, StepOutputs* out = nullptr);
  // Host-driven phases. forward keeps activations in the trainer's context for backward;
  // input_grad=true compiles the backward pass to also produce dL/d(input).
  Tensor forward(const Tensor& x, bool input_grad = false) { return forward(Inputs(&x, 1), input_grad); }
  Tensor forward(Inputs xs, bool input_grad = false);  // the first output
  // Every output of the model, in order (for a model whose forward returns several).
  std::vector<Tensor> forward_outputs(Inputs xs, bool input_grad = false);
  // Accumulates parameter gradients from dL/d(output). When input_grad is non-null it receives
  // dL/d(input) (allocated here, shaped like the input). A model with several outputs takes one
  // gradient per output (an undefined Tensor where the loss does not depend on that output).
  void backward(const Tensor& grad_output, Tensor* input_grad = nullptr) {
    backward(std::span<const Tensor>(&grad_output, 1), input_grad);
  }
  void backward(std::span<const Tensor> grad_outputs, Tensor* input_grad = nullptr);
  void zero_grad();
  // (clip) + optimizer step with the scheduled learning rate.
  void update();

  // A training step as tasks with dependencies, for a host scheduler that overlaps them with its
  // own work (docs/executors.md). begin_step zeroes the gradients, checks and copies the batch and
  // returns the tasks: one per module (the first `depth` components of its path) and pass.
  // run_task(k) runs one; tasks whose dependencies have all finished may run concurrently from
  // different host threads (they then share the context's executor, which must allow that). A
  // task's parameter gradients are complete in trainable_gradients() when it returns.
  // finish_step() requires every task to have run, then clips and updates like step() and returns
  // the loss. Any order respecting the dependencies gives bitwise the result of step().
  const std::vector<StepTask>& begin_step(const Tensor& x, const Tensor& y, int depth = 1) {
    return begin_step(Inputs(&x, 1), y, depth);
  }
  const std::vector<StepTask>& begin_step(Inputs xs, const Tensor& y, int depth = 1);
  void run_task(int k);
  double finish_step();

  Model& model() { return *model_; }
  // With backend "cuda" the optimizer's state is first copied back from the device (and uploaded
  // again before the next device update, as the state may be written: checkpoints restore it so).
  Optimizer& optimizer() {
    optimizer_host_access();
    return *optimizer_;
  }
  Context& context() { return ctx_; }
  const Loss& loss() const { return loss_; }
  void set_schedule(std::shared_ptr<Schedule> s) { schedule_ = std::move(s); }
  double current_lr() const;
  TrainerOptions& options() { return options_; }
  int64_t steps() const { return optimizer_->step_count(); }
  // Updates skipped by the skip_nonfinite policy or by loss scaling (non-finite gradients).
  int64_t skipped_steps() const { return skipped_; }
  // The loss scale the next backward pass is seeded with (1 without loss scaling) and the count of
  // consecutive finite steps towards its growth (0 without dynamic scaling).
  float loss_scale() const;
  int64_t loss_scale_growth_tracker() const;
  // Restores the dynamic scaler's state (checkpoints); ValueError for a non-positive or non-finite
  // scale or a negative count. Ignored without dynamic loss scaling.
  void set_loss_scale_state(double scale, int64_t growth_tracker);
  // Memory a training step on (x, y) of these signatures needs; compiles its plan if new.
  MemoryReport memory_report(const Shape& x_shape, DType x_dtype, const Shape& y_shape, DType y_dtype);
  // Re-records the parameter checksums (verify_parameters) after a deliberate write to the
  // parameters (loading a checkpoint, editing weights by hand).
  void reseal_parameters();
  // Backend "cuda" (CUDA builds; docs/cuda.md): step, compute_gradients, evaluate and update run on
  // cuda:0 ("cuda:N": device N) with the model's device copies (Model::device_buffers), inputs and target uploaded once
  // per step through pinned memory, gradients accumulated and clipped and the optimizer (SGD, Adam,
  // AdamW, AMSGrad) run on the device, and the loss the step's one read-back. Returns the cudaMalloc
  // calls made for this trainer's steps (its context's arena, its buffers, the model's copies):
  // constant once steps are steady. 0 for a trainer that never ran on a device.
  uint64_t device_allocations() const;

 private:
  // fresh_grads: the gradients replace the model's (step) instead of adding to them.
  double run_loss_plan(Inputs xs, const Tensor& y, PlanMode mode, StepOutputs* out = nullptr,
                       bool fresh_grads = false);
  void copy_step_outputs(const Plan& p, const Bindings& b, StepOutputs& out);
  // Copies the inputs into pending_inputs_ (the host may reuse its arrays before the pass that
  // needs them) and writes their addresses into `ptrs`.
  void hold_inputs(Inputs xs, std::array<void*, kMaxInputs>& ptrs);
  // The end of a step after its gradients: the skip_nonfinite / check_finite policies on the loss,
  // then update(). `who` names the caller in the error. Returns the loss.
  double finish_with_update(double loss, const char* who);
  // The plan for this mode and signature: a per-mode last-used entry answers repeated steps without
  // building a key (so a step allocates nothing); a miss asks the model.
  std::shared_ptr<const Plan> plan_for(PlanMode mode, Inputs xs, const Tensor* y, bool input_grad);
  struct CachedPlan {
    uint64_t generation = ~uint64_t{0};
    std::vector<Shape> x_shapes;
    std::vector<DType> x_dtypes;
    Shape y_shape;
    DType y_dtype = DType::f32;
    bool input_grad = false;
    std::shared_ptr<const Plan> plan;
  };
  CachedPlan cache_[4];
  void check_input(const Tensor& x, const char* what) const;
  PlanKey make_key(PlanMode mode, Inputs xs, const Tensor* y, bool input_grad) const;
  MemoryReport report_for(const Plan& p);
  void check_budget(const Plan& p, const Shape& x_shape);
  void follow_model_dtype();
  void verify_parameters() const;
  std::vector<uint64_t> checksum_parameters(std::size_t first_slot) const;
  void reseal_frozen();

  std::shared_ptr<Model> model_;
  Loss loss_;
  std::shared_ptr<Optimizer> optimizer_;
  std::shared_ptr<Schedule> schedule_;
  TrainerOptions options_;
  Context ctx_;
  std::shared_ptr<const Plan> pending_;  // plan whose forward ran last (for backward)
  std::vector<Tensor> pending_inputs_;  // private copies of the last forward's inputs
  int64_t skipped_ = 0;
  std::unique_ptr<LossScaler> scaler_;  // null without loss scaling
  // The seed of a train_loss plan's backward pass with loss scaling: the scale in the loss's dtype,
  // written here (the plan binds it as its seed input). Null without loss scaling.
  void* loss_seed(DType loss_dtype);
  alignas(8) unsigned char seed_value_[8] = {};
  // update()'s one sequence, on the host's buffers or a device's copies (backends/device_runtime.hpp).
  void apply_update(UpdateSteps& steps);
  const Tensor& scaled_grad_output(const Tensor& grad_output, Tensor& copy, Tensor& scaled);
  std::vector<Tensor> scaled_seeds_;  // backward's grad_outputs times the loss scale
  std::vector<Tensor> seed_copies_;   // contiguous copies of them, or zeros for an output without one
  std::vector<void*> seed_ptrs_;
  void run_forward(Inputs xs, bool input_grad);  // the training forward, leaving pending_ set
  Tensor pending_output(std::size_t k);           // a copy of output k of that forward
  void check_grad_output(const Plan& p, std::size_t k, const Tensor& g) const;
  struct TaskedStep;  // the step begin_step prepared (trainer_tasks.cpp)
  void end_tasked_step();  // another run reuses the context's memory: a tasked step is void
  std::unique_ptr<TaskedStep> tasked_;
  std::vector<uint64_t> checksums_;  // per layout slot; empty until the first update
  uint64_t sealed_generation_ = 0;   // the model's generation when checksums_ were taken
  // The device side of steps (a device backend's DeviceTrainer), made on the first device step;
  // declared after ctx_ so that it goes before the context's queue. It reaches this trainer's
  // members through TrainerInternals (nn/trainer_internals.hpp).
  friend struct TrainerInternals;
  struct DeviceDeleter {
    void operator()(DeviceTrainer* d) const noexcept;
  };
  std::unique_ptr<DeviceTrainer, DeviceDeleter> device_;
  bool on_device() const;  // the model's backend runs on a device
  DeviceTrainer& device_trainer();
  void optimizer_host_access();
};

}  // namespace treadle

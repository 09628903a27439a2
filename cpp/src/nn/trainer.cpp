#include "treadle/trainer.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backends/device_runtime.hpp"
#include "core/plan.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/trainer_tasks.hpp"
#include "treadle/error.hpp"

namespace treadle {

namespace {
template <typename T>
bool all_finite(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

bool tensor_finite(const Tensor& t) {
  if (t.dtype() == DType::f32) return all_finite(t.data_as<float>(), t.numel());
  if (t.dtype() == DType::f64) return all_finite(t.data_as<double>(), t.numel());
  return true;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Model> model, Loss loss, std::shared_ptr<Optimizer> optimizer,
                 TrainerOptions options, Executor* executor, uint64_t seed)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(std::move(optimizer)), options_(options),
      ctx_(executor, seed) {
  if (!model_) throw_value_error("Trainer: model is null");
  if (!optimizer_) throw_value_error("Trainer: optimizer is null");
  // Everything is checked before the optimizer is touched: a refused trainer changes nothing.
  validate_loss_scaling(options_.loss_scaling, "Trainer");
  if (on_device()) device_trainer().check_support("Trainer");  // e.g. an optimizer without a device update
  optimizer_->claim(model_.get(), "Trainer");
  try {
    optimizer_->bind(model_->trainable_layout(), model_->num_trainable(), model_->dtype());
  } catch (...) {
    optimizer_->release(model_.get());
    throw;
  }
  if (options_.loss_scaling.mode != LossScaling::Mode::off)
    scaler_ = std::make_unique<LossScaler>(options_.loss_scaling);
}

Trainer::~Trainer() {
  if (device_) device_->wait();  // the last update may still run: it ends before its buffers go
  optimizer_->release(model_.get());
}

void Trainer::DeviceDeleter::operator()(DeviceTrainer* d) const noexcept { delete d; }

bool Trainer::on_device() const { return plan_device(model_->backend()).kind != DeviceKind::cpu; }

DeviceTrainer& Trainer::device_trainer() {
  if (!device_) {
    const Device d = plan_device(model_->backend());
    device_.reset(require_device_runtime(d, "Trainer").make_trainer(d, *this).release());
  }
  return *device_;
}

void Trainer::optimizer_host_access() {
  if (device_) device_->optimizer_to_host(true);
}

uint64_t Trainer::device_allocations() const {
  return ctx_.device_allocations() + (device_ ? device_->allocations() : 0) + model_->device_allocations();
}

void Trainer::check_input(const Tensor& t, const char* what) const {
  if (!t.defined()) throw_value_error("Trainer: ", what, " is undefined");
  if (!t.is_cpu()) {  // device memory: read by a model on a device backend only, and on the device
    if (!on_device())
      throw_type_error("Trainer: ", what, " is on ", device_name(t.device()), " but the model runs on the CPU (backend '",
                       model_->backend(), "'); call model.set_backend('cuda') or pass host arrays");
    if (options_.check_finite)
      throw_value_error("Trainer: check_finite reads the ", what, " on the host, which is on ", device_name(t.device()),
                        "; pass host arrays or turn check_finite off");
    return;
  }
  if (options_.check_finite && !tensor_finite(t)) throw_value_error("Trainer: ", what, " contains NaN or Inf");
}

double Trainer::current_lr() const {
  return schedule_ ? schedule_->lr_at(optimizer_->step_count(), optimizer_->lr()) : optimizer_->lr();
}

PlanKey Trainer::make_key(PlanMode mode, Inputs xs, const Tensor* y, bool input_grad) const {
  PlanKey key = model_->infer_key(std::vector<Tensor>(xs.begin(), xs.end()));
  key.mode = mode;
  key.input_grad = input_grad;
  key.loss_seed_input = scaler_ && mode == PlanMode::train_loss;
  if (y) {
    // The target's dtype is checked before compiling so the error names the loss, not an op.
    if (!loss_.accepts_target_dtype(y->dtype(), model_->dtype()))
      throw_type_error(loss_.kind, ": expected target of dtype ", dtype_name(loss_.target_dtype(model_->dtype())),
                       ", got ", dtype_name(y->dtype()));
    key.loss_key = loss_.key();
    key.target_shape = y->shape();
    key.target_dtype = y->dtype();
  }
  return key;
}

std::shared_ptr<const Plan> Trainer::plan_for(PlanMode mode, Inputs xs, const Tensor* y, bool input_grad) {
  CachedPlan& c = cache_[static_cast<int>(mode)];
  bool hit = c.plan && c.generation == model_->generation() && c.input_grad == input_grad &&
             c.x_shapes.size() == xs.size() && (!y || (c.y_shape == y->shape() && c.y_dtype == y->dtype()));
  for (std::size_t i = 0; hit && i < xs.size(); ++i)
    hit = c.x_shapes[i] == xs[i].shape() && c.x_dtypes[i] == xs[i].dtype();
  if (hit) return c.plan;
  if (xs.empty() || xs.size() > kMaxInputs)
    throw_value_error("Trainer: expected 1 to ", kMaxInputs, " model inputs, got ", xs.size());
  const uint64_t generation = model_->generation();
  std::shared_ptr<const Plan> p = model_->plan(make_key(mode, xs, y, input_grad), y ? &loss_ : nullptr);
  if (options_.memory_budget) check_budget(*p, xs[0].shape());  // before the plan first runs here
  c = CachedPlan{generation, {}, {}, y ? y->shape() : Shape{}, y ? y->dtype() : DType::f32, input_grad, p};
  for (const Tensor& x : xs) {
    c.x_shapes.push_back(x.shape());
    c.x_dtypes.push_back(x.dtype());
  }
  return c.plan;
}

MemoryReport Trainer::report_for(const Plan& p) {
  MemoryReport r;
  r.parameters = model_->flat_parameters().nbytes();
  r.gradients = model_->flat_gradients().nbytes();
  for (const auto& [name, t] : optimizer_->state()) r.optimizer_state += t.defined() ? t.nbytes() : 0;
  r.activations = std::max(p.arena_bytes(), ctx_.arena_bytes());  // the context keeps its largest arena
  return r;
}

void Trainer::check_budget(const Plan& p, const Shape& x_shape) {
  MemoryReport r = report_for(p);
  if (r.total() > options_.memory_budget)
    throw_value_error("Trainer: input of shape ", shape_str(x_shape), " needs ", r.total(), " bytes (parameters ",
                      r.parameters, ", gradients ", r.gradients, ", optimizer state ", r.optimizer_state,
                      ", activations ", r.activations, "), over the memory_budget of ", options_.memory_budget,
                      " bytes");
}

MemoryReport Trainer::memory_report(const Shape& x_shape, DType x_dtype, const Shape& y_shape, DType y_dtype) {
  Tensor x(x_shape, x_dtype), y(y_shape, y_dtype);  // signatures only; the data is never read
  return report_for(*model_->plan(make_key(PlanMode::train_loss, Inputs(&x, 1), &y, false), &loss_));
}

double Trainer::run_loss_plan(Inputs xs, const Tensor& y, PlanMode mode, StepOutputs* step_out, bool fresh_grads) {
  for (const Tensor& x : xs) check_input(x, "input");
  check_input(y, "target");
  if (options_.verify_parameters) verify_parameters();
  std::shared_ptr<const Plan> p = plan_for(mode, xs, &y, false);
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  loss_.check_target(out.shape, out.dtype, y);  // e.g. class indices in range, before any compute
  if (p->device().kind != DeviceKind::cpu) {
    if (fresh_grads) zero_grad();  // the device trainer adds into the device gradients
    if (step_out)
      throw_value_error("Trainer: returning a step's outputs is not implemented for backend '", model_->backend(),
                        "' yet");
    return device_trainer().run_loss_plan(*p, xs, y, mode);
  }
  std::array<Tensor, kMaxInputs> x_copies;  // only for non-contiguous inputs
  std::array<void*, kMaxInputs> in_ptr{};
  for (std::size_t i = 0; i < xs.size(); ++i)
    in_ptr[i] = xs[i].is_contiguous() ? xs[i].data() : (x_copies[i] = xs[i].clone()).data();
  Tensor y_copy;
  const Tensor& yc = y.is_contiguous() ? y : (y_copy = y.clone());
  void* tgt_ptr[1] = {yc.data()};
  void* seed_ptr[1] = {mode == PlanMode::train_loss ? loss_seed(p->graph.info(p->loss).dtype) : nullptr};
  Bindings b{model_->flat_parameters().data(), std::span<void* const>(in_ptr.data(), xs.size()), tgt_ptr,
             std::span<void* const>(seed_ptr, seed_ptr[0] ? 1 : 0)};
  pending_.reset();  // this run reuses the context's activation memory: a pending backward is void
  end_tasked_step();
  p->run(ctx_, b, 0, p->num_steps());
  if (mode == PlanMode::train_loss) {
    const Tensor& grads = model_->flat_gradients();
    if (fresh_grads) p->write_param_grads(ctx_, b, grads.data(), grads.nbytes());
    else p->accumulate_param_grads(ctx_, b, grads.data());
    pending_.reset();
    if (options_.verify_parameters) reseal_frozen();  // training forwards update running statistics
  }
  if (step_out) copy_step_outputs(*p, b, *step_out);
  return read_scalar(p->address(ctx_, b, p->loss), p->graph.info(p->loss).dtype);
}

double Trainer::step(Inputs xs, const Tensor& y, StepOutputs* out) {
  Model::TrainingCall call(*model_, "Trainer.step");
  ExecutorRun run(ctx_.executor());  // one call-in of the host's workers for forward, backward and update
  if (options_.cuda_graph && on_device()) {
    if (out) throw_value_error("Trainer.step: returning the outputs is not implemented for CUDA-graph steps");
    return device_trainer().graph_step(xs, y);
  }
  // The step's gradients replace the model's (zeroed first, on the device).
  return finish_with_update(run_loss_plan(xs, y, PlanMode::train_loss, out, /*fresh_grads=*/true), "Trainer.step");
}

double Trainer::finish_with_update(double loss, const char* who) {
  if (options_.skip_nonfinite && !std::isfinite(loss)) {
    ++skipped_;
    return loss;
  }
  if (options_.check_finite && !std::isfinite(loss))
    throw_value_error(who, ": loss is ", loss, "; parameters left unchanged");
  update();
  return loss;
}

void Trainer::hold_inputs(Inputs xs, std::array<void*, kMaxInputs>& ptrs) {
  pending_inputs_.resize(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    Tensor& held = pending_inputs_[i];
    if (!held.defined() || held.shape() != xs[i].shape() || held.dtype() != xs[i].dtype())
      held = Tensor(xs[i].shape(), xs[i].dtype());
    held.copy_from(xs[i]);
    ptrs[i] = held.data();
  }
}

double Trainer::compute_gradients(Inputs xs, const Tensor& y, StepOutputs* out) {
  Model::TrainingCall call(*model_, "Trainer.compute_gradients");
  return run_loss_plan(xs, y, PlanMode::train_loss, out);
}

double Trainer::evaluate(Inputs xs, const Tensor& y, StepOutputs* out) {
  Model::TrainingCall call(*model_, "Trainer.evaluate");
  return run_loss_plan(xs, y, PlanMode::eval_loss, out);
}

namespace {

// Copies a planned value into `dst`, reallocating only when its shape or dtype changed.
void copy_out(const Plan& p, const void* src, int id, Tensor& dst) {
  const ValueInfo& info = p.graph.info(id);
  if (!dst.defined() || dst.shape() != info.shape || dst.dtype() != info.dtype || !dst.is_contiguous())
    dst = Tensor(info.shape, info.dtype);
  std::memcpy(dst.data(), src, dst.nbytes());
}

}  // namespace

void Trainer::copy_step_outputs(const Plan& p, const Bindings& b, StepOutputs& out) {
  out.outputs.resize(p.outputs.size());
  for (std::size_t i = 0; i < p.outputs.size(); ++i)
    copy_out(p, p.address(ctx_, b, p.outputs[i]), p.outputs[i], out.outputs[i]);
  out.values.resize(p.observed.size());
  for (std::size_t i = 0; i < p.observed.size(); ++i) {
    const auto& [name, id] = p.observed[i];
    if (out.values[i].first != name) out.values[i].first = name;
    copy_out(p, p.address(ctx_, b, id), id, out.values[i].second);
  }
}

void Trainer::zero_grad() {
  Model::TrainingCall call(*model_, "Trainer.zero_grad");
  model_->zero_grad();
}

Tensor Trainer::forward(Inputs xs, bool input_grad) {
  Model::TrainingCall call(*model_, "Trainer.forward");
  run_forward(xs, input_grad);
  return pending_output(0);
}

std::vector<Tensor> Trainer::forward_outputs(Inputs xs, bool input_grad) {
  Model::TrainingCall call(*model_, "Trainer.forward");
  run_forward(xs, input_grad);
  std::vector<Tensor> outs;
  for (std::size_t k = 0; k < pending_->outputs.size(); ++k) outs.push_back(pending_output(k));
  return outs;
}

Tensor Trainer::pending_output(std::size_t k) {
  std::array<void*, kMaxInputs> in_ptr{};
  for (std::size_t i = 0; i < pending_inputs_.size(); ++i) in_ptr[i] = pending_inputs_[i].data();
  Bindings b{model_->flat_parameters().data(), std::span<void* const>(in_ptr.data(), pending_inputs_.size()), {}, {}};
  const int id = pending_->outputs.at(k);
  Tensor y;
  copy_out(*pending_, pending_->address(ctx_, b, id), id, y);
  return y;
}

void Trainer::run_forward(Inputs xs, bool input_grad) {
  for (const Tensor& x : xs) check_input(x, "input");
  if (options_.verify_parameters) verify_parameters();
  std::shared_ptr<const Plan> p = plan_for(PlanMode::train_seeded, xs, nullptr, input_grad);
  if (p->device().kind != DeviceKind::cpu)
    throw_value_error("Trainer.forward: the host-driven phases (forward/backward, begin_step) are not implemented ",
                      "for backend '", model_->backend(), "' on ", device_name(p->device()),
                      "; use step() or compute_gradients()");
  std::array<void*, kMaxInputs> in_ptr{};
  hold_inputs(xs, in_ptr);  // backward needs them, and the host may reuse its arrays
  Bindings b{model_->flat_parameters().data(), std::span<void* const>(in_ptr.data(), xs.size()), {}, {}};
  end_tasked_step();
  p->run(ctx_, b, 0, p->forward_end);
  if (options_.verify_parameters) reseal_frozen();
  pending_ = p;
}

void Trainer::check_grad_output(const Plan& p, std::size_t k, const Tensor& g) const {
  const ValueInfo& out = p.graph.info(p.outputs.at(k));
  const std::string which = p.outputs.size() > 1 ? "grad_output " + std::to_string(k) : "grad_output";
  if (g.shape() != out.shape)
    throw_value_error("Trainer.backward: expected ", which, " of shape ", shape_str(out.shape), ", got ",
                      shape_str(g.shape()));
  if (g.dtype() != out.dtype)
    throw_type_error("Trainer.backward: expected ", which, " of dtype ", dtype_name(out.dtype), ", got ",
                     dtype_name(g.dtype()));
  check_input(g, which.c_str());
}

void Trainer::backward(std::span<const Tensor> grad_outputs, Tensor* input_grad) {
  Model::TrainingCall call(*model_, "Trainer.backward");
  if (!pending_) throw_value_error("Trainer.backward: call forward first (each forward allows one backward)");
  std::shared_ptr<const Plan> p = pending_;
  const std::size_t n = p->outputs.size();
  if (grad_outputs.size() != n)
    throw_value_error("Trainer.backward: the model has ", n, " output", n > 1 ? "s" : "", "; got ", grad_outputs.size(),
                      " gradient", grad_outputs.size() == 1 ? "" : "s", " (one per output, in order)");
  bool any = false;
  for (std::size_t k = 0; k < n; ++k) {
    if (grad_outputs[k].defined()) check_grad_output(*p, k, grad_outputs[k]);
    any = any || grad_outputs[k].defined();
  }
  if (!any) throw_value_error("Trainer.backward: expected grad_output" , n > 1 ? "s (at least one)" : "", ", got none");
  if (input_grad && p->input_grads.empty())
    throw_value_error("Trainer.backward: input gradient requested but forward was called without input_grad=True");
  // Member buffers, sized once: a steady host-driven loop allocates nothing here.
  scaled_seeds_.resize(n);
  seed_copies_.resize(n);  // non-contiguous gradients, or zeros for an output without one
  seed_ptrs_.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const Tensor* g = &grad_outputs[k];
    if (!g->defined()) {
      const ValueInfo& out = p->graph.info(p->outputs[k]);
      Tensor& zeros = seed_copies_[k];
      if (!zeros.defined() || zeros.shape() != out.shape || zeros.dtype() != out.dtype)
        zeros = Tensor(out.shape, out.dtype);
      std::memset(zeros.data(), 0, zeros.nbytes());
      g = &zeros;
    }
    seed_ptrs_[k] = scaled_grad_output(*g, seed_copies_[k], scaled_seeds_[k]).data();
  }
  std::array<void*, kMaxInputs> in_ptr{};
  for (std::size_t i = 0; i < pending_inputs_.size(); ++i) in_ptr[i] = pending_inputs_[i].data();
  Bindings b{model_->flat_parameters().data(), std::span<void* const>(in_ptr.data(), pending_inputs_.size()), {},
             std::span<void* const>(seed_ptrs_.data(), n)};
  p->run(ctx_, b, p->forward_end, p->num_steps());
  p->accumulate_param_grads(ctx_, b, model_->flat_gradients().data());
  pending_.reset();
  if (input_grad) {
    int id = p->input_grads.at(0);
    *input_grad = Tensor(pending_inputs_[0].shape(), pending_inputs_[0].dtype());
    if (id >= 0) std::memcpy(input_grad->data(), p->address(ctx_, b, id), input_grad->nbytes());
  }
}

// The seed of the host-driven backward: grad_output itself (`copy` when it is not contiguous), or
// with loss scaling grad_output times the scale (in a buffer the trainer keeps), so that update()
// unscales every kind of step alike.
const Tensor& Trainer::scaled_grad_output(const Tensor& grad_output, Tensor& copy, Tensor& scaled) {
  if (!scaler_) return grad_output.is_contiguous() ? grad_output : (copy = grad_output.clone());
  if (!scaled.defined() || scaled.shape() != grad_output.shape() || scaled.dtype() != grad_output.dtype())
    scaled = Tensor(grad_output.shape(), grad_output.dtype());
  scaled.copy_from(grad_output);
  const float s = scaler_->scale();
  if (scaled.dtype() == DType::f32) {
    float* p = scaled.data_as<float>();
    for (int64_t i = 0; i < scaled.numel(); ++i) p[i] *= s;
  } else {
    double* p = scaled.data_as<double>();
    for (int64_t i = 0; i < scaled.numel(); ++i) p[i] *= static_cast<double>(s);
  }
  return scaled;
}

void* Trainer::loss_seed(DType loss_dtype) {
  if (!scaler_) return nullptr;
  const float s = scaler_->scale();
  if (loss_dtype == DType::f32) {
    std::memcpy(seed_value_, &s, sizeof s);
  } else {
    const double d = s;
    std::memcpy(seed_value_, &d, sizeof d);
  }
  return seed_value_;
}

float Trainer::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }

int64_t Trainer::loss_scale_growth_tracker() const { return scaler_ ? scaler_->growth_tracker() : 0; }

void Trainer::set_loss_scale_state(double scale, int64_t growth_tracker) {
  if (scaler_) scaler_->set_state(scale, growth_tracker, "Trainer.set_loss_scale_state");
}

namespace {

// update()'s pieces on the host's buffers.
class HostUpdateSteps final : public UpdateSteps {
 public:
  HostUpdateSteps(Model& model, Optimizer& optimizer, Schedule* schedule, Executor& exec)
      : model_(model), optimizer_(optimizer), schedule_(schedule), exec_(exec) {}

  bool unscale(float inv_scale) override {
    return unscale_gradients(model_.trainable_gradients(), inv_scale, exec_);
  }

  // The global norm in double: finite exactly when every gradient is finite and the norm does not
  // overflow, which is what clipping and the update need.
  bool gradients_finite() override {
    const Tensor& g = model_.trainable_gradients();
    double sum = 0;
    if (g.dtype() == DType::f32) {
      const float* p = g.data_as<float>();
      for (int64_t i = 0; i < g.numel(); ++i) sum += static_cast<double>(p[i]) * p[i];
    } else {
      const double* p = g.data_as<double>();
      for (int64_t i = 0; i < g.numel(); ++i) sum += p[i] * p[i];
    }
    return std::isfinite(std::sqrt(sum));
  }

  void clip(double max_norm) override { clip_grad_norm(model_.trainable_gradients(), max_norm, exec_); }

  // Each parameter group at its own (scheduled) lr; without groups that is current_lr().
  void optimizer_step() override {
    optimizer_.step(model_.trainable_parameters(), model_.trainable_gradients(), schedule_, exec_);
  }

 private:
  Model& model_;
  Optimizer& optimizer_;
  Schedule* schedule_;
  Executor& exec_;
};

}  // namespace

void Trainer::update() {
  Model::TrainingCall call(*model_, "Trainer.update");
  ExecutorRun run(ctx_.executor());
  follow_model_dtype();
  if (optimizer_->numel() != model_->num_trainable() || optimizer_->dtype() != model_->dtype())
    throw_type_error("Trainer.update: the model changed (dtype ", dtype_name(model_->dtype()), ", ",
                     model_->num_trainable(), " trainable values) since the optimizer was bound (",
                     dtype_name(optimizer_->dtype()), ", ", optimizer_->numel(), "); create a new optimizer");
  if (on_device()) {
    DeviceTrainer& device = device_trainer();
    device.check_support("Trainer.update");
    return apply_update(device.update_steps());
  }
  if (device_) device_->optimizer_to_host(true);  // back from the device: the host state is updated now
  HostUpdateSteps host(*model_, *optimizer_, schedule_.get(), ctx_.executor());
  apply_update(host);
}

void Trainer::apply_update(UpdateSteps& steps) {
  if (scaler_ && !scaler_->update(steps.unscale(scaler_->inv_scale()))) {
    ++skipped_;  // the scaler's rule skips a step with a non-finite gradient (and lowers the scale)
    return;
  }
  if (options_.skip_nonfinite && !steps.gradients_finite()) {
    ++skipped_;
    return;
  }
  if (options_.verify_parameters) verify_parameters();  // never bake a corrupted value into an update
  if (options_.clip_grad_norm > 0) steps.clip(options_.clip_grad_norm);
  steps.optimizer_step();
  if (options_.verify_parameters) reseal_parameters();
}

void Trainer::follow_model_dtype() {
  // model.to(dtype) keeps the layout: the optimizer's state is converted with it and keeps its step
  // count, so training goes on where it was.
  if (optimizer_->dtype() == model_->dtype() || optimizer_->numel() != model_->num_trainable()) return;
  if (device_) device_->optimizer_to_host(true);
  optimizer_->bind(model_->trainable_layout(), model_->num_trainable(), model_->dtype());
}

// FNV-1a over the bytes of each parameter slot: cheap, and any flipped bit changes it.
std::vector<uint64_t> Trainer::checksum_parameters(std::size_t first_slot) const {
  const std::vector<ParamSlot>& layout = model_->layout();
  const std::size_t es = dtype_size(model_->dtype());
  const auto* base = static_cast<const unsigned char*>(model_->flat_parameters().data());
  std::vector<uint64_t> sums(layout.size(), 0);
  for (std::size_t i = first_slot; i < layout.size(); ++i) {
    uint64_t h = 14695981039346656037ull;
    const unsigned char* p = base + layout[i].offset * es;
    for (std::size_t k = 0, n = static_cast<std::size_t>(layout[i].numel) * es; k < n; ++k)
      h = (h ^ p[k]) * 1099511628211ull;
    sums[i] = h;
  }
  return sums;
}

void Trainer::reseal_parameters() {
  checksums_ = checksum_parameters(0);
  sealed_generation_ = model_->generation();
}

void Trainer::reseal_frozen() {
  if (checksums_.size() != model_->layout().size() || sealed_generation_ != model_->generation())
    return reseal_parameters();
  const std::vector<ParamSlot>& layout = model_->layout();
  std::vector<uint64_t> now = checksum_parameters(model_->trainable_layout().size());
  for (std::size_t i = model_->trainable_layout().size(); i < layout.size(); ++i) checksums_[i] = now[i];
}

void Trainer::verify_parameters() const {
  const std::vector<ParamSlot>& layout = model_->layout();
  // Nothing recorded yet, or the model re-packed its buffer (a dtype change) since.
  if (checksums_.size() != layout.size() || sealed_generation_ != model_->generation()) return;
  std::vector<uint64_t> now = checksum_parameters(0);
  std::string bad;
  for (std::size_t i = 0; i < layout.size(); ++i)
    if (now[i] != checksums_[i]) bad += (bad.empty() ? "'" : ", '") + layout[i].name + "'";
  if (!bad.empty())
    throw_runtime_error("Trainer: parameter checksum mismatch in ", bad, " before update ", steps() + 1,
                        ": the parameters changed outside an update (memory corruption, or a deliberate write: ",
                        "call reseal_parameters() after editing them)");
}

}  // namespace treadle

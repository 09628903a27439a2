#include "treadle/trainer.hpp"

#include <cmath>
#include <cstring>

#include "core/plan.hpp"
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

double read_scalar(const void* p, DType dt) {
  return dt == DType::f32 ? static_cast<double>(*static_cast<const float*>(p)) : *static_cast<const double*>(p);
}
}  // namespace

Trainer::Trainer(std::shared_ptr<Model> model, Loss loss, std::shared_ptr<Optimizer> optimizer,
                 TrainerOptions options, Executor* executor, uint64_t seed)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(std::move(optimizer)), options_(options),
      ctx_(executor, seed) {
  if (!model_) throw_value_error("Trainer: model is null");
  if (!optimizer_) throw_value_error("Trainer: optimizer is null");
  optimizer_->bind(model_->trainable_layout(), model_->num_trainable(), model_->dtype());
}

Trainer::~Trainer() = default;

void Trainer::check_input(const Tensor& t, const char* what) const {
  if (!t.defined()) throw_value_error("Trainer: ", what, " is undefined");
  if (options_.check_finite && !tensor_finite(t)) throw_value_error("Trainer: ", what, " contains NaN or Inf");
}

double Trainer::current_lr() const {
  return schedule_ ? schedule_->lr_at(optimizer_->step_count(), optimizer_->lr()) : optimizer_->lr();
}

std::shared_ptr<const Plan> Trainer::plan_for(PlanMode mode, const Tensor& x, const Tensor* y, bool input_grad) {
  CachedPlan& c = cache_[static_cast<int>(mode)];
  if (c.plan && c.generation == model_->generation() && c.x_shape == x.shape() && c.x_dtype == x.dtype() &&
      c.input_grad == input_grad && (!y || (c.y_shape == y->shape() && c.y_dtype == y->dtype())))
    return c.plan;
  const uint64_t generation = model_->generation();
  PlanKey key = model_->infer_key({x});
  key.mode = mode;
  key.input_grad = input_grad;
  if (y) {
    // The target's dtype is checked before compiling so the error names the loss, not an op.
    if (y->dtype() != loss_.target_dtype(model_->dtype()))
      throw_type_error(loss_.kind, ": expected target of dtype ", dtype_name(loss_.target_dtype(model_->dtype())),
                       ", got ", dtype_name(y->dtype()));
    key.loss_key = loss_.key();
    key.target_shape = y->shape();
    key.target_dtype = y->dtype();
  }
  c = CachedPlan{generation, x.shape(), y ? y->shape() : Shape{}, x.dtype(), y ? y->dtype() : DType::f32, input_grad,
                 model_->plan(key, y ? &loss_ : nullptr)};
  return c.plan;
}

double Trainer::run_loss_plan(const Tensor& x, const Tensor& y, PlanMode mode) {
  check_input(x, "input");
  check_input(y, "target");
  std::shared_ptr<const Plan> p = plan_for(mode, x, &y, false);
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  loss_.check_target(out.shape, out.dtype, y);  // e.g. class indices in range, before any compute
  Tensor x_copy, y_copy;  // only for non-contiguous inputs
  const Tensor& xc = x.is_contiguous() ? x : (x_copy = x.clone());
  const Tensor& yc = y.is_contiguous() ? y : (y_copy = y.clone());
  void* in_ptr[1] = {xc.data()};
  void* tgt_ptr[1] = {yc.data()};
  Bindings b{model_->flat_parameters().data(), in_ptr, tgt_ptr, {}};
  pending_.reset();  // this run reuses the context's activation memory: a pending backward is void
  p->run(ctx_, b, 0, p->num_steps());
  if (mode == PlanMode::train_loss) {
    p->accumulate_param_grads(ctx_, b, model_->flat_gradients().data());
    pending_.reset();
  }
  return read_scalar(p->address(ctx_, b, p->loss), p->graph.info(p->loss).dtype);
}

double Trainer::step(const Tensor& x, const Tensor& y) {
  zero_grad();
  double loss = run_loss_plan(x, y, PlanMode::train_loss);
  if (options_.check_finite && !std::isfinite(loss))
    throw_value_error("Trainer.step: loss is ", loss, "; parameters left unchanged");
  update();
  return loss;
}

double Trainer::compute_gradients(const Tensor& x, const Tensor& y) {
  return run_loss_plan(x, y, PlanMode::train_loss);
}

double Trainer::evaluate(const Tensor& x, const Tensor& y) { return run_loss_plan(x, y, PlanMode::eval_loss); }

Tensor Trainer::forward(const Tensor& x, bool input_grad) {
  check_input(x, "input");
  std::shared_ptr<const Plan> p = plan_for(PlanMode::train_seeded, x, nullptr, input_grad);
  // Keep a private copy of the input: backward needs it, and the host may reuse its array.
  if (!pending_input_.defined() || pending_input_.shape() != x.shape() || pending_input_.dtype() != x.dtype())
    pending_input_ = Tensor(x.shape(), x.dtype());
  pending_input_.copy_from(x);
  void* in_ptr[1] = {pending_input_.data()};
  Bindings b{model_->flat_parameters().data(), in_ptr, {}, {}};
  p->run(ctx_, b, 0, p->forward_end);
  pending_ = p;
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  Tensor y(out.shape, out.dtype);
  std::memcpy(y.data(), p->address(ctx_, b, p->outputs[0]), y.nbytes());
  return y;
}

void Trainer::backward(const Tensor& grad_output, Tensor* input_grad) {
  if (!pending_) throw_value_error("Trainer.backward: call forward first (each forward allows one backward)");
  std::shared_ptr<const Plan> p = pending_;
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  if (!grad_output.defined() || grad_output.shape() != out.shape)
    throw_value_error("Trainer.backward: expected grad_output of shape ", shape_str(out.shape), ", got ",
                      grad_output.defined() ? shape_str(grad_output.shape()) : "none");
  if (grad_output.dtype() != out.dtype)
    throw_type_error("Trainer.backward: expected grad_output of dtype ", dtype_name(out.dtype), ", got ",
                     dtype_name(grad_output.dtype()));
  if (input_grad && p->input_grads.empty())
    throw_value_error("Trainer.backward: input gradient requested but forward was called without input_grad=True");
  check_input(grad_output, "grad_output");
  Tensor g_copy;
  const Tensor& g = grad_output.is_contiguous() ? grad_output : (g_copy = grad_output.clone());
  void* in_ptr[1] = {pending_input_.data()};
  void* seed_ptr[1] = {g.data()};
  Bindings b{model_->flat_parameters().data(), in_ptr, {}, seed_ptr};
  p->run(ctx_, b, p->forward_end, p->num_steps());
  p->accumulate_param_grads(ctx_, b, model_->flat_gradients().data());
  pending_.reset();
  if (input_grad) {
    int id = p->input_grads.at(0);
    *input_grad = Tensor(pending_input_.shape(), pending_input_.dtype());
    if (id >= 0) std::memcpy(input_grad->data(), p->address(ctx_, b, id), input_grad->nbytes());
  }
}

void Trainer::update() {
  if (optimizer_->numel() != model_->num_trainable() || optimizer_->dtype() != model_->dtype())
    throw_type_error("Trainer.update: the model changed (dtype ", dtype_name(model_->dtype()), ", ",
                     model_->num_trainable(), " trainable values) since the optimizer was bound (",
                     dtype_name(optimizer_->dtype()), ", ", optimizer_->numel(), "); create a new optimizer");
  const Tensor& grads = model_->trainable_gradients();
  if (options_.clip_grad_norm > 0) clip_grad_norm(grads, options_.clip_grad_norm, ctx_.executor());
  optimizer_->step(model_->trainable_parameters(), grads, current_lr(), ctx_.executor());
}

}  // namespace treadle

#pragma once
// Optimizers update the model's one flat parameter buffer from its one flat gradient buffer in a
// single fused pass; their state (momentum, moments, accumulators) lives in flat buffers of the
// same layout. Formulas follow torch.optim exactly, so the same hyper-parameters give the same steps.
// Only float32 and float64 buffers are supported; arithmetic runs in the buffers' dtype.
// Parameter groups (torch's param_groups) give sets of parameters their own hyper-parameters: the
// update still makes one pass over the flat buffers, segment by segment with each segment's
// group coefficients; parameters in no group are not updated.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "treadle/executor.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

// Where one named parameter lives in the flat buffers (offset in elements).
struct ParamSlot {
  std::string name;
  Shape shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

class Schedule;

// Hyper-parameters of a set of parameters, by slot name: overrides of the optimizer's options under
// torch's names ("lr", "weight_decay", "momentum", "beta1", "beta2", "eps", flags as 0 or 1).
struct ParamGroup {
  std::vector<std::string> params;
  std::vector<std::pair<std::string, double>> options;
};

class TREADLE_API Optimizer {
 public:
  explicit Optimizer(double lr) : lrs_{lr}, step_lrs_{lr} {}
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  // Allocates zeroed state for a flat buffer of `total` elements with this layout (slots must lie
  // inside [0, total) without overlapping; elements between slots are padding). Called by the
  // trainer once, and again after the model changes dtype: re-binding the same layout converts the
  // existing state to the new dtype and keeps step_count(); a different layout starts afresh (t = 0).
  void bind(const std::vector<ParamSlot>& layout, int64_t total, DType dtype);
  bool bound() const { return bound_; }
  int64_t numel() const { return total_; }
  DType dtype() const { return dtype_; }
  // One update: params -= f(grads, state). `lr` is the learning rate for this step (after any
  // schedule). Increments step_count() first, so update t (1-based, as torch's `step`) is
  // step_count() afterwards. Both buffers must be contiguous, on the CPU, of the bound dtype and
  // size. Allocates nothing; big buffers are split over `exec` with results independent of chunking.
  // With parameter groups, `lr` is used by every group for this update.
  void step(const Tensor& params, const Tensor& grads, double lr, Executor& exec);
  // The same update with each group at its own lr, mapped through `schedule` when given
  // (schedule->lr_at(step_count(), group_lr(g)), torch's per-group base lrs).
  void step(const Tensor& params, const Tensor& grads, const Schedule* schedule, Executor& exec);

  // The lr of group 0 (the only group without parameter groups).
  double lr() const { return lrs_[0]; }
  int64_t step_count() const { return t_; }
  // Both refuse (ValueError, nothing changed) what no update could use: a negative or non-finite
  // learning rate, a negative step count.
  void set_lr(double lr) { set_group_lr(0, lr); }
  void set_step_count(int64_t t);

  // Replaces the groups (before bind, or followed by a re-bind: state restarts when the layout
  // changes). Each option is checked against the optimizer's own (unknown keys and invalid values
  // are ValueErrors naming them; nothing changes on a refusal); a parameter in two groups is refused.
  // At bind, names that are not trainable slots are skipped (a frozen parameter, like a torch
  // parameter without a gradient). An empty list means one group of every parameter.
  void set_param_groups(const std::vector<ParamGroup>& groups);
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // One set of options over every trainable parameter: no groups, or one group holding them all
  // (what torch's `Adam(model.parameters())` gives). Known after bind.
  bool uniform_options() const { return groups_.empty() || one_full_group_; }
  // Counts changes of the options other than lr (set_param_groups, set_group_option), so a caller
  // that mirrors them (the device trainer) asks again only when they changed.
  uint64_t options_version() const { return options_version_; }
  int num_groups() const { return static_cast<int>(lrs_.size()); }
  double group_lr(int g) const;
  void set_group_lr(int g, double lr);
  // Changes one option of group g between updates (OneCycleLR cycles "momentum" or "beta1"): "lr"
  // as set_group_lr, any other key checked like set_param_groups. A change that would add or drop a
  // state buffer (momentum from 0, amsgrad) is refused: create the optimizer with it instead.
  void set_group_option(int g, const std::string& key, double value);
  // The (begin, end, group) element ranges an update walks, in flat order (after bind).
  std::vector<std::tuple<int64_t, int64_t, int>> segments() const;

  // An optimizer's state belongs to one model: the trainers of that model share it (a notebook
  // that re-creates its trainer keeps the optimizer), and while any of them lives, a trainer of
  // another model (or a manual bind) is refused before anything changes. claim() is called by
  // the Trainer constructor and release() by its destructor.
  void claim(const void* model, const char* who);
  void release(const void* model);
  bool claimed() const { return claims_ > 0; }
  // Named 1-D state buffers (torch's state keys: "momentum_buffer", "exp_avg", "sum", ...), for
  // checkpoints and tests. Element-wise optimizers mirror the flat parameter buffer; row/column-wise
  // AdaGrad keeps a compact buffer (see rowwise_adagrad). Writing into them is how a checkpoint is
  // restored (with set_step_count).
  std::vector<std::pair<std::string, Tensor>>& state() { return state_; }
  const std::vector<ParamSlot>& layout() const { return layout_; }
  // The update as a rule a device backend runs itself (the trainer of backend "cuda"): its family,
  // whether weight decay is decoupled (AdamW), and the options other than lr by their field names
  // (flags as 0 or 1; the first group's: the trainer refuses groups with other options). Absent for
  // optimizers whose update runs on the host only. A device trainer asks this, never the name.
  struct UpdateRule {
    enum class Family : uint8_t { sgd, adam };
    Family family = Family::sgd;
    bool decoupled_weight_decay = false;
    std::vector<std::pair<std::string, double>> options;
  };
  virtual std::optional<UpdateRule> update_rule() const { return std::nullopt; }

 protected:
  virtual std::vector<std::string> state_names() const = 0;
  // Elements of state buffer i (layout_ and total_ are set when this is asked); default: total_.
  virtual int64_t state_numel(int /*i*/) const { return total_; }
  // After zero-allocation (e.g. AdaGrad's initial accumulator, per-slot tables, scratch space).
  virtual void initialize_state() {}
  // Each group's options from its overrides (empty `groups`: one group of the defaults). Throws
  // ValueError for an unknown key or invalid value; the default refuses groups altogether.
  virtual void configure_groups(const std::vector<ParamGroup>& groups);
  // One option of group g (not "lr"); the default refuses, like configure_groups.
  virtual void change_group_option(int g, const std::string& key, double value);
  // One update; step_lrs_[g] is group g's lr for it and segments_ the ranges to update.
  virtual void update(const Tensor& params, const Tensor& grads, Executor& exec) = 0;
  Tensor& state_buffer(int i) { return state_.at(i).second; }

 private:
  void build_segments();
  void check_step(const Tensor& params, const Tensor& grads) const;
  void run_update(const Tensor& params, const Tensor& grads, Executor& exec);

 protected:

  // A run of flat elements [begin, end) whose slots all belong to group `group`.
  struct Segment {
    int64_t begin, end;
    int group;
  };
  std::vector<Segment> segments_;  // built at bind
  std::vector<double> lrs_;        // per group
  std::vector<double> step_lrs_;   // per group, for the update in progress
  std::vector<ParamGroup> groups_;
  bool one_full_group_ = false;     // set at bind (build_segments)
  uint64_t options_version_ = 0;
  int64_t t_ = 0;
  bool bound_ = false;
  DType dtype_ = DType::f32;
  int64_t total_ = 0;
  std::vector<ParamSlot> layout_;
  std::vector<std::pair<std::string, Tensor>> state_;
  const void* claimed_for_ = nullptr;  // the model of the trainers holding this optimizer
  int claims_ = 0;
};

namespace optim {

struct SGDOptions {
  double lr = 1e-2, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};
struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false;
};
struct RMSpropOptions {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0.0, momentum = 0.0;
  bool centered = false;
};
struct AdagradOptions {
  double lr = 1e-2, lr_decay = 0.0, weight_decay = 0.0, initial_accumulator_value = 0.0, eps = 1e-10;
};
struct AdadeltaOptions {
  double lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0.0;
};
struct AdamaxOptions {
  double lr = 2e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
struct NAdamOptions {
  double lr = 2e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;
};
struct RAdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false;
};

TREADLE_API std::shared_ptr<Optimizer> sgd(const SGDOptions& o);
TREADLE_API std::shared_ptr<Optimizer> adam(const AdamOptions& o);
// AdamW: decoupled weight decay, p *= 1 - lr * weight_decay before the Adam step. AdamOptions'
// weight_decay defaults to 0; torch.optim.AdamW's (and treadle.optim.AdamW's) default is 1e-2.
TREADLE_API std::shared_ptr<Optimizer> adamw(const AdamOptions& o);
TREADLE_API std::shared_ptr<Optimizer> rmsprop(const RMSpropOptions& o);
TREADLE_API std::shared_ptr<Optimizer> adagrad(const AdagradOptions& o);
// Matrix-aware AdaGrad: one accumulator per row (or column) of each 2-D weight, fed by the mean of
// the squared gradients in that row (column); other tensors fall back to element-wise AdaGrad, bit
// for bit. With g = grad + weight_decay * p and clr = lr / (1 + (t - 1) * lr_decay), for a (R, C)
// slot: acc[r] += mean_c g[r, c]^2; p[r, c] -= clr * g[r, c] / (sqrt(acc[r]) + eps).
// The state "sum" is compact: slot by slot in layout order, R (rows) or C (columns) entries for a
// 2-D slot and numel entries otherwise; padding between slots is neither stored nor updated.
TREADLE_API std::shared_ptr<Optimizer> rowwise_adagrad(const AdagradOptions& o);
TREADLE_API std::shared_ptr<Optimizer> columnwise_adagrad(const AdagradOptions& o);
// torch.optim.Adadelta, Adamax, NAdam (momentum_decay schedule; its product of momentum factors
// mu_product is kept per group) and RAdam (rectified Adam), single-tensor formulas.
TREADLE_API std::shared_ptr<Optimizer> adadelta(const AdadeltaOptions& o);
TREADLE_API std::shared_ptr<Optimizer> adamax(const AdamaxOptions& o);
TREADLE_API std::shared_ptr<Optimizer> nadam(const NAdamOptions& o);
TREADLE_API std::shared_ptr<Optimizer> radam(const RAdamOptions& o);

}  // namespace optim

// Learning-rate schedules, evaluated per optimizer step (closed forms of torch.optim.lr_scheduler).
class TREADLE_API Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  virtual std::string name() const = 0;
};

// Each lr_at(t, base_lr) equals the lr torch's scheduler gives after t calls of .step() (one per
// optimizer step), i.e. the lr of update t + 1; t < 0 is a ValueError.
namespace schedule {
// base_lr * factor for t < total_iters, then base_lr (torch's ConstantLR; the default is constant).
TREADLE_API std::shared_ptr<Schedule> constant(double factor = 1.0, int64_t total_iters = 0);
// base_lr * gamma^(t / step_size) (StepLR).
TREADLE_API std::shared_ptr<Schedule> step(int64_t step_size, double gamma = 0.1);
// base_lr * gamma^t (ExponentialLR).
TREADLE_API std::shared_ptr<Schedule> exponential(double gamma);
// eta_min + (base_lr - eta_min) * (1 + cos(pi * t / t_max)) / 2 (CosineAnnealingLR). As in torch,
// the cosine is not clamped: past t_max the lr rises again (period 2 * t_max).
TREADLE_API std::shared_ptr<Schedule> cosine(int64_t t_max, double eta_min = 0.0);
// Linear warm-up from start_factor*lr to lr over `warmup` steps, then cosine to eta_min at `total`
// (torch: SequentialLR of LinearLR(start_factor, total_iters=warmup) and
// CosineAnnealingLR(T_max=total - warmup, eta_min) with milestone warmup; unclamped like cosine).
TREADLE_API std::shared_ptr<Schedule> warmup_cosine(int64_t warmup, int64_t total, double eta_min = 0.0,
                                                    double start_factor = 0.0);
}  // namespace schedule

// Scales `grads` in place so that its global L2 norm is at most max_norm (torch's
// clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1). Returns the norm before clipping.
// max_norm must be >= 0. A non-finite norm is returned as is and scales the gradients to NaN, as torch.
TREADLE_API double clip_grad_norm(const Tensor& grads, double max_norm);
// Same, split over `exec`; the result does not depend on the executor (fixed blocks, ordered sum).
TREADLE_API double clip_grad_norm(const Tensor& grads, double max_norm, Executor& exec);

}  // namespace treadle

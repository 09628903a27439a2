// The Optimizer base: binding a flat layout (state allocation happens here, never in step) and the
// checks every step makes before the fused update of a concrete optimizer runs.
#include <algorithm>
#include <cmath>

#include "treadle/error.hpp"
#include "treadle/optim.hpp"

namespace treadle {
namespace {

bool same_layout(const std::vector<ParamSlot>& a, const std::vector<ParamSlot>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].offset != b[i].offset ||
        a[i].numel != b[i].numel)
      return false;
  }
  return true;
}

// Slots must be consistent (numel matches shape), inside [0, total) and pairwise disjoint, so the
// per-slot optimizers (row-wise AdaGrad) never touch an element twice.
void check_layout(const std::string& who, const std::vector<ParamSlot>& layout, int64_t total) {
  if (total < 0) throw_value_error(who, ".bind: total must be >= 0, got ", total);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(layout.size());
  for (const ParamSlot& s : layout) {
    for (int64_t d : s.shape)
      if (d < 0) throw_value_error(who, ".bind: slot '", s.name, "' has a negative dimension in ", shape_str(s.shape));
    if (s.numel != shape_numel(s.shape))
      throw_value_error(who, ".bind: slot '", s.name, "' has numel ", s.numel, " but shape ", shape_str(s.shape),
                        " holds ", shape_numel(s.shape));
    if (s.offset < 0 || s.offset + s.numel > total)
      throw_value_error(who, ".bind: slot '", s.name, "' spans [", s.offset, ", ", s.offset + s.numel,
                        ") outside the flat buffer of ", total, " elements");
    ranges.emplace_back(s.offset, s.offset + s.numel);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second)
      throw_value_error(who, ".bind: slots overlap at element ", ranges[i].first);
  }
}

template <typename From, typename To>
void convert_into(const Tensor& from, const Tensor& to) {
  const From* src = from.data_as<From>();
  To* dst = to.data_as<To>();
  for (int64_t i = 0, n = from.numel(); i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

// Copies `from` into `to` (same numel), converting between float32 and float64.
void copy_converting(const Tensor& from, const Tensor& to) {
  const bool f32_in = from.dtype() == DType::f32, f32_out = to.dtype() == DType::f32;
  if (f32_in && f32_out) convert_into<float, float>(from, to);
  if (f32_in && !f32_out) convert_into<float, double>(from, to);
  if (!f32_in && f32_out) convert_into<double, float>(from, to);
  if (!f32_in && !f32_out) convert_into<double, double>(from, to);
}

// Checked on every step, so the optimizer's name (a std::string) is only built for the message.
void check_buffer(const Optimizer& o, const char* what, const Tensor& t, DType dtype, int64_t total) {
  if (!t.defined()) throw_value_error(o.name(), ".step: ", what, " is an undefined tensor");
  if (t.device().kind != DeviceKind::cpu)
    throw_type_error(o.name(), ".step: ", what, " must be on the CPU, got ", device_name(t.device()));
  if (t.dtype() != dtype)
    throw_type_error(o.name(), ".step: ", what, " has dtype ", dtype_name(t.dtype()),
                     " but the optimizer is bound to ", dtype_name(dtype));
  if (t.numel() != total)
    throw_value_error(o.name(), ".step: ", what, " has ", t.numel(), " elements but the optimizer is bound to ",
                      total);
  if (!t.is_contiguous()) throw_type_error(o.name(), ".step: ", what, " must be contiguous");
}

}  // namespace

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr))
    throw_value_error(name(), ": invalid lr (learning rate) value: ", lr, " (must be finite and >= 0)");
  lr_ = lr;
}

void Optimizer::set_step_count(int64_t t) {
  if (t < 0) throw_value_error(name(), ": invalid step count ", t, " (must be >= 0)");
  t_ = t;
}

void Optimizer::claim(const void* model, const char* who) {
  if (claims_ > 0 && claimed_for_ != model)
    throw_value_error(who, ": this ", name(), " already serves a trainer of another model; its state (step count, ",
                      "moments) belongs to that model, so create one optimizer per model");
  claimed_for_ = model;
  ++claims_;
}

void Optimizer::release(const void* model) {
  if (claims_ > 0 && claimed_for_ == model && --claims_ == 0) claimed_for_ = nullptr;
}

void Optimizer::bind(const std::vector<ParamSlot>& layout, int64_t total, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error(name(), ".bind: only float32 and float64 parameters are supported, got ", dtype_name(dtype));
  check_layout(name(), layout, total);
  const bool keep = bound_ && total == total_ && same_layout(layout, layout_);
  std::vector<std::pair<std::string, Tensor>> old = std::move(state_);
  state_.clear();
  layout_ = layout;
  total_ = total;
  dtype_ = dtype;
  bound_ = false;  // until the state is complete
  const std::vector<std::string> names = state_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    state_.emplace_back(names[i], Tensor(Shape{state_numel(static_cast<int>(i))}, dtype));
  initialize_state();
  if (keep && old.size() == state_.size()) {
    for (std::size_t i = 0; i < old.size(); ++i) copy_converting(old[i].second, state_[i].second);
  } else {
    t_ = 0;
  }
  bound_ = true;
}

void Optimizer::step(const Tensor& params, const Tensor& grads, double lr, Executor& exec) {
  if (!bound_) throw_runtime_error(name(), ".step: the optimizer is not bound; call bind(layout, total, dtype) first");
  check_buffer(*this, "params", params, dtype_, total_);
  check_buffer(*this, "grads", grads, dtype_, total_);
  if (!(lr >= 0.0) || !std::isfinite(lr)) throw_value_error(name(), ".step: invalid learning rate: ", lr);
  // An executor runs every chunk before it rethrows (its contract), so an update that raises was
  // still applied in full: the step counts either way, keeping bias corrections in step.
  ++t_;
  update(params, grads, lr, exec);
}

}  // namespace treadle

// The Optimizer base: binding a flat layout (state allocation happens here, never in step) and the
// checks every step makes before the fused update of a concrete optimizer runs.
#include <algorithm>
#include <cmath>
#include <unordered_map>

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

void check_lr(const Optimizer& o, double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr))
    throw_value_error(o.name(), ": invalid lr (learning rate) value: ", lr, " (must be finite and >= 0)");
}

}  // namespace

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

double Optimizer::group_lr(int g) const {
  if (g < 0 || g >= num_groups())
    throw_value_error(name(), ": no parameter group ", g, " (the optimizer has ", num_groups(), ")");
  return lrs_[static_cast<std::size_t>(g)];
}

void Optimizer::set_group_lr(int g, double lr) {
  group_lr(g);  // checks g
  check_lr(*this, lr);
  lrs_[static_cast<std::size_t>(g)] = lr;
}

std::vector<std::tuple<int64_t, int64_t, int>> Optimizer::segments() const {
  std::vector<std::tuple<int64_t, int64_t, int>> out;
  for (const Segment& s : segments_) out.emplace_back(s.begin, s.end, s.group);
  return out;
}

void Optimizer::configure_groups(const std::vector<ParamGroup>& groups) {
  if (!groups.empty()) throw_value_error(name(), ": parameter groups are not supported by this optimizer");
}

void Optimizer::change_group_option(int, const std::string& key, double) {
  throw_value_error(name(), ": option '", key, "' cannot change between updates");
}

void Optimizer::set_group_option(int g, const std::string& key, double value) {
  if (key == "lr") return set_group_lr(g, value);
  group_lr(g);  // checks g
  if (!std::isfinite(value)) throw_value_error(name(), ": invalid ", key, " value: ", value, " (must be finite)");
  change_group_option(g, key, value);
  ++options_version_;
  if (!groups_.empty()) {
    auto& opts = groups_[static_cast<std::size_t>(g)].options;
    auto it = std::find_if(opts.begin(), opts.end(), [&](const auto& kv) { return kv.first == key; });
    if (it == opts.end())
      opts.emplace_back(key, value);
    else
      it->second = value;
  }
}

void Optimizer::set_param_groups(const std::vector<ParamGroup>& groups) {
  std::unordered_map<std::string, std::size_t> owner;
  std::vector<double> lrs;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    double lr = lrs_[0];
    for (const auto& [key, value] : groups[g].options)
      if (key == "lr") lr = value;
    check_lr(*this, lr);
    lrs.push_back(lr);
    for (const std::string& p : groups[g].params) {
      auto [it, fresh] = owner.emplace(p, g);
      if (!fresh)
        throw_value_error(name(), ": parameter '", p, "' appears in parameter groups ", it->second, " and ", g,
                          " (a parameter belongs to at most one group)");
    }
  }
  configure_groups(groups);  // checks keys and values; throws before anything below changes
  groups_ = groups;
  ++options_version_;
  if (lrs.empty()) lrs.push_back(lrs_[0]);
  lrs_ = lrs;
  step_lrs_ = lrs;
  if (bound_) {  // new segments (and state, where the groups change which buffers exist)
    const std::vector<ParamSlot> layout = layout_;
    bind(layout, total_, dtype_);
  }
}

// Runs of consecutive slots in the same group, as flat ranges (padding between two slots of one
// group is updated with them: its gradient is zero). Without groups, the whole buffer is one run.
void Optimizer::build_segments() {
  segments_.clear();
  one_full_group_ = false;
  if (groups_.empty()) {
    segments_.push_back({0, total_, 0});
    return;
  }
  std::unordered_map<std::string, int> group_of;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (const std::string& p : groups_[g].params) group_of.emplace(p, static_cast<int>(g));
  std::vector<const ParamSlot*> slots;
  for (const ParamSlot& s : layout_) slots.push_back(&s);
  std::sort(slots.begin(), slots.end(), [](const ParamSlot* a, const ParamSlot* b) { return a->offset < b->offset; });
  int prev = -1;  // group of the previous slot in flat order (-1: in no group)
  for (const ParamSlot* s : slots) {
    auto it = group_of.find(s->name);
    const int g = it == group_of.end() ? -1 : it->second;
    if (g >= 0 && g == prev)
      segments_.back().end = s->offset + s->numel;
    else if (g >= 0)
      segments_.push_back({s->offset, s->offset + s->numel, g});
    prev = g;
  }
  one_full_group_ = groups_.size() == 1 && std::all_of(slots.begin(), slots.end(), [&](const ParamSlot* s) {
                      return group_of.count(s->name) != 0;
                    });
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
  build_segments();
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

void Optimizer::check_step(const Tensor& params, const Tensor& grads) const {
  if (!bound_) throw_runtime_error(name(), ".step: the optimizer is not bound; call bind(layout, total, dtype) first");
  check_buffer(*this, "params", params, dtype_, total_);
  check_buffer(*this, "grads", grads, dtype_, total_);
}

void Optimizer::step(const Tensor& params, const Tensor& grads, double lr, Executor& exec) {
  check_step(params, grads);
  if (!(lr >= 0.0) || !std::isfinite(lr)) throw_value_error(name(), ".step: invalid learning rate: ", lr);
  std::fill(step_lrs_.begin(), step_lrs_.end(), lr);
  run_update(params, grads, exec);
}

void Optimizer::step(const Tensor& params, const Tensor& grads, const Schedule* schedule, Executor& exec) {
  check_step(params, grads);
  for (std::size_t g = 0; g < lrs_.size(); ++g) {
    const double lr = schedule ? schedule->lr_at(t_, lrs_[g]) : lrs_[g];
    if (!(lr >= 0.0) || !std::isfinite(lr))
      throw_value_error(name(), ".step: invalid learning rate ", lr, " for parameter group ", g);
    step_lrs_[g] = lr;
  }
  run_update(params, grads, exec);
}

void Optimizer::run_update(const Tensor& params, const Tensor& grads, Executor& exec) {
  // An executor runs every chunk before it rethrows (its contract), so an update that raises was
  // still applied in full: the step counts either way, keeping bias corrections in step.
  ++t_;
  update(params, grads, exec);
}

}  // namespace treadle

#include "nn/loss_scaler.hpp"

#include <atomic>
#include <cmath>
#include <limits>

#include "backends/eigen/eigen_common.hpp"
#include "treadle/error.hpp"

namespace treadle {

namespace {
constexpr double kMaxFloat = std::numeric_limits<float>::max();

bool positive_float(double x) { return x > 0 && x <= kMaxFloat; }

template <typename T>
bool unscale_impl(const Tensor& grads, T inv, Executor& exec) {
  T* g = grads.data_as<T>();
  std::atomic<bool> found{false};
  eigen::parallel_chunks(exec, grads.numel(), eigen::kElementGrain, [&](int64_t b, int64_t e) {
    bool bad = false;
    for (int64_t i = b; i < e; ++i) {
      bad |= !std::isfinite(g[i]);
      g[i] *= inv;
    }
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}
}  // namespace

void validate_loss_scaling(const LossScaling& o, const char* who) {
  using Mode = LossScaling::Mode;
  if (o.mode != Mode::off && o.mode != Mode::fixed && o.mode != Mode::dynamic)
    throw_value_error(who, ": loss_scaling.mode is not off, fixed or dynamic (", static_cast<int>(o.mode), ")");
  if (o.mode == Mode::off) return;
  if (!positive_float(o.init_scale))
    throw_value_error(who, ": loss_scaling.init_scale must be positive and finite in float32, got ", o.init_scale);
  if (o.mode == Mode::fixed) return;
  if (!(o.growth_factor > 1.0) || !std::isfinite(o.growth_factor))
    throw_value_error(who, ": loss_scaling.growth_factor must be > 1 and finite, got ", o.growth_factor);
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    throw_value_error(who, ": loss_scaling.backoff_factor must be in (0, 1), got ", o.backoff_factor);
  if (o.growth_interval < 1 || o.growth_interval > std::numeric_limits<int32_t>::max())
    throw_value_error(who, ": loss_scaling.growth_interval must be in [1, 2^31 - 1], got ", o.growth_interval);
}

LossScaler::LossScaler(const LossScaling& options) : options_(options) {
  validate_loss_scaling(options, "LossScaler");
  if (options.mode == LossScaling::Mode::off) throw_value_error("LossScaler: loss_scaling.mode is off");
  scale_ = static_cast<float>(options.init_scale);
}

float LossScaler::inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

bool LossScaler::update(bool found_nonfinite) {
  if (!dynamic()) return !found_nonfinite;
  if (found_nonfinite) {
    // A float32 scale times backoff_factor in (0, 1) stays finite; it may reach 0 only after
    // ~150 consecutive overflows, which a finite loss cannot cause.
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  return true;
}

void LossScaler::set_state(double scale, int64_t growth_tracker, const char* who) {
  if (!positive_float(scale) || static_cast<double>(static_cast<float>(scale)) != scale)
    throw_value_error(who, ": the loss scale must be a positive finite float32 value, got ", scale);
  if (growth_tracker < 0) throw_value_error(who, ": the loss scale's growth tracker must be >= 0, got ", growth_tracker);
  if (!dynamic()) return;
  scale_ = static_cast<float>(scale);
  growth_tracker_ = growth_tracker;
}

bool unscale_gradients(const Tensor& grads, float inv_scale, Executor& exec) {
  if (grads.dtype() == DType::f32) return unscale_impl<float>(grads, inv_scale, exec);
  if (grads.dtype() == DType::f64) return unscale_impl<double>(grads, static_cast<double>(inv_scale), exec);
  throw_type_error("unscale_gradients: gradients must be float32 or float64, got ", dtype_name(grads.dtype()));
}

}  // namespace treadle

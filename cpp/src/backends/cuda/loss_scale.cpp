// The host side of dynamic loss scaling: option checks and the scaler's step rule.
#include "backends/cuda/loss_scale.hpp"

#include <cmath>
#include <limits>

#include "treadle/error.hpp"

namespace treadle::cuda {

void validate_loss_scale_options(const LossScaleOptions& o) {
  if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale))
    throw_value_error("loss_scale: init_scale must be positive and finite, got ", o.init_scale);
  if (!(o.growth_factor > 1.0f) || !std::isfinite(o.growth_factor))
    throw_value_error("loss_scale: growth_factor must be > 1 and finite, got ", o.growth_factor);
  if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f))
    throw_value_error("loss_scale: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  if (o.growth_interval < 1 || o.growth_interval > std::numeric_limits<int32_t>::max())
    throw_value_error("loss_scale: growth_interval must be in [1, 2^31 - 1], got ", o.growth_interval);
}

void validate_loss_scale_rule(const LossScaleRule& r) {
  if (!(r.growth_factor > 1.0) || !std::isfinite(r.growth_factor))
    throw_value_error("loss_scale_update: growth_factor must be > 1 and finite, got ", r.growth_factor);
  if (!(r.backoff_factor > 0.0 && r.backoff_factor < 1.0))
    throw_value_error("loss_scale_update: backoff_factor must be in (0, 1), got ", r.backoff_factor);
  if (r.growth_interval < 1)
    throw_value_error("loss_scale_update: growth_interval must be >= 1, got ", r.growth_interval);
}

DynamicLossScaler::DynamicLossScaler(const LossScaleOptions& options) : options_(options) {
  validate_loss_scale_options(options);
  scale_ = options.init_scale;
}

// torch.amp.GradScaler's rule (_amp_update_scale_): back off and restart the count on overflow;
// otherwise count, and grow at the interval (only if the grown scale is finite), restarting the count.
bool DynamicLossScaler::update(bool found_nonfinite) {
  int32_t count = static_cast<int32_t>(good_steps_);
  const bool applied = apply_loss_scale_rule(scale_, count, found_nonfinite, loss_scale_rule(options_));
  good_steps_ = count;
  if (!applied) ++skipped_;
  return applied;
}

}  // namespace treadle::cuda

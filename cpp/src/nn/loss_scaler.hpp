#pragma once
// The host rule of loss scaling (TrainerOptions::loss_scaling), as torch.amp.GradScaler: the scale
// the backward pass is seeded with, the unscaling of the gradients before the update, and the
// scale's update from whether they were finite. Any trainer (the host one, a device one that reads
// its non-finite flag back) calls update(found_nonfinite) once per optimizer step.
#include <cstdint>

#include "treadle/executor.hpp"
#include "treadle/tensor.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// ValueError naming the field unless the options are usable: init_scale positive and finite in
// float32; for dynamic scaling growth_factor > 1 and finite, backoff_factor in (0, 1), growth_interval
// in [1, 2^31 - 1]. `who` names the caller.
void validate_loss_scaling(const LossScaling& o, const char* who);

class LossScaler {
 public:
  // The options are validated; mode must not be off.
  explicit LossScaler(const LossScaling& options);

  const LossScaling& options() const { return options_; }
  bool dynamic() const { return options_.mode == LossScaling::Mode::dynamic; }
  // The current scale (a float32 value, as torch keeps it) and its reciprocal as the unscaling
  // uses it: 1 / scale computed in double, then rounded to float32 (GradScaler.unscale_).
  float scale() const { return scale_; }
  float inv_scale() const;
  // Consecutive finite steps since the scale last changed (torch's growth tracker).
  int64_t growth_tracker() const { return growth_tracker_; }

  // The end of an optimizer step: returns true when the update is to be applied, false (skip it)
  // when some gradient was not finite. Dynamic scaling then multiplies the scale by backoff_factor
  // and restarts the count; after growth_interval consecutive finite steps it multiplies the scale
  // by growth_factor (unless that overflows float32) and restarts the count. A fixed scale never
  // changes. The products are taken in double and rounded to float32, as torch's CPU kernel does.
  bool update(bool found_nonfinite);

  // Restores a saved state (a checkpoint): ValueError naming `who` unless the scale is positive
  // and finite and the count non-negative. Only a dynamic scaler has state to restore.
  void set_state(double scale, int64_t growth_tracker, const char* who);

 private:
  LossScaling options_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

// Multiplies every gradient by `inv_scale` in place (float32 or float64 buffers, in fixed chunks on
// `exec`) and returns true when any of them was not finite before (torch's
// _amp_foreach_non_finite_check_and_unscale_).
bool unscale_gradients(const Tensor& grads, float inv_scale, Executor& exec);

}  // namespace treadle

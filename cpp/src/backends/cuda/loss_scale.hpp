#pragma once
// Mixed precision: dynamic loss scaling and float32 <-> fp16 conversion.
//
// A step with loss scaling: the loss gradient is seeded with `scale` instead of 1, so small fp16
// gradients do not flush to zero; before the optimizer the gradients are unscaled (multiplied by
// 1/scale, computed once in float32, as torch.amp.GradScaler) into float32, and any Inf/NaN among
// them sets a flag in device memory: no host synchronisation inside. The host reads the flag with
// the step's loss (one small copy it makes anyway) and DynamicLossScaler decides: a non-finite
// gradient skips the optimizer step and multiplies the scale by backoff_factor (0.5); after
// growth_interval consecutive good steps the scale grows by growth_factor (2), unless that would
// overflow float32. loss_scale_update does the same on the device, for loops that never read
// the flag on the host.
//
// The flag is an int32 in device memory, cleared with clear_nonfinite_flag and only ever set to 1
// by the kernels (concurrent stores of the same value: no atomics, and the result does not depend
// on the order). fp16 values are raw IEEE binary16 bits (uint16_t), so this header needs no CUDA
// half types. All functions validate their arguments on the host (ValueError naming the function)
// and take the stream explicitly.
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>

// The rule below is one function for the host and the kernel (nvcc sees it as both).
#ifdef __CUDACC__
#define TREADLE_LOSS_SCALE_HD __host__ __device__
#else
#define TREADLE_LOSS_SCALE_HD
#endif

namespace treadle::cuda {

struct LossScaleOptions {
  float init_scale = 65536.0f;  // 2^16, torch's default
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};
// ValueError unless init_scale is positive and finite, growth_factor > 1, backoff_factor in (0, 1),
// growth_interval in [1, 2^31 - 1].
void validate_loss_scale_options(const LossScaleOptions& o);

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScaleOptions& options = {});
  float scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }      // consecutive finite steps since the last change
  int64_t skipped_steps() const { return skipped_; }      // total steps skipped for overflow
  const LossScaleOptions& options() const { return options_; }
  // Called once per step with the flag read back from the device. Returns true when the optimizer
  // step should be applied; false (skip it) when the gradients were not finite.
  bool update(bool found_nonfinite);

 private:
  LossScaleOptions options_;
  float scale_;
  int64_t good_steps_ = 0, skipped_ = 0;
};

// *flag = 0 (asynchronously on `stream`).
void clear_nonfinite_flag(int32_t* flag, cudaStream_t stream);

enum class ScaleDirection { multiply, divide };
// out[i] = in[i] * s, s = *scale (multiply) or 1 / *scale computed in float32 (divide); `scale` is a
// device pointer. Sets *flag = 1 when any in[i] or out[i] is not finite. in == out is allowed.
void scale_gradients(const float* in, float* out, int64_t n, const float* scale, ScaleDirection direction,
                     int32_t* found_nonfinite, cudaStream_t stream);
// out[i] = float(in[i]) * (1 / *scale): fp16 gradients unscaled into float32 master gradients, with
// the same flag.
void unscale_fp16_gradients(const uint16_t* in, float* out, int64_t n, const float* scale, int32_t* found_nonfinite,
                            cudaStream_t stream);
// The dynamic rule's constants as the device takes them. The factors are doubles and each product
// is taken in double and rounded once to float32, as treadle::LossScaler (the trainer's host rule,
// torch's CPU kernel) does: with factors that float32 represents exactly (2, 0.5) this is the plain
// float32 product, so DynamicLossScaler agrees as well.
struct LossScaleRule {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int32_t growth_interval = 2000;
};
// ValueError (naming loss_scale_update) unless growth_factor > 1 and finite, backoff_factor in (0, 1)
// and growth_interval >= 1.
void validate_loss_scale_rule(const LossScaleRule& r);
inline LossScaleRule loss_scale_rule(const LossScaleOptions& o) {
  return {o.growth_factor, o.backoff_factor, static_cast<int32_t>(o.growth_interval)};
}

// One step of the rule on (scale, growth tracker): what loss_scale_update's kernel runs, callable on
// the host so that a host mirror can be checked against it. A non-finite step backs off and restarts
// the count; a finite one counts, and at the interval grows (unless the grown scale is not a finite
// float32) and restarts the count. Returns whether the step's update is applied.
TREADLE_LOSS_SCALE_HD inline bool apply_loss_scale_rule(float& scale, int32_t& growth_tracker, bool found_nonfinite,
                                                        const LossScaleRule& r) {
  if (found_nonfinite) {
    scale = static_cast<float>(static_cast<double>(scale) * r.backoff_factor);
    growth_tracker = 0;
    return false;
  }
  if (++growth_tracker >= r.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale) * r.growth_factor);
    if (grown <= FLT_MAX) scale = grown;  // false for +Inf (and NaN)
    growth_tracker = 0;
  }
  return true;
}

// The same rule on the device: *scale and *good_steps updated from *found_nonfinite (a kernel of
// one thread; the rule validated on the host). Capturable: the step of a CUDA graph updates the
// scale its next replay seeds the backward with, with nothing read back.
void loss_scale_update(float* scale, int32_t* good_steps, const int32_t* found_nonfinite, const LossScaleRule& r,
                       cudaStream_t stream);
void loss_scale_update(float* scale, int32_t* good_steps, const int32_t* found_nonfinite, const LossScaleOptions& o,
                       cudaStream_t stream);

// float32 -> fp16 bits, round to nearest even; beyond the fp16 range -> +-Inf, NaN stays NaN.
void float_to_fp16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
// fp16 bits -> float32 (exact).
void fp16_to_float(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);

}  // namespace treadle::cuda

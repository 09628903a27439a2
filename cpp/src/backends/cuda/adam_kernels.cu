// Fused Adam / AdamW / AMSGrad over one flat buffer: one read of p, g, m, v (and vmax), one write of
// p, m, v, as the CPU optimizer's fused pass (same arithmetic, in the same order).
#include <cmath>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

template <bool kCoupled, bool kAmsgrad>
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, float* __restrict__ vmax, int64_t n, AdamCoefficients k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float pi = p[i] * k.shrink;
    float gi = g[i];
    if constexpr (kCoupled) gi = gi + k.wd * pi;
    const float mi = m[i] + k.w1 * (gi - m[i]);  // lerp(m, g, 1 - beta1)
    const float vi = v[i] * k.b2 + k.w2 * gi * gi;
    float second = vi;
    if constexpr (kAmsgrad) second = vmax[i] = fmaxf(vmax[i], vi);
    const float denom = sqrtf(second) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + k.neg_step * mi / denom;
  }
}

template <bool kCoupled, bool kAmsgrad>
void launch(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamCoefficients& k,
            cudaStream_t stream) {
  adam_kernel<kCoupled, kAmsgrad><<<element_blocks(n), kElementThreads, 0, stream>>>(p, g, m, v, vmax, n, k);
}

}  // namespace

AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step, bool decoupled, bool amsgrad) {
  const char* who = decoupled ? "adamw" : "adam";
  if (!(lr >= 0)) throw_value_error(who, ": lr must be >= 0, got ", lr);
  if (!(beta1 >= 0 && beta1 < 1)) throw_value_error(who, ": beta1 must be in [0, 1), got ", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) throw_value_error(who, ": beta2 must be in [0, 1), got ", beta2);
  if (!(eps > 0)) throw_value_error(who, ": eps must be > 0, got ", eps);
  if (!(weight_decay >= 0)) throw_value_error(who, ": weight_decay must be >= 0, got ", weight_decay);
  if (step < 1) throw_value_error(who, ": step must be >= 1 (the count including this update), got ", step);
  const double t = static_cast<double>(step);
  const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
  AdamCoefficients k;
  k.shrink = decoupled ? static_cast<float>(1 - lr * weight_decay) : 1.0f;
  k.wd = static_cast<float>(weight_decay);
  k.w1 = static_cast<float>(1 - beta1);
  k.b2 = static_cast<float>(beta2);
  k.w2 = static_cast<float>(1 - beta2);
  k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  k.eps = static_cast<float>(eps);
  k.neg_step = static_cast<float>(-(lr / bc1));
  k.coupled = !decoupled && weight_decay != 0;
  k.amsgrad = amsgrad;
  return k;
}

void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                 int64_t n, const AdamCoefficients& k, cudaStream_t stream) {
  if (n < 0) throw_value_error("adam_update: negative element count ", n);
  if (n == 0) return;
  if (param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr ||
      (k.amsgrad && max_exp_avg_sq == nullptr))
    throw_value_error("adam_update: null device pointer for ", n, " elements (amsgrad ", k.amsgrad ? "on" : "off", ")");
  if (k.coupled) {
    if (k.amsgrad) launch<true, true>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, k, stream);
    else launch<true, false>(param, grad, exp_avg, exp_avg_sq, nullptr, n, k, stream);
  } else {
    if (k.amsgrad) launch<false, true>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, k, stream);
    else launch<false, false>(param, grad, exp_avg, exp_avg_sq, nullptr, n, k, stream);
  }
  check_launch("adam_update");
}

}  // namespace treadle::cuda

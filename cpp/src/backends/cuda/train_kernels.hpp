#pragma once
// The kernels around a training step on the device (the trainer's side of docs/cuda.md): adding a
// plan's parameter gradients into the flat gradient buffer, counting non-finite values (anomaly mode,
// skip_nonfinite) and the SGD update. Same conventions as cuda_kernels.hpp: device pointers, the
// caller's stream, host-side argument checks (ValueError naming the function), float32 only,
// deterministic, no allocation. No CUDA syntax here: includable from the core's .cpp files.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/cuda_kernels.hpp"

namespace treadle::cuda {

// dst[i] += src[i] for i < n: Plan::accumulate_param_grads' loop on the device.
void add_into(float* dst, const float* src, int64_t n, cudaStream_t stream);

// What nonfinite_stats writes: how many of the n values are NaN or +-Inf, and the smallest index of
// one (n when there is none). Integer atomics only, so the result does not depend on scheduling.
struct NonfiniteStats {
  unsigned long long count;
  long long first;
};
// Resets *out and counts x[0, n) into it; the host reads `count` (8 bytes) after the stream, and
// `first` only when count is not 0.
void nonfinite_stats(const float* x, int64_t n, NonfiniteStats* out, cudaStream_t stream);

// Gradient clipping by the global L2 norm, as clip_grad_norm (treadle/optim.hpp, torch's
// clip_grad_norm_): norm = sqrt(sum g^2) summed in double in a fixed order (deterministic), coef =
// min(max_norm / (norm + 1e-6), 1) in double then float, g *= coef unless coef is 1 (a NaN norm gives
// NaN gradients, as torch). Everything stays on the device: `coef` (float) and `norm` (double) are
// written to device memory, nothing is read back (a CUDA graph can hold it). `partial` is scratch of
// clip_workspace_bytes(n).
std::size_t clip_workspace_bytes(int64_t n);
void clip_grad_norm(float* grads, int64_t n, double max_norm, void* partial, float* coef, double* norm,
                    cudaStream_t stream);

// SGD with momentum, dampening, Nesterov and coupled weight decay, torch.optim.SGD's single-tensor
// formula as the CPU optimizer's fused pass: d = g + wd * p; buf = first ? d : mom * buf + keep * d;
// d = nesterov ? d + mom * buf : buf; p -= lr * d. Scalars computed in double on the host, used in float.
struct SgdCoefficients {
  float lr = 0.0f, wd = 0.0f, momentum = 0.0f, keep = 1.0f;  // keep = 1 - dampening
  bool decay = false, use_momentum = false, nesterov = false;
  bool first = false;  // update 1: the momentum buffer starts as a copy of d
};
// step >= 1 is the update's count including itself; throws ValueError for invalid hyperparameters.
SgdCoefficients sgd_coefficients(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                                 int64_t step);
// momentum_buffer may be null unless k.use_momentum.
void sgd_update(float* param, const float* grad, float* momentum_buffer, int64_t n, const SgdCoefficients& k,
                cudaStream_t stream);

// The same two updates with their coefficients read from device memory when the kernel runs: what a
// CUDA graph replays while the step count and the learning rate change (the host writes the
// coefficients of each step into that memory before the replay). The flags that choose the kernel
// (`shape`'s coupled/amsgrad, decay/use_momentum/nesterov) are fixed at launch, the values are read
// from `k_device`; the arithmetic is adam_update's and sgd_update's. `skip` (device memory, may be
// null for none) is loss scaling's non-finite flag: when *skip is not 0 as the kernel runs, it
// writes nothing (parameters and optimizer state keep their values), so a captured step whose
// gradients overflowed leaves the model as a skipped host step does.
void adam_update_indirect(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                          int64_t n, const AdamCoefficients& shape, const AdamCoefficients* k_device,
                          cudaStream_t stream, const int32_t* skip = nullptr);
void sgd_update_indirect(float* param, const float* grad, float* momentum_buffer, int64_t n,
                         const SgdCoefficients& shape, const SgdCoefficients* k_device, cudaStream_t stream,
                         const int32_t* skip = nullptr);

}  // namespace treadle::cuda

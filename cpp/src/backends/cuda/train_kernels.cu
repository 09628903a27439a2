// Kernels around a device training step: gradient accumulation, the non-finite count and SGD.
// Grid-stride loops with 64-bit indices, as the other element kernels.
#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/train_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

__global__ void add_into_kernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] += src[i];
}

__global__ void reset_stats_kernel(NonfiniteStats* out, int64_t n) {
  out->count = 0;
  out->first = n;
}

struct MinOp {
  __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

// One block-level count and minimum index per block, then one atomic of each per block.
__global__ void nonfinite_kernel(const float* __restrict__ x, int64_t n, NonfiniteStats* out) {
  __shared__ unsigned long long count_smem[32];
  __shared__ long long first_smem[32];
  unsigned long long count = 0;
  long long first = n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (!isfinite(x[i])) {
      ++count;
      if (i < first) first = i;
    }
  count = block_reduce(count, SumOp{}, 0ull, count_smem);
  first = block_reduce(first, MinOp{}, static_cast<long long>(n), first_smem);
  if (threadIdx.x == 0 && count != 0) {
    atomicAdd(&out->count, count);
    atomicMin(&out->first, first);
  }
}

// One element of SGD (both launch forms).
// Clipping: each of up to kClipBlocks blocks sums the squares of one contiguous chunk in double;
// one block then adds the partial sums in chunk order. The chunking depends on n only.
constexpr int64_t kClipBlocks = 1024;
constexpr int kClipThreads = 256;

int64_t clip_chunk(int64_t n) {
  const int64_t chunk = (n + kClipBlocks - 1) / kClipBlocks;
  return chunk < 1 ? 1 : chunk;
}

__global__ void clip_partials_kernel(const float* __restrict__ g, int64_t n, int64_t chunk,
                                     double* __restrict__ partial) {
  __shared__ double smem[32];
  const int64_t b = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t e = b + chunk < n ? b + chunk : n;
  double s = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) s += static_cast<double>(g[i]) * g[i];
  s = block_reduce(s, SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void clip_coefficient_kernel(const double* __restrict__ partial, int blocks, double max_norm,
                                        float* __restrict__ coef, double* __restrict__ norm) {
  __shared__ double smem[32];
  double s = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_reduce(s, SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) {
    const double total_norm = sqrt(s);
    const double c = max_norm / (total_norm + 1e-6);
    *coef = static_cast<float>(1.0 < c ? 1.0 : c);  // std::min(c, 1.0): a NaN c stays NaN
    *norm = total_norm;
  }
}

__global__ void clip_scale_kernel(float* __restrict__ g, int64_t n, const float* __restrict__ coef) {
  const float c = *coef;
  if (c == 1.0f) return;  // as the host: a NaN coefficient fails this test and scales
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) g[i] = g[i] * c;
}

template <bool kDecay, bool kMomentum, bool kNesterov>
__device__ __forceinline__ void sgd_element(float* __restrict__ p, const float* __restrict__ g,
                                            float* __restrict__ buf, int64_t i, const SgdCoefficients& k) {
  float d = g[i];
  if constexpr (kDecay) d = d + k.wd * p[i];
  if constexpr (kMomentum) {
    const float bi = k.first ? d : buf[i] * k.momentum + k.keep * d;
    buf[i] = bi;
    d = kNesterov ? d + k.momentum * bi : bi;
  }
  p[i] = p[i] - k.lr * d;
}

// kIndirect: the coefficients are read from device memory (`kp`) instead of the argument `k`, and
// `skip` (loss scaling's non-finite flag, or null) when set makes the kernel write nothing.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kIndirect>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf, int64_t n,
                           SgdCoefficients k, const SgdCoefficients* kp, const int32_t* skip) {
  if constexpr (kIndirect) {
    if (skip != nullptr && *skip != 0) return;
    k = *kp;
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    sgd_element<kDecay, kMomentum, kNesterov>(p, g, buf, i, k);
}

template <bool kIndirect>
void launch_sgd(float* p, const float* g, float* buf, int64_t n, const SgdCoefficients& k,
                const SgdCoefficients* kp, const int32_t* skip, cudaStream_t stream) {
  auto go = [&](auto kernel) { kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(p, g, buf, n, k, kp, skip); };
  // Six instantiations instead of eight: Nesterov implies momentum.
  if (k.decay) {
    if (!k.use_momentum) go(sgd_kernel<true, false, false, kIndirect>);
    else if (k.nesterov) go(sgd_kernel<true, true, true, kIndirect>);
    else go(sgd_kernel<true, true, false, kIndirect>);
  } else {
    if (!k.use_momentum) go(sgd_kernel<false, false, false, kIndirect>);
    else if (k.nesterov) go(sgd_kernel<false, true, true, kIndirect>);
    else go(sgd_kernel<false, true, false, kIndirect>);
  }
}

// Adam with its coefficients from device memory: adam_kernels.cu's element arithmetic, in the same
// order (the graph-replayed step must match the launched one).
template <bool kCoupled, bool kAmsgrad>
__global__ void adam_indirect_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                     float* __restrict__ v, float* __restrict__ vmax, int64_t n,
                                     const AdamCoefficients* kp, const int32_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  const AdamCoefficients k = *kp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float pi = p[i] * k.shrink;
    float gi = g[i];
    if constexpr (kCoupled) gi = gi + k.wd * pi;
    const float mi = m[i] + k.w1 * (gi - m[i]);
    const float vi = v[i] * k.b2 + k.w2 * gi * gi;
    float second = vi;
    if constexpr (kAmsgrad) second = vmax[i] = fmaxf(vmax[i], vi);
    const float denom = sqrtf(second) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + k.neg_step * mi / denom;
  }
}

}  // namespace

void add_into(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n < 0) throw_value_error("add_into: negative element count ", n);
  if (n == 0) return;
  if (dst == nullptr || src == nullptr) throw_value_error("add_into: null device pointer for ", n, " elements");
  add_into_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(dst, src, n);
  check_launch("add_into");
}

void nonfinite_stats(const float* x, int64_t n, NonfiniteStats* out, cudaStream_t stream) {
  if (n < 0) throw_value_error("nonfinite_stats: negative element count ", n);
  if (out == nullptr || (n > 0 && x == nullptr))
    throw_value_error("nonfinite_stats: null device pointer (", n, " elements)");
  reset_stats_kernel<<<1, 1, 0, stream>>>(out, n);
  check_launch("nonfinite_stats (reset)");
  if (n == 0) return;
  nonfinite_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, n, out);
  check_launch("nonfinite_stats");
}

std::size_t clip_workspace_bytes(int64_t n) {
  const int64_t blocks = n <= 0 ? 1 : (n + clip_chunk(n) - 1) / clip_chunk(n);
  return static_cast<std::size_t>(blocks) * sizeof(double);
}

void clip_grad_norm(float* grads, int64_t n, double max_norm, void* partial, float* coef, double* norm,
                    cudaStream_t stream) {
  if (!(max_norm >= 0)) throw_value_error("clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  if (n < 0) throw_value_error("clip_grad_norm: negative element count ", n);
  if (partial == nullptr || coef == nullptr || norm == nullptr || (n > 0 && grads == nullptr))
    throw_value_error("clip_grad_norm: null device pointer (", n, " elements)");
  const int64_t chunk = clip_chunk(n);
  const int blocks = static_cast<int>(n == 0 ? 0 : (n + chunk - 1) / chunk);
  auto* parts = static_cast<double*>(partial);
  if (blocks > 0) clip_partials_kernel<<<blocks, kClipThreads, 0, stream>>>(grads, n, chunk, parts);
  check_launch("clip_grad_norm (partial sums)");
  clip_coefficient_kernel<<<1, 1024, 0, stream>>>(parts, blocks, max_norm, coef, norm);
  check_launch("clip_grad_norm (coefficient)");
  if (n == 0) return;
  clip_scale_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(grads, n, coef);
  check_launch("clip_grad_norm (scale)");
}

SgdCoefficients sgd_coefficients(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                                 int64_t step) {
  if (!(lr >= 0)) throw_value_error("sgd: lr must be >= 0, got ", lr);
  if (!(momentum >= 0)) throw_value_error("sgd: momentum must be >= 0, got ", momentum);
  if (!(weight_decay >= 0)) throw_value_error("sgd: weight_decay must be >= 0, got ", weight_decay);
  if (!std::isfinite(dampening)) throw_value_error("sgd: dampening must be finite, got ", dampening);
  if (nesterov && (momentum <= 0 || dampening != 0))
    throw_value_error("sgd: nesterov needs momentum > 0 and dampening 0, got momentum ", momentum, ", dampening ",
                      dampening);
  if (step < 1) throw_value_error("sgd: step must be >= 1 (the count including this update), got ", step);
  SgdCoefficients k;
  k.lr = static_cast<float>(lr);
  k.wd = static_cast<float>(weight_decay);
  k.momentum = static_cast<float>(momentum);
  k.keep = static_cast<float>(1 - dampening);
  k.decay = weight_decay != 0;
  k.use_momentum = momentum != 0;
  k.nesterov = nesterov;
  k.first = step == 1;
  return k;
}

void sgd_update(float* param, const float* grad, float* momentum_buffer, int64_t n, const SgdCoefficients& k,
                cudaStream_t stream) {
  if (n < 0) throw_value_error("sgd_update: negative element count ", n);
  if (n == 0) return;
  if (param == nullptr || grad == nullptr || (k.use_momentum && momentum_buffer == nullptr))
    throw_value_error("sgd_update: null device pointer for ", n, " elements (momentum ",
                      k.use_momentum ? "on" : "off", ")");
  launch_sgd<false>(param, grad, momentum_buffer, n, k, nullptr, nullptr, stream);
  check_launch("sgd_update");
}

void sgd_update_indirect(float* param, const float* grad, float* momentum_buffer, int64_t n,
                         const SgdCoefficients& shape, const SgdCoefficients* k_device, cudaStream_t stream,
                         const int32_t* skip) {
  if (n < 0) throw_value_error("sgd_update_indirect: negative element count ", n);
  if (n == 0) return;
  if (param == nullptr || grad == nullptr || k_device == nullptr || (shape.use_momentum && momentum_buffer == nullptr))
    throw_value_error("sgd_update_indirect: null device pointer for ", n, " elements (momentum ",
                      shape.use_momentum ? "on" : "off", ")");
  launch_sgd<true>(param, grad, momentum_buffer, n, shape, k_device, skip, stream);
  check_launch("sgd_update_indirect");
}

void adam_update_indirect(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                          int64_t n, const AdamCoefficients& shape, const AdamCoefficients* k_device,
                          cudaStream_t stream, const int32_t* skip) {
  if (n < 0) throw_value_error("adam_update_indirect: negative element count ", n);
  if (n == 0) return;
  if (param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr || k_device == nullptr ||
      (shape.amsgrad && max_exp_avg_sq == nullptr))
    throw_value_error("adam_update_indirect: null device pointer for ", n, " elements (amsgrad ",
                      shape.amsgrad ? "on" : "off", ")");
  auto go = [&](auto kernel, float* vmax) {
    kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, vmax, n, k_device,
                                                              skip);
  };
  if (shape.coupled) {
    if (shape.amsgrad) go(adam_indirect_kernel<true, true>, max_exp_avg_sq);
    else go(adam_indirect_kernel<true, false>, nullptr);
  } else {
    if (shape.amsgrad) go(adam_indirect_kernel<false, true>, max_exp_avg_sq);
    else go(adam_indirect_kernel<false, false>, nullptr);
  }
  check_launch("adam_update_indirect");
}

}  // namespace treadle::cuda

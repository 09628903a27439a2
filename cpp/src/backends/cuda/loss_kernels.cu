// Elementwise losses (mse, l1, huber, bce_with_logits) and their gradients, the Eigen reference's
// terms in its grouping. The forward sums the terms in double: a fixed number of blocks for a given
// n (at most kMaxPartials) each reduce a grid-strided share into one partial, then one block adds
// the partials; both orders depend only on n.
#include <initializer_list>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/loss_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr int kLossThreads = 256;
constexpr int64_t kItemsPerThread = 8;
constexpr int64_t kMaxPartials = 1024;

int64_t partial_count(int64_t n) {
  const int64_t per_block = kLossThreads * kItemsPerThread;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return blocks < kMaxPartials ? blocks : kMaxPartials;
}

template <PointLoss L>
struct Term;

template <>
struct Term<PointLoss::mse> {
  __device__ static float value(float p, float t, float) { return (p - t) * (p - t); }
  __device__ static float deriv(float p, float t, float) { return 2.0f * (p - t); }
};
template <>
struct Term<PointLoss::l1> {
  __device__ static float value(float p, float t, float) { return fabsf(p - t); }
  __device__ static float deriv(float p, float t, float) {  // 0 at 0 (and for NaN), as the reference's sign
    const float d = p - t;
    return static_cast<float>((d > 0.0f) - (d < 0.0f));
  }
};
template <>
struct Term<PointLoss::huber> {  // quadratic within delta of the target, linear (slope delta) beyond
  __device__ static float value(float p, float t, float delta) {
    const float d = fabsf(p - t);
    return d < delta ? 0.5f * d * d : delta * (d - 0.5f * delta);
  }
  __device__ static float deriv(float p, float t, float delta) {
    const float d = p - t;
    return d < -delta ? -delta : (d > delta ? delta : d);
  }
};
template <>
struct Term<PointLoss::bce_with_logits> {
  // (1 - t) x + max(-x, 0) + log1p(exp(-|x|)): no overflow, torch's grouping. The product is rounded
  // on its own (__fmul_rn is never contracted into an FMA), as the reference rounds it: the sum that
  // follows can cancel (x < 0, t near 0).
  __device__ static float value(float x, float t, float) {
    const float neg = -x;
    return __fmul_rn(1.0f - t, x) + (neg < 0.0f ? 0.0f : neg) + log1pf(expf(-fabsf(x)));
  }
  __device__ static float deriv(float x, float t, float) {
    const float z = expf(-fabsf(x));  // in (0, 1]: the sigmoid without overflow
    const float sig = x >= 0.0f ? 1.0f / (1.0f + z) : z / (1.0f + z);
    return sig - t;
  }
};

template <PointLoss L>
__global__ void loss_partials(const float* __restrict__ p, const float* __restrict__ t, double* __restrict__ partial,
                              int64_t n, float delta) {
  __shared__ double smem[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double s = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    s += static_cast<double>(Term<L>::value(p[i], t[i], delta));
  s = block_reduce(s, SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: the partials in a fixed order; the mean divides in double, as the reference.
__global__ void loss_total(const double* __restrict__ partial, int64_t count, float* __restrict__ loss, double n,
                           bool mean) {
  __shared__ double smem[32];
  double s = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) s += partial[k];
  s = block_reduce(s, SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(mean ? s / n : s);  // 0 / 0: NaN for a mean of nothing
}

template <PointLoss L>
__global__ void loss_backward(const float* __restrict__ p, const float* __restrict__ t,
                              const float* __restrict__ grad_loss, float* __restrict__ dp, int64_t n, bool mean,
                              float delta) {
  const float g = grad_loss[0];
  const float scale = mean ? static_cast<float>(static_cast<double>(g) / static_cast<double>(n)) : g;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dp[i] = Term<L>::deriv(p[i], t[i], delta) * scale;
}

// Calls f.operator()<L>() with the loss as a template argument.
template <typename F>
void dispatch(PointLoss kind, F&& f) {
  switch (kind) {
    case PointLoss::mse: return f.template operator()<PointLoss::mse>();
    case PointLoss::l1: return f.template operator()<PointLoss::l1>();
    case PointLoss::huber: return f.template operator()<PointLoss::huber>();
    case PointLoss::bce_with_logits: return f.template operator()<PointLoss::bce_with_logits>();
  }
  throw_value_error("point_loss: unknown loss ", static_cast<int>(kind));
}

void check_args(const char* fn, PointLoss kind, int64_t n, float delta, std::initializer_list<const void*> ptrs) {
  if (n < 0) throw_value_error(fn, "(", point_loss_name(kind), "): negative element count ", n);
  if (kind == PointLoss::huber && !(delta >= 0.0f))  // the op requires > 0; float32 rounding may give 0
    throw_value_error(fn, "(huber_loss): delta must be positive, got ", delta);
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, "(", point_loss_name(kind), "): null device pointer for ", n, " elements");
}

}  // namespace

const char* point_loss_name(PointLoss kind) {
  switch (kind) {
    case PointLoss::mse: return "mse_loss";
    case PointLoss::l1: return "l1_loss";
    case PointLoss::huber: return "huber_loss";
    case PointLoss::bce_with_logits: return "bce_with_logits";
  }
  return "unknown";
}

std::size_t point_loss_workspace_bytes(int64_t n) {
  return n > 0 ? static_cast<std::size_t>(partial_count(n)) * sizeof(double) : 0;
}

void point_loss_forward(PointLoss kind, const float* pred, const float* target, float* loss, int64_t n,
                        Reduction reduction, float delta, void* workspace, cudaStream_t stream) {
  check_args("point_loss_forward", kind, n, delta, {loss});
  if (n > 0) check_args("point_loss_forward", kind, n, delta, {pred, target, workspace});
  const int64_t blocks = n > 0 ? partial_count(n) : 0;
  auto* partial = static_cast<double*>(workspace);
  if (blocks > 0) {
    dispatch(kind, [&]<PointLoss L>() {
      loss_partials<L><<<static_cast<unsigned>(blocks), kLossThreads, 0, stream>>>(pred, target, partial, n, delta);
    });
    check_launch("point_loss_forward");
  }
  loss_total<<<1, kLossThreads, 0, stream>>>(partial, blocks, loss, static_cast<double>(n),
                                             reduction == Reduction::mean);
  check_launch("point_loss_forward: total");
}

void point_loss_backward(PointLoss kind, const float* pred, const float* target, const float* grad_loss,
                         float* dpred, int64_t n, Reduction reduction, float delta, cudaStream_t stream) {
  check_args("point_loss_backward", kind, n, delta, {});
  if (n == 0) return;
  check_args("point_loss_backward", kind, n, delta, {pred, target, grad_loss, dpred});
  dispatch(kind, [&]<PointLoss L>() {
    loss_backward<L><<<element_blocks(n), kElementThreads, 0, stream>>>(pred, target, grad_loss, dpred, n,
                                                                         reduction == Reduction::mean, delta);
  });
  check_launch("point_loss_backward");
}

}  // namespace treadle::cuda

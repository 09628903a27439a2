// Elementwise maps of the core's ops: broadcast arithmetic (add, sub, mul), scale, mul3, the activations
// with attributes (leaky_relu, elu, softplus) and their backward maps, and dropout. The formulas are
// the Eigen reference's (backends/eigen/elementwise_kernels.cpp, activation_kernels.cpp,
// dropout_kernels.cpp) in the same grouping, with its NaN behaviour: comparisons written as the
// reference's (x > 0 ? ...), and std::max(v, 0) as (v < 0 ? 0 : v), which passes a NaN on where
// fmaxf would drop it. Precise libdevice math (no --use_fast_math). Grid-stride loops, 64-bit indices.
#include <initializer_list>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/strided_index.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- broadcast arithmetic
template <BinaryOp Op>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (Op == BinaryOp::add) return a + b;
  if constexpr (Op == BinaryOp::sub) return a - b;
  return a * b;
}

// Same shape: no index arithmetic.
template <BinaryOp Op>
__global__ void binary_same(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                            int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = apply<Op>(a[i], b[i]);
}

template <BinaryOp Op>
__global__ void binary_strided(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                               int64_t n, StridedLayout l) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t ia = strided_offset(i, l.ndim, l.dims, l.stride_a);
    const int64_t ib = strided_offset(i, l.ndim, l.dims, l.stride_b);
    y[i] = apply<Op>(a[ia], b[ib]);
  }
}

template <BinaryOp Op>
void launch_binary(const float* a, const float* b, float* y, int64_t n, const StridedLayout& l,
                   cudaStream_t stream) {
  const bool same = l.ndim == 0 || (l.ndim == 1 && l.stride_a[0] == 1 && l.stride_b[0] == 1);
  if (same)
    binary_same<Op><<<element_blocks(n), kElementThreads, 0, stream>>>(a, b, y, n);
  else
    binary_strided<Op><<<element_blocks(n), kElementThreads, 0, stream>>>(a, b, y, n, l);
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
  }
  return "unknown";
}

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float alpha, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = alpha * x[i];
}

__global__ void mul3_kernel(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                            float* __restrict__ y, float alpha, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = alpha * ((a[i] * b[i]) * c[i]);
}

// ---- activations with attributes, forward (x) and backward (x, dy)
using Kind = ParamActivation::Kind;

template <Kind K>
struct ParamAct;

template <>
struct ParamAct<Kind::leaky_relu> {
  __device__ static float fwd(float x, const ParamActivation& p) { return x > 0.0f ? x : x * p.negative_slope; }
  __device__ static float bwd(float x, float dy, const ParamActivation& p) {
    return x > 0.0f ? dy : dy * p.negative_slope;
  }
};
template <>
struct ParamAct<Kind::elu> {  // expm1 keeps the accuracy near 0
  __device__ static float fwd(float x, const ParamActivation& p) { return x > 0.0f ? x : p.alpha * expm1f(x); }
  __device__ static float bwd(float x, float dy, const ParamActivation& p) {
    return x > 0.0f ? dy : dy * p.alpha * expf(x);
  }
};
template <>
struct ParamAct<Kind::softplus> {  // max(z, 0) + log1p(exp(-|z|)) is finite for any z
  __device__ static float fwd(float x, const ParamActivation& p) {
    const float z = p.beta * x;
    if (z > p.threshold) return x;
    return ((z < 0.0f ? 0.0f : z) + log1pf(expf(-fabsf(z)))) / p.beta;
  }
  __device__ static float bwd(float x, float dy, const ParamActivation& p) {
    const float z = p.beta * x;
    return z > p.threshold ? dy : dy * (1.0f / (1.0f + expf(-z)));
  }
};

template <Kind K>
__global__ void param_forward(const float* __restrict__ x, float* __restrict__ y, int64_t n, ParamActivation p) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = ParamAct<K>::fwd(x[i], p);
}

template <Kind K>
__global__ void param_backward(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                               int64_t n, ParamActivation p) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = ParamAct<K>::bwd(x[i], dy[i], p);
}

// Calls f.operator()<K>() with the kind as a template argument (one kernel per activation).
template <typename F>
void dispatch(Kind kind, F&& f) {
  switch (kind) {
    case Kind::leaky_relu: return f.template operator()<Kind::leaky_relu>();
    case Kind::elu: return f.template operator()<Kind::elu>();
    case Kind::softplus: return f.template operator()<Kind::softplus>();
  }
  throw_value_error("param_activation: unknown activation ", static_cast<int>(kind));
}

// ---- dropout: the reference's splitmix64 draw, in the same 64-bit integer arithmetic
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// dropout_key's mix on the device (the host function is in elementwise_layout.cpp).
__device__ __forceinline__ uint64_t device_dropout_key(uint64_t seed, uint64_t counter, uint64_t stream) {
  uint64_t k = mix64(seed + kGolden);
  k = mix64(k ^ mix64(counter + 2 * kGolden));
  return mix64(k ^ mix64(stream + 3 * kGolden));
}

// `rng` non-null: the key is made from the seed and counter it holds (`key` is then the node's
// stream id); every thread mixes it itself, six multiplications, instead of a second launch.
__global__ void dropout_kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ mask,
                               int64_t n, uint64_t key, const DeviceRngState* rng, double p, float keep_scale) {
  if (rng != nullptr) key = device_dropout_key(rng->seed, rng->counter, key);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    // A 53-bit integer times 2^-53: exact in double, the reference's uniform in [0, 1).
    const double u = static_cast<double>(mix64(key + (static_cast<uint64_t>(i) + 1) * kGolden) >> 11) * 0x1.0p-53;
    const float m = u < p ? 0.0f : keep_scale;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

void check_count(const char* fn, const char* what, int64_t n, std::initializer_list<const void*> ptrs) {
  if (n < 0) throw_value_error(fn, "(", what, "): negative element count ", n);
  if (n == 0) return;
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, "(", what, "): null device pointer for ", n, " elements");
}

}  // namespace

void binary_forward(BinaryOp op, const float* a, const float* b, float* y, int64_t n, const StridedLayout& layout,
                    cudaStream_t stream) {
  check_count("binary_forward", binary_name(op), n, {a, b, y});
  if (layout.ndim < 0 || layout.ndim > kMaxLayoutDims)
    throw_value_error("binary_forward(", binary_name(op), "): layout of ", layout.ndim, " dimensions (at most ",
                      kMaxLayoutDims, ")");
  int64_t count = 1;
  for (int d = 0; d < layout.ndim; ++d) count *= layout.dims[d];
  if (count != n)
    throw_value_error("binary_forward(", binary_name(op), "): layout of ", count, " elements for an output of ", n);
  if (n == 0) return;
  switch (op) {
    case BinaryOp::add: launch_binary<BinaryOp::add>(a, b, y, n, layout, stream); break;
    case BinaryOp::sub: launch_binary<BinaryOp::sub>(a, b, y, n, layout, stream); break;
    case BinaryOp::mul: launch_binary<BinaryOp::mul>(a, b, y, n, layout, stream); break;
  }
  check_launch("binary_forward");
}

void scale_forward(const float* x, float* y, float alpha, int64_t n, cudaStream_t stream) {
  check_count("scale_forward", "scale", n, {x, y});
  if (n == 0) return;
  scale_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, alpha, n);
  check_launch("scale_forward");
}

void mul3_forward(const float* a, const float* b, const float* c, float* y, float alpha, int64_t n,
                  cudaStream_t stream) {
  check_count("mul3_forward", "mul3", n, {a, b, c, y});
  if (n == 0) return;
  mul3_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(a, b, c, y, alpha, n);
  check_launch("mul3_forward");
}

const char* param_activation_name(ParamActivation::Kind kind) {
  switch (kind) {
    case Kind::leaky_relu: return "leaky_relu";
    case Kind::elu: return "elu";
    case Kind::softplus: return "softplus";
  }
  return "unknown";
}

void param_activation_forward(const ParamActivation& act, const float* x, float* y, int64_t n,
                              cudaStream_t stream) {
  check_count("param_activation_forward", param_activation_name(act.kind), n, {x, y});
  if (act.kind == Kind::softplus && act.beta == 0.0f)
    throw_value_error("param_activation_forward(softplus): beta must be nonzero");
  if (n == 0) return;
  dispatch(act.kind, [&]<Kind K>() {
    param_forward<K><<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, n, act);
  });
  check_launch("param_activation_forward");
}

void param_activation_backward(const ParamActivation& act, const float* x, const float* dy, float* dx, int64_t n,
                               cudaStream_t stream) {
  check_count("param_activation_backward", param_activation_name(act.kind), n, {x, dy, dx});
  if (n == 0) return;
  dispatch(act.kind, [&]<Kind K>() {
    param_backward<K><<<element_blocks(n), kElementThreads, 0, stream>>>(x, dy, dx, n, act);
  });
  check_launch("param_activation_backward");
}

namespace {
void launch_dropout(const char* fn, const float* x, float* y, float* mask, int64_t n, uint64_t key,
                    const DeviceRngState* rng, double p, cudaStream_t stream) {
  check_count(fn, "dropout", n, {x, y, mask});
  if (!(p >= 0.0 && p <= 1.0)) throw_value_error(fn, ": p must be in [0, 1], got ", p);
  if (n == 0) return;
  // The reference's scale: 1 / (1 - p) in double, rounded once to float32.
  const float keep_scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  dropout_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, mask, n, key, rng, p, keep_scale);
  check_launch(fn);
}
}  // namespace

void dropout_forward(const float* x, float* y, float* mask, int64_t n, uint64_t key, double p, cudaStream_t stream) {
  launch_dropout("dropout_forward", x, y, mask, n, key, nullptr, p, stream);
}

void dropout_forward_indirect(const float* x, float* y, float* mask, int64_t n, const DeviceRngState* rng,
                              uint64_t stream_id, double p, cudaStream_t stream) {
  if (rng == nullptr && n > 0) throw_value_error("dropout_forward_indirect: null device pointer for the RNG state");
  launch_dropout("dropout_forward_indirect", x, y, mask, n, stream_id, rng, p, stream);
}

}  // namespace treadle::cuda

// Elementwise maps: the activations and their backward maps (float32, with the same forms as the
// Eigen reference, chosen to avoid cancellation: 0.5 * (1 + erf(z)) as 0.5 * erfc(-z), 0.5 * (1 +
// tanh(u)) as sigmoid(2u); precise libdevice math, no --use_fast_math), and the rounding of product
// operands to bf16.
#include <cuda_bf16.h>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;

// exp(-x) overflowing to inf gives the correct limit 0.
__device__ __forceinline__ float sigmoid_of(float x) { return 1.0f / (1.0f + expf(-x)); }

template <Activation A>
struct Act;

template <>
struct Act<Activation::relu> {  // x < 0 keeps NaN flowing through, as PyTorch does
  __device__ static float fwd(float x) { return x < 0.0f ? 0.0f : x; }
  __device__ static float bwd(float y, float dy) { return y > 0.0f ? dy : 0.0f; }
};
template <>
struct Act<Activation::tanh> {
  __device__ static float fwd(float x) { return tanhf(x); }
  __device__ static float bwd(float y, float dy) { return dy * (1.0f - y * y); }
};
template <>
struct Act<Activation::sigmoid> {
  __device__ static float fwd(float x) { return sigmoid_of(x); }
  __device__ static float bwd(float y, float dy) { return dy * y * (1.0f - y); }
};
template <>
struct Act<Activation::gelu> {
  __device__ static float fwd(float x) { return 0.5f * x * erfcf(-x * kInvSqrt2); }
  __device__ static float bwd(float x, float dy) {
    const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};
template <>
struct Act<Activation::gelu_tanh> {
  __device__ static float fwd(float x) {
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    return x * sigmoid_of(2.0f * u);
  }
  __device__ static float bwd(float x, float dy) {
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float s = sigmoid_of(2.0f * u);  // 0.5 * (1 + tanh(u)); 1 - tanh(u)^2 = 4 s (1 - s)
    return dy * (s + 2.0f * x * s * (1.0f - s) * du);
  }
};
template <>
struct Act<Activation::silu> {
  __device__ static float fwd(float x) { return x * sigmoid_of(x); }
  __device__ static float bwd(float x, float dy) {
    const float s = sigmoid_of(x);
    return dy * s * (1.0f + x * (1.0f - s));
  }
};

template <Activation A>
__global__ void forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = Act<A>::fwd(x[i]);
}

template <Activation A>
__global__ void backward_kernel(const float* __restrict__ s, const float* __restrict__ dy, float* __restrict__ dx,
                                int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = Act<A>::bwd(s[i], dy[i]);
}

// Calls f.operator()<A>() with the activation as a template argument (one kernel per activation).
template <typename F>
void dispatch(Activation act, F&& f) {
  switch (act) {
    case Activation::relu: return f.template operator()<Activation::relu>();
    case Activation::tanh: return f.template operator()<Activation::tanh>();
    case Activation::sigmoid: return f.template operator()<Activation::sigmoid>();
    case Activation::gelu: return f.template operator()<Activation::gelu>();
    case Activation::gelu_tanh: return f.template operator()<Activation::gelu_tanh>();
    case Activation::silu: return f.template operator()<Activation::silu>();
  }
  throw_value_error("activation: unknown activation ", static_cast<int>(act));
}

void check_elementwise(const char* fn, Activation act, int64_t n, const void* a, const void* b, const void* c) {
  if (n < 0) throw_value_error(fn, "(", activation_name(act), "): negative element count ", n);
  if (n > 0 && (a == nullptr || b == nullptr || c == nullptr))
    throw_value_error(fn, "(", activation_name(act), "): null device pointer for ", n, " elements");
}

__global__ void bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

}  // namespace

void round_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n < 0) throw_value_error("round_to_bf16: negative element count ", n);
  if (n == 0) return;
  if (x == nullptr || y == nullptr) throw_value_error("round_to_bf16: null device pointer for ", n, " elements");
  bf16_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, n);
  check_launch("round_to_bf16");
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::relu: return "relu";
    case Activation::tanh: return "tanh";
    case Activation::sigmoid: return "sigmoid";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
  }
  return "unknown";
}

bool activation_backward_uses_output(Activation act) {
  return act == Activation::relu || act == Activation::tanh || act == Activation::sigmoid;
}

void activation_forward(Activation act, const float* x, float* y, int64_t n, cudaStream_t stream) {
  check_elementwise("activation_forward", act, n, x, y, y);
  if (n == 0) return;
  dispatch(act, [&]<Activation A>() { forward_kernel<A><<<element_blocks(n), kElementThreads, 0, stream>>>(x, y, n); });
  check_launch("activation_forward");
}

void activation_backward(Activation act, const float* saved, const float* dy, float* dx, int64_t n,
                         cudaStream_t stream) {
  check_elementwise("activation_backward", act, n, saved, dy, dx);
  if (n == 0) return;
  dispatch(act, [&]<Activation A>() {
    backward_kernel<A><<<element_blocks(n), kElementThreads, 0, stream>>>(saved, dy, dx, n);
  });
  check_launch("activation_backward");
}

}  // namespace treadle::cuda

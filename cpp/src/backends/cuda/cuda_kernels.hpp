#pragma once
// The backend's own kernels as plain functions: device pointers, sizes, and the caller's stream
// (always explicit). Each validates its arguments on the host (ValueError naming the function and
// the values), launches, and checks the launch (RuntimeError); faults inside a kernel surface at the
// caller's next synchronisation. All are float32, deterministic (fixed reduction order for a given
// shape, no atomics) and allocate nothing: scratch is passed in, sized by the *_workspace_bytes
// functions. How these plug into the core's KernelArgs is described in docs/cuda.md.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treadle::cuda {

// ---- elementwise activations (the core's relu, tanh, sigmoid, gelu, silu ops)
enum class Activation { relu, tanh, sigmoid, gelu, gelu_tanh, silu };
const char* activation_name(Activation act);
// Which tensor the backward takes, as the core's *_backward ops do: the forward's output y for
// relu, tanh and sigmoid; its input x for gelu, gelu_tanh and silu.
bool activation_backward_uses_output(Activation act);

void activation_forward(Activation act, const float* x, float* y, int64_t n, cudaStream_t stream);
// dx = dy * act'(.) where `saved` is y or x (see activation_backward_uses_output).
void activation_backward(Activation act, const float* saved, const float* dy, float* dx, int64_t n,
                         cudaStream_t stream);

// ---- softmax over one axis of a tensor viewed as (outer, axis, inner), row-major.
// Numerically stable (the axis maximum is subtracted). backward: dx = y * (dy - sum(y * dy)).
void softmax_forward(const float* x, float* y, int64_t outer, int64_t axis, int64_t inner, cudaStream_t stream);
void softmax_backward(const float* y, const float* dy, float* dx, int64_t outer, int64_t axis, int64_t inner,
                      cudaStream_t stream);

// ---- cross-entropy with class indices, as the core's cross_entropy op: logits (outer, classes,
// inner) with classes along dimension 1 (inner = 1 for (N, C) logits), int64 labels (outer, inner).
// loss[0] = sum or mean over the positions of -log_softmax(logits)[label]. A label outside
// [0, classes) cannot raise on the device: that position's loss, and so the total, is NaN, and its
// gradient row is NaN. The host checks labels when it has them.
enum class Reduction { mean, sum };
std::size_t cross_entropy_workspace_bytes(int64_t outer, int64_t inner);
void cross_entropy_forward(const float* logits, const int64_t* labels, float* loss, int64_t outer, int64_t classes,
                           int64_t inner, Reduction reduction, void* workspace, cudaStream_t stream);
// dlogits = grad_loss[0] * scale * (softmax(logits) - onehot(label)), scale 1/positions for mean.
// grad_loss is a device pointer (the upstream gradient stays on the device).
void cross_entropy_backward(const float* logits, const int64_t* labels, const float* grad_loss, float* dlogits,
                            int64_t outer, int64_t classes, int64_t inner, Reduction reduction, cudaStream_t stream);

// ---- fused Adam / AdamW / AMSGrad over one flat parameter buffer, the same arithmetic as the
// CPU optimizer (torch.optim.Adam's). Coefficients come from adam_coefficients, computed on the
// host once per step (they depend on the step count).
struct AdamCoefficients {
  float shrink = 1.0f;   // AdamW: 1 - lr * weight_decay, applied to p first; Adam: 1
  float wd = 0.0f;       // Adam (coupled): g += wd * p
  float w1 = 0.1f;       // 1 - beta1
  float b2 = 0.999f;     // beta2
  float w2 = 0.001f;     // 1 - beta2
  float bc2_sqrt = 1.0f; // sqrt(1 - beta2^t)
  float eps = 1e-8f;
  float neg_step = 0.0f; // -lr / (1 - beta1^t)
  bool coupled = false;  // weight decay added to the gradient (Adam with weight_decay != 0)
  bool amsgrad = false;
};
// step >= 1 (the count after this update); throws ValueError for out-of-range hyperparameters.
AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step, bool decoupled, bool amsgrad);
// vmax may be null unless k.amsgrad.
void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                 int64_t n, const AdamCoefficients& k, cudaStream_t stream);

// ---- y = x rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), stored as raw bf16 bits:
// the operands of the exact bf16 products (lt_gemm.hpp, MathMode::bf16_operands).
void round_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// ---- out[c] = sum_r x[r * cols + c]: the bias gradient of linear (a column reduction).
std::size_t column_sum_workspace_bytes(int64_t rows, int64_t cols);
void column_sum(const float* x, float* out, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream);

// ---- sequences of a recurrent layer (rnn_kernels.cu): float32 (T, N, W), or (N, T, W) with
// batch_first; `lengths` int32 (N) in device memory, each in [1, T] (checked by the caller on the
// host), or null: every sequence T long.
// dst(t, n) = src(len[n] - 1 - t, n) with `reverse`, else src(t, n), for t < len[n]; zeros for
// t >= len[n]. src and dst must not overlap.
void sequence_copy(const float* src, float* dst, int64_t T, int64_t N, int64_t W, const int32_t* lengths,
                   bool batch_first, bool reverse, cudaStream_t stream);
// data(t, n) = 0 for t >= len[n], in place (lengths required).
void sequence_zero_padding(float* data, int64_t T, int64_t N, int64_t W, const int32_t* lengths, bool batch_first,
                           cudaStream_t stream);
// The core's int64 lengths as cuDNN's int32, saturating (a value outside int32 stays out of range).
void lengths_to_int32(const int64_t* src, int32_t* dst, int64_t n, cudaStream_t stream);

}  // namespace treadle::cuda

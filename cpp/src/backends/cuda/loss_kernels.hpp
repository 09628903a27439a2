#pragma once
// The core's losses of one prediction against a target of its shape: mse_loss, l1_loss, huber_loss
// (delta) and bce_with_logits, reduced to a scalar by "mean" or "sum", and their backward ops
// (pred, target, upstream scalar) -> d/dpred. As the Eigen reference (backends/eigen/loss_kernels.cpp):
// per-element terms in float32, the total summed in double and divided by n in double (a mean over
// no elements is NaN, a sum 0); the gradient's scale is upstream / n in double, rounded to float32
// once. The total is summed in an order fixed by n: per-block partials, then one block adds them.
// Conventions of cuda_kernels.hpp (host-side checks, explicit stream, no allocation, no atomics).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/cuda_kernels.hpp"

namespace treadle::cuda {

enum class PointLoss { mse, l1, huber, bce_with_logits };
const char* point_loss_name(PointLoss kind);

// Scratch of the forward: one double per partial sum.
std::size_t point_loss_workspace_bytes(int64_t n);
// loss[0] = mean or sum over n elements of term(pred, target); delta is read for huber only.
void point_loss_forward(PointLoss kind, const float* pred, const float* target, float* loss, int64_t n,
                        Reduction reduction, float delta, void* workspace, cudaStream_t stream);
// dpred = d term / d pred * scale, scale = grad_loss[0] (a device pointer) over n for "mean".
void point_loss_backward(PointLoss kind, const float* pred, const float* target, const float* grad_loss,
                         float* dpred, int64_t n, Reduction reduction, float delta, cudaStream_t stream);

}  // namespace treadle::cuda

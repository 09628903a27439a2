// Softmax and cross-entropy over one axis of a tensor viewed as (outer, axis, inner).
// Two kernel shapes: contiguous rows (inner == 1) take one block per row with block reductions;
// strided axes (inner > 1) take one thread per position looping over the axis, so that neighbouring
// threads read neighbouring addresses. Both subtract the axis maximum before exp (no overflow) and
// reduce in a fixed order: results do not depend on the launch beyond the shape.
#include <cmath>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Max and sum of exp(x - max) along one contiguous row, with the block.
__device__ void row_stats(const float* row, int64_t len, float* smem, float& mx, float& sum) {
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < len; c += blockDim.x) m = fmaxf(m, row[c]);
  mx = block_reduce(m, MaxOp{}, -INFINITY, smem);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < len; c += blockDim.x) s += expf(row[c] - mx);
  sum = block_reduce(s, SumOp{}, 0.0f, smem);
}

// The same along a strided axis, by one thread.
__device__ void column_stats(const float* base, int64_t len, int64_t stride, float& mx, float& sum) {
  float m = -INFINITY;
  for (int64_t c = 0; c < len; ++c) m = fmaxf(m, base[c * stride]);
  float s = 0.0f;
  for (int64_t c = 0; c < len; ++c) s += expf(base[c * stride] - m);
  mx = m;
  sum = s;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t len) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * len;
    float mx, sum;
    row_stats(xr, len, smem, mx, sum);
    const float inv = 1.0f / sum;
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) y[r * len + c] = expf(xr[c] - mx) * inv;
  }
}

__global__ void softmax_columns(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t len,
                                int64_t inner) {
  const int64_t positions = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * len * inner + p % inner;
    float mx, sum;
    column_stats(x + base, len, inner, mx, sum);
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < len; ++c) y[base + c * inner] = expf(x[base + c * inner] - mx) * inv;
  }
}

__global__ void softmax_backward_rows(const float* __restrict__ y, const float* __restrict__ dy,
                                      float* __restrict__ dx, int64_t rows, int64_t len) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * len;
    float d = 0.0f;
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) d += y[off + c] * dy[off + c];
    const float dot = block_reduce(d, SumOp{}, 0.0f, smem);
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) dx[off + c] = y[off + c] * (dy[off + c] - dot);
  }
}

__global__ void softmax_backward_columns(const float* __restrict__ y, const float* __restrict__ dy,
                                         float* __restrict__ dx, int64_t outer, int64_t len, int64_t inner) {
  const int64_t positions = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * len * inner + p % inner;
    float dot = 0.0f;
    for (int64_t c = 0; c < len; ++c) dot += y[base + c * inner] * dy[base + c * inner];
    for (int64_t c = 0; c < len; ++c) {
      const int64_t i = base + c * inner;
      dx[i] = y[i] * (dy[i] - dot);
    }
  }
}

// -log_softmax at the label, rounded in the order of the reference: (x_l - max) - log(sum).
__device__ float label_loss(float x_label, float mx, float sum) { return -((x_label - mx) - logf(sum)); }

__global__ void ce_rows(const float* __restrict__ x, const int64_t* __restrict__ labels, float* __restrict__ losses,
                        int64_t rows, int64_t classes) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * classes;
    float mx, sum;
    row_stats(xr, classes, smem, mx, sum);
    if (threadIdx.x == 0) {
      const int64_t l = labels[r];
      losses[r] = (l >= 0 && l < classes) ? label_loss(xr[l], mx, sum) : NAN;
    }
  }
}

__global__ void ce_columns(const float* __restrict__ x, const int64_t* __restrict__ labels,
                           float* __restrict__ losses, int64_t outer, int64_t classes, int64_t inner) {
  const int64_t positions = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * classes * inner + p % inner;
    float mx, sum;
    column_stats(x + base, classes, inner, mx, sum);
    const int64_t l = labels[p];
    losses[p] = (l >= 0 && l < classes) ? label_loss(x[base + l * inner], mx, sum) : NAN;
  }
}

// One block adds the per-position losses in double, in a fixed order.
__global__ void ce_total(const float* __restrict__ losses, float* __restrict__ loss, int64_t positions, double scale) {
  __shared__ double smem[32];
  double s = 0.0;
  for (int64_t p = threadIdx.x; p < positions; p += blockDim.x) s += static_cast<double>(losses[p]);
  s = block_reduce(s, SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(s * scale);
}

__global__ void ce_backward_rows(const float* __restrict__ x, const int64_t* __restrict__ labels,
                                 const float* __restrict__ grad_loss, float* __restrict__ dx, int64_t rows,
                                 int64_t classes, float scale) {
  __shared__ float smem[32];
  const float g = grad_loss[0] * scale;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * classes;
    float mx, sum;
    row_stats(xr, classes, smem, mx, sum);
    const int64_t l = labels[r];
    const bool valid = l >= 0 && l < classes;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
      const float prob = expf(xr[c] - mx) / sum;
      dx[r * classes + c] = valid ? (c == l ? prob - 1.0f : prob) * g : NAN;
    }
  }
}

__global__ void ce_backward_columns(const float* __restrict__ x, const int64_t* __restrict__ labels,
                                    const float* __restrict__ grad_loss, float* __restrict__ dx, int64_t outer,
                                    int64_t classes, int64_t inner, float scale) {
  const float g = grad_loss[0] * scale;
  const int64_t positions = outer * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * classes * inner + p % inner;
    float mx, sum;
    column_stats(x + base, classes, inner, mx, sum);
    const int64_t l = labels[p];
    const bool valid = l >= 0 && l < classes;
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t i = base + c * inner;
      const float prob = expf(x[i] - mx) / sum;
      dx[i] = valid ? (c == l ? prob - 1.0f : prob) * g : NAN;
    }
  }
}

void check_layout(const char* fn, int64_t outer, int64_t axis, int64_t inner) {
  if (outer < 0 || axis < 1 || inner < 1)
    throw_value_error(fn, ": expected outer >= 0, axis >= 1, inner >= 1; got (", outer, ", ", axis, ", ", inner, ")");
}

void check_pointers(const char* fn, int64_t count, std::initializer_list<const void*> ptrs) {
  if (count == 0) return;
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, ": null device pointer for a tensor of ", count, " elements");
}

}  // namespace

void softmax_forward(const float* x, float* y, int64_t outer, int64_t axis, int64_t inner, cudaStream_t stream) {
  check_layout("softmax_forward", outer, axis, inner);
  check_pointers("softmax_forward", outer * axis * inner, {x, y});
  if (outer == 0) return;
  if (inner == 1)
    softmax_rows<<<row_blocks(outer), reduction_threads(axis), 0, stream>>>(x, y, outer, axis);
  else
    softmax_columns<<<element_blocks(outer * inner), kElementThreads, 0, stream>>>(x, y, outer, axis, inner);
  check_launch("softmax_forward");
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t outer, int64_t axis, int64_t inner,
                      cudaStream_t stream) {
  check_layout("softmax_backward", outer, axis, inner);
  check_pointers("softmax_backward", outer * axis * inner, {y, dy, dx});
  if (outer == 0) return;
  if (inner == 1)
    softmax_backward_rows<<<row_blocks(outer), reduction_threads(axis), 0, stream>>>(y, dy, dx, outer, axis);
  else
    softmax_backward_columns<<<element_blocks(outer * inner), kElementThreads, 0, stream>>>(y, dy, dx, outer, axis,
                                                                                            inner);
  check_launch("softmax_backward");
}

std::size_t cross_entropy_workspace_bytes(int64_t outer, int64_t inner) {
  return static_cast<std::size_t>(outer * inner) * sizeof(float);
}

void cross_entropy_forward(const float* logits, const int64_t* labels, float* loss, int64_t outer, int64_t classes,
                           int64_t inner, Reduction reduction, void* workspace, cudaStream_t stream) {
  check_layout("cross_entropy_forward", outer, classes, inner);
  const int64_t positions = outer * inner;
  check_pointers("cross_entropy_forward", positions, {logits, labels, workspace});
  check_pointers("cross_entropy_forward", 1, {loss});
  float* losses = static_cast<float*>(workspace);
  if (positions > 0) {
    if (inner == 1)
      ce_rows<<<row_blocks(outer), reduction_threads(classes), 0, stream>>>(logits, labels, losses, outer, classes);
    else
      ce_columns<<<element_blocks(positions), kElementThreads, 0, stream>>>(logits, labels, losses, outer, classes,
                                                                            inner);
    check_launch("cross_entropy_forward");
  }
  // Mean over no positions is NaN, as torch's; a sum over none is 0.
  const double scale = reduction == Reduction::mean ? (positions > 0 ? 1.0 / static_cast<double>(positions) : NAN) : 1.0;
  ce_total<<<1, 1024, 0, stream>>>(losses, loss, positions, scale);
  check_launch("cross_entropy_forward: total");
}

void cross_entropy_backward(const float* logits, const int64_t* labels, const float* grad_loss, float* dlogits,
                            int64_t outer, int64_t classes, int64_t inner, Reduction reduction, cudaStream_t stream) {
  check_layout("cross_entropy_backward", outer, classes, inner);
  const int64_t positions = outer * inner;
  check_pointers("cross_entropy_backward", positions, {logits, labels, grad_loss, dlogits});
  if (positions == 0) return;
  const float scale = reduction == Reduction::mean ? static_cast<float>(1.0 / static_cast<double>(positions)) : 1.0f;
  if (inner == 1)
    ce_backward_rows<<<row_blocks(outer), reduction_threads(classes), 0, stream>>>(logits, labels, grad_loss, dlogits,
                                                                                   outer, classes, scale);
  else
    ce_backward_columns<<<element_blocks(positions), kElementThreads, 0, stream>>>(logits, labels, grad_loss, dlogits,
                                                                                  outer, classes, inner, scale);
  check_launch("cross_entropy_backward");
}

}  // namespace treadle::cuda

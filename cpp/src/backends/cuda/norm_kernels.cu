// Normalisation kernels. Per-row statistics take one block per row (grid-stride over rows) with
// block reductions in double: the reference's two passes (mean, then centred squares) and the same
// double formulas for every output, so float32 results agree with it to rounding. Reductions over
// rows (the weight gradients) run in two passes through the workspace: partial sums of fixed row
// ranges, then their sum in range order. Fixed orders everywhere, no atomics.
#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/norm_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Rows per partial sum of a weight gradient, and the most partial sums kept per column.
constexpr int64_t kRowsPerPart = 32;
constexpr int64_t kMaxParts = 256;

int64_t parts_for(int64_t rows) {
  const int64_t parts = (rows + kRowsPerPart - 1) / kRowsPerPart;
  return parts < 1 ? 1 : parts > kMaxParts ? kMaxParts : parts;
}

// Mean and 1/sqrt(biased var + eps) of `len` contiguous values, with the block; every thread gets them.
__device__ void row_mean_rstd(const float* x, int64_t len, double eps, double* smem, double& mean, double& rstd) {
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += static_cast<double>(x[j]);
  mean = block_reduce(s, SumOp{}, 0.0, smem) / static_cast<double>(len);
  double v = 0.0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double d = static_cast<double>(x[j]) - mean;
    v += d * d;
  }
  rstd = 1.0 / sqrt(block_reduce(v, SumOp{}, 0.0, smem) / static_cast<double>(len) + eps);
}

__global__ void layer_norm_rows(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                int64_t rows, int64_t len, double eps) {
  __shared__ double smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * len;
    double m, rs;
    row_mean_rstd(xr, len, eps, smem, m, rs);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<float>(m);
      rstd[r] = static_cast<float>(rs);
    }
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      double v = (static_cast<double>(xr[j]) - m) * rs;
      if (w) v *= static_cast<double>(w[j]);
      if (b) v += static_cast<double>(b[j]);
      y[r * len + j] = static_cast<float>(v);
    }
  }
}

__global__ void rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                              float* __restrict__ rstd, int64_t rows, int64_t len, double eps) {
  __shared__ double smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * len;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
    const double rs = 1.0 / sqrt(block_reduce(ss, SumOp{}, 0.0, smem) / static_cast<double>(len) + eps);
    if (threadIdx.x == 0) rstd[r] = static_cast<float>(rs);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const double v = static_cast<double>(xr[j]) * rs;
      y[r * len + j] = static_cast<float>(w ? v * static_cast<double>(w[j]) : v);
    }
  }
}

// dx per row; `mean` null: the RMS form.
__global__ void row_norm_dx(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ mean,
                            const float* __restrict__ rstd, const float* __restrict__ w, float* __restrict__ dx,
                            int64_t rows, int64_t len) {
  __shared__ double smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * len;
    const double m = mean ? static_cast<double>(mean[r]) : 0.0, rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const double g = w ? static_cast<double>(dy[off + j]) * w[j] : static_cast<double>(dy[off + j]);
      sg += g;
      sgx += g * (static_cast<double>(x[off + j]) - m) * rs;
    }
    const double mg = mean ? block_reduce(sg, SumOp{}, 0.0, smem) / static_cast<double>(len) : 0.0;
    const double mgx = block_reduce(sgx, SumOp{}, 0.0, smem) / static_cast<double>(len);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const double g = w ? static_cast<double>(dy[off + j]) * w[j] : static_cast<double>(dy[off + j]);
      dx[off + j] = static_cast<float>(rs * (g - mg - (static_cast<double>(x[off + j]) - m) * rs * mgx));
    }
  }
}

// Pass 1 of the weight gradients: partial sums over row range `part` for column j, into
// acc_w[part * len + j] (and acc_b when db is wanted).
__global__ void row_norm_dweight_parts(const float* __restrict__ dy, const float* __restrict__ x,
                                       const float* __restrict__ mean, const float* __restrict__ rstd,
                                       double* __restrict__ acc_w, double* __restrict__ acc_b, int64_t rows,
                                       int64_t len, int64_t parts) {
  const int64_t per = (rows + parts - 1) / parts;
  const int64_t items = parts * len, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
    const int64_t part = i / len, j = i % len;
    const int64_t r1 = (part + 1) * per < rows ? (part + 1) * per : rows;
    double sw = 0.0, sb = 0.0;
    for (int64_t r = part * per; r < r1; ++r) {
      const double m = mean ? static_cast<double>(mean[r]) : 0.0;
      const double g = dy[r * len + j];
      sw += g * (static_cast<double>(x[r * len + j]) - m) * static_cast<double>(rstd[r]);
      sb += g;
    }
    acc_w[i] = sw;
    if (acc_b) acc_b[i] = sb;
  }
}

// Pass 2: the partial sums of each column added in range order.
__global__ void sum_parts(const double* __restrict__ acc_w, const double* __restrict__ acc_b, float* __restrict__ dw,
                          float* __restrict__ db, int64_t len, int64_t parts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < len; j += stride) {
    double sw = 0.0, sb = 0.0;
    for (int64_t p = 0; p < parts; ++p) {
      sw += acc_w[p * len + j];
      if (db) sb += acc_b[p * len + j];
    }
    dw[j] = static_cast<float>(sw);
    if (db) db[j] = static_cast<float>(sb);
  }
}

// ---- group_norm: row r = (sample, group) of cg * spatial values; channel of element k in the row
// is (r % groups) * cg + k / spatial.
__global__ void group_norm_rows(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                GroupNormShape s, double eps) {
  __shared__ double smem[32];
  const int64_t cg = s.channels / s.groups, len = cg * s.spatial, rows = s.n * s.groups;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * len;
    double m, rs;
    row_mean_rstd(xr, len, eps, smem, m, rs);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<float>(m);
      rstd[r] = static_cast<float>(rs);
    }
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const int64_t c = (r % s.groups) * cg + k / s.spatial;
      const double wc = w ? static_cast<double>(w[c]) : 1.0, bc = b ? static_cast<double>(b[c]) : 0.0;
      y[r * len + k] = static_cast<float>((static_cast<double>(xr[k]) - m) * rs * wc + bc);
    }
  }
}

__global__ void group_norm_dx(const float* __restrict__ dy, const float* __restrict__ x,
                              const float* __restrict__ mean, const float* __restrict__ rstd,
                              const float* __restrict__ w, float* __restrict__ dx, GroupNormShape s) {
  __shared__ double smem[32];
  const int64_t cg = s.channels / s.groups, len = cg * s.spatial, rows = s.n * s.groups;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * len;
    const double m = mean[r], rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const double wc = w ? static_cast<double>(w[(r % s.groups) * cg + k / s.spatial]) : 1.0;
      const double g = static_cast<double>(dy[off + k]) * wc;
      sg += g;
      sgx += g * (static_cast<double>(x[off + k]) - m) * rs;
    }
    const double mg = block_reduce(sg, SumOp{}, 0.0, smem) / static_cast<double>(len);
    const double mgx = block_reduce(sgx, SumOp{}, 0.0, smem) / static_cast<double>(len);
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const double wc = w ? static_cast<double>(w[(r % s.groups) * cg + k / s.spatial]) : 1.0;
      dx[off + k] =
          static_cast<float>(rs * (static_cast<double>(dy[off + k]) * wc - mg - (x[off + k] - m) * rs * mgx));
    }
  }
}

// One block per channel: dweight = sum dy * (x - mean) * rstd, dbias = sum dy over (n, spatial).
__global__ void group_norm_dweight(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   float* __restrict__ dw, float* __restrict__ db, GroupNormShape s) {
  __shared__ double smem[32];
  const int64_t cg = s.channels / s.groups, count = s.n * s.spatial;
  for (int64_t c = blockIdx.x; c < s.channels; c += gridDim.x) {
    double sw = 0.0, sb = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t n = i / s.spatial, r = n * s.groups + c / cg, o = (n * s.channels + c) * s.spatial + i % s.spatial;
      const double g = dy[o];
      sw += g * (static_cast<double>(x[o]) - static_cast<double>(mean[r])) * static_cast<double>(rstd[r]);
      sb += g;
    }
    sw = block_reduce(sw, SumOp{}, 0.0, smem);
    sb = block_reduce(sb, SumOp{}, 0.0, smem);
    if (threadIdx.x == 0) {
      dw[c] = static_cast<float>(sw);
      db[c] = static_cast<float>(sb);
    }
  }
}

// ---- batch_norm_eval_backward
__global__ void bn_eval_dx(const float* __restrict__ dy, const float* __restrict__ rv, const float* __restrict__ w,
                           float* __restrict__ dx, int64_t total, int64_t channels, int64_t spatial, double eps) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t c = (i / spatial) % channels;
    const double scale = (w ? static_cast<double>(w[c]) : 1.0) * (1.0 / sqrt(static_cast<double>(rv[c]) + eps));
    dx[i] = static_cast<float>(dy[i] * scale);
  }
}

// One block per channel. The product dy * (x - running_mean) is formed in float32 before the double
// scale, as the reference's expression does.
__global__ void bn_eval_dweight(const float* __restrict__ dy, const float* __restrict__ x,
                                const float* __restrict__ rm, const float* __restrict__ rv, float* __restrict__ dw,
                                float* __restrict__ db, int64_t n, int64_t channels, int64_t spatial, double eps) {
  __shared__ double smem[32];
  const int64_t count = n * spatial;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    const double is = 1.0 / sqrt(static_cast<double>(rv[c]) + eps);
    double sw = 0.0, sb = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t o = ((i / spatial) * channels + c) * spatial + i % spatial;
      const float t = __fmul_rn(dy[o], __fsub_rn(x[o], rm[c]));
      sw += static_cast<double>(t) * is;
      sb += static_cast<double>(dy[o]);
    }
    sw = block_reduce(sw, SumOp{}, 0.0, smem);
    sb = block_reduce(sb, SumOp{}, 0.0, smem);
    if (threadIdx.x == 0) {
      dw[c] = static_cast<float>(sw);
      db[c] = static_cast<float>(sb);
    }
  }
}

// ---- log_softmax: contiguous rows (one block each) or strided axes (one thread per position).
__global__ void log_softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t len) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * len;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_reduce(m, MaxOp{}, -INFINITY, smem);
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) s += expf(xr[c] - m);
    const float log_sum = logf(block_reduce(s, SumOp{}, 0.0f, smem));
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) y[r * len + c] = (xr[c] - m) - log_sum;
  }
}

__global__ void log_softmax_columns(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t len,
                                    int64_t inner) {
  const int64_t positions = outer * inner, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * len * inner + p % inner;
    float m = -INFINITY;
    for (int64_t c = 0; c < len; ++c) m = fmaxf(m, x[base + c * inner]);
    float s = 0.0f;
    for (int64_t c = 0; c < len; ++c) s += expf(x[base + c * inner] - m);
    const float log_sum = logf(s);
    for (int64_t c = 0; c < len; ++c) y[base + c * inner] = (x[base + c * inner] - m) - log_sum;
  }
}

__global__ void log_softmax_backward_rows(const float* __restrict__ y, const float* __restrict__ dy,
                                          float* __restrict__ dx, int64_t rows, int64_t len) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * len;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) s += dy[off + c];
    const float sum = block_reduce(s, SumOp{}, 0.0f, smem);
    for (int64_t c = threadIdx.x; c < len; c += blockDim.x) dx[off + c] = dy[off + c] - expf(y[off + c]) * sum;
  }
}

__global__ void log_softmax_backward_columns(const float* __restrict__ y, const float* __restrict__ dy,
                                             float* __restrict__ dx, int64_t outer, int64_t len, int64_t inner) {
  const int64_t positions = outer * inner, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const int64_t base = (p / inner) * len * inner + p % inner;
    float sum = 0.0f;
    for (int64_t c = 0; c < len; ++c) sum += dy[base + c * inner];
    for (int64_t c = 0; c < len; ++c) {
      const int64_t i = base + c * inner;
      dx[i] = dy[i] - expf(y[i]) * sum;
    }
  }
}

void check_rows(const char* fn, int64_t rows, int64_t len) {
  if (rows < 0 || len < 1)
    throw_value_error(fn, ": expected rows >= 0 and a row length >= 1, got (", rows, ", ", len, ")");
}

void check_pointers(const char* fn, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, ": null device pointer");
}

void check_group_shape(const char* fn, const GroupNormShape& s) {
  if (s.n < 0 || s.channels < 1 || s.spatial < 1 || s.groups < 1 || s.channels % s.groups != 0)
    throw_value_error(fn, ": expected n >= 0, spatial >= 1 and channels divisible by groups, got n ", s.n,
                      ", channels ", s.channels, ", spatial ", s.spatial, ", groups ", s.groups);
}

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t len, double eps, cudaStream_t stream) {
  check_rows("layer_norm_forward", rows, len);
  if (bias && !weight) throw_value_error("layer_norm_forward: a bias needs a weight");
  if (rows == 0) return;
  check_pointers("layer_norm_forward", {x, y, mean, rstd});
  layer_norm_rows<<<row_blocks(rows), reduction_threads(len), 0, stream>>>(x, weight, bias, y, mean, rstd, rows, len,
                                                                           eps);
  check_launch("layer_norm_forward");
}

void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t len,
                      double eps, cudaStream_t stream) {
  check_rows("rms_norm_forward", rows, len);
  if (rows == 0) return;
  check_pointers("rms_norm_forward", {x, y, rstd});
  rms_norm_rows<<<row_blocks(rows), reduction_threads(len), 0, stream>>>(x, weight, y, rstd, rows, len, eps);
  check_launch("rms_norm_forward");
}

std::size_t row_norm_workspace_bytes(int64_t rows, int64_t len) {
  return 2 * sizeof(double) * static_cast<std::size_t>(parts_for(rows) * len);
}

void row_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* weight,
                       float* dx, float* dweight, float* dbias, int64_t rows, int64_t len, void* workspace,
                       cudaStream_t stream) {
  check_rows("row_norm_backward", rows, len);
  check_pointers("row_norm_backward", {dy, x, rstd, dx});
  if (weight) check_pointers("row_norm_backward (weight gradient)", {dweight, workspace});
  if (rows > 0) {
    row_norm_dx<<<row_blocks(rows), reduction_threads(len), 0, stream>>>(dy, x, mean, rstd, weight, dx, rows, len);
    check_launch("row_norm_backward: dx");
  }
  if (!weight) return;
  const int64_t parts = parts_for(rows);
  auto* acc_w = static_cast<double*>(workspace);
  double* acc_b = dbias ? acc_w + parts * len : nullptr;
  if (rows > 0) {
    row_norm_dweight_parts<<<element_blocks(parts * len), kElementThreads, 0, stream>>>(dy, x, mean, rstd, acc_w,
                                                                                        acc_b, rows, len, parts);
    check_launch("row_norm_backward: weight gradient parts");
  }
  // No rows: one part of zero sums (pass 1 did not run), so write the zeros here.
  sum_parts<<<element_blocks(len), kElementThreads, 0, stream>>>(acc_w, acc_b, dweight, dbias, len,
                                                                 rows > 0 ? parts : 0);
  check_launch("row_norm_backward: weight gradient");
}

void group_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                        const GroupNormShape& s, double eps, cudaStream_t stream) {
  check_group_shape("group_norm_forward", s);
  if ((weight == nullptr) != (bias == nullptr))
    throw_value_error("group_norm_forward: give weight and bias, or neither");
  if (s.n == 0) return;
  check_pointers("group_norm_forward", {x, y, mean, rstd});
  const int64_t len = s.channels / s.groups * s.spatial;
  group_norm_rows<<<row_blocks(s.n * s.groups), reduction_threads(len), 0, stream>>>(x, weight, bias, y, mean, rstd,
                                                                                     s, eps);
  check_launch("group_norm_forward");
}

void group_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* weight,
                         float* dx, float* dweight, float* dbias, const GroupNormShape& s, cudaStream_t stream) {
  check_group_shape("group_norm_backward", s);
  check_pointers("group_norm_backward", {dy, x, mean, rstd, dx});
  if (weight) check_pointers("group_norm_backward (weight gradient)", {dweight, dbias});
  const int64_t len = s.channels / s.groups * s.spatial;
  if (s.n > 0) {
    group_norm_dx<<<row_blocks(s.n * s.groups), reduction_threads(len), 0, stream>>>(dy, x, mean, rstd, weight, dx,
                                                                                     s);
    check_launch("group_norm_backward: dx");
  }
  if (!weight) return;
  group_norm_dweight<<<row_blocks(s.channels), reduction_threads(s.n * s.spatial), 0, stream>>>(dy, x, mean, rstd,
                                                                                                dweight, dbias, s);
  check_launch("group_norm_backward: weight gradient");
}

void batch_norm_eval_backward(const float* dy, const float* x, const float* running_mean, const float* running_var,
                              const float* weight, float* dx, float* dweight, float* dbias, int64_t n,
                              int64_t channels, int64_t spatial, double eps, cudaStream_t stream) {
  if (n < 0 || channels < 1 || spatial < 1)
    throw_value_error("batch_norm_eval_backward: expected n >= 0, channels >= 1, spatial >= 1, got (", n, ", ",
                      channels, ", ", spatial, ")");
  check_pointers("batch_norm_eval_backward", {dy, x, running_mean, running_var, dx});
  if (weight) check_pointers("batch_norm_eval_backward (weight gradient)", {dweight, dbias});
  const int64_t total = n * channels * spatial;
  if (total > 0) {
    bn_eval_dx<<<element_blocks(total), kElementThreads, 0, stream>>>(dy, running_var, weight, dx, total, channels,
                                                                      spatial, eps);
    check_launch("batch_norm_eval_backward: dx");
  }
  if (!weight) return;
  bn_eval_dweight<<<row_blocks(channels), reduction_threads(n * spatial), 0, stream>>>(
      dy, x, running_mean, running_var, dweight, dbias, n, channels, spatial, eps);
  check_launch("batch_norm_eval_backward: weight gradient");
}

void log_softmax_forward(const float* x, float* y, int64_t outer, int64_t axis, int64_t inner, cudaStream_t stream) {
  if (outer < 0 || axis < 1 || inner < 1)
    throw_value_error("log_softmax_forward: expected outer >= 0, axis >= 1, inner >= 1; got (", outer, ", ", axis,
                      ", ", inner, ")");
  if (outer == 0) return;
  check_pointers("log_softmax_forward", {x, y});
  if (inner == 1)
    log_softmax_rows<<<row_blocks(outer), reduction_threads(axis), 0, stream>>>(x, y, outer, axis);
  else
    log_softmax_columns<<<element_blocks(outer * inner), kElementThreads, 0, stream>>>(x, y, outer, axis, inner);
  check_launch("log_softmax_forward");
}

void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t outer, int64_t axis, int64_t inner,
                          cudaStream_t stream) {
  if (outer < 0 || axis < 1 || inner < 1)
    throw_value_error("log_softmax_backward: expected outer >= 0, axis >= 1, inner >= 1; got (", outer, ", ", axis,
                      ", ", inner, ")");
  if (outer == 0) return;
  check_pointers("log_softmax_backward", {y, dy, dx});
  if (inner == 1)
    log_softmax_backward_rows<<<row_blocks(outer), reduction_threads(axis), 0, stream>>>(y, dy, dx, outer, axis);
  else
    log_softmax_backward_columns<<<element_blocks(outer * inner), kElementThreads, 0, stream>>>(y, dy, dx, outer,
                                                                                                axis, inner);
  check_launch("log_softmax_backward");
}

}  // namespace treadle::cuda

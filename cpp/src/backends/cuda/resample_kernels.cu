// Adaptive average pooling, 2-d upsampling and the output transform, forward and backward. One
// thread per output element (forward) or per input element (backward, a gather in the reference's
// scatter order, so the float32 sums round exactly as the reference's). Float arithmetic that the
// reference rounds step by step uses the _rn intrinsics, which nvcc never fuses into an FMA.
#include <cmath>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/launch_common.cuh"
#include "backends/cuda/resample_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

__device__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- adaptive average pooling
__device__ int64_t window_begin(int64_t o, int64_t in, int64_t out) { return o * in / out; }
__device__ int64_t window_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

__global__ void adaptive_forward_k(const float* __restrict__ x, float* __restrict__ y, AdaptivePoolShape s,
                                   int64_t total) {
  const int64_t iv = s.in[0] * s.in[1] * s.in[2], ov = s.out[0] * s.out[1] * s.out[2];
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t p = i / ov, ow = i % s.out[2], oh = (i / s.out[2]) % s.out[1];
    const int64_t od = (i / (s.out[2] * s.out[1])) % s.out[0];
    const int64_t d0 = window_begin(od, s.in[0], s.out[0]), d1 = window_end(od, s.in[0], s.out[0]);
    const int64_t h0 = window_begin(oh, s.in[1], s.out[1]), h1 = window_end(oh, s.in[1], s.out[1]);
    const int64_t w0 = window_begin(ow, s.in[2], s.out[2]), w1 = window_end(ow, s.in[2], s.out[2]);
    const float* xp = x + p * iv;
    float sum = 0.0f;
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) sum += xp[(d * s.in[1] + h) * s.in[2] + w];
    y[i] = sum / static_cast<float>((d1 - d0) * (h1 - h0) * (w1 - w0));
  }
}

// The outputs along one dimension whose windows may hold input index i: [lo, hi).
struct OutRange {
  int64_t lo, hi;
};
__device__ OutRange outputs_over(int64_t i, int64_t in, int64_t out) {
  const int64_t hi = ((i + 1) * out + in - 1) / in;
  return {i * out / in, hi < out ? hi : out};
}

// Each input element adds dy / count of every window holding it, in output order (the reference's).
__global__ void adaptive_backward_k(const float* __restrict__ dy, float* __restrict__ dx, AdaptivePoolShape s,
                                    int64_t total) {
  const int64_t iv = s.in[0] * s.in[1] * s.in[2], ov = s.out[0] * s.out[1] * s.out[2];
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t p = i / iv, w = i % s.in[2], h = (i / s.in[2]) % s.in[1], d = (i / (s.in[2] * s.in[1])) % s.in[0];
    const OutRange rd = outputs_over(d, s.in[0], s.out[0]), rh = outputs_over(h, s.in[1], s.out[1]),
                   rw = outputs_over(w, s.in[2], s.out[2]);
    float acc = 0.0f;
    for (int64_t od = rd.lo; od < rd.hi; ++od) {
      const int64_t d0 = window_begin(od, s.in[0], s.out[0]), d1 = window_end(od, s.in[0], s.out[0]);
      if (d < d0 || d >= d1) continue;
      for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
        const int64_t h0 = window_begin(oh, s.in[1], s.out[1]), h1 = window_end(oh, s.in[1], s.out[1]);
        if (h < h0 || h >= h1) continue;
        for (int64_t ow = rw.lo; ow < rw.hi; ++ow) {
          const int64_t w0 = window_begin(ow, s.in[2], s.out[2]), w1 = window_end(ow, s.in[2], s.out[2]);
          if (w < w0 || w >= w1) continue;
          const float count = static_cast<float>((d1 - d0) * (h1 - h0) * (w1 - w0));
          acc += dy[p * ov + (od * s.out[1] + oh) * s.out[2] + ow] / count;
        }
      }
    }
    dx[i] = acc;
  }
}

// ---- upsampling: where one output row/column reads (the reference's Tap: nearest has w1 = 0).
struct Tap {
  int64_t i0, i1;
  double w0, w1;
};

__device__ Tap nearest_tap(int64_t dst, int64_t in, int64_t out, double user_scale) {
  int64_t src;
  if (out == in) {
    src = dst;
  } else if (out == 2 * in) {
    src = dst >> 1;
  } else {
    const float scale = user_scale > 0 ? static_cast<float>(1.0 / user_scale)
                                       : __fdiv_rn(static_cast<float>(in), static_cast<float>(out));
    const auto f = static_cast<int64_t>(floorf(__fmul_rn(static_cast<float>(dst), scale)));
    src = f < in - 1 ? f : in - 1;
  }
  return {src, src, 1.0, 0.0};
}

__device__ Tap linear_tap(int64_t dst, int64_t in, int64_t out, bool align_corners, double user_scale) {
  if (in == out) return {dst, dst, 1.0, 0.0};
  float scale;
  if (align_corners)
    scale = out > 1 ? __fdiv_rn(static_cast<float>(in - 1), static_cast<float>(out - 1)) : 0.0f;
  else
    scale = user_scale > 0 ? static_cast<float>(1.0 / user_scale)
                           : __fdiv_rn(static_cast<float>(in), static_cast<float>(out));
  float src = align_corners ? __fmul_rn(scale, static_cast<float>(dst))
                            : __fsub_rn(__fmul_rn(scale, __fadd_rn(static_cast<float>(dst), 0.5f)), 0.5f);
  if (!align_corners && src < 0.0f) src = 0.0f;
  const auto f = static_cast<int64_t>(floorf(src));
  const int64_t i0 = f < in - 1 ? f : in - 1;
  const float lambda = fminf(fmaxf(__fsub_rn(src, static_cast<float>(i0)), 0.0f), 1.0f);
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), static_cast<double>(__fsub_rn(1.0f, lambda)), static_cast<double>(lambda)};
}

// taps[0, out_h) for the rows, taps[out_h, out_h + out_w) for the columns.
__global__ void make_taps_k(Tap* __restrict__ taps, UpsampleShape s) {
  for (int64_t t = first_index(); t < s.out_h + s.out_w; t += grid_stride()) {
    const bool row = t < s.out_h;
    const int64_t dst = row ? t : t - s.out_h, in = row ? s.in_h : s.in_w, out = row ? s.out_h : s.out_w;
    const double user = row ? s.scale_h : s.scale_w;
    taps[t] = s.bilinear ? linear_tap(dst, in, out, s.align_corners, user) : nearest_tap(dst, in, out, user);
  }
}

__global__ void upsample_forward_k(const float* __restrict__ x, float* __restrict__ y, const Tap* __restrict__ taps,
                                   UpsampleShape s, int64_t total) {
  const Tap* cols = taps + s.out_h;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t p = i / (s.out_h * s.out_w), oi = (i / s.out_w) % s.out_h, oj = i % s.out_w;
    const Tap &r = taps[oi], &c = cols[oj];
    const float* x0 = x + (p * s.in_h + r.i0) * s.in_w;
    if (!s.bilinear) {  // a copy, as the reference (a weighted sum would turn Inf into NaN)
      y[i] = x0[c.i0];
      continue;
    }
    const float* x1 = x + (p * s.in_h + r.i1) * s.in_w;
    const float rw0 = static_cast<float>(r.w0), rw1 = static_cast<float>(r.w1);
    const float cw0 = static_cast<float>(c.w0), cw1 = static_cast<float>(c.w1);
    const float top = __fadd_rn(__fmul_rn(cw0, x0[c.i0]), __fmul_rn(cw1, x0[c.i1]));
    const float bottom = __fadd_rn(__fmul_rn(cw0, x1[c.i0]), __fmul_rn(cw1, x1[c.i1]));
    y[i] = __fadd_rn(__fmul_rn(rw0, top), __fmul_rn(rw1, bottom));
  }
}

// The taps (non-decreasing in both i0 and i1) that read index v: [first with i1 >= v, first with i0 > v).
__device__ OutRange taps_reading(const Tap* taps, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (taps[mid].i1 >= v) hi = mid; else lo = mid + 1;
  }
  int64_t end = lo, top = n;
  while (end < top) {
    const int64_t mid = (end + top) / 2;
    if (taps[mid].i0 > v) top = mid; else end = mid + 1;
  }
  return {lo, end};
}

// dx at (p, h, w): the reference's scatter terms that land here, in its order (rows, columns, then
// the four taps), each rounded to float32 before it is added.
__global__ void upsample_backward_k(const float* __restrict__ dy, float* __restrict__ dx, const Tap* __restrict__ taps,
                                    UpsampleShape s, int64_t total) {
  const Tap* cols = taps + s.out_h;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t p = i / (s.in_h * s.in_w), h = (i / s.in_w) % s.in_h, w = i % s.in_w;
    const OutRange rr = taps_reading(taps, s.out_h, h), rc = taps_reading(cols, s.out_w, w);
    const float* dyp = dy + p * s.out_h * s.out_w;
    float acc = 0.0f;
    for (int64_t oi = rr.lo; oi < rr.hi; ++oi) {
      const Tap& r = taps[oi];
      for (int64_t oj = rc.lo; oj < rc.hi; ++oj) {
        const Tap& c = cols[oj];
        if (!s.bilinear) {
          if (r.i0 == h && c.i0 == w) acc += dyp[oi * s.out_w + oj];
          continue;
        }
        const double g = dyp[oi * s.out_w + oj];
        if (r.i0 == h && c.i0 == w) acc += static_cast<float>(r.w0 * c.w0 * g);
        if (r.i0 == h && c.i1 == w) acc += static_cast<float>(r.w0 * c.w1 * g);
        if (r.i1 == h && c.i0 == w) acc += static_cast<float>(r.w1 * c.w0 * g);
        if (r.i1 == h && c.i1 == w) acc += static_cast<float>(r.w1 * c.w1 * g);
      }
    }
    dx[i] = acc;
  }
}

// ---- output transform (torch's softplus: beta 1, threshold 20)
__device__ double act_value(int act, double x) {
  switch (act) {
    case 1: return x > 20.0 ? x : log1p(exp(x));
    case 2: return 1.0 / (1.0 + exp(-x));
    case 3: return tanh(x);
    default: return x;
  }
}

__device__ double act_slope(int act, double x) {
  switch (act) {
    case 1: return x > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-x));
    case 2: {
      const double sg = 1.0 / (1.0 + exp(-x));
      return sg * (1.0 - sg);
    }
    case 3: {
      const double t = tanh(x);
      return 1.0 - t * t;
    }
    default: return 1.0;
  }
}

__device__ int64_t pick(int64_t n, int64_t j) { return n == 1 ? 0 : j; }

__global__ void output_transform_k(const float* __restrict__ x, const float* __restrict__ scale,
                                   const float* __restrict__ shift, float* __restrict__ y, OutputTransformShape s) {
  for (int64_t i = first_index(); i < s.rows * s.d; i += grid_stride()) {
    const int64_t j = i % s.d;
    const double v = act_value(s.acts[pick(s.num_acts, j)], x[i]);
    y[i] = static_cast<float>(v * scale[pick(s.scale_len, j)] + shift[pick(s.shift_len, j)]);
  }
}

__global__ void output_transform_dx_k(const float* __restrict__ dy, const float* __restrict__ x,
                                      const float* __restrict__ scale, float* __restrict__ dx, OutputTransformShape s) {
  for (int64_t i = first_index(); i < s.rows * s.d; i += grid_stride()) {
    const int64_t j = i % s.d;
    dx[i] = static_cast<float>(static_cast<double>(dy[i]) * act_slope(s.acts[pick(s.num_acts, j)], x[i]) *
                               scale[pick(s.scale_len, j)]);
  }
}

// Block q < scale_len: dscale[q]; block scale_len + q: dshift[q]. A parameter of length 1 sums
// every element, one of length d its column.
__global__ void output_transform_params_k(const float* __restrict__ dy, const float* __restrict__ x,
                                          float* __restrict__ dscale, float* __restrict__ dshift,
                                          OutputTransformShape s) {
  __shared__ double smem[32];
  for (int64_t q = blockIdx.x; q < s.scale_len + s.shift_len; q += gridDim.x) {
    const bool is_scale = q < s.scale_len;
    const int64_t col = is_scale ? q : q - s.scale_len, len = is_scale ? s.scale_len : s.shift_len;
    const int64_t count = len == 1 ? s.rows * s.d : s.rows;
    double sum = 0.0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t i = len == 1 ? k : k * s.d + col;
      const double g = dy[i];
      sum += is_scale ? g * act_value(s.acts[pick(s.num_acts, i % s.d)], x[i]) : g;
    }
    sum = block_reduce(sum, SumOp{}, 0.0, smem);
    if (threadIdx.x == 0) (is_scale ? dscale : dshift)[col] = static_cast<float>(sum);
  }
}

void check_pointers(const char* fn, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p == nullptr) throw_value_error(fn, ": null device pointer");
}

void check_adaptive(const char* fn, const AdaptivePoolShape& s) {
  for (int k = 0; k < 3; ++k)
    if (s.in[k] < 1 || s.out[k] < 1)
      throw_value_error(fn, ": sizes must be positive, got input (", s.in[0], ", ", s.in[1], ", ", s.in[2],
                        ") and output (", s.out[0], ", ", s.out[1], ", ", s.out[2], ")");
  if (s.planes < 0) throw_value_error(fn, ": negative plane count ", s.planes);
}

void check_upsample(const char* fn, const UpsampleShape& s) {
  if (s.planes < 0 || s.in_h < 1 || s.in_w < 1 || s.out_h < 1 || s.out_w < 1)
    throw_value_error(fn, ": expected planes >= 0 and positive sizes, got planes ", s.planes, ", input (", s.in_h,
                      ", ", s.in_w, "), output (", s.out_h, ", ", s.out_w, ")");
}

void check_transform(const char* fn, const OutputTransformShape& s) {
  const bool lens_ok = (s.scale_len == 1 || s.scale_len == s.d) && (s.shift_len == 1 || s.shift_len == s.d);
  if (s.rows < 0 || s.d < 1 || !lens_ok || s.num_acts < 1 || s.num_acts > kMaxOutputActivations ||
      (s.num_acts != 1 && s.num_acts != s.d))
    throw_value_error(fn, ": inconsistent shape: rows ", s.rows, ", d ", s.d, ", scale ", s.scale_len, ", shift ",
                      s.shift_len, ", activations ", s.num_acts);
}

}  // namespace

void adaptive_avg_pool_forward(const float* x, float* y, const AdaptivePoolShape& s, cudaStream_t stream) {
  check_adaptive("adaptive_avg_pool_forward", s);
  const int64_t total = s.planes * s.out[0] * s.out[1] * s.out[2];
  if (total == 0) return;
  check_pointers("adaptive_avg_pool_forward", {x, y});
  adaptive_forward_k<<<element_blocks(total), kElementThreads, 0, stream>>>(x, y, s, total);
  check_launch("adaptive_avg_pool_forward");
}

void adaptive_avg_pool_backward(const float* dy, float* dx, const AdaptivePoolShape& s, cudaStream_t stream) {
  check_adaptive("adaptive_avg_pool_backward", s);
  const int64_t total = s.planes * s.in[0] * s.in[1] * s.in[2];
  if (total == 0) return;
  check_pointers("adaptive_avg_pool_backward", {dy, dx});
  adaptive_backward_k<<<element_blocks(total), kElementThreads, 0, stream>>>(dy, dx, s, total);
  check_launch("adaptive_avg_pool_backward");
}

std::size_t upsample_workspace_bytes(const UpsampleShape& s) {
  return static_cast<std::size_t>(s.out_h + s.out_w) * sizeof(Tap);
}

void upsample2d_forward(const float* x, float* y, const UpsampleShape& s, void* workspace, cudaStream_t stream) {
  check_upsample("upsample2d_forward", s);
  const int64_t total = s.planes * s.out_h * s.out_w;
  if (total == 0) return;
  check_pointers("upsample2d_forward", {x, y, workspace});
  auto* taps = static_cast<Tap*>(workspace);
  make_taps_k<<<element_blocks(s.out_h + s.out_w), kElementThreads, 0, stream>>>(taps, s);
  check_launch("upsample2d_forward: taps");
  upsample_forward_k<<<element_blocks(total), kElementThreads, 0, stream>>>(x, y, taps, s, total);
  check_launch("upsample2d_forward");
}

void upsample2d_backward(const float* dy, float* dx, const UpsampleShape& s, void* workspace, cudaStream_t stream) {
  check_upsample("upsample2d_backward", s);
  const int64_t total = s.planes * s.in_h * s.in_w;
  if (total == 0) return;
  check_pointers("upsample2d_backward", {dy, dx, workspace});
  auto* taps = static_cast<Tap*>(workspace);
  make_taps_k<<<element_blocks(s.out_h + s.out_w), kElementThreads, 0, stream>>>(taps, s);
  check_launch("upsample2d_backward: taps");
  upsample_backward_k<<<element_blocks(total), kElementThreads, 0, stream>>>(dy, dx, taps, s, total);
  check_launch("upsample2d_backward");
}

void output_transform_forward(const float* x, const float* scale, const float* shift, float* y,
                              const OutputTransformShape& s, cudaStream_t stream) {
  check_transform("output_transform_forward", s);
  if (s.rows == 0) return;
  check_pointers("output_transform_forward", {x, scale, shift, y});
  output_transform_k<<<element_blocks(s.rows * s.d), kElementThreads, 0, stream>>>(x, scale, shift, y, s);
  check_launch("output_transform_forward");
}

void output_transform_backward(const float* dy, const float* x, const float* scale, float* dx, float* dscale,
                               float* dshift, const OutputTransformShape& s, cudaStream_t stream) {
  check_transform("output_transform_backward", s);
  check_pointers("output_transform_backward", {dscale, dshift});
  if (s.rows > 0) {
    check_pointers("output_transform_backward", {dy, x, scale, dx});
    output_transform_dx_k<<<element_blocks(s.rows * s.d), kElementThreads, 0, stream>>>(dy, x, scale, dx, s);
    check_launch("output_transform_backward: dx");
  }
  const int64_t count = s.scale_len == 1 || s.shift_len == 1 ? s.rows * s.d : s.rows;
  output_transform_params_k<<<row_blocks(s.scale_len + s.shift_len), reduction_threads(count), 0, stream>>>(
      dy, x, dscale, dshift, s);
  check_launch("output_transform_backward: scale and shift");
}

}  // namespace treadle::cuda

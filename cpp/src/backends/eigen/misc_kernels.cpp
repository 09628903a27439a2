// Reference kernels for upsampling and the output transform. Upsampling maps output to input
// coordinates exactly as torch's CPU kernels do (same scale rules and rounding), so results match
// to rounding; the backward is the adjoint (scatter of the same taps), parallel over (N, C) planes.
#include <algorithm>
#include <cmath>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace {

using eigen::kElementGrain;
using eigen::parallel_chunks;

// Where one output row/column reads: input indices i0, i1 with weights w0, w1 (nearest: w1 = 0).
struct Tap {
  int64_t i0, i1;
  double w0, w1;
};
static_assert(sizeof(Tap) == 32, "the op's workspace rule assumes 32-byte taps");

// torch's nearest_idx: the scale in float, floor, clamp.
Tap nearest_tap(int64_t dst, int64_t in, int64_t out, double user_scale) {
  int64_t src;
  if (out == in) {
    src = dst;
  } else if (out == 2 * in) {
    src = dst >> 1;
  } else {
    const float scale = user_scale > 0 ? static_cast<float>(1.0 / user_scale) : static_cast<float>(in) / out;
    src = std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * scale)), in - 1);
  }
  return {src, src, 1.0, 0.0};
}

// torch's area_pixel_compute_scale / source_index / guard_index_and_lambda, in the kernel's dtype T.
// A dimension whose size is unchanged maps each index onto itself whatever the scale factor, with
// the zero-weight tap on the same index (torch's rules: a NaN/Inf neighbour does not leak in).
template <typename T>
Tap linear_tap(int64_t dst, int64_t in, int64_t out, bool align_corners, double user_scale) {
  if (in == out) return {dst, dst, 1.0, 0.0};
  T scale;
  if (align_corners)
    scale = out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  else
    scale = user_scale > 0 ? static_cast<T>(1.0 / user_scale) : static_cast<T>(in) / static_cast<T>(out);
  T src = align_corners ? scale * static_cast<T>(dst) : scale * (static_cast<T>(dst) + T(0.5)) - T(0.5);
  if (!align_corners && src < T(0)) src = T(0);
  const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
  const T lambda = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1));
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), static_cast<double>(T(1) - lambda), static_cast<double>(lambda)};
}

// Fills taps for rows (oh entries) then columns (ow entries) into the workspace.
template <typename T>
Tap* make_taps(const KernelArgs& a, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  const bool bilinear = a.attrs().s("mode") == "bilinear", ac = a.attrs().i_or("align_corners", 0) != 0;
  const double sh = a.attrs().f_or("scale_h", 0.0), sw = a.attrs().f_or("scale_w", 0.0);
  Tap* taps = static_cast<Tap*>(a.workspace);
  for (int64_t i = 0; i < oh; ++i) taps[i] = bilinear ? linear_tap<T>(i, h, oh, ac, sh) : nearest_tap(i, h, oh, sh);
  for (int64_t j = 0; j < ow; ++j)
    taps[oh + j] = bilinear ? linear_tap<T>(j, w, ow, ac, sw) : nearest_tap(j, w, ow, sw);
  return taps;
}

template <typename T>
void upsample_kernel(const KernelArgs& a) {
  const int64_t planes = a.in[0].dim(0) * a.in[0].dim(1), h = a.in[0].dim(2), w = a.in[0].dim(3);
  const int64_t oh = a.out[0].dim(2), ow = a.out[0].dim(3);
  const Tap* taps = make_taps<T>(a, h, w, oh, ow);
  const Tap* cols = taps + oh;
  // Nearest copies (as torch does): a weighted sum would turn Inf into NaN through its 0 * Inf tap.
  const bool nearest = a.attrs().s("mode") != "bilinear";
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, planes, std::max<int64_t>(1, kElementGrain / (oh * ow)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const Tap& r = taps[i];
        const T *x0 = xp + r.i0 * w, *x1 = xp + r.i1 * w;
        const T rw0 = static_cast<T>(r.w0), rw1 = static_cast<T>(r.w1);
        if (nearest) {
          for (int64_t j = 0; j < ow; ++j) yp[i * ow + j] = x0[cols[j].i0];
          continue;
        }
        for (int64_t j = 0; j < ow; ++j) {
          const Tap& c = cols[j];
          const T cw0 = static_cast<T>(c.w0), cw1 = static_cast<T>(c.w1);
          yp[i * ow + j] = rw0 * (cw0 * x0[c.i0] + cw1 * x0[c.i1]) + rw1 * (cw0 * x1[c.i0] + cw1 * x1[c.i1]);
        }
      }
    }
  });
}

template <typename T>
void upsample_backward_kernel(const KernelArgs& a) {
  const int64_t planes = a.out[0].dim(0) * a.out[0].dim(1), h = a.out[0].dim(2), w = a.out[0].dim(3);
  const int64_t oh = a.in[0].dim(2), ow = a.in[0].dim(3);
  const Tap* taps = make_taps<T>(a, h, w, oh, ow);
  const Tap* cols = taps + oh;
  const bool nearest = a.attrs().s("mode") != "bilinear";  // a plain scatter, as in the forward
  const T* dy = a.in[0].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  parallel_chunks(a.exec, planes, std::max<int64_t>(1, kElementGrain / (oh * ow)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* dxp = dx + p * h * w;
      const T* dyp = dy + p * oh * ow;
      std::fill(dxp, dxp + h * w, T(0));
      for (int64_t i = 0; i < oh; ++i) {
        const Tap& r = taps[i];
        T *d0 = dxp + r.i0 * w, *d1 = dxp + r.i1 * w;
        if (nearest) {
          for (int64_t j = 0; j < ow; ++j) d0[cols[j].i0] += dyp[i * ow + j];
          continue;
        }
        for (int64_t j = 0; j < ow; ++j) {
          const Tap& c = cols[j];
          const double g = dyp[i * ow + j];
          d0[c.i0] += static_cast<T>(r.w0 * c.w0 * g);
          d0[c.i1] += static_cast<T>(r.w0 * c.w1 * g);
          d1[c.i0] += static_cast<T>(r.w1 * c.w0 * g);
          d1[c.i1] += static_cast<T>(r.w1 * c.w1 * g);
        }
      }
    }
  });
}

// ---- output_transform: y = act(x) * scale + shift per last-dimension index j.
enum Act : int64_t { kIdentity = 0, kSoftplus = 1, kSigmoid = 2, kTanh = 3 };

// torch's softplus with beta = 1, threshold = 20.
double act_value(int64_t act, double x) {
  switch (act) {
    case kSoftplus: return x > 20.0 ? x : std::log1p(std::exp(x));
    case kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case kTanh: return std::tanh(x);
    default: return x;
  }
}

double act_slope(int64_t act, double x) {
  switch (act) {
    case kSoftplus: return x > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-x));
    case kSigmoid: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 - s);
    }
    case kTanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    default: return 1.0;
  }
}

// Index into a per-output parameter of length D or 1.
inline int64_t pick(int64_t n, int64_t j) { return n == 1 ? 0 : j; }

template <typename T>
void output_transform_kernel(const KernelArgs& a) {
  const std::vector<int64_t>& acts = a.attrs().ints("activations");
  const int64_t d = a.in[0].dim(-1), n = a.in[0].numel, ns = a.in[1].numel, nb = a.in[2].numel;
  const int64_t na = static_cast<int64_t>(acts.size());
  const T *x = a.in[0].ptr<T>(), *scale = a.in[1].ptr<T>(), *shift = a.in[2].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t j = i % d;
      y[i] = static_cast<T>(act_value(acts[pick(na, j)], x[i]) * scale[pick(ns, j)] + shift[pick(nb, j)]);
    }
  });
}

template <typename T>
void output_transform_backward_kernel(const KernelArgs& a) {
  const std::vector<int64_t>& acts = a.attrs().ints("activations");
  const int64_t d = a.in[1].dim(-1), n = a.in[1].numel, ns = a.in[2].numel, nb = a.in[3].numel;
  const int64_t na = static_cast<int64_t>(acts.size());
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>(), *scale = a.in[2].ptr<T>();
  T *dx = a.out[0].ptr<T>(), *dscale = a.out[1].ptr<T>(), *dshift = a.out[2].ptr<T>();
  parallel_chunks(a.exec, n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t j = i % d;
      dx[i] = static_cast<T>(dy[i] * act_slope(acts[pick(na, j)], x[i]) * scale[pick(ns, j)]);
    }
  });
  // Column sums (D is the number of outputs: small), serial in row order.
  double *sum_scale = static_cast<double*>(a.workspace), *sum_shift = sum_scale + d;
  std::fill(sum_scale, sum_scale + 2 * d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i % d;
    sum_scale[pick(ns, j)] += dy[i] * act_value(acts[pick(na, j)], x[i]);
    sum_shift[pick(nb, j)] += dy[i];
  }
  for (int64_t j = 0; j < ns; ++j) dscale[j] = static_cast<T>(sum_scale[j]);
  for (int64_t j = 0; j < nb; ++j) dshift[j] = static_cast<T>(sum_shift[j]);
}

}  // namespace

void register_eigen_misc(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "upsample2d", upsample_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "upsample2d_backward", upsample_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "output_transform", output_transform_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "output_transform_backward", output_transform_backward_kernel);
}

}  // namespace treadle

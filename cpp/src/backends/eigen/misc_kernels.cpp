// Reference kernels for upsampling and the output transform. Upsampling (nearest, nearest-exact,
// bilinear, bicubic) maps output to input coordinates exactly as torch's CPU kernels do (same scale
// rules and rounding), so results match to rounding; the backward is the adjoint (scatter of the same taps), parallel over (N, C) planes.
#include <algorithm>
#include <cmath>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace {

using eigen::kElementGrain;
using eigen::parallel_chunks;

// Where one output row/column reads: input indices i[k] with weights w[k] (nearest: one tap, w = 1;
// bilinear: two; bicubic: four, clamped to the edge as torch's upsample_get_value_bounded does).
struct Tap {
  int64_t i[4];
  double w[4];
};
static_assert(sizeof(Tap) == 64, "the op's workspace rule assumes 64-byte taps");

enum class Mode { nearest, nearest_exact, bilinear, bicubic };

Mode mode_of(const Attrs& attrs) {
  const std::string& m = attrs.s("mode");
  if (m == "bilinear") return Mode::bilinear;
  if (m == "bicubic") return Mode::bicubic;
  return m == "nearest-exact" ? Mode::nearest_exact : Mode::nearest;
}

Tap single(int64_t src) { return {{src, src, src, src}, {1.0, 0.0, 0.0, 0.0}}; }

// torch's compute_scales_value: the user's factor inverted, else the size ratio.
template <typename T>
T scale_value(int64_t in, int64_t out, double user_scale) {
  return user_scale > 0 ? static_cast<T>(1.0 / user_scale) : static_cast<T>(in) / static_cast<T>(out);
}

// torch's nearest_idx: the scale in float, floor, clamp.
Tap nearest_tap(int64_t dst, int64_t in, int64_t out, double user_scale) {
  if (out == in) return single(dst);
  if (out == 2 * in) return single(dst >> 1);
  const float scale = scale_value<float>(in, out, user_scale);
  return single(std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * scale)), in - 1));
}

// torch's nearest_exact_idx: the source pixel whose centre is nearest, floorf((dst + 0.5) * scale).
Tap nearest_exact_tap(int64_t dst, int64_t in, int64_t out, double user_scale) {
  const float scale = scale_value<float>(in, out, user_scale);
  return single(std::min(static_cast<int64_t>(std::floor(static_cast<float>((static_cast<double>(dst) + 0.5) * scale))),
                         in - 1));
}

// torch's area_pixel_compute_scale / source_index / guard_index_and_lambda, in the kernel's dtype T.
// A dimension whose size is unchanged maps each index onto itself whatever the scale factor, with
// the zero-weight tap on the same index (torch's rules: a NaN/Inf neighbour does not leak in).
template <typename T>
T pixel_scale(int64_t in, int64_t out, bool align_corners, double user_scale) {
  if (align_corners) return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  return scale_value<T>(in, out, user_scale);
}

template <typename T>
Tap linear_tap(int64_t dst, int64_t in, int64_t out, bool align_corners, double user_scale) {
  if (in == out) return single(dst);
  const T scale = pixel_scale<T>(in, out, align_corners, user_scale);
  T src = align_corners ? scale * static_cast<T>(dst) : scale * (static_cast<T>(dst) + T(0.5)) - T(0.5);
  if (!align_corners && src < T(0)) src = T(0);
  const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
  const T lambda = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1));
  const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
  return {{i0, i1, i1, i1}, {static_cast<double>(T(1) - lambda), static_cast<double>(lambda), 0.0, 0.0}};
}

// torch's bicubic rule: the source index may be negative (no clamp before the floor, taken in float as
// torch's floorf does), Keys' cubic convolution with A = -0.75 on the four neighbours, edges clamped.
template <typename T>
Tap cubic_tap(int64_t dst, int64_t in, int64_t out, bool align_corners, double user_scale) {
  const T scale = pixel_scale<T>(in, out, align_corners, user_scale);
  const T src = align_corners ? scale * static_cast<T>(dst) : scale * (static_cast<T>(dst) + T(0.5)) - T(0.5);
  const int64_t i0 = std::min(static_cast<int64_t>(std::floor(static_cast<float>(src))), in - 1);
  const T t = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1));
  const T a = T(-0.75);
  const auto near = [a](T x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };          // |x| <= 1
  const auto far = [a](T x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };     // 1 < |x| < 2
  const T w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
  Tap tap;
  for (int k = 0; k < 4; ++k) {
    tap.i[k] = std::min(std::max<int64_t>(i0 - 1 + k, 0), in - 1);
    tap.w[k] = static_cast<double>(w[k]);
  }
  return tap;
}

// Fills taps for rows (oh entries) then columns (ow entries) into the workspace.
template <typename T>
Tap* make_taps(const KernelArgs& a, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  const Mode mode = mode_of(a.attrs());
  const bool ac = a.attrs().i_or("align_corners", 0) != 0;
  const double sh = a.attrs().f_or("scale_h", 0.0), sw = a.attrs().f_or("scale_w", 0.0);
  const auto tap = [&](int64_t dst, int64_t in, int64_t out, double user_scale) {
    switch (mode) {
      case Mode::bilinear: return linear_tap<T>(dst, in, out, ac, user_scale);
      case Mode::bicubic: return cubic_tap<T>(dst, in, out, ac, user_scale);
      case Mode::nearest_exact: return nearest_exact_tap(dst, in, out, user_scale);
      case Mode::nearest: break;
    }
    return nearest_tap(dst, in, out, user_scale);
  };
  Tap* taps = static_cast<Tap*>(a.workspace);
  const bool same = mode == Mode::bicubic && h == oh && w == ow;  // torch copies a same-size bicubic input
  for (int64_t i = 0; i < oh; ++i) taps[i] = same ? single(i) : tap(i, h, oh, sh);
  for (int64_t j = 0; j < ow; ++j) taps[oh + j] = same ? single(j) : tap(j, w, ow, sw);
  return taps;
}

// Taps per row/column: 1 for the nearest modes, 2 bilinear, 4 bicubic.
int taps_of(Mode mode) { return mode == Mode::bicubic ? 4 : mode == Mode::bilinear ? 2 : 1; }

template <typename T>
void upsample_kernel(const KernelArgs& a) {
  const int64_t planes = a.in[0].dim(0) * a.in[0].dim(1), h = a.in[0].dim(2), w = a.in[0].dim(3);
  const int64_t oh = a.out[0].dim(2), ow = a.out[0].dim(3);
  const Tap* taps = make_taps<T>(a, h, w, oh, ow);
  const Tap* cols = taps + oh;
  // Nearest copies (as torch does): a weighted sum would turn Inf into NaN through its 0 * Inf tap.
  const int n = taps_of(mode_of(a.attrs()));
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, planes, std::max<int64_t>(1, kElementGrain / (oh * ow)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const Tap& r = taps[i];
        if (n == 1) {
          const T* x0 = xp + r.i[0] * w;
          for (int64_t j = 0; j < ow; ++j) yp[i * ow + j] = x0[cols[j].i[0]];
          continue;
        }
        for (int64_t j = 0; j < ow; ++j) {  // along the row first, then across rows (torch's order)
          const Tap& c = cols[j];
          T sum = 0;
          for (int u = 0; u < n; ++u) {
            const T* xr = xp + r.i[u] * w;
            T along = 0;
            for (int v = 0; v < n; ++v) along += static_cast<T>(c.w[v]) * xr[c.i[v]];
            sum += static_cast<T>(r.w[u]) * along;
          }
          yp[i * ow + j] = sum;
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
  const int n = taps_of(mode_of(a.attrs()));  // nearest: a plain scatter, as in the forward
  const T* dy = a.in[0].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  parallel_chunks(a.exec, planes, std::max<int64_t>(1, kElementGrain / (oh * ow)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* dxp = dx + p * h * w;
      const T* dyp = dy + p * oh * ow;
      std::fill(dxp, dxp + h * w, T(0));
      for (int64_t i = 0; i < oh; ++i) {
        const Tap& r = taps[i];
        if (n == 1) {
          T* d0 = dxp + r.i[0] * w;
          for (int64_t j = 0; j < ow; ++j) d0[cols[j].i[0]] += dyp[i * ow + j];
          continue;
        }
        for (int64_t j = 0; j < ow; ++j) {
          const Tap& c = cols[j];
          const double g = dyp[i * ow + j];
          for (int u = 0; u < n; ++u) {
            T* dr = dxp + r.i[u] * w;
            for (int v = 0; v < n; ++v) dr[c.i[v]] += static_cast<T>(r.w[u] * c.w[v] * g);
          }
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

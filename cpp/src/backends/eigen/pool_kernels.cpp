// Reference pooling kernels (max, average, adaptive average and their backward passes) over 1 to 3
// spatial dims stored as 3-d with unit leading dims. Planes (n, c) are independent and split over
// the host's executor; within a plane everything runs in a fixed order, so results never depend on
// chunking (overlapping windows accumulate their gradients in output order).
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "ops/conv_geometry.hpp"

namespace treadle {
namespace {
using namespace eigen;

// Window taps k in [lo, hi) of one dimension whose input index start + k*dilation is in [0, size).
struct Taps {
  int64_t lo, hi;
};
inline Taps taps(int64_t start, int64_t kernel, int64_t dilation, int64_t size) {
  if (dilation == 1) {  // the common case, without divisions
    const int64_t lo = std::clamp<int64_t>(-start, 0, kernel);
    return {lo, std::clamp(size - start, lo, kernel)};
  }
  int64_t lo = start >= 0 ? 0 : (-start + dilation - 1) / dilation;
  int64_t hi = size - 1 - start < 0 ? 0 : (size - 1 - start) / dilation + 1;
  return {std::min(lo, kernel), std::clamp(hi, std::min(lo, kernel), kernel)};
}

// Calls visit(input_index) for each tap of the window starting at (d0, h0, w0) that lies inside
// the input, in PyTorch's scan order (d, then h, then w).
template <typename Visit>
inline void visit_window(const PoolGeometry& g, int64_t d0, int64_t h0, int64_t w0, const Taps& td, const Taps& th,
                         Visit&& visit) {
  const Taps tw = taps(w0, g.kernel[2], g.dilation[2], g.in[2]);
  for (int64_t kd = td.lo; kd < td.hi; ++kd)
    for (int64_t kh = th.lo; kh < th.hi; ++kh) {
      const int64_t row = ((d0 + kd * g.dilation[0]) * g.in[1] + h0 + kh * g.dilation[1]) * g.in[2];
      for (int64_t kw = tw.lo; kw < tw.hi; ++kw) visit(row + w0 + kw * g.dilation[2]);
    }
}

// Calls f(plane, out_index, window_start, window) for every output position, planes split over
// the executor; window(visit) runs visit_window for that output.
template <typename F>
void for_each_window(Executor& exec, const PoolGeometry& g, F&& f) {
  const int64_t work = std::max<int64_t>(1, g.out_volume() * g.kernel[0] * g.kernel[1] * g.kernel[2]);
  parallel_chunks(exec, g.planes, std::max<int64_t>(1, kElementGrain / work), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int64_t o = 0;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        const int64_t d0 = od * g.stride[0] - g.pad[0];
        const Taps td = taps(d0, g.kernel[0], g.dilation[0], g.in[0]);
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          const int64_t h0 = oh * g.stride[1] - g.pad[1];
          const Taps th = taps(h0, g.kernel[1], g.dilation[1], g.in[1]);
          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
            const int64_t w0 = ow * g.stride[2] - g.pad[2];
            f(p, o, Dims3{d0, h0, w0}, [&](auto&& visit) { visit_window(g, d0, h0, w0, td, th, visit); });
          }
        }
      }
    }
  });
}

PoolGeometry forward_geometry(const char* kind, const KernelArgs& a, bool dilation) {
  return pool_geometry(kind, *a.in[0].shape, a.attrs(), dilation);
}

PoolGeometry backward_geometry(const char* kind, const KernelArgs& a, bool dilation) {
  return pool_geometry(kind, *a.out[0].shape, a.attrs(), dilation);
}

// take ? a : b through bit masks. On real data (ReLU outputs: many ties at zero) `v > best` is
// unpredictable, and GCC turns a plain ?: into a branch whose mispredictions dominated max pooling.
template <typename T>
inline T select(bool take, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U mask = U(0) - U(take);
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & mask) | (std::bit_cast<U>(b) & ~mask)));
}

// The running first maximum of a window (NaN wins, as in PyTorch), without data-dependent branches.
template <typename T>
struct FirstMax {
  T best = -std::numeric_limits<T>::infinity();
  int64_t arg = -1;
  inline void operator()(const T* xp, int64_t i) {
    const T v = xp[i];
    const bool take = (arg < 0) | (v > best) | (v != v);
    best = select(take, v, best);
    arg = select(take, i, arg);
  }
};

// n consecutive outputs of one row whose KH x KW windows lie inside the input: constant trip
// counts, no per-output tap arithmetic (the generic path costs ~5x more per output).
template <typename T, int KH, int KW>
void max_pool_row(const T* xp, int64_t first, int64_t step, int64_t row_step, int64_t col_step, int64_t n, T* y,
                  int64_t* idx) {
  for (int64_t j = 0; j < n; ++j, first += step) {
    FirstMax<T> m;
    for (int kh = 0; kh < KH; ++kh)
      for (int kw = 0; kw < KW; ++kw) m(xp, first + kh * row_step + kw * col_step);
    y[j] = m.best;
    idx[j] = m.arg;
  }
}

// The usual pool, 2x2 windows at stride 2 without dilation, as a loop GCC vectorises: the taps of
// n outputs are compared as vectors (blends for FirstMax's select), no loop-carried state. The
// generic max_pool_row above keeps one output's running maximum in scalars.
template <typename T>
void max_pool_row_2x2_stride2(const T* xp, int64_t first, int64_t row_step, int64_t n, T* y, int64_t* idx) {
  const T* top = xp + first;
  const T* bottom = top + row_step;
  for (int64_t j = 0; j < n; ++j) {
    const T a = top[2 * j], b = top[2 * j + 1], c = bottom[2 * j], d = bottom[2 * j + 1];
    T best = a;
    int64_t arg = 0;
    const bool take_b = (b > best) | (b != b);
    best = take_b ? b : best;
    arg = take_b ? 1 : arg;
    const bool take_c = (c > best) | (c != c);
    best = take_c ? c : best;
    arg = take_c ? row_step : arg;
    const bool take_d = (d > best) | (d != d);
    best = take_d ? d : best;
    arg = take_d ? row_step + 1 : arg;
    y[j] = best;
    idx[j] = first + 2 * j + arg;
  }
}

// Outputs [lo, hi) along w whose whole window lies inside the input.
Taps interior_columns(const PoolGeometry& g) {
  const int64_t s = g.stride[2], p = g.pad[2], last = g.in[2] - 1 - (g.kernel[2] - 1) * g.dilation[2] + p;
  const int64_t lo = std::min((p + s - 1) / s, g.out[2]);
  return {lo, last < 0 ? lo : std::clamp(last / s + 1, lo, g.out[2])};
}

// One plane: interior windows of 1x2, 1x3, 2x2 and 3x3 kernels (the usual pools) through
// max_pool_row, every other window through visit_window.
template <typename T>
void max_pool_plane(const PoolGeometry& g, const T* xp, T* yp, int64_t* ip) {
  const int64_t kh = g.kernel[1], kw = g.kernel[2];
  const int fixed = g.kernel[0] != 1 || kh > 3 || kw < 2 || kw > 3 || (kh != 1 && kh != kw) ? 0 : int(kh * 10 + kw);
  const Taps inner = fixed ? interior_columns(g) : Taps{0, 0};
  const int64_t row_step = g.dilation[1] * g.in[2], col_step = g.dilation[2], step = g.stride[2];
  int64_t o = 0;
  for (int64_t od = 0; od < g.out[0]; ++od) {
    const int64_t d0 = od * g.stride[0] - g.pad[0];
    const Taps td = taps(d0, g.kernel[0], g.dilation[0], g.in[0]);
    for (int64_t oh = 0; oh < g.out[1]; ++oh, o += g.out[2]) {
      const int64_t h0 = oh * g.stride[1] - g.pad[1];
      const Taps th = taps(h0, kh, g.dilation[1], g.in[1]);
      const bool fast = fixed && td.lo == 0 && td.hi == 1 && th.lo == 0 && th.hi == kh;
      const Taps mid = fast ? inner : Taps{g.out[2], g.out[2]};
      auto generic = [&](int64_t ow) {
        FirstMax<T> m;
        visit_window(g, d0, h0, ow * step - g.pad[2], td, th, [&](int64_t i) { m(xp, i); });
        yp[o + ow] = m.best;
        ip[o + ow] = m.arg;
      };
      for (int64_t ow = 0; ow < mid.lo; ++ow) generic(ow);
      const int64_t first = (d0 * g.in[1] + h0) * g.in[2] + mid.lo * step - g.pad[2], n = mid.hi - mid.lo;
      T* y = yp + o + mid.lo;
      int64_t* idx = ip + o + mid.lo;
      if (fast && fixed == 12) max_pool_row<T, 1, 2>(xp, first, step, row_step, col_step, n, y, idx);
      if (fast && fixed == 13) max_pool_row<T, 1, 3>(xp, first, step, row_step, col_step, n, y, idx);
      if (fast && fixed == 22 && step == 2 && col_step == 1)
        max_pool_row_2x2_stride2(xp, first, row_step, n, y, idx);
      else if (fast && fixed == 22)
        max_pool_row<T, 2, 2>(xp, first, step, row_step, col_step, n, y, idx);
      if (fast && fixed == 33) max_pool_row<T, 3, 3>(xp, first, step, row_step, col_step, n, y, idx);
      for (int64_t ow = mid.hi; ow < g.out[2]; ++ow) generic(ow);
    }
  }
}

template <typename T>
void max_pool_kernel(const KernelArgs& a) {
  const PoolGeometry g = forward_geometry("max", a, true);
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  int64_t* idx = a.out[1].ptr<int64_t>();
  const int64_t iv = g.in_volume(), ov = g.out_volume();
  const int64_t work = std::max<int64_t>(1, ov * g.kernel[0] * g.kernel[1] * g.kernel[2]);
  parallel_chunks(a.exec, g.planes, std::max<int64_t>(1, kElementGrain / work), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) max_pool_plane(g, x + p * iv, y + p * ov, idx + p * ov);
  });
}

template <typename T>
void max_pool_backward_kernel(const KernelArgs& a) {
  const PoolGeometry g = backward_geometry("max", a, true);
  const T* dy = a.in[0].ptr<T>();
  const int64_t* idx = a.in[1].ptr<int64_t>();
  T* dx = a.out[0].ptr<T>();
  const int64_t iv = g.in_volume(), ov = g.out_volume();
  parallel_chunks(a.exec, g.planes, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, iv + ov)),
                  [&](int64_t p0, int64_t p1) {
                    std::fill(dx + p0 * iv, dx + p1 * iv, T(0));
                    for (int64_t p = p0; p < p1; ++p)
                      for (int64_t o = 0; o < ov; ++o)
                        if (idx[p * ov + o] >= 0) dx[p * iv + idx[p * ov + o]] += dy[p * ov + o];
                  });
}

// PyTorch's divisor: the window clipped to input+padding (count_include_pad), the window clipped
// to the input (otherwise), or divisor_override.
struct AvgRule {
  int64_t divisor_override;
  bool include_pad;
  explicit AvgRule(const Attrs& a) {
    // Keys longer than the small-string buffer: static, so a kernel run never allocates.
    static const std::string divisor_key = "divisor_override", include_key = "count_include_pad";
    divisor_override = a.i_or(divisor_key, 0);
    include_pad = a.i_or(include_key, 1) != 0;
  }
};
int64_t avg_divisor(const PoolGeometry& g, const Dims3& start, const AvgRule& rule) {
  if (rule.divisor_override) return rule.divisor_override;
  const bool include_pad = rule.include_pad;
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t end = std::min(start[i] + g.kernel[i], g.in[i] + g.pad[i]);
    n *= include_pad ? end - start[i] : std::min(end, g.in[i]) - std::max<int64_t>(start[i], 0);
  }
  return n;
}

template <typename T>
void avg_pool_kernel(const KernelArgs& a) {
  const PoolGeometry g = forward_geometry("avg", a, false);
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  const int64_t iv = g.in_volume(), ov = g.out_volume();
  const AvgRule rule(a.attrs());
  for_each_window(a.exec, g, [&](int64_t p, int64_t o, const Dims3& start, auto&& window) {
    const T* xp = x + p * iv;
    T sum = 0;
    int64_t count = 0;
    window([&](int64_t i) { sum += xp[i], ++count; });
    y[p * ov + o] = count == 0 ? T(0) : sum / static_cast<T>(avg_divisor(g, start, rule));
  });
}

template <typename T>
void avg_pool_backward_kernel(const KernelArgs& a) {
  const PoolGeometry g = backward_geometry("avg", a, false);
  const T* dy = a.in[0].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  const int64_t iv = g.in_volume(), ov = g.out_volume();
  const AvgRule rule(a.attrs());
  // Each chunk zeroes and fills only its own planes: for_each_window visits a plane's outputs in order.
  for_each_window(a.exec, g, [&](int64_t p, int64_t o, const Dims3& start, auto&& window) {
    T* dxp = dx + p * iv;
    if (o == 0) std::fill(dxp, dxp + iv, T(0));
    const T gval = dy[p * ov + o] / static_cast<T>(avg_divisor(g, start, rule));
    window([&](int64_t i) { dxp[i] += gval; });
  });
}

// PyTorch's adaptive windows: [floor(o*I/O), ceil((o+1)*I/O)).
struct AdaptiveGeometry {
  int64_t planes;
  Dims3 in{1, 1, 1}, out{1, 1, 1};
};
AdaptiveGeometry adaptive_geometry(const Shape& x, const Shape& y) {
  AdaptiveGeometry g{x[0] * x[1]};
  const int nd = static_cast<int>(x.size()) - 2;
  for (int i = 0; i < nd; ++i) g.in[3 - nd + i] = x[2 + i], g.out[3 - nd + i] = y[2 + i];
  return g;
}
int64_t window_begin(int64_t o, int64_t in, int64_t out) { return o * in / out; }
int64_t window_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

// Calls f(plane, out_index, d-range, h-range, w-range) per output, planes split over the executor.
template <typename F>
void for_each_adaptive(Executor& exec, const AdaptiveGeometry& g, F&& f) {
  const int64_t iv = g.in[0] * g.in[1] * g.in[2], ov = g.out[0] * g.out[1] * g.out[2];
  parallel_chunks(exec, g.planes, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, iv + ov)),
                  [&](int64_t p0, int64_t p1) {
                    for (int64_t p = p0; p < p1; ++p) {
                      int64_t o = 0;
                      for (int64_t od = 0; od < g.out[0]; ++od)
                        for (int64_t oh = 0; oh < g.out[1]; ++oh)
                          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o)
                            f(p, o, Taps{window_begin(od, g.in[0], g.out[0]), window_end(od, g.in[0], g.out[0])},
                              Taps{window_begin(oh, g.in[1], g.out[1]), window_end(oh, g.in[1], g.out[1])},
                              Taps{window_begin(ow, g.in[2], g.out[2]), window_end(ow, g.in[2], g.out[2])});
                    }
                  });
}

template <typename T>
void adaptive_avg_pool_kernel(const KernelArgs& a) {
  const AdaptiveGeometry g = adaptive_geometry(*a.in[0].shape, *a.out[0].shape);
  const T* x = a.in[0].ptr<T>();
  T* y = a.out[0].ptr<T>();
  const int64_t iv = g.in[0] * g.in[1] * g.in[2], ov = g.out[0] * g.out[1] * g.out[2];
  for_each_adaptive(a.exec, g, [&](int64_t p, int64_t o, Taps d, Taps h, Taps w) {
    const T* xp = x + p * iv;
    T sum = 0;
    for (int64_t id = d.lo; id < d.hi; ++id)
      for (int64_t ih = h.lo; ih < h.hi; ++ih)
        sum += ConstVecMap<T>(xp + (id * g.in[1] + ih) * g.in[2] + w.lo, w.hi - w.lo).sum();
    y[p * ov + o] = sum / static_cast<T>((d.hi - d.lo) * (h.hi - h.lo) * (w.hi - w.lo));
  });
}

template <typename T>
void adaptive_avg_pool_backward_kernel(const KernelArgs& a) {
  const AdaptiveGeometry g = adaptive_geometry(*a.out[0].shape, *a.in[0].shape);
  const T* dy = a.in[0].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  const int64_t iv = g.in[0] * g.in[1] * g.in[2], ov = g.out[0] * g.out[1] * g.out[2];
  for_each_adaptive(a.exec, g, [&](int64_t p, int64_t o, Taps d, Taps h, Taps w) {
    T* dxp = dx + p * iv;
    if (o == 0) std::fill(dxp, dxp + iv, T(0));
    const T gval = dy[p * ov + o] / static_cast<T>((d.hi - d.lo) * (h.hi - h.lo) * (w.hi - w.lo));
    for (int64_t id = d.lo; id < d.hi; ++id)
      for (int64_t ih = h.lo; ih < h.hi; ++ih)
        VecMap<T>(dxp + (id * g.in[1] + ih) * g.in[2] + w.lo, w.hi - w.lo) += gval;
  });
}

}  // namespace

void register_eigen_pool(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "max_pool", max_pool_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "max_pool_backward", max_pool_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "avg_pool", avg_pool_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "avg_pool_backward", avg_pool_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "adaptive_avg_pool", adaptive_avg_pool_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "adaptive_avg_pool_backward", adaptive_avg_pool_backward_kernel);
}

}  // namespace treadle

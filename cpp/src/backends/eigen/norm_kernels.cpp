// Reference kernels for the normalisation ops. Statistics and reductions accumulate in double (also
// for float32), with a two-pass variance (mean first, then centred squares), so float32 results stay
// within rounding of torch's. Work is split over rows (per-sample statistics) or channels (batch
// statistics, weight gradients); every output element is computed by one chunk, so results never
// depend on how the executor chunks.
#include <algorithm>
#include <cmath>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"

namespace treadle {
namespace {

using eigen::kElementGrain;
using eigen::parallel_chunks;

// Items per chunk so that a chunk touches about kElementGrain elements.
int64_t grain_for(int64_t elements_per_item) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, elements_per_item));
}

int64_t trailing_numel(const TensorRef& t, int k) {
  int64_t n = 1;
  for (int d = t.ndim() - k; d < t.ndim(); ++d) n *= t.dim(d);
  return n;
}

// (N, C, S): S is the product of the spatial dimensions.
struct NCS {
  int64_t n, c, s;
};
NCS ncs_of(const TensorRef& t) { return {t.dim(0), t.dim(1), t.numel / std::max<int64_t>(1, t.dim(0) * t.dim(1))}; }

template <typename T>
const T* opt_in(const KernelArgs& a, int i) {
  return a.num_in > i ? a.in[i].ptr<T>() : nullptr;
}

// Mean and 1/sqrt(var + eps) of n contiguous values (biased variance).
template <typename T>
void row_stats(const T* x, int64_t n, double eps, double& mean, double& rstd) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  mean = s / static_cast<double>(n);
  double v = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    v += d * d;
  }
  rstd = 1.0 / std::sqrt(v / static_cast<double>(n) + eps);
}

// ---- layer_norm
template <typename T>
void layer_norm_kernel(const KernelArgs& a) {
  const int k = static_cast<int>(a.attrs().i("normalized_ndim"));
  const double eps = a.attrs().f("eps");
  const int64_t L = trailing_numel(a.in[0], k), rows = L ? a.in[0].numel / L : 0;
  const T *x = a.in[0].ptr<T>(), *w = opt_in<T>(a, 1), *b = opt_in<T>(a, 2);
  T *y = a.out[0].ptr<T>(), *mean = a.out[1].ptr<T>(), *rstd = a.out[2].ptr<T>();
  parallel_chunks(a.exec, rows, grain_for(L), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * L;
      T* yr = y + r * L;
      double m, rs;
      row_stats(xr, L, eps, m, rs);
      mean[r] = static_cast<T>(m);
      rstd[r] = static_cast<T>(rs);
      for (int64_t j = 0; j < L; ++j) {
        double v = (xr[j] - m) * rs;
        if (w) v *= w[j];
        if (b) v += b[j];
        yr[j] = static_cast<T>(v);
      }
    }
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight, per row of L values.
// `mean` null: RMS statistics (xhat = x * rstd, no mean(g) term).
template <typename T>
void row_norm_dx(const KernelArgs& a, int64_t L, const T* mean, const T* rstd, const T* w) {
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>();
  T* dx = a.out[0].ptr<T>();
  const int64_t rows = L ? a.in[1].numel / L : 0;
  parallel_chunks(a.exec, rows, grain_for(L), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *dyr = dy + r * L, *xr = x + r * L;
      const double m = mean ? static_cast<double>(mean[r]) : 0.0, rs = rstd[r];
      double sg = 0, sgx = 0;
      for (int64_t j = 0; j < L; ++j) {
        const double g = w ? double{dyr[j]} * w[j] : double{dyr[j]};
        sg += g;
        sgx += g * (xr[j] - m) * rs;
      }
      const double mg = mean ? sg / static_cast<double>(L) : 0.0, mgx = sgx / static_cast<double>(L);
      for (int64_t j = 0; j < L; ++j) {
        const double g = w ? double{dyr[j]} * w[j] : double{dyr[j]};
        dx[r * L + j] = static_cast<T>(rs * (g - mg - (xr[j] - m) * rs * mgx));
      }
    }
  });
}

// dweight[j] = sum_r dy[r, j] * xhat[r, j] and (dbias non-null) dbias[j] = sum_r dy[r, j], split over
// columns; `acc` is workspace for 2 * L doubles.
template <typename T>
void row_norm_dweight(const KernelArgs& a, int64_t L, const T* mean, const T* rstd, T* dw, T* db, double* acc) {
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>();
  const int64_t rows = L ? a.in[1].numel / L : 0;
  parallel_chunks(a.exec, L, grain_for(rows), [&](int64_t c0, int64_t c1) {
    double *aw = acc, *ab = acc + L;
    std::fill(aw + c0, aw + c1, 0.0);
    if (db) std::fill(ab + c0, ab + c1, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const double m = mean ? static_cast<double>(mean[r]) : 0.0, rs = rstd[r];
      const T *dyr = dy + r * L, *xr = x + r * L;
      for (int64_t j = c0; j < c1; ++j) {
        aw[j] += dyr[j] * (xr[j] - m) * rs;
        if (db) ab[j] += dyr[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      dw[j] = static_cast<T>(aw[j]);
      if (db) db[j] = static_cast<T>(ab[j]);
    }
  });
}

template <typename T>
void layer_norm_backward_kernel(const KernelArgs& a) {
  const int k = static_cast<int>(a.attrs().i("normalized_ndim"));
  const int64_t L = trailing_numel(a.in[1], k);
  const T *mean = a.in[2].ptr<T>(), *rstd = a.in[3].ptr<T>(), *w = opt_in<T>(a, 4);
  row_norm_dx<T>(a, L, mean, rstd, w);
  if (w) row_norm_dweight<T>(a, L, mean, rstd, a.out[1].ptr<T>(), a.out[2].ptr<T>(), static_cast<double*>(a.workspace));
}

// ---- rms_norm
template <typename T>
void rms_norm_kernel(const KernelArgs& a) {
  const int k = static_cast<int>(a.attrs().i("normalized_ndim"));
  const double eps = a.attrs().f("eps");
  const int64_t L = trailing_numel(a.in[0], k), rows = L ? a.in[0].numel / L : 0;
  const T *x = a.in[0].ptr<T>(), *w = opt_in<T>(a, 1);
  T *y = a.out[0].ptr<T>(), *rstd = a.out[1].ptr<T>();
  parallel_chunks(a.exec, rows, grain_for(L), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * L;
      double ss = 0;
      for (int64_t j = 0; j < L; ++j) ss += double{xr[j]} * xr[j];
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(L) + eps);
      rstd[r] = static_cast<T>(rs);
      for (int64_t j = 0; j < L; ++j) y[r * L + j] = static_cast<T>(w ? xr[j] * rs * w[j] : xr[j] * rs);
    }
  });
}

template <typename T>
void rms_norm_backward_kernel(const KernelArgs& a) {
  const int k = static_cast<int>(a.attrs().i("normalized_ndim"));
  const int64_t L = trailing_numel(a.in[1], k);
  const T *rstd = a.in[2].ptr<T>(), *w = opt_in<T>(a, 3);
  row_norm_dx<T>(a, L, nullptr, rstd, w);
  if (w) row_norm_dweight<T>(a, L, nullptr, rstd, a.out[1].ptr<T>(), nullptr, static_cast<double*>(a.workspace));
}

// ---- group_norm: rows are (sample, group) blocks of Cg * S contiguous values.
template <typename T>
void group_norm_kernel(const KernelArgs& a) {
  const int64_t G = a.attrs().i("num_groups");
  const double eps = a.attrs().f("eps");
  const NCS d = ncs_of(a.in[0]);
  const int64_t cg = d.c / G, L = cg * d.s;
  const T *x = a.in[0].ptr<T>(), *w = opt_in<T>(a, 1), *b = opt_in<T>(a, 2);
  T *y = a.out[0].ptr<T>(), *mean = a.out[1].ptr<T>(), *rstd = a.out[2].ptr<T>();
  parallel_chunks(a.exec, d.n * G, grain_for(L), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double m, rs;
      row_stats(x + r * L, L, eps, m, rs);
      mean[r] = static_cast<T>(m);
      rstd[r] = static_cast<T>(rs);
      for (int64_t cc = 0; cc < cg; ++cc) {
        const int64_t c = (r % G) * cg + cc;
        const double wc = w ? double{w[c]} : 1.0, bc = b ? double{b[c]} : 0.0;
        const T* xs = x + r * L + cc * d.s;
        T* ys = y + r * L + cc * d.s;
        for (int64_t s = 0; s < d.s; ++s) ys[s] = static_cast<T>((xs[s] - m) * rs * wc + bc);
      }
    }
  });
}

template <typename T>
void group_norm_backward_kernel(const KernelArgs& a) {
  const int64_t G = a.attrs().i("num_groups");
  const NCS d = ncs_of(a.in[1]);
  const int64_t cg = d.c / G, L = cg * d.s;
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>(), *mean = a.in[2].ptr<T>(), *rstd = a.in[3].ptr<T>();
  const T* w = opt_in<T>(a, 4);
  T* dx = a.out[0].ptr<T>();
  parallel_chunks(a.exec, d.n * G, grain_for(L), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const double m = mean[r], rs = rstd[r];
      double sg = 0, sgx = 0;
      for (int64_t cc = 0; cc < cg; ++cc) {
        const double wc = w ? double{w[(r % G) * cg + cc]} : 1.0;
        for (int64_t s = 0, o = r * L + cc * d.s; s < d.s; ++s) {
          const double g = dy[o + s] * wc;
          sg += g;
          sgx += g * (x[o + s] - m) * rs;
        }
      }
      const double mg = sg / static_cast<double>(L), mgx = sgx / static_cast<double>(L);
      for (int64_t cc = 0; cc < cg; ++cc) {
        const double wc = w ? double{w[(r % G) * cg + cc]} : 1.0;
        for (int64_t s = 0, o = r * L + cc * d.s; s < d.s; ++s)
          dx[o + s] = static_cast<T>(rs * (dy[o + s] * wc - mg - (x[o + s] - m) * rs * mgx));
      }
    }
  });
  if (!w) return;
  T *dw = a.out[1].ptr<T>(), *db = a.out[2].ptr<T>();
  parallel_chunks(a.exec, d.c, grain_for(d.n * d.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sw = 0, sb = 0;
      for (int64_t n = 0; n < d.n; ++n) {
        const int64_t r = n * G + c / cg, o = (n * d.c + c) * d.s;
        const double m = mean[r], rs = rstd[r];
        for (int64_t s = 0; s < d.s; ++s) {
          sw += dy[o + s] * (x[o + s] - m) * rs;
          sb += dy[o + s];
        }
      }
      dw[c] = static_cast<T>(sw);
      db[c] = static_cast<T>(sb);
    }
  });
}

// ---- batch_norm: statistics per channel over (N, S).
template <typename T>
void batch_norm_kernel(const KernelArgs& a) {
  const double eps = a.attrs().f("eps");
  const NCS d = ncs_of(a.in[0]);
  const T *x = a.in[0].ptr<T>(), *w = opt_in<T>(a, 1), *b = opt_in<T>(a, 2);
  T *y = a.out[0].ptr<T>(), *mean = a.out[1].ptr<T>(), *rstd = a.out[2].ptr<T>();
  const double count = static_cast<double>(d.n * d.s);
  parallel_chunks(a.exec, d.c, grain_for(d.n * d.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s) sum += x[o + s];
      const double m = sum / count;
      double v = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s) v += (x[o + s] - m) * (x[o + s] - m);
      const double rs = 1.0 / std::sqrt(v / count + eps);
      mean[c] = static_cast<T>(m);
      rstd[c] = static_cast<T>(rs);
      const double wc = w ? double{w[c]} : 1.0, bc = b ? double{b[c]} : 0.0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s)
          y[o + s] = static_cast<T>((x[o + s] - m) * rs * wc + bc);
    }
  });
}

// dx = weight * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); dweight = sum(dy * xhat); dbias = sum(dy).
template <typename T>
void batch_norm_backward_kernel(const KernelArgs& a) {
  const NCS d = ncs_of(a.in[1]);
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>(), *mean = a.in[2].ptr<T>(), *rstd = a.in[3].ptr<T>();
  const T* w = opt_in<T>(a, 4);
  T *dx = a.out[0].ptr<T>(), *dw = w ? a.out[1].ptr<T>() : nullptr, *db = w ? a.out[2].ptr<T>() : nullptr;
  const double count = static_cast<double>(d.n * d.s);
  parallel_chunks(a.exec, d.c, grain_for(d.n * d.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double m = mean[c], rs = rstd[c], wc = w ? double{w[c]} : 1.0;
      double sdy = 0, sdyx = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s) {
          sdy += dy[o + s];
          sdyx += dy[o + s] * (x[o + s] - m) * rs;
        }
      const double mdy = sdy / count, mdyx = sdyx / count;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s)
          dx[o + s] = static_cast<T>(wc * rs * (dy[o + s] - mdy - (x[o + s] - m) * rs * mdyx));
      if (w) {
        dw[c] = static_cast<T>(sdyx);
        db[c] = static_cast<T>(sdy);
      }
    }
  });
}

// ---- batch_norm_eval: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias.
template <typename T>
void batch_norm_eval_kernel(const KernelArgs& a) {
  const double eps = a.attrs().f("eps");
  const NCS d = ncs_of(a.in[0]);
  const T *x = a.in[0].ptr<T>(), *rm = a.in[1].ptr<T>(), *rv = a.in[2].ptr<T>();
  const T *w = opt_in<T>(a, 3), *b = opt_in<T>(a, 4);
  T* y = a.out[0].ptr<T>();
  parallel_chunks(a.exec, d.n * d.c, grain_for(d.s), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c = p % d.c;
      const double alpha = (w ? double{w[c]} : 1.0) / std::sqrt(double{rv[c]} + eps);
      const double beta = (b ? double{b[c]} : 0.0) - rm[c] * alpha;
      for (int64_t s = 0; s < d.s; ++s) y[p * d.s + s] = static_cast<T>(x[p * d.s + s] * alpha + beta);
    }
  });
}

template <typename T>
void batch_norm_eval_backward_kernel(const KernelArgs& a) {
  const double eps = a.attrs().f("eps");
  const NCS d = ncs_of(a.in[1]);
  const T *dy = a.in[0].ptr<T>(), *x = a.in[1].ptr<T>(), *rm = a.in[2].ptr<T>(), *rv = a.in[3].ptr<T>();
  const T* w = opt_in<T>(a, 4);
  T *dx = a.out[0].ptr<T>(), *dw = w ? a.out[1].ptr<T>() : nullptr, *db = w ? a.out[2].ptr<T>() : nullptr;
  parallel_chunks(a.exec, d.c, grain_for(d.n * d.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double is = 1.0 / std::sqrt(double{rv[c]} + eps), scale = (w ? double{w[c]} : 1.0) * is;
      double sw = 0, sb = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0, o = (n * d.c + c) * d.s; s < d.s; ++s) {
          dx[o + s] = static_cast<T>(dy[o + s] * scale);
          sw += dy[o + s] * (x[o + s] - rm[c]) * is;
          sb += dy[o + s];
        }
      if (w) {
        dw[c] = static_cast<T>(sw);
        db[c] = static_cast<T>(sb);
      }
    }
  });
}

// ---- batch_norm_update_stats: writes running_mean, running_var, num_batches_tracked in place
// (inputs 2..4), as torch: running = (1 - f) * running + f * batch, with the unbiased batch variance
// and f = momentum, or 1 / num_batches_tracked for the cumulative average (momentum < 0).
// batch_norm_update_running: the same without the count (momentum >= 0, checked by the op).
template <typename T>
void update_running(const KernelArgs& a, T* tracked) {
  const double eps = a.attrs().f("eps"), momentum = a.attrs().f("momentum");
  const double count = static_cast<double>(a.attrs().i("count"));
  const T *mean = a.in[0].ptr<T>(), *rstd = a.in[1].ptr<T>();
  T *rm = a.in[2].ptr<T>(), *rv = a.in[3].ptr<T>();
  double f = momentum;
  if (tracked) {
    const double batches = static_cast<double>(tracked[0]) + 1.0;
    tracked[0] = static_cast<T>(batches);
    if (momentum < 0) f = 1.0 / batches;
  }
  for (int64_t c = 0; c < a.in[0].numel; ++c) {
    // The biased variance comes back from rstd = 1/sqrt(var + eps) (clamped at 0 against rounding).
    const double rs = rstd[c], var = std::max(0.0, 1.0 / (rs * rs) - eps);
    rm[c] = static_cast<T>((1.0 - f) * rm[c] + f * mean[c]);
    rv[c] = static_cast<T>((1.0 - f) * rv[c] + f * var * count / (count - 1.0));
  }
}

template <typename T>
void batch_norm_update_stats_kernel(const KernelArgs& a) {
  update_running<T>(a, a.in[4].ptr<T>());
}

template <typename T>
void batch_norm_update_running_kernel(const KernelArgs& a) {
  update_running<T>(a, nullptr);
}

}  // namespace

void register_eigen_norm(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "layer_norm", layer_norm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "layer_norm_backward", layer_norm_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "rms_norm", rms_norm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "rms_norm_backward", rms_norm_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "group_norm", group_norm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "group_norm_backward", group_norm_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm", batch_norm_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm_backward", batch_norm_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm_eval", batch_norm_eval_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm_eval_backward", batch_norm_eval_backward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm_update_stats", batch_norm_update_stats_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "batch_norm_update_running", batch_norm_update_running_kernel);
}

}  // namespace treadle

// Reference convolution kernels: im2col + Eigen GEMM for the forward pass, the data gradient
// (GEMM + col2im) and the weight gradient (GEMM on the same im2col panels). 1-d and 2-d problems are
// 3-d ones with unit leading dims (see ops/conv_geometry.hpp).
//
// Work is split into (sample, group) units handed round-robin to a fixed number of slots; each slot
// owns a slice of the planned workspace (its im2col tile and, for the weight gradient, its own
// accumulator, summed in slot order at the end). The split depends only on shapes, so results are
// bit-identical whatever executor the host lends.
#include <algorithm>
#include <cstring>

#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "ops/conv_geometry.hpp"

namespace treadle {
namespace {
using namespace eigen;

template <typename T>
using StrideMapR = Eigen::Map<MatrixR<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using ConstStrideMapR = Eigen::Map<const MatrixR<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Output positions o in [lo, hi) whose input index o*stride + offset lies in [0, size).
struct Span {
  int64_t lo, hi;
};
Span valid_span(int64_t offset, int64_t stride, int64_t size, int64_t out) {
  int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  int64_t hi = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

// Walks the im2col matrix of one (sample, group) for output positions [l0, l1): calls
// line(row_ptr_offset_in_col, input_line_or_null, ow_begin, ow_end, span, kw_offset) once per
// (kernel row, output line). Index arithmetic happens per line, never per element.
template <typename Line>
void for_each_line(const ConvGeometry& g, int64_t l0, int64_t l1, Line&& line) {
  const int64_t cols = l1 - l0, plane = g.out[1] * g.out[2], ow_n = g.out[2];
  const int64_t id_n = g.in[0], ih_n = g.in[1], iw_n = g.in[2];
  int64_t row = 0;
  for (int64_t c = 0; c < g.in_group(); ++c)
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd)
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh)
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw, ++row) {
          const int64_t off_d = kd * g.dilation[0] - g.pad_begin[0], off_h = kh * g.dilation[1] - g.pad_begin[1];
          const int64_t off_w = kw * g.dilation[2] - g.pad_begin[2];
          const Span span = valid_span(off_w, g.stride[2], iw_n, ow_n);
          int64_t od = l0 / plane, oh = (l0 % plane) / ow_n, ow = l0 % ow_n;
          int64_t pos = row * cols;
          for (int64_t l = l0; l < l1;) {
            const int64_t run = std::min(ow_n - ow, l1 - l);
            const int64_t id = od * g.stride[0] + off_d, ih = oh * g.stride[1] + off_h;
            const bool inside = id >= 0 && id < id_n && ih >= 0 && ih < ih_n;
            line(pos, inside ? ((c * id_n + id) * ih_n + ih) * iw_n : -1, ow, ow + run, span, off_w);
            pos += run;
            l += run;
            ow = 0;
            if (++oh == g.out[1]) oh = 0, ++od;
          }
        }
}

template <typename T>
void im2col(const ConvGeometry& g, const T* x, int64_t l0, int64_t l1, T* col) {
  const int64_t s = g.stride[2];
  for_each_line(g, l0, l1, [&](int64_t pos, int64_t src, int64_t b, int64_t e, Span sp, int64_t off) {
    T* dst = col + pos;  // dst[o - b] for output positions o in [b, e)
    const int64_t lo = src < 0 ? e : std::clamp(sp.lo, b, e), hi = src < 0 ? e : std::clamp(sp.hi, lo, e);
    std::fill(dst, dst + (lo - b), T(0));
    if (s == 1) std::copy(x + (src + lo + off), x + (src + hi + off), dst + (lo - b));
    else for (int64_t o = lo; o < hi; ++o) dst[o - b] = x[src + o * s + off];
    std::fill(dst + (hi - b), dst + (e - b), T(0));
  });
}

template <typename T>
void col2im_add(const ConvGeometry& g, const T* col, int64_t l0, int64_t l1, T* x) {
  const int64_t s = g.stride[2];
  for_each_line(g, l0, l1, [&](int64_t pos, int64_t dst, int64_t b, int64_t e, Span sp, int64_t off) {
    if (dst < 0) return;
    const T* src = col + pos;  // src[o - b]
    const int64_t lo = std::clamp(sp.lo, b, e), hi = std::clamp(sp.hi, lo, e);
    if (s == 1) {
      T* out = x + (dst + lo + off);
      const T* in = src + (lo - b);
      for (int64_t i = 0; i < hi - lo; ++i) out[i] += in[i];
    } else {
      for (int64_t o = lo; o < hi; ++o) x[dst + o * s + off] += src[o - b];
    }
  });
}

// Runs slot(s) for s in [0, slots) on the host's executor.
template <typename F>
void run_slots(Executor& exec, int64_t slots, F&& slot) {
  if (slots <= 1 || exec.num_workers() <= 1) {
    for (int64_t s = 0; s < slots; ++s) slot(s);
    return;
  }
  exec.parallel_for(slots, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) slot(s);
  });
}

// Adds bias[c] to each of `channels` rows of length `len`.
template <typename T>
void add_channel_bias(T* y, const T* bias, int64_t channels, int64_t len) {
  for (int64_t c = 0; c < channels; ++c) VecMap<T>(y + c * len, len) += bias[c];
}

template <typename T>
void conv_forward_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_forward(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::forward);
  const T *x = a.in[0].ptr<T>(), *w = a.in[1].ptr<T>(), *bias = a.num_in == 3 ? a.in[2].ptr<T>() : nullptr;
  T* y = a.out[0].ptr<T>();
  const int64_t K = g.rows(), L = g.out_volume(), cin = g.in_group(), cout = g.out_group();
  const int64_t units = g.batch * g.groups;
  run_slots(a.exec, p.slots, [&](int64_t slot) {
    T* col = static_cast<T*>(a.workspace) + slot * K * p.tile;
    for (int64_t u = slot; u < units; u += p.slots) {
      const int64_t n = u / g.groups, grp = u % g.groups;
      const T* xg = x + (n * g.channels + grp * cin) * g.in_volume();
      T* yg = y + (n * g.out_channels + grp * cout) * L;
      ConstMapR<T> W(w + grp * cout * K, cout, K);
      for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
        const int64_t cols = std::min(p.tile, L - l0);
        StrideMapR<T> Y(yg + l0, cout, cols, Eigen::OuterStride<>(L));
        if (p.needs_columns) {
          im2col(g, xg, l0, l0 + cols, col);
          Y.noalias() = W * ConstMapR<T>(col, K, cols);
        } else {
          Y.noalias() = W * ConstStrideMapR<T>(xg + l0, K, cols, Eigen::OuterStride<>(L));
        }
      }
      if (bias) add_channel_bias(yg, bias + grp * cout, cout, L);
    }
  });
}

// dx = col2im(W^T dy) per (sample, group); with a bias this is the transposed convolution's forward.
template <typename T>
void conv_backward_data_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_backward_data(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::backward_data);
  const T *dy = a.in[0].ptr<T>(), *w = a.in[1].ptr<T>(), *bias = a.num_in == 3 ? a.in[2].ptr<T>() : nullptr;
  T* dx = a.out[0].ptr<T>();
  const int64_t K = g.rows(), L = g.out_volume(), cin = g.in_group(), cout = g.out_group();
  const int64_t units = g.batch * g.groups, in_vol = g.in_volume();
  run_slots(a.exec, p.slots, [&](int64_t slot) {
    T* col = static_cast<T*>(a.workspace) + slot * K * p.tile;
    for (int64_t u = slot; u < units; u += p.slots) {
      const int64_t n = u / g.groups, grp = u % g.groups;
      const T* dyg = dy + (n * g.out_channels + grp * cout) * L;
      T* dxg = dx + (n * g.channels + grp * cin) * in_vol;
      ConstMapR<T> W(w + grp * cout * K, cout, K);
      if (p.needs_columns) std::fill(dxg, dxg + cin * in_vol, T(0));
      for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
        const int64_t cols = std::min(p.tile, L - l0);
        ConstStrideMapR<T> DY(dyg + l0, cout, cols, Eigen::OuterStride<>(L));
        if (p.needs_columns) {
          MapR<T>(col, K, cols).noalias() = W.transpose() * DY;
          col2im_add(g, col, l0, l0 + cols, dxg);
        } else {
          StrideMapR<T>(dxg + l0, K, cols, Eigen::OuterStride<>(L)).noalias() = W.transpose() * DY;
        }
      }
      if (bias) add_channel_bias(dxg, bias + grp * cin, cin, in_vol);
    }
  });
}

// dW = sum over samples of dy * im2col(x)^T; each slot accumulates its units privately (slot 0
// straight into dW), then the slots are summed in order.
template <typename T>
void conv_backward_weight_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_backward_weight(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::backward_weight);
  const T *x = a.in[0].ptr<T>(), *dy = a.in[1].ptr<T>();
  T* dw = a.out[0].ptr<T>();
  const int64_t K = g.rows(), L = g.out_volume(), cin = g.in_group(), cout = g.out_group();
  const int64_t units = g.batch * g.groups, w_numel = g.out_channels * K, slots = p.acc_slots;
  T* ws = static_cast<T*>(a.workspace);
  T* acc_base = ws + (p.needs_columns ? slots * K * p.tile : 0);
  run_slots(a.exec, slots, [&](int64_t slot) {
    T* acc = slot == 0 ? dw : acc_base + (slot - 1) * w_numel;
    T* col = ws + slot * K * p.tile;
    std::fill(acc, acc + w_numel, T(0));
    for (int64_t u = slot; u < units; u += slots) {
      const int64_t n = u / g.groups, grp = u % g.groups;
      const T* xg = x + (n * g.channels + grp * cin) * g.in_volume();
      const T* dyg = dy + (n * g.out_channels + grp * cout) * L;
      MapR<T> DW(acc + grp * cout * K, cout, K);
      for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
        const int64_t cols = std::min(p.tile, L - l0);
        ConstStrideMapR<T> DY(dyg + l0, cout, cols, Eigen::OuterStride<>(L));
        if (p.needs_columns) {
          im2col(g, xg, l0, l0 + cols, col);
          DW.noalias() += DY * ConstMapR<T>(col, K, cols).transpose();
        } else {
          DW.noalias() += DY * ConstStrideMapR<T>(xg + l0, K, cols, Eigen::OuterStride<>(L)).transpose();
        }
      }
    }
  });
  if (slots > 1)
    parallel_chunks(a.exec, w_numel, kElementGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t s = 1; s < slots; ++s) {
        const T* acc = acc_base + (s - 1) * w_numel;
        for (int64_t i = i0; i < i1; ++i) dw[i] += acc[i];
      }
    });
}

// db[c] = sum over samples and positions of dy[n, c, ...]; channels split over the executor.
template <typename T>
void conv_backward_bias_kernel(const KernelArgs& a) {
  const TensorRef& dy = a.in[0];
  const int64_t n = dy.dim(0), c = dy.dim(1), len = n * c == 0 ? 0 : dy.numel / (n * c);
  const T* src = dy.ptr<T>();
  T* db = a.out[0].ptr<T>();
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n * len));
  parallel_chunks(a.exec, c, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += ConstVecMap<T>(src + (i * c + ch) * len, len).sum();
      db[ch] = s;
    }
  });
}

}  // namespace

void register_eigen_conv(KernelTable& t) {
  TREADLE_EIGEN_REGISTER_FLOATS(t, "conv", conv_forward_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "conv_backward_data", conv_backward_data_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "conv_backward_weight", conv_backward_weight_kernel);
  TREADLE_EIGEN_REGISTER_FLOATS(t, "conv_backward_bias", conv_backward_bias_kernel);
}

}  // namespace treadle

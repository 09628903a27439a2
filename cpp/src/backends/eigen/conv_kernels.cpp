// Reference convolution kernels: im2col + Eigen GEMM for the forward pass, the data gradient
// (GEMM + col2im) and the weight gradient (GEMM on the same im2col panels). 1-d and 2-d problems are
// 3-d ones with unit leading dims (see ops/conv_geometry.hpp). Stride-1 convolutions of unit depth
// take the "wide" path: on a zero-padded copy of the input every im2col row is one contiguous
// slice, at the price of Wp - OW discarded columns per output row (see ConvWorkPlan).
//
// Work is split into (sample, group) units handed round-robin to a fixed number of slots; each slot
// owns a slice of the planned workspace (its im2col tile and, for the weight gradient, its own
// accumulator, summed in slot order at the end). The split depends only on shapes, so results are
// bit-identical whatever executor the host lends.
#include <algorithm>
#include <cstring>

#include "backends/eigen/rounded_operands.hpp"
#include "backends/eigen/eigen_backend.hpp"
#include "backends/eigen/eigen_common.hpp"
#include "backends/eigen/epilogue.hpp"
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

// ---- the wide path (stride 1, unit depth): im2col rows are contiguous slices of a padded copy ----

// Layout of one slot on the wide path: [padded input][rows x tile columns][out/groups x tile].
template <typename T>
struct WideSlot {
  T* pad;
  T* col;
  T* buf;
  WideSlot(const ConvGeometry& g, const ConvWorkPlan& p, T* base)
      : pad(base), col(base + p.padded_elements), buf(base + p.padded_elements + g.rows() * p.tile) {}
};

int64_t padded_plane(const ConvGeometry& g, const ConvWorkPlan& p) {
  return (g.in[1] + g.pad_begin[1] + g.pad_end[1]) * p.padded_row;
}

// The group's input channels into the zeroed padded buffer.
template <typename T>
void pad_input(const ConvGeometry& g, const ConvWorkPlan& p, const T* x, T* pad) {
  const int64_t H = g.in[1], W = g.in[2], Wp = p.padded_row, plane = padded_plane(g, p);
  std::fill(pad, pad + p.padded_elements, T(0));
  for (int64_t c = 0; c < g.in_group(); ++c)
    for (int64_t ih = 0; ih < H; ++ih)
      std::copy(x + (c * H + ih) * W, x + (c * H + ih + 1) * W, pad + c * plane + (ih + g.pad_begin[1]) * Wp + g.pad_begin[2]);
}

// Row (c, kh, kw) of the wide im2col tile starting at output row `line0`: one slice of the padded input.
template <typename F>
void for_each_wide_row(const ConvGeometry& g, const ConvWorkPlan& p, int64_t line0, F&& row) {
  const int64_t Wp = p.padded_row, plane = padded_plane(g, p);
  int64_t r = 0;
  for (int64_t c = 0; c < g.in_group(); ++c)
    for (int64_t kh = 0; kh < g.kernel[1]; ++kh)
      for (int64_t kw = 0; kw < g.kernel[2]; ++kw, ++r)
        row(r, c * plane + (line0 + kh * g.dilation[1]) * Wp + kw * g.dilation[2]);
}

template <typename T>
void im2col_wide(const ConvGeometry& g, const ConvWorkPlan& p, const T* pad, int64_t line0, int64_t cols, T* col) {
  for_each_wide_row(g, p, line0, [&](int64_t r, int64_t at) { std::copy(pad + at, pad + at + cols, col + r * cols); });
}

template <typename T>
void col2im_wide_add(const ConvGeometry& g, const ConvWorkPlan& p, const T* col, int64_t line0, int64_t cols, T* pad) {
  for_each_wide_row(g, p, line0, [&](int64_t r, int64_t at) {
    VecMap<T>(pad + at, cols) += ConstVecMap<T>(col + r * cols, cols);
  });
}

// Output rows [line0, line0 + lines) of `channels` channels between the compact layout (rows of OW)
// and the wide one (rows of Wp; the extra columns are zero going in and dropped coming out).
template <typename T>
void compact_to_wide(const ConvGeometry& g, const ConvWorkPlan& p, const T* y, int64_t line0, int64_t lines,
                     int64_t channels, T* wide) {
  const int64_t OW = g.out[2], Wp = p.padded_row, L = g.out_volume(), cols = lines * Wp;
  for (int64_t o = 0; o < channels; ++o)
    for (int64_t l = 0; l < lines; ++l) {
      T* dst = wide + o * cols + l * Wp;
      std::copy(y + o * L + (line0 + l) * OW, y + o * L + (line0 + l + 1) * OW, dst);
      std::fill(dst + OW, dst + Wp, T(0));
    }
}

template <typename T>
void wide_to_compact(const ConvGeometry& g, const ConvWorkPlan& p, const T* wide, int64_t line0, int64_t lines,
                     int64_t channels, T* y) {
  const int64_t OW = g.out[2], Wp = p.padded_row, L = g.out_volume(), cols = lines * Wp;
  for (int64_t o = 0; o < channels; ++o)
    for (int64_t l = 0; l < lines; ++l)
      std::copy(wide + o * cols + l * Wp, wide + o * cols + l * Wp + OW, y + o * L + (line0 + l) * OW);
}

// ---- one (sample, group) unit per pass ------------------------------------------------------

// Where one (sample, group) unit starts: its group, and element offsets of its slice of the
// convolution's input (C/groups channels) and output (out/groups channels).
struct UnitOffsets {
  int64_t grp, x, y;
};
UnitOffsets unit_offsets(const ConvGeometry& g, int64_t u) {
  const int64_t n = u / g.groups, grp = u % g.groups;
  return {grp, (n * g.channels + grp * g.in_group()) * g.in_volume(),
          (n * g.out_channels + grp * g.out_group()) * g.out_volume()};
}

template <typename T>
void forward_unit(const ConvGeometry& g, const ConvWorkPlan& p, const T* xg, const T* wg, T* yg, T* slot) {
  const int64_t K = g.rows(), L = g.out_volume(), cout = g.out_group();
  ConstMapR<T> W(wg, cout, K);
  if (p.wide) {
    WideSlot<T> s(g, p, slot);
    pad_input(g, p, xg, s.pad);
    const int64_t lines_per_tile = p.tile / p.padded_row;
    for (int64_t line0 = 0; line0 < g.out[1]; line0 += lines_per_tile) {
      const int64_t lines = std::min(lines_per_tile, g.out[1] - line0), cols = lines * p.padded_row;
      im2col_wide(g, p, s.pad, line0, cols, s.col);
      MapR<T>(s.buf, cout, cols).noalias() = W * ConstMapR<T>(s.col, K, cols);
      wide_to_compact(g, p, s.buf, line0, lines, cout, yg);
    }
    return;
  }
  for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
    const int64_t cols = std::min(p.tile, L - l0);
    StrideMapR<T> Y(yg + l0, cout, cols, Eigen::OuterStride<>(L));
    if (p.needs_columns) {
      im2col(g, xg, l0, l0 + cols, slot);
      Y.noalias() = W * ConstMapR<T>(slot, K, cols);
    } else {
      Y.noalias() = W * ConstStrideMapR<T>(xg + l0, K, cols, Eigen::OuterStride<>(L));
    }
  }
}

template <typename T>
void backward_data_unit(const ConvGeometry& g, const ConvWorkPlan& p, const T* dyg, const T* wg, T* dxg, T* slot) {
  const int64_t K = g.rows(), L = g.out_volume(), cin = g.in_group(), cout = g.out_group(), in_vol = g.in_volume();
  ConstMapR<T> W(wg, cout, K);
  if (p.wide) {
    WideSlot<T> s(g, p, slot);
    std::fill(s.pad, s.pad + p.padded_elements, T(0));
    const int64_t lines_per_tile = p.tile / p.padded_row;
    for (int64_t line0 = 0; line0 < g.out[1]; line0 += lines_per_tile) {
      const int64_t lines = std::min(lines_per_tile, g.out[1] - line0), cols = lines * p.padded_row;
      compact_to_wide(g, p, dyg, line0, lines, cout, s.buf);
      MapR<T>(s.col, K, cols).noalias() = W.transpose() * ConstMapR<T>(s.buf, cout, cols);
      col2im_wide_add(g, p, s.col, line0, cols, s.pad);
    }
    const int64_t H = g.in[1], W_in = g.in[2], plane = padded_plane(g, p);
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t ih = 0; ih < H; ++ih) {
        const T* src = s.pad + c * plane + (ih + g.pad_begin[1]) * p.padded_row + g.pad_begin[2];
        std::copy(src, src + W_in, dxg + (c * H + ih) * W_in);
      }
    return;
  }
  if (p.needs_columns) std::fill(dxg, dxg + cin * in_vol, T(0));
  for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
    const int64_t cols = std::min(p.tile, L - l0);
    ConstStrideMapR<T> DY(dyg + l0, cout, cols, Eigen::OuterStride<>(L));
    if (p.needs_columns) {
      MapR<T>(slot, K, cols).noalias() = W.transpose() * DY;
      col2im_add(g, slot, l0, l0 + cols, dxg);
    } else {
      StrideMapR<T>(dxg + l0, K, cols, Eigen::OuterStride<>(L)).noalias() = W.transpose() * DY;
    }
  }
}

// Adds this unit's dy * im2col(x)^T into dw (the group's rows).
template <typename T>
void backward_weight_unit(const ConvGeometry& g, const ConvWorkPlan& p, const T* xg, const T* dyg, T* dwg, T* slot) {
  const int64_t K = g.rows(), L = g.out_volume(), cout = g.out_group();
  MapR<T> DW(dwg, cout, K);
  if (p.wide) {
    WideSlot<T> s(g, p, slot);
    pad_input(g, p, xg, s.pad);
    const int64_t lines_per_tile = p.tile / p.padded_row;
    for (int64_t line0 = 0; line0 < g.out[1]; line0 += lines_per_tile) {
      const int64_t lines = std::min(lines_per_tile, g.out[1] - line0), cols = lines * p.padded_row;
      im2col_wide(g, p, s.pad, line0, cols, s.col);
      compact_to_wide(g, p, dyg, line0, lines, cout, s.buf);
      DW.noalias() += ConstMapR<T>(s.buf, cout, cols) * ConstMapR<T>(s.col, K, cols).transpose();
    }
    return;
  }
  for (int64_t l0 = 0; l0 < L; l0 += p.tile) {
    const int64_t cols = std::min(p.tile, L - l0);
    ConstStrideMapR<T> DY(dyg + l0, cout, cols, Eigen::OuterStride<>(L));
    if (p.needs_columns) {
      im2col(g, xg, l0, l0 + cols, slot);
      DW.noalias() += DY * ConstMapR<T>(slot, K, cols).transpose();
    } else {
      DW.noalias() += DY * ConstStrideMapR<T>(xg + l0, K, cols, Eigen::OuterStride<>(L)).transpose();
    }
  }
}

// ---- kernels --------------------------------------------------------------------------------

// The kernel's scratch after the rounded operand copies (bf16 or fp16 compute), if the node has
// them (they come first in the workspace, rounded_operands.hpp).
template <typename T>
T* slot_workspace(const KernelArgs& a) {
  return reinterpret_cast<T*>(static_cast<char*>(a.workspace) +
                              rounded_operand_workspace_bytes(a.in[0].numel, a.in[1].numel, a.attrs()));
}

template <typename T>
void conv_forward_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_forward(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::forward);
  const auto [x, w] = product_operands<T>(a);
  const T* bias = a.num_in == 3 ? a.in[2].ptr<T>() : nullptr;
  T* const ws = slot_workspace<T>(a);
  T* y = a.out[0].ptr<T>();
  const int64_t units = g.batch * g.groups, cout = g.out_group();
  const Epilogue epilogue = epilogue_of(a.attrs());
  run_slots(a.exec, p.slots, [&](int64_t slot) {
    for (int64_t u = slot; u < units; u += p.slots) {
      const UnitOffsets at = unit_offsets(g, u);
      forward_unit(g, p, x + at.x, w + at.grp * cout * g.rows(), y + at.y, ws + slot * p.slot_elements);
      if (bias) add_channel_bias(y + at.y, bias + at.grp * cout, cout, g.out_volume());
      apply_epilogue(epilogue, y + at.y, cout * g.out_volume());
    }
  });
}

// dx = col2im(W^T dy) per (sample, group); with a bias this is the transposed convolution's forward.
template <typename T>
void conv_backward_data_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_backward_data(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::backward_data);
  const auto [dy, w] = product_operands<T>(a);
  const T* bias = a.num_in == 3 ? a.in[2].ptr<T>() : nullptr;
  T* const ws = slot_workspace<T>(a);
  T* dx = a.out[0].ptr<T>();
  const int64_t units = g.batch * g.groups, cin = g.in_group();
  run_slots(a.exec, p.slots, [&](int64_t slot) {
    for (int64_t u = slot; u < units; u += p.slots) {
      const UnitOffsets at = unit_offsets(g, u);
      backward_data_unit(g, p, dy + at.y, w + at.grp * g.out_group() * g.rows(), dx + at.x,
                         ws + slot * p.slot_elements);
      if (bias) add_channel_bias(dx + at.x, bias + at.grp * cin, cin, g.in_volume());
    }
  });
}

// dW = sum over samples of dy * im2col(x)^T; each slot accumulates its units privately (slot 0
// straight into dW), then the slots are summed in order.
template <typename T>
void conv_backward_weight_kernel(const KernelArgs& a) {
  const ConvGeometry g = conv_geometry_backward_weight(*a.in[0].shape, *a.in[1].shape, a.attrs());
  const ConvWorkPlan p = conv_work_plan(g, ConvPass::backward_weight);
  const auto [x, dy] = product_operands<T>(a);
  T* dw = a.out[0].ptr<T>();
  const int64_t units = g.batch * g.groups, w_numel = g.out_channels * g.rows(), slots = p.acc_slots;
  T* ws = slot_workspace<T>(a);
  T* acc_base = ws + slots * p.slot_elements;
  run_slots(a.exec, slots, [&](int64_t slot) {
    T* acc = slot == 0 ? dw : acc_base + (slot - 1) * w_numel;
    std::fill(acc, acc + w_numel, T(0));
    for (int64_t u = slot; u < units; u += slots) {
      const UnitOffsets at = unit_offsets(g, u);
      backward_weight_unit(g, p, x + at.x, dy + at.y, acc + at.grp * g.out_group() * g.rows(),
                           ws + slot * p.slot_elements);
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

#pragma once
// Geometry of an N-d convolution or pooling window, shared by the op definitions (shape checks,
// workspace sizes) and the Eigen kernels. The kernels recompute it on every run, so nothing here
// allocates unless it throws (op names are string literals, never built strings). 1-d and 2-d problems are stored as 3-d ones with leading
// unit dimensions, so one implementation serves all three.
#include <array>
#include <cstdint>
#include <string>

#include "treadle/graph.hpp"

namespace treadle {

using Dims3 = std::array<int64_t, 3>;

struct ConvGeometry {
  int nd = 2;                      // spatial dimensions the caller sees (1, 2 or 3)
  int64_t batch = 0;               // N
  int64_t channels = 0;            // C: channels of the convolution's input x
  int64_t out_channels = 0;        // channels of the convolution's output y
  int64_t groups = 1;
  Dims3 in{1, 1, 1}, out{1, 1, 1};  // spatial sizes of x and y
  Dims3 kernel{1, 1, 1}, stride{1, 1, 1}, pad_begin{0, 0, 0}, pad_end{0, 0, 0}, dilation{1, 1, 1};

  int64_t in_group() const { return channels / groups; }
  int64_t out_group() const { return out_channels / groups; }
  int64_t kernel_volume() const { return kernel[0] * kernel[1] * kernel[2]; }
  int64_t in_volume() const { return in[0] * in[1] * in[2]; }
  int64_t out_volume() const { return out[0] * out[1] * out[2]; }
  int64_t rows() const { return in_group() * kernel_volume(); }  // GEMM depth: one row per (c, kd, kh, kw)
  // A 1x1 window with unit stride and no padding: the input already is the im2col matrix.
  bool pointwise() const;
};

// Spatial size of a window sweep: floor((in + pads - dilation*(k-1) - 1) / stride) + 1 (may be < 1).
int64_t window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_begin, int64_t pad_end,
                           int64_t dilation);

// Reads an integer-list attribute of length 1 (all dimensions) or nd; `dflt` when absent.
// Values must be >= `min_value`. Throws ValueError naming `op` and `name`.
Dims3 read_dims(const char* op, const Attrs& attrs, const char* name, int nd, int64_t dflt, int64_t min_value);

// Fills the window attributes (stride, padding, padding_end, dilation, groups) of `g` from `attrs`
// and computes g.out from g.in and g.kernel. g.nd, channel counts and sizes must already be set.
// Throws ValueError when the window does not fit (spatial size too small for the kernel).
void read_conv_window(const char* op, const Attrs& attrs, ConvGeometry& g);

// How the Eigen kernels split a convolution: work units are (sample, group) pairs handed out
// round-robin to a fixed number of slots that run in parallel; each slot owns an im2col buffer of
// rows() x tile columns (and, for the weight gradient, a private accumulator). The split depends
// only on the shapes, never on the executor, so results are bit-identical for any host.
struct ConvWorkPlan {
  int64_t slots = 1;       // parallel slots (<= units)
  int64_t tile = 1;        // output positions per im2col tile
  int64_t acc_slots = 1;   // slots for the weight gradient (bounded by accumulator memory)
  bool needs_columns = true;
  // Stride-1 convolutions with a unit depth (all 1-d and 2-d ones) run on a zero-padded copy of
  // each input: every im2col row is then one contiguous slice ("wide" rows of padded_row outputs,
  // the extra ones discarded), instead of one short copy per output row.
  bool wide = false;
  int64_t padded_row = 0;       // Wp = W + padding
  int64_t padded_elements = 0;  // C/groups * Hp * Wp plus the slack the last slice reads
  int64_t slot_elements = 0;    // workspace per slot
};
enum class ConvPass { forward, backward_data, backward_weight };
ConvWorkPlan conv_work_plan(const ConvGeometry& g, ConvPass pass);
// Elements (of the op's dtype) of workspace the kernel for `pass` uses; matches the kernels' layout:
// [slots x slot_elements][(acc_slots - 1) x weight accumulators], a slot being [rows x tile] or, on
// the wide path, [padded input][rows x tile][out_channels/groups x tile].
int64_t conv_workspace_elements(const ConvGeometry& g, ConvPass pass);

// Geometry of the three convolution ops from their inputs' shapes (validated by the ops' infer).
ConvGeometry conv_geometry_forward(const Shape& x, const Shape& w, const Attrs& attrs);
ConvGeometry conv_geometry_backward_data(const Shape& dy, const Shape& w, const Attrs& attrs);
ConvGeometry conv_geometry_backward_weight(const Shape& x, const Shape& dy, const Attrs& attrs);

// Pooling windows (max, average): same layout, one channel group per plane, no weights.
struct PoolGeometry {
  int nd = 2;
  int64_t planes = 0;  // N * C
  Dims3 in{1, 1, 1}, out{1, 1, 1};
  Dims3 kernel{1, 1, 1}, stride{1, 1, 1}, pad{0, 0, 0}, dilation{1, 1, 1};
  bool ceil_mode = false;
  int64_t in_volume() const { return in[0] * in[1] * in[2]; }
  int64_t out_volume() const { return out[0] * out[1] * out[2]; }
};
// PyTorch's pooling_output_shape for one dim (may be < 1 when the input is too small).
int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode);
// `x` is the pooled input (N, C, *spatial); reads kernel_size, stride (default kernel_size),
// padding, dilation (only when `allow_dilation`) and ceil_mode. Output sizes follow PyTorch,
// including its rule that a ceil-mode window must start inside the input or its left padding.
PoolGeometry pool_geometry(const char* kind, const Shape& x, const Attrs& attrs, bool allow_dilation);

}  // namespace treadle

// N-d convolution (1-d, 2-d, 3-d; stride, asymmetric padding, dilation, groups, bias) and its two
// backward ops. The gradient of "conv" is "conv_backward_data" (dx) + "conv_backward_weight" (dw) +
// "conv_backward_bias" (db); a transposed convolution IS "conv_backward_data" run forward, so its
// gradients are again "conv" and "conv_backward_weight". Every rule below is written with these
// four ops, which also makes second derivatives available.
#include <algorithm>
#include <limits>
#include <sstream>

#include "core/op_registry.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_conv.hpp"

namespace treadle {

// ---- shared geometry --------------------------------------------------------------------------

int64_t window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_begin, int64_t pad_end,
                           int64_t dilation) {
  // Wide: absurd kernel or padding sizes must not wrap around to a window that "fits".
  using wide = __int128;
  const wide span = wide(in) + pad_begin + pad_end - wide(dilation) * (kernel - 1) - 1;
  if (span < 0) return 0;
  const wide out = span / stride + 1;
  return out > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(out);
}

bool ConvGeometry::pointwise() const {
  for (int i = 0; i < 3; ++i)
    if (kernel[i] != 1 || stride[i] != 1 || pad_begin[i] != 0 || in[i] != out[i]) return false;
  return true;
}

namespace {

std::string dims_str(const Dims3& d, int nd) {
  std::ostringstream os;
  os << "(";
  for (int i = 3 - nd; i < 3; ++i) os << (i > 3 - nd ? ", " : "") << d[i];
  os << (nd == 1 ? ",)" : ")");
  return os.str();
}

Dims3 spatial_of(const Shape& s, int nd) {
  Dims3 d{1, 1, 1};
  for (int i = 0; i < nd; ++i) d[3 - nd + i] = s[s.size() - nd + i];
  return d;
}

Shape shape_of(const Dims3& d, int nd) { return Shape(d.begin() + (3 - nd), d.end()); }

const char* conv_label(int nd) {
  static const char* const names[] = {"conv", "conv1d", "conv2d", "conv3d"};
  return names[nd >= 1 && nd <= 3 ? nd : 0];
}

const char* conv_transpose_label(int nd) {
  static const char* const names[] = {"conv_transpose", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"};
  return names[nd >= 1 && nd <= 3 ? nd : 0];
}

}  // namespace

Dims3 read_dims(const char* op, const Attrs& attrs, const char* name, int nd, int64_t dflt, int64_t min_value) {
  Dims3 d{1, 1, 1};
  if (!attrs.has(name)) {
    for (int i = 0; i < nd; ++i) d[3 - nd + i] = dflt;
    if (dflt == 0) d = {0, 0, 0};
    return d;
  }
  const std::vector<int64_t>& v = attrs.ints(name);
  if (v.size() != 1 && v.size() != static_cast<std::size_t>(nd))
    throw_value_error(op, ": ", name, " must have 1 or ", nd, " values, got ", shape_str(v));
  for (int i = 0; i < nd; ++i) {
    int64_t x = v.size() == 1 ? v[0] : v[i];
    if (x < min_value) throw_value_error(op, ": ", name, " must be >= ", min_value, ", got ", shape_str(v));
    d[3 - nd + i] = x;
  }
  if (min_value <= 0 && nd < 3)
    for (int i = 0; i < 3 - nd; ++i) d[i] = 0;  // paddings of the unit dimensions
  return d;
}

void read_conv_window(const char* op, const Attrs& attrs, ConvGeometry& g) {
  const int nd = g.nd;
  g.stride = read_dims(op, attrs, "stride", nd, 1, 1);
  g.dilation = read_dims(op, attrs, "dilation", nd, 1, 1);
  g.pad_begin = read_dims(op, attrs, "padding", nd, 0, 0);
  // The end padding may be negative: a transposed convolution with output_padding >= stride
  // produces trailing positions that no window of the forward convolution reaches.
  g.pad_end = attrs.has("padding_end")
                  ? read_dims(op, attrs, "padding_end", nd, 0, std::numeric_limits<int64_t>::min() / 4)
                  : g.pad_begin;
  g.groups = attrs.i_or("groups", 1);
  if (g.groups < 1) throw_value_error(op, ": groups must be >= 1, got ", g.groups);
  if (g.channels % g.groups != 0)
    throw_value_error(op, ": groups=", g.groups, " must divide the input channels, got ", g.channels);
  if (g.out_channels % g.groups != 0)
    throw_value_error(op, ": groups=", g.groups, " must divide the output channels, got ", g.out_channels);
  for (int i = 0; i < 3; ++i) {
    g.out[i] = window_output_size(g.in[i], g.kernel[i], g.stride[i], g.pad_begin[i], g.pad_end[i], g.dilation[i]);
    if (g.out[i] < 1)
      throw_value_error(op, ": spatial size ", dims_str(g.in, nd), " with padding ", dims_str(g.pad_begin, nd),
                        " is too small for kernel ", dims_str(g.kernel, nd), " with dilation ",
                        dims_str(g.dilation, nd));
  }
}

namespace {

void check_rank(const char* op, const char* what, const Shape& s) {
  if (s.size() < 3 || s.size() > 5)
    throw_value_error(op, ": ", what, " must be (N, C, *spatial) with 1 to 3 spatial dimensions, got ", shape_str(s));
}

// An empty spatial extent would make an output out of padding alone (torch refuses it too).
void check_spatial(const char* op, const Shape& x, int nd) {
  for (int i = 0; i < nd; ++i)
    if (x[2 + i] < 1) throw_value_error(op, ": input ", shape_str(x), " has an empty spatial dimension");
}

}  // namespace

ConvGeometry conv_geometry_forward(const Shape& x, const Shape& w, const Attrs& attrs) {
  check_rank("conv", "input", x);
  ConvGeometry g;
  g.nd = static_cast<int>(x.size()) - 2;
  const char* op = conv_label(g.nd);
  if (w.size() != x.size())
    throw_value_error(op, ": weight must be (out_channels, in_channels/groups, *kernel) with ", g.nd,
                      " kernel dimensions, got ", shape_str(w));
  g.batch = x[0];
  g.channels = x[1];
  g.out_channels = w[0];
  g.in = spatial_of(x, g.nd);
  g.kernel = spatial_of(w, g.nd);
  for (int64_t k : g.kernel)
    if (k < 1) throw_value_error(op, ": kernel sizes must be >= 1, got weight ", shape_str(w));
  check_spatial(op, x, g.nd);
  read_conv_window(op, attrs, g);
  if (w[1] * g.groups != g.channels)
    throw_value_error(op, ": expected input with ", w[1] * g.groups, " channels (weight ", shape_str(w),
                      ", groups=", g.groups, "), got input ", shape_str(x));
  return g;
}

ConvGeometry conv_geometry_backward_data(const Shape& dy, const Shape& w, const Attrs& attrs) {
  ConvGeometry g;
  g.nd = static_cast<int>(dy.size()) - 2;
  check_rank("conv_transpose", "input", dy);
  const char* op = conv_transpose_label(g.nd);
  if (w.size() != dy.size())
    throw_value_error(op, ": weight must be (in_channels, out_channels/groups, *kernel) with ", g.nd,
                      " kernel dimensions, got ", shape_str(w));
  check_spatial(op, dy, g.nd);
  g.batch = dy[0];
  g.out_channels = w[0];
  g.groups = attrs.i_or("groups", 1);
  g.channels = w[1] * std::max<int64_t>(g.groups, 1);
  if (dy[1] != w[0])
    throw_value_error(op, ": expected input with ", w[0], " channels (weight ", shape_str(w), "), got input ",
                      shape_str(dy));
  g.kernel = spatial_of(w, g.nd);
  g.in = read_dims(op, attrs, "input_size", g.nd, 1, 1);
  read_conv_window(op, attrs, g);
  if (spatial_of(dy, g.nd) != g.out)
    throw_value_error(op, ": output size ", dims_str(g.in, g.nd), " is inconsistent with input ", shape_str(dy),
                      " (a convolution of that size gives spatial ", dims_str(g.out, g.nd), ")");
  return g;
}

ConvGeometry conv_geometry_backward_weight(const Shape& x, const Shape& dy, const Attrs& attrs) {
  const char* op = "conv_backward_weight";
  check_rank(op, "input", x);
  if (dy.size() != x.size() || dy[0] != x[0])
    throw_value_error(op, ": output gradient ", shape_str(dy), " does not match input ", shape_str(x));
  ConvGeometry g;
  g.nd = static_cast<int>(x.size()) - 2;
  g.batch = x[0];
  g.channels = x[1];
  g.out_channels = dy[1];
  g.in = spatial_of(x, g.nd);
  g.kernel = read_dims(op, attrs, "kernel_size", g.nd, 1, 1);
  read_conv_window(op, attrs, g);
  if (spatial_of(dy, g.nd) != g.out)
    throw_value_error(op, ": output gradient ", shape_str(dy), " should have spatial size ", dims_str(g.out, g.nd));
  return g;
}

// ---- work split (shared with the Eigen kernels) -------------------------------------------------

namespace {
constexpr int64_t kMaxSlots = 16;               // parallel slots per convolution
constexpr int64_t kColumnBudget = 1 << 17;      // elements of one slot's im2col tile
constexpr int64_t kAccumulatorBudget = 1 << 22;  // elements of all weight-gradient accumulators
}  // namespace

namespace {

// The wide path trades one short copy per (im2col row, output row) for one per (output channel,
// output row) plus a few extra GEMM columns: it pays when there are more im2col rows than channels.
bool wide_applies(const ConvGeometry& g) {
  if (g.pointwise() || g.rows() <= g.out_group() || g.in[0] != 1 || g.kernel[0] != 1 || g.pad_begin[0] != 0 || g.pad_end[0] != 0) return false;
  for (int i = 1; i < 3; ++i)
    if (g.stride[i] != 1 || g.pad_begin[i] < 0 || g.pad_end[i] < 0) return false;
  return true;
}

}  // namespace

ConvWorkPlan conv_work_plan(const ConvGeometry& g, ConvPass pass) {
  ConvWorkPlan p;
  const int64_t units = g.batch * g.groups;
  p.slots = std::clamp<int64_t>(units, 1, kMaxSlots);
  p.needs_columns = !g.pointwise();
  p.wide = wide_applies(g);
  const int64_t max_cols = std::max<int64_t>(1, kColumnBudget / std::max<int64_t>(1, g.rows()));
  if (p.wide) {
    // Whole wide rows per tile.
    p.padded_row = g.in[2] + g.pad_begin[2] + g.pad_end[2];
    const int64_t padded_rows = g.in[1] + g.pad_begin[1] + g.pad_end[1];
    p.padded_elements = g.in_group() * padded_rows * p.padded_row + (g.kernel[2] - 1) * g.dilation[2];
    p.tile = std::clamp<int64_t>(max_cols / p.padded_row, 1, g.out[1]) * p.padded_row;
    p.slot_elements = p.padded_elements + (g.rows() + g.out_group()) * p.tile;
  } else {
    // Whole output rows per tile where they fit, so the im2col loops run over long contiguous rows.
    const int64_t row_len = g.out[2], l = g.out_volume();
    p.tile = max_cols >= row_len ? std::min(l, max_cols / row_len * row_len)
                                 : std::min(l, std::max<int64_t>(max_cols, 64));
    p.slot_elements = p.needs_columns ? g.rows() * p.tile : 0;
  }
  if (pass == ConvPass::backward_weight) {
    const int64_t w_numel = g.out_channels * g.rows();
    p.acc_slots = std::clamp<int64_t>(kAccumulatorBudget / std::max<int64_t>(1, w_numel), 1, p.slots);
  }
  return p;
}

int64_t conv_workspace_elements(const ConvGeometry& g, ConvPass pass) {
  const ConvWorkPlan p = conv_work_plan(g, pass);
  const int64_t slots = pass == ConvPass::backward_weight ? p.acc_slots : p.slots;
  int64_t n = slots * p.slot_elements;
  if (pass == ConvPass::backward_weight) n += (p.acc_slots - 1) * g.out_channels * g.rows();
  return n;
}

// ---- op definitions ---------------------------------------------------------------------------

namespace {

// Rewrites the window attributes in full per-dimension form so gradient ops and kernels read them directly.
void normalise_window(Attrs& attrs, const ConvGeometry& g) {
  attrs.set("stride", shape_of(g.stride, g.nd));
  attrs.set("padding", shape_of(g.pad_begin, g.nd));
  attrs.set("padding_end", shape_of(g.pad_end, g.nd));
  attrs.set("dilation", shape_of(g.dilation, g.nd));
  attrs.set("groups", g.groups);
}

Attrs window_attrs(const Attrs& a) {
  Attrs w;
  // the compute precision carries over to the convolutions of the gradient, as for products
  for (const char* k : {"stride", "padding", "padding_end", "dilation", "groups", kPrecisionAttr})
    for (const auto& [name, v] : a.items())
      if (name == k) w.set(name, v);
  return w;
}

void check_inputs(const std::string& op, const std::vector<TensorMeta>& in, std::size_t lo, std::size_t hi) {
  if (in.size() < lo || in.size() > hi)
    throw_value_error(op, ": expected ", lo, lo == hi ? "" : " or " + std::to_string(hi), " inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
}

void check_bias(const std::string& op, const std::vector<TensorMeta>& in, int64_t channels) {
  if (in.size() == 3 && in[2].shape != Shape{channels})
    throw_value_error(op, ": bias must have shape (", channels, ",), got ", shape_str(in[2].shape));
}

std::vector<TensorMeta> infer_conv(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_inputs("conv", in, 2, 3);
  check_activation_attr("conv", attrs);
  check_precision_attr("conv", attrs, in[0].dtype);
  ConvGeometry g = conv_geometry_forward(in[0].shape, in[1].shape, attrs);
  check_bias(conv_label(g.nd), in, g.out_channels);
  normalise_window(attrs, g);
  Shape out{g.batch, g.out_channels};
  for (int64_t s : shape_of(g.out, g.nd)) out.push_back(s);
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_conv_backward_data(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_inputs("conv_backward_data", in, 2, 3);
  check_precision_attr("conv_backward_data", attrs, in[0].dtype);
  ConvGeometry g = conv_geometry_backward_data(in[0].shape, in[1].shape, attrs);
  check_bias(conv_transpose_label(g.nd), in, g.channels);
  normalise_window(attrs, g);
  Shape out{g.batch, g.channels};
  for (int64_t s : shape_of(g.in, g.nd)) out.push_back(s);
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_conv_backward_weight(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_inputs("conv_backward_weight", in, 2, 2);
  check_precision_attr("conv_backward_weight", attrs, in[0].dtype);
  ConvGeometry g = conv_geometry_backward_weight(in[0].shape, in[1].shape, attrs);
  normalise_window(attrs, g);
  Shape out{g.out_channels, g.in_group()};
  for (int64_t s : shape_of(g.kernel, g.nd)) out.push_back(s);
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_conv_backward_bias(const std::vector<TensorMeta>& in, Attrs&) {
  check_inputs("conv_backward_bias", in, 1, 1);
  if (in[0].shape.size() < 2)
    throw_value_error("conv_backward_bias: expected (N, C, ...), got ", shape_str(in[0].shape));
  return {{{in[0].shape[1]}, in[0].dtype}};
}

Shape spatial(const Value& v) {
  Shape s = v.shape();
  return Shape(s.begin() + 2, s.end());
}

Value backward_data(Value dy, Value w, const Attrs& window, const Shape& input_size) {
  Attrs a = window;
  a.set("input_size", input_size);
  return dy.graph().apply1("conv_backward_data", {dy, w}, a);
}

Value backward_weight(Value x, Value dy, const Attrs& window, const Shape& kernel_size) {
  Attrs a = window;
  a.set("kernel_size", kernel_size);
  return x.graph().apply1("conv_backward_weight", {x, dy}, a);
}

std::vector<Value> grad_conv(const GradContext& c) {
  const Attrs win = window_attrs(c.node.attrs);
  Value x = c.inputs[0], w = c.inputs[1], dy = activation_grad(c);
  std::vector<Value> g(c.inputs.size());
  if (c.needs_grad[0]) g[0] = backward_data(dy, w, win, spatial(x));
  if (c.needs_grad[1]) g[1] = backward_weight(x, dy, win, spatial(w));
  if (c.inputs.size() == 3 && c.needs_grad[2]) g[2] = dy.graph().apply1("conv_backward_bias", {dy});
  return g;
}

// y = conv_backward_data(x, w) + b is linear in x and in w: its adjoints are a convolution of the
// upstream gradient and a weight gradient with x in the role of the convolution's output gradient.
std::vector<Value> grad_conv_backward_data(const GradContext& c) {
  const Attrs win = window_attrs(c.node.attrs);
  Value x = c.inputs[0], w = c.inputs[1], gy = c.grad_outputs[0];
  std::vector<Value> g(c.inputs.size());
  if (c.needs_grad[0]) g[0] = gy.graph().apply1("conv", {gy, w}, win);
  if (c.needs_grad[1]) g[1] = backward_weight(gy, x, win, spatial(w));
  if (c.inputs.size() == 3 && c.needs_grad[2]) g[2] = gy.graph().apply1("conv_backward_bias", {gy});
  return g;
}

std::vector<Value> grad_conv_backward_weight(const GradContext& c) {
  const Attrs win = window_attrs(c.node.attrs);
  Value x = c.inputs[0], dy = c.inputs[1], gw = c.grad_outputs[0];
  std::vector<Value> g(2);
  if (c.needs_grad[0]) g[0] = backward_data(dy, gw, win, spatial(x));
  if (c.needs_grad[1]) g[1] = x.graph().apply1("conv", {x, gw}, win);
  return g;
}

std::size_t bytes_of(int64_t elements, DType dt) { return static_cast<std::size_t>(elements) * dtype_size(dt); }

}  // namespace

void register_conv_ops(OpRegistry& r) {
  r.add({.name = "conv",
         .infer = infer_conv,
         .grad = grad_conv,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs& a) {
           ConvGeometry g = conv_geometry_forward(in[0].shape, in[1].shape, a);
           return rounded_operand_workspace(in, a) + bytes_of(conv_workspace_elements(g, ConvPass::forward), in[0].dtype);
         }});
  r.add({.name = "conv_backward_data",
         .infer = infer_conv_backward_data,
         .grad = grad_conv_backward_data,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs& a) {
           ConvGeometry g = conv_geometry_backward_data(in[0].shape, in[1].shape, a);
           return rounded_operand_workspace(in, a) +
                  bytes_of(conv_workspace_elements(g, ConvPass::backward_data), in[0].dtype);
         }});
  r.add({.name = "conv_backward_weight",
         .infer = infer_conv_backward_weight,
         .grad = grad_conv_backward_weight,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs& a) {
           ConvGeometry g = conv_geometry_backward_weight(in[0].shape, in[1].shape, a);
           return rounded_operand_workspace(in, a) +
                  bytes_of(conv_workspace_elements(g, ConvPass::backward_weight), in[0].dtype);
         }});
  r.add({.name = "conv_backward_bias", .infer = infer_conv_backward_bias});
}

// ---- symbolic API -----------------------------------------------------------------------------

namespace ops {

Value conv(Value x, Value weight, Value bias, const Shape& stride, const Shape& padding, const Shape& dilation,
           int64_t groups, const Shape& padding_end) {
  Attrs a{{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  if (!padding_end.empty()) a.set("padding_end", padding_end);
  if (bias.defined()) return x.graph().apply1("conv", {x, weight, bias}, a);
  return x.graph().apply1("conv", {x, weight}, a);
}

Value conv_transpose(Value x, Value weight, Value bias, const Shape& stride, const Shape& padding,
                     const Shape& output_padding, const Shape& dilation, int64_t groups) {
  const int nd = x.ndim() - 2;
  const char* op = conv_transpose_label(nd);
  if (nd < 1 || nd > 3 || weight.ndim() != x.ndim())
    throw_value_error(op, ": expected input (N, C, *spatial) and weight (C, out/groups, *kernel), got ",
                      shape_str(x.shape()), " and ", shape_str(weight.shape()));
  Attrs a{{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  const Dims3 s = read_dims(op, a, "stride", nd, 1, 1), p = read_dims(op, a, "padding", nd, 0, 0);
  const Dims3 d = read_dims(op, a, "dilation", nd, 1, 1);
  Attrs opa{{"output_padding", output_padding}};
  const Dims3 op_pad = read_dims(op, opa, "output_padding", nd, 0, 0);
  Shape size, pad_end;
  for (int i = 3 - nd; i < 3; ++i) {
    if (op_pad[i] >= std::max(s[i], d[i]))
      throw_value_error(op, ": output_padding must be smaller than stride or dilation, got output_padding ",
                        shape_str(output_padding), ", stride ", shape_str(stride), ", dilation ", shape_str(dilation));
    const int64_t k = weight.dim(2 + i - (3 - nd)), in = x.dim(2 + i - (3 - nd));
    size.push_back((in - 1) * s[i] - 2 * p[i] + d[i] * (k - 1) + op_pad[i] + 1);
    if (size.back() < 1)
      throw_value_error(op, ": output size ", shape_str(size), " is not positive for input ", shape_str(x.shape()));
    pad_end.push_back(p[i] - op_pad[i]);
  }
  a.set("padding_end", pad_end);
  a.set("input_size", size);
  if (bias.defined()) return x.graph().apply1("conv_backward_data", {x, weight, bias}, a);
  return x.graph().apply1("conv_backward_data", {x, weight}, a);
}

}  // namespace ops
}  // namespace treadle

// Pooling over 1 to 3 spatial dims: max (with the argmax kept as an int64 second output so the
// backward pass routes each gradient to the first maximum, as PyTorch does), average (PyTorch's
// count_include_pad / ceil_mode / divisor_override rules) and adaptive average (PyTorch's window
// formula start = floor(o*I/O), end = ceil((o+1)*I/O)). Average pools are linear, so the gradient of
// each backward op is the forward op again.
#include <algorithm>
#include <limits>
#include <string_view>

#include "core/op_registry.hpp"
#include "ops/conv_geometry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_conv.hpp"

namespace treadle {
namespace {

const char* pool_label(const char* kind, int nd) {
  static const char* const names[2][3] = {{"max_pool1d", "max_pool2d", "max_pool3d"},
                                          {"avg_pool1d", "avg_pool2d", "avg_pool3d"}};
  return names[std::string_view(kind) == "max" ? 0 : 1][nd < 1 ? 0 : nd > 3 ? 2 : nd - 1];
}

std::string dims_text(const Dims3& d, int nd) {
  return shape_str(Shape(d.begin() + (3 - nd), d.end()));
}

Shape with_spatial(const Shape& nc_from, const std::vector<int64_t>& spatial) {
  Shape s{nc_from[0], nc_from[1]};
  s.insert(s.end(), spatial.begin(), spatial.end());
  return s;
}

}  // namespace

// Floor or ceil division; in ceil mode the last window must start inside the input or its left padding.
int64_t pool_output_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  // Wide: absurd kernel or padding sizes must not wrap around to a window that "fits".
  using wide = __int128;
  const wide num = wide(in) + wide(2) * p - wide(d) * (k - 1) - 1 + (ceil_mode ? wide(s) - 1 : 0);
  wide out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= wide(in) + p) --out;
  if (out > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  return out < std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::min() : static_cast<int64_t>(out);
}

PoolGeometry pool_geometry(const char* kind, const Shape& x, const Attrs& attrs, bool allow_dilation) {
  if (x.size() < 3 || x.size() > 5)
    throw_value_error(kind, "_pool: expected input (N, C, *spatial) with 1 to 3 spatial dimensions, got ",
                      shape_str(x));
  PoolGeometry g;
  g.nd = static_cast<int>(x.size()) - 2;
  const char* op = pool_label(kind, g.nd);
  g.planes = x[0] * x[1];
  for (int i = 0; i < g.nd; ++i) g.in[3 - g.nd + i] = x[2 + i];
  for (int i = 0; i < g.nd; ++i)  // padding alone would make a window out of nothing
    if (x[2 + i] < 1) throw_value_error(op, ": input ", shape_str(x), " has an empty spatial dimension");
  if (!attrs.has("kernel_size")) throw_value_error(op, ": kernel_size is required");
  g.kernel = read_dims(op, attrs, "kernel_size", g.nd, 1, 1);
  g.stride = attrs.has("stride") && !attrs.ints("stride").empty() ? read_dims(op, attrs, "stride", g.nd, 1, 1) : g.kernel;
  g.pad = read_dims(op, attrs, "padding", g.nd, 0, 0);
  g.dilation = allow_dilation ? read_dims(op, attrs, "dilation", g.nd, 1, 1) : Dims3{1, 1, 1};
  g.ceil_mode = attrs.i_or("ceil_mode", 0) != 0;
  for (int i = 3 - g.nd; i < 3; ++i)
    if (g.pad[i] > g.kernel[i] / 2)
      throw_value_error(op, ": padding should be at most half of kernel size, got padding ", dims_text(g.pad, g.nd),
                        " and kernel_size ", dims_text(g.kernel, g.nd));
  for (int i = 0; i < 3; ++i) {
    g.out[i] = pool_output_size(g.in[i], g.kernel[i], g.stride[i], g.pad[i], g.dilation[i], g.ceil_mode);
    if (g.out[i] < 1)
      throw_value_error(op, ": input ", shape_str(x), " is too small for kernel_size ", dims_text(g.kernel, g.nd),
                        " with padding ", dims_text(g.pad, g.nd), " and dilation ", dims_text(g.dilation, g.nd));
  }
  return g;
}

namespace {

void normalise_pool(Attrs& attrs, const PoolGeometry& g, bool dilation) {
  auto shape = [&](const Dims3& d) { return Shape(d.begin() + (3 - g.nd), d.end()); };
  attrs.set("kernel_size", shape(g.kernel));
  attrs.set("stride", shape(g.stride));
  attrs.set("padding", shape(g.pad));
  if (dilation) attrs.set("dilation", shape(g.dilation));
  attrs.set("ceil_mode", int64_t{g.ceil_mode});
}

Shape out_shape(const Shape& x, const PoolGeometry& g) {
  return with_spatial(x, Shape(g.out.begin() + (3 - g.nd), g.out.end()));
}

Shape spatial(const Shape& s) { return Shape(s.begin() + 2, s.end()); }

// The backward ops receive the pooled input's spatial size as "input_size" and check that pooling
// an input of that size gives the shape of the incoming gradient.
PoolGeometry backward_geometry(const char* kind, const Shape& dy, const Attrs& attrs, bool dilation) {
  if (!attrs.has("input_size")) throw_value_error(kind, "_pool_backward: input_size is required");
  if (dy.size() < 3) throw_value_error(kind, "_pool_backward: expected (N, C, *spatial), got ", shape_str(dy));
  const Shape x = with_spatial(dy, attrs.ints("input_size"));
  PoolGeometry g = pool_geometry(kind, x, attrs, dilation);
  if (out_shape(x, g) != dy)
    throw_value_error(kind, "_pool_backward: gradient ", shape_str(dy), " does not match pooled input ",
                      shape_str(x), " (expected ", shape_str(out_shape(x, g)), ")");
  return g;
}

std::vector<TensorMeta> infer_max_pool(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("max_pool", in, 1);
  check_floating("max_pool", in[0]);
  PoolGeometry g = pool_geometry("max", in[0].shape, attrs, true);
  normalise_pool(attrs, g, true);
  const Shape out = out_shape(in[0].shape, g);
  return {{out, in[0].dtype}, {out, DType::i64}};
}

std::vector<TensorMeta> infer_max_pool_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("max_pool_backward", in, 2);
  check_floating("max_pool_backward", in[0]);
  if (in[1].dtype != DType::i64 || in[1].shape != in[0].shape)
    throw_type_error("max_pool_backward: indices must be int64 of shape ", shape_str(in[0].shape), ", got ",
                     dtype_name(in[1].dtype), shape_str(in[1].shape));
  PoolGeometry g = backward_geometry("max", in[0].shape, attrs, true);
  normalise_pool(attrs, g, true);
  return {{with_spatial(in[0].shape, attrs.ints("input_size")), in[0].dtype}};
}

void check_avg_attrs(Attrs& attrs, const std::string& op) {
  if (attrs.i_or("divisor_override", 0) < 0)
    throw_value_error(op, ": divisor_override must be positive, got ", attrs.i("divisor_override"));
}

std::vector<TensorMeta> infer_avg_pool(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("avg_pool", in, 1);
  check_floating("avg_pool", in[0]);
  check_avg_attrs(attrs, "avg_pool");
  PoolGeometry g = pool_geometry("avg", in[0].shape, attrs, false);
  normalise_pool(attrs, g, false);
  return {{out_shape(in[0].shape, g), in[0].dtype}};
}

std::vector<TensorMeta> infer_avg_pool_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("avg_pool_backward", in, 1);
  check_floating("avg_pool_backward", in[0]);
  check_avg_attrs(attrs, "avg_pool_backward");
  PoolGeometry g = backward_geometry("avg", in[0].shape, attrs, false);
  normalise_pool(attrs, g, false);
  return {{with_spatial(in[0].shape, attrs.ints("input_size")), in[0].dtype}};
}

Shape read_adaptive_size(const std::string& op, const Attrs& attrs, const char* name, std::size_t nd) {
  if (!attrs.has(name)) throw_value_error(op, ": ", name, " is required");
  const Shape& s = attrs.ints(name);
  if (s.size() != nd) throw_value_error(op, ": ", name, " must have ", nd, " values, got ", shape_str(s));
  for (int64_t v : s)
    if (v < 1) throw_value_error(op, ": ", name, " must be positive, got ", shape_str(s));
  return s;
}

std::vector<TensorMeta> infer_adaptive_avg_pool(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("adaptive_avg_pool", in, 1);
  check_floating("adaptive_avg_pool", in[0]);
  const Shape& x = in[0].shape;
  if (x.size() < 3 || x.size() > 5)
    throw_value_error("adaptive_avg_pool: expected input (N, C, *spatial) with 1 to 3 spatial dimensions, got ",
                      shape_str(x));
  const Shape out = read_adaptive_size("adaptive_avg_pool", attrs, "output_size", x.size() - 2);
  for (int64_t v : spatial(x))
    if (v < 1) throw_value_error("adaptive_avg_pool: input spatial size must be positive, got ", shape_str(x));
  return {{with_spatial(x, out), in[0].dtype}};
}

std::vector<TensorMeta> infer_adaptive_avg_pool_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("adaptive_avg_pool_backward", in, 1);
  check_floating("adaptive_avg_pool_backward", in[0]);
  const Shape& dy = in[0].shape;
  if (dy.size() < 3 || dy.size() > 5)
    throw_value_error("adaptive_avg_pool_backward: expected (N, C, *spatial), got ", shape_str(dy));
  const Shape size = read_adaptive_size("adaptive_avg_pool_backward", attrs, "input_size", dy.size() - 2);
  return {{with_spatial(dy, size), in[0].dtype}};
}

Attrs with_input_size(const Attrs& a, const Shape& x) {
  Attrs b = a;
  b.set("input_size", spatial(x));
  return b;
}

Attrs without(const Attrs& a, const std::string& key) {
  Attrs b;
  for (const auto& [name, v] : a.items())
    if (name != key) b.set(name, v);
  return b;
}

std::vector<Value> grad_max_pool(const GradContext& c) {
  if (!c.needs_grad[0] || !c.grad_outputs[0].defined()) return {Value()};
  Attrs a = with_input_size(c.node.attrs, c.inputs[0].shape());
  return {c.inputs[0].graph().apply1("max_pool_backward", {c.grad_outputs[0], c.outputs[1]}, a)};
}

std::vector<Value> grad_avg_pool(const GradContext& c) {
  Attrs a = with_input_size(c.node.attrs, c.inputs[0].shape());
  return {c.inputs[0].graph().apply1("avg_pool_backward", {c.grad_outputs[0]}, a)};
}

std::vector<Value> grad_avg_pool_backward(const GradContext& c) {
  return {c.inputs[0].graph().apply1("avg_pool", {c.grad_outputs[0]}, without(c.node.attrs, "input_size"))};
}

std::vector<Value> grad_adaptive_avg_pool(const GradContext& c) {
  Attrs a{{"input_size", spatial(c.inputs[0].shape())}};
  return {c.inputs[0].graph().apply1("adaptive_avg_pool_backward", {c.grad_outputs[0]}, a)};
}

std::vector<Value> grad_adaptive_avg_pool_backward(const GradContext& c) {
  Attrs a{{"output_size", spatial(c.inputs[0].shape())}};
  return {c.inputs[0].graph().apply1("adaptive_avg_pool", {c.grad_outputs[0]}, a)};
}

}  // namespace

void register_pool_ops(OpRegistry& r) {
  r.add({.name = "max_pool", .infer = infer_max_pool, .grad = grad_max_pool});
  r.add({.name = "max_pool_backward", .infer = infer_max_pool_backward});
  r.add({.name = "avg_pool", .infer = infer_avg_pool, .grad = grad_avg_pool});
  r.add({.name = "avg_pool_backward", .infer = infer_avg_pool_backward, .grad = grad_avg_pool_backward});
  r.add({.name = "adaptive_avg_pool", .infer = infer_adaptive_avg_pool, .grad = grad_adaptive_avg_pool});
  r.add({.name = "adaptive_avg_pool_backward",
         .infer = infer_adaptive_avg_pool_backward,
         .grad = grad_adaptive_avg_pool_backward});
}

namespace ops {

Value max_pool(Value x, const Shape& kernel_size, const Shape& stride, const Shape& padding, const Shape& dilation,
               bool ceil_mode) {
  return max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode).first;
}

std::pair<Value, Value> max_pool_with_indices(Value x, const Shape& kernel_size, const Shape& stride,
                                              const Shape& padding, const Shape& dilation, bool ceil_mode) {
  Attrs a{{"kernel_size", kernel_size}, {"stride", stride}, {"padding", padding}, {"dilation", dilation},
          {"ceil_mode", int64_t{ceil_mode}}};
  std::vector<Value> out = x.graph().apply("max_pool", {x}, a);
  return {out.at(0), out.at(1)};
}

Value avg_pool(Value x, const Shape& kernel_size, const Shape& stride, const Shape& padding, bool ceil_mode,
               bool count_include_pad, int64_t divisor_override) {
  Attrs a{{"kernel_size", kernel_size}, {"stride", stride}, {"padding", padding}, {"ceil_mode", int64_t{ceil_mode}},
          {"count_include_pad", int64_t{count_include_pad}}, {"divisor_override", divisor_override}};
  return x.graph().apply1("avg_pool", {x}, a);
}

Value adaptive_avg_pool(Value x, const Shape& output_size) {
  return x.graph().apply1("adaptive_avg_pool", {x}, {{"output_size", output_size}});
}

}  // namespace ops
}  // namespace treadle

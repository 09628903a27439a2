// Small layers' ops: 2-D upsampling (nearest, nearest-exact, bilinear, bicubic) with its adjoint as the gradient, and the
// per-output transform for bounded regression targets.
#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_layers.hpp"

namespace treadle {
namespace {

// Shared attribute checks: size (H_out, W_out) > 0, mode, align_corners only for bilinear and bicubic,
// scales >= 0.
void check_upsample_attrs(const std::string& op, const Attrs& attrs) {
  const Shape& size = attrs.ints("size");
  if (size.size() != 2 || size[0] <= 0 || size[1] <= 0)
    throw_value_error(op, ": size must be 2 positive integers (H_out, W_out), got ", shape_str(size));
  const std::string& mode = attrs.s("mode");
  if (mode != "nearest" && mode != "nearest-exact" && mode != "bilinear" && mode != "bicubic")
    throw_value_error(op, ": mode must be 'nearest', 'nearest-exact', 'bilinear' or 'bicubic', got '", mode, "'");
  if ((mode == "nearest" || mode == "nearest-exact") && attrs.i_or("align_corners", 0))
    throw_value_error(op, ": align_corners applies to modes 'bilinear' and 'bicubic' only");
  for (const char* s : {"scale_h", "scale_w"})
    if (attrs.f_or(s, 0.0) < 0) throw_value_error(op, ": ", s, " must be >= 0, got ", attrs.f(s));
}

void check_nchw(const std::string& op, const TensorMeta& m) {
  check_floating(op, m);
  if (m.shape.size() != 4) throw_value_error(op, ": expected input of shape (N, C, H, W), got ", shape_str(m.shape));
}

// inputs (x (N, C, H, W)); attrs size, mode, align_corners, scale_h, scale_w -> (N, C, H_out, W_out)
std::vector<TensorMeta> infer_upsample(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "upsample2d";
  check_num_inputs(op, in, 1);
  check_nchw(op, in[0]);
  check_upsample_attrs(op, attrs);
  const Shape& size = attrs.ints("size");
  // An empty plane has nothing to sample from (the kernel would read outside the input).
  if (in[0].shape[2] < 1 || in[0].shape[3] < 1)
    throw_value_error(op, ": input of shape ", shape_str(in[0].shape), " has an empty spatial dimension");
  return {{{in[0].shape[0], in[0].shape[1], size[0], size[1]}, in[0].dtype}};
}

std::vector<Value> grad_upsample(const GradContext& c) {
  Attrs attrs = c.node.attrs;
  const Shape x = c.inputs[0].shape();
  attrs.set("input_size", Shape{x[2], x[3]});
  return {c.graph.apply1("upsample2d_backward", {c.grad_outputs[0]}, attrs)};
}

// inputs (dy (N, C, H_out, W_out)); the forward's attrs plus input_size (H, W) -> (N, C, H, W)
std::vector<TensorMeta> infer_upsample_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "upsample2d_backward";
  check_num_inputs(op, in, 1);
  check_nchw(op, in[0]);
  check_upsample_attrs(op, attrs);
  const Shape &size = attrs.ints("size"), &input = attrs.ints("input_size");
  if (input.size() != 2 || input[0] <= 0 || input[1] <= 0)
    throw_value_error(op, ": input_size must be 2 positive integers, got ", shape_str(input));
  if (in[0].shape[2] != size[0] || in[0].shape[3] != size[1])
    throw_value_error(op, ": gradient of shape ", shape_str(in[0].shape), " does not match size ", shape_str(size));
  return {{{in[0].shape[0], in[0].shape[1], input[0], input[1]}, in[0].dtype}};
}

// inputs (x (..., D), scale, shift) with scale and shift of shape (D,) or (1,); attrs activations
// (codes of ops::OutputActivation, length D or 1) -> x's shape
std::vector<TensorMeta> infer_output_transform(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "output_transform";
  check_num_inputs(op, in, 3);
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  if (in[0].shape.empty()) throw_value_error(op, ": expected input of shape (N, D), got a scalar");
  const int64_t d = in[0].shape.back();
  for (int i : {1, 2})
    if (in[i].shape != Shape{d} && in[i].shape != Shape{1})
      throw_value_error(op, ": ", (i == 1 ? "scale" : "shift"), " of shape ", shape_str(in[i].shape),
                        " does not match input of shape ", shape_str(in[0].shape), " (expected (", d, ",) or (1,))");
  const Shape& acts = attrs.ints("activations");
  if (acts.size() != 1 && static_cast<int64_t>(acts.size()) != d)
    throw_value_error(op, ": expected 1 or ", d, " activations for input of shape ", shape_str(in[0].shape), ", got ",
                      acts.size());
  for (int64_t a : acts)
    if (a < 0 || a > 3)
      throw_value_error(op, ": activation code ", a, " is not 0..3 (identity, softplus, sigmoid, tanh)");
  return {in[0]};
}

std::vector<Value> grad_output_transform(const GradContext& c) {
  auto outs = c.graph.apply("output_transform_backward", {c.grad_outputs[0], c.inputs[0], c.inputs[1], c.inputs[2]},
                            c.node.attrs);
  return {outs[0], outs[1], outs[2]};
}

// inputs (dy, x, scale, shift) -> (dx, dscale, dshift)
std::vector<TensorMeta> infer_output_transform_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "output_transform_backward";
  check_num_inputs(op, in, 4);
  if (in[0].shape != in[1].shape)
    throw_value_error(op, ": gradient of shape ", shape_str(in[0].shape), " for input of shape ",
                      shape_str(in[1].shape));
  std::vector<TensorMeta> fwd{in[1], in[2], in[3]};
  infer_output_transform(fwd, attrs);
  return {in[1], in[2], in[3]};
}

}  // namespace

void register_misc_ops(OpRegistry& r) {
  r.add({.name = "upsample2d",
         .infer = infer_upsample,
         .grad = grad_upsample,
         .workspace = [](const std::vector<TensorMeta>&, const Attrs& a) {
           // source taps per row/column; the sizes fit memory (Graph::apply refused larger outputs)
           return (static_cast<std::size_t>(a.ints("size")[0]) + static_cast<std::size_t>(a.ints("size")[1])) * 64;
         }});
  r.add({.name = "upsample2d_backward",
         .infer = infer_upsample_backward,
         .workspace = [](const std::vector<TensorMeta>&, const Attrs& a) {
           return (static_cast<std::size_t>(a.ints("size")[0]) + static_cast<std::size_t>(a.ints("size")[1])) * 64;
         }});
  r.add({.name = "output_transform", .infer = infer_output_transform, .grad = grad_output_transform});
  r.add({.name = "output_transform_backward",
         .infer = infer_output_transform_backward,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs&) {
           return 2 * sizeof(double) * static_cast<std::size_t>(in[1].shape.back());  // column sums
         }});
}

namespace ops {

Value upsample(Value x, const Shape& size, const std::string& mode, bool align_corners, double scale_h,
               double scale_w) {
  return x.graph().apply1("upsample2d", {x},
                          {{"size", size},
                           {"mode", mode},
                           {"align_corners", int64_t{align_corners}},
                           {"scale_h", scale_h},
                           {"scale_w", scale_w}});
}

OutputActivation output_activation_from_name(const std::string& name) {
  if (name == "identity") return OutputActivation::identity;
  if (name == "softplus") return OutputActivation::softplus;
  if (name == "sigmoid") return OutputActivation::sigmoid;
  if (name == "tanh") return OutputActivation::tanh;
  throw_value_error("OutputTransform: unknown activation '", name, "' (expected identity, softplus, sigmoid or tanh)");
}

Value output_transform(Value x, Value scale, Value shift, const std::vector<OutputActivation>& activations) {
  std::vector<int64_t> codes;
  for (OutputActivation a : activations) codes.push_back(static_cast<int64_t>(a));
  return x.graph().apply1("output_transform", {x, scale, shift}, {{"activations", codes}});
}

}  // namespace ops
}  // namespace treadle

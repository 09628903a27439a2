// softmax and log_softmax over any axis, with their backward ops (Jacobian-vector products):
//   softmax_backward(y, dy)     = y * (dy - sum(dy * y))
//   log_softmax_backward(y, dy) = dy - exp(y) * sum(dy)
// where sums run along the axis. Both backward ops take the forward output, not the input.
// The backward ops are differentiable in turn (second derivatives), with G the incoming gradient:
//   softmax_backward:     d/d(dy) = softmax_backward(y, G) (the Jacobian is symmetric),
//                         d/dy    = G * (dy - sum(dy * y)) - dy * sum(G * y)
//   log_softmax_backward: d/d(dy) = G - sum(G * exp(y)),  d/dy = -G * exp(y) * sum(dy)
#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

// Stores the axis non-negative so kernels need not know the sign convention.
void normalize_axis_attr(const std::string& op, const TensorMeta& m, Attrs& attrs) {
  const int64_t axis = attrs.has("axis") ? attrs.i("axis") : -1;
  attrs.set("axis", int64_t{normalize_axis(op, axis, static_cast<int>(m.shape.size()))});
}

OpDef forward_def(const std::string& name) {
  OpDef d;
  d.name = name;
  d.infer = [name](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(name, in, 1);
    check_floating(name, in[0]);
    normalize_axis_attr(name, in[0], attrs);
    return std::vector<TensorMeta>{same_as(in[0])};
  };
  d.grad = [name](const GradContext& ctx) -> std::vector<Value> {
    if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
    return {ctx.graph.apply1(name + "_backward", {ctx.outputs.at(0), ctx.grad_outputs[0]},
                             {{"axis", ctx.node.attrs.i("axis")}})};
  };
  return d;
}

std::vector<Value> grad_softmax_backward(const GradContext& c) {
  std::vector<Value> g(2);
  const Value& gout = c.grad_outputs.at(0);
  if (!gout.defined()) return g;
  const Value &y = c.inputs[0], &dy = c.inputs[1];
  const int axis = static_cast<int>(c.node.attrs.i("axis"));
  if (c.needs_grad[1]) g[1] = c.graph.apply1("softmax_backward", {y, gout}, c.node.attrs);
  if (c.needs_grad[0]) {
    const Value centred = ops::sub(dy, ops::sum(ops::mul(dy, y), axis, true));
    g[0] = ops::sub(ops::mul(gout, centred), ops::mul(dy, ops::sum(ops::mul(gout, y), axis, true)));
  }
  return g;
}

std::vector<Value> grad_log_softmax_backward(const GradContext& c) {
  std::vector<Value> g(2);
  const Value& gout = c.grad_outputs.at(0);
  if (!gout.defined()) return g;
  const Value &y = c.inputs[0], &dy = c.inputs[1];
  const int axis = static_cast<int>(c.node.attrs.i("axis"));
  const Value gp = ops::mul(gout, ops::exp(y));
  if (c.needs_grad[1]) g[1] = ops::sub(gout, ops::sum(gp, axis, true));
  if (c.needs_grad[0]) g[0] = ops::scale(ops::mul(gp, ops::sum(dy, axis, true)), -1.0);
  return g;
}

OpDef backward_def(const std::string& forward) {
  OpDef d;
  d.name = forward + "_backward";
  const std::string name = d.name;
  d.infer = [name](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(name, in, 2);
    check_floating(name, in[0]);
    check_same_dtype(name, in);
    if (in[0].shape != in[1].shape)
      throw_value_error(name, ": gradient shape ", shape_str(in[1].shape), " does not match output shape ",
                        shape_str(in[0].shape));
    normalize_axis_attr(name, in[0], attrs);
    return std::vector<TensorMeta>{same_as(in[0])};
  };
  d.grad = forward == "softmax" ? grad_softmax_backward : grad_log_softmax_backward;
  return d;
}

Value apply_softmax(const char* op, const Value& x, int axis) {
  if (!x.defined()) throw_value_error(op, ": input is an undefined value");
  return x.graph().apply1(op, {x}, {{"axis", int64_t{axis}}});
}

}  // namespace

void register_softmax_ops(OpRegistry& r) {
  for (const char* name : {"softmax", "log_softmax"}) {
    r.add(forward_def(name));
    r.add(backward_def(name));
  }
}

namespace ops {

Value softmax(Value x, int axis) { return apply_softmax("softmax", x, axis); }

Value log_softmax(Value x, int axis) { return apply_softmax("log_softmax", x, axis); }

}  // namespace ops
}  // namespace treadle

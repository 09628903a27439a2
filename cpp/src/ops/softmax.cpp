// softmax and log_softmax over any axis, with their backward ops (Jacobian-vector products):
//   softmax_backward(y, dy)     = y * (dy - sum(dy * y))
//   log_softmax_backward(y, dy) = dy - exp(y) * sum(dy)
// where sums run along the axis. Both backward ops take the forward output, not the input.
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

// Linear (x @ W^T + b) and 2-D matmul with transpose flags. Gradients are matmuls and a reduction;
// a node's compute precision (ops/precision.hpp) carries over to the products of its gradient, and
// a linear may carry a fused activation (ops/fusion.hpp).
#include "core/op_registry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

std::vector<TensorMeta> infer_linear(const std::vector<TensorMeta>& in, Attrs& attrs) {
  if (in.size() != 2 && in.size() != 3) throw_value_error("linear: expected 2 or 3 inputs, got ", in.size());
  check_floating("linear", in[0]);
  check_same_dtype("linear", in);
  check_precision_attr("linear", attrs, in[0].dtype);
  check_activation_attr("linear", attrs);
  const Shape &x = in[0].shape, &w = in[1].shape;
  if (w.size() != 2) throw_value_error("linear: weight must be 2-D (out, in), got ", shape_str(w));
  if (x.empty()) throw_value_error("linear: input must have at least 1 dimension, got a scalar");
  if (x.back() != w[1])
    throw_value_error("linear: expected input of shape (N, ", w[1], "), got ", shape_str(x));
  if (in.size() == 3 && in[2].shape != Shape{w[0]})
    throw_value_error("linear: bias must have shape (", w[0], ",), got ", shape_str(in[2].shape));
  Shape out = x;
  out.back() = w[0];
  return {{out, in[0].dtype}};
}

// Views x (and dy) as 2-D (rows, features) for the gradient matmuls.
Value as_2d(Value v) {
  if (v.ndim() == 2) return v;
  return ops::reshape(v, {-1, v.shape().back()});
}

std::vector<Value> grad_linear(const GradContext& c) {
  Value x = c.inputs[0], w = c.inputs[1];
  Value dy = as_2d(activation_grad(c));
  std::vector<Value> g(c.inputs.size());
  if (c.needs_grad[0]) {
    Value dx = precision_product("matmul", c.node, dy, w, false, false);
    g[0] = x.ndim() == 2 ? dx : ops::reshape(dx, x.shape());
  }
  if (c.needs_grad[1]) g[1] = precision_product("matmul", c.node, dy, as_2d(x), true, false);
  if (c.inputs.size() == 3 && c.needs_grad[2]) g[2] = ops::sum_to(dy, c.inputs[2].shape());
  return g;
}

std::vector<TensorMeta> infer_matmul(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("matmul", in, 2);
  check_floating("matmul", in[0]);
  check_same_dtype("matmul", in);
  check_precision_attr("matmul", attrs, in[0].dtype);
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.size() != 2 || b.size() != 2)
    throw_value_error("matmul: expected 2-D operands, got ", shape_str(a), " and ", shape_str(b));
  bool ta = attrs.i_or("trans_a", 0), tb = attrs.i_or("trans_b", 0);
  int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (k != kb)
    throw_value_error("matmul: inner dimensions differ: ", shape_str(a), (ta ? "^T" : ""), " @ ", shape_str(b),
                      (tb ? "^T" : ""));
  return {{{m, n}, in[0].dtype}};
}

std::vector<Value> grad_matmul(const GradContext& c) {
  bool ta = c.node.attrs.i_or("trans_a", 0), tb = c.node.attrs.i_or("trans_b", 0);
  Value a = c.inputs[0], b = c.inputs[1], dc = c.grad_outputs[0];
  std::vector<Value> g(2);
  auto mm = [&](Value p, Value q, bool tp, bool tq) { return precision_product("matmul", c.node, p, q, tp, tq); };
  if (c.needs_grad[0]) g[0] = !ta ? mm(dc, b, false, !tb) : mm(b, dc, tb, true);
  if (c.needs_grad[1]) g[1] = !tb ? mm(a, dc, !ta, false) : mm(dc, a, true, ta);
  return g;
}

}  // namespace

void register_linear_ops(OpRegistry& r) {
  r.add({.name = "linear", .infer = infer_linear, .grad = grad_linear, .workspace = rounded_operand_workspace});
  r.add({.name = "matmul", .infer = infer_matmul, .grad = grad_matmul, .workspace = rounded_operand_workspace});
  register_fused_activation(r);
}

namespace ops {
Value linear(Value x, Value weight, Value bias) {
  if (bias.defined()) return x.graph().apply1("linear", {x, weight, bias});
  return x.graph().apply1("linear", {x, weight});
}
Value matmul(Value a, Value b, bool trans_a, bool trans_b) {
  return a.graph().apply1("matmul", {a, b}, {{"trans_a", int64_t{trans_a}}, {"trans_b", int64_t{trans_b}}});
}
}  // namespace ops

}  // namespace treadle

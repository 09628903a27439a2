// Elementwise math: exp, log, log1p, sqrt, abs, pow (a scalar exponent) and clamp, with PyTorch's
// names, attributes and semantics (div is with the other binary ops in elementwise.cpp).
//
// Every gradient rule is written with differentiable graph ops, so these ops can be differentiated
// twice (a loss built from derivatives of a network's output differentiates through them again).
// The two piecewise ops, abs and clamp, have backward ops of their own that are linear in the
// incoming gradient: their gradient with respect to it is the same op again, and with respect to
// the saved input zero (the mask is piecewise constant).
#include <cmath>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

Graph& graph_of(const char* op, const Value& x) {
  if (!x.defined()) throw_value_error(op, ": input is an undefined value");
  return x.graph();
}

std::vector<TensorMeta> infer_unary(const std::string& op, const std::vector<TensorMeta>& in) {
  check_num_inputs(op, in, 1);
  check_floating(op, in[0]);
  return {same_as(in[0])};
}

// (x, dy) -> dx for the piecewise ops.
std::vector<TensorMeta> infer_masked_backward(const std::string& op, const std::vector<TensorMeta>& in) {
  check_num_inputs(op, in, 2);
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  if (in[0].shape != in[1].shape)
    throw_value_error(op, ": gradient shape ", shape_str(in[1].shape), " does not match input shape ",
                      shape_str(in[0].shape));
  return {same_as(in[0])};
}

bool wants(const GradContext& c) { return c.needs_grad.at(0) && c.grad_outputs.at(0).defined(); }

// One unary op whose gradient is dy times a factor built from the input x and the output y.
OpDef unary_def(const char* name, Value (*dx)(const Value& x, const Value& y, const Value& dy)) {
  OpDef d;
  d.name = name;
  d.infer = [name](const std::vector<TensorMeta>& in, Attrs&) { return infer_unary(name, in); };
  d.grad = [dx](const GradContext& c) -> std::vector<Value> {
    if (!wants(c)) return {Value()};
    return {dx(c.inputs[0], c.outputs.at(0), c.grad_outputs[0])};
  };
  return d;
}

// A backward op linear in dy whose mask depends only on x: d/d(dy) is itself, d/dx is zero.
OpDef masked_backward_def(const char* name) {
  OpDef d;
  d.name = name;
  d.infer = [name](const std::vector<TensorMeta>& in, Attrs&) { return infer_masked_backward(name, in); };
  d.grad = [name](const GradContext& c) -> std::vector<Value> {
    if (!c.needs_grad.at(1) || !c.grad_outputs.at(0).defined()) return {Value(), Value()};
    return {Value(), c.graph.apply1(name, {c.inputs[0], c.grad_outputs[0]}, c.node.attrs)};
  };
  return d;
}

void check_finite_attr(const std::string& op, const Attrs& attrs, const char* name, bool allow_inf) {
  const double v = attrs.f(name);
  if (std::isnan(v) || (!allow_inf && std::isinf(v)))
    throw_value_error(op, ": ", name, " must be ", allow_inf ? "a number (not NaN)" : "finite", ", got ", v);
}

OpDef pow_def() {
  OpDef d;
  d.name = "pow";
  d.pointwise = true;
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    if (!attrs.has("exponent")) throw_value_error("pow: missing attribute 'exponent'");
    check_finite_attr("pow", attrs, "exponent", false);
    attrs.set("exponent", attrs.f("exponent"));  // an integer exponent from Python is stored as a double
    return infer_unary("pow", in);
  };
  d.grad = [](const GradContext& c) -> std::vector<Value> {
    if (!wants(c)) return {Value()};
    const double p = c.node.attrs.f("exponent");
    const Value& x = c.inputs[0];
    const Value& dy = c.grad_outputs[0];
    if (p == 0.0) return {ops::scale(dy, 0.0)};  // as torch: zero, even at x = 0
    if (p == 1.0) return {dy};
    return {ops::mul(dy, ops::scale(ops::pow(x, p - 1.0), p))};
  };
  return d;
}

void check_clamp_attrs(const std::string& op, Attrs& attrs) {
  if (!attrs.has("min") && !attrs.has("max")) throw_value_error(op, ": at least one of 'min' and 'max' must be given");
  for (const char* bound : {"min", "max"}) {
    if (!attrs.has(bound)) continue;
    check_finite_attr(op, attrs, bound, true);
    attrs.set(bound, attrs.f(bound));
  }
}

OpDef clamp_def() {
  OpDef d;
  d.name = "clamp";
  d.infer = [](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_clamp_attrs("clamp", attrs);
    return infer_unary("clamp", in);
  };
  d.grad = [](const GradContext& c) -> std::vector<Value> {
    if (!wants(c)) return {Value()};
    return {c.graph.apply1("clamp_backward", {c.inputs[0], c.grad_outputs[0]}, c.node.attrs)};
  };
  return d;
}

}  // namespace

void register_math_ops(OpRegistry& r) {
  r.add(unary_def("exp", [](const Value&, const Value& y, const Value& dy) { return ops::mul(dy, y); }));
  r.add(unary_def("log", [](const Value& x, const Value&, const Value& dy) { return ops::div(dy, x); }));
  r.add(unary_def("log1p", [](const Value& x, const Value&, const Value& dy) {
    return ops::div(dy, ops::add(x, ops::scalar_like(x, 1.0)));
  }));
  r.add(unary_def("sqrt", [](const Value&, const Value& y, const Value& dy) {
    return ops::scale(ops::div(dy, y), 0.5);
  }));
  r.add(unary_def("abs", [](const Value& x, const Value&, const Value& dy) {
    return x.graph().apply1("abs_backward", {x, dy});
  }));
  r.add(masked_backward_def("abs_backward"));
  r.add(pow_def());
  r.add(clamp_def());
  OpDef clamp_back = masked_backward_def("clamp_backward");
  auto infer_back = clamp_back.infer;
  clamp_back.infer = [infer_back](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_clamp_attrs("clamp_backward", attrs);
    return infer_back(in, attrs);
  };
  r.add(std::move(clamp_back));
}

namespace ops {

Value exp(Value x) { return graph_of("exp", x).apply1("exp", {x}); }
Value log(Value x) { return graph_of("log", x).apply1("log", {x}); }
Value log1p(Value x) { return graph_of("log1p", x).apply1("log1p", {x}); }
Value sqrt(Value x) { return graph_of("sqrt", x).apply1("sqrt", {x}); }
Value abs(Value x) { return graph_of("abs", x).apply1("abs", {x}); }
Value pow(Value x, double exponent) { return graph_of("pow", x).apply1("pow", {x}, {{"exponent", exponent}}); }

Value clamp(Value x, std::optional<double> min, std::optional<double> max) {
  Attrs attrs;
  if (min) attrs.set("min", *min);
  if (max) attrs.set("max", *max);
  return graph_of("clamp", x).apply1("clamp", {x}, attrs);
}


}  // namespace ops
}  // namespace treadle

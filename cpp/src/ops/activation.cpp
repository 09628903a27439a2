// Activation ops: relu, leaky_relu, elu, gelu (erf or tanh form), silu, tanh, sigmoid, softplus.
// Each forward op has a backward op of its own ("<name>_backward") taking (saved, dy) -> dx, where
// `saved` is the forward output when that is cheaper and at least as stable (relu, tanh, sigmoid)
// and the forward input otherwise. Attributes follow PyTorch's names and defaults.
//
// The backward ops are differentiable too (second derivatives, for losses built from gradients):
// dx = f'(saved) * dy is linear in dy, so its gradient with respect to dy is the backward op again,
// and with respect to `saved` it is g * dy * (df'/dsaved), the activation's "curvature", written
// with differentiable graph ops (zero for the piecewise-linear relu and leaky_relu). The product
// with g * dy is one mul3 node: a PINN's derivative graphs are mostly these terms over
// (batch, width) values, each op a pass over memory.
#include <cmath>
#include <variant>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/module.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

struct NumAttr {
  const char* name;
  double dflt;
  const char* onnx = nullptr;  // the attribute of UnarySpec::onnx it becomes (LeakyReLU's negative_slope: alpha)
};

// dy * g * d(f'(saved))/d(saved): the backward op's gradient with respect to `saved`.
using Curvature = Value (*)(const Value& saved, const Value& dy, const Value& g, const Attrs& attrs);

struct UnarySpec {
  const char* name;
  // torch.nn's module for it and what the module does, or null: the op's module is not pointwise
  // with numeric options (GELU's `approximate` is a string: its module is written by hand).
  const char* module;
  const char* doc;
  // The ONNX operator computing the module with its options as attributes, or null where the export
  // composes operators (io.py: SiLU, Softplus) or there is no module.
  const char* onnx;
  bool backward_uses_output;  // backward takes (y, dy) instead of (x, dy)
  std::vector<NumAttr> num_attrs;
  void (*check)(const std::string& op, Attrs& attrs) = nullptr;  // op-specific attribute checks
  Curvature curvature = nullptr;                                  // null: f' is piecewise constant
};

Value one_minus(const Value& v) { return ops::sub(ops::scalar_like(v, 1.0), v); }

// tanh' = 1 - y^2, so d/dy = -2y.
Value tanh_curvature(const Value& y, const Value& dy, const Value& g, const Attrs&) {
  return ops::mul3(dy, g, y, -2.0);
}

// sigmoid' = y (1 - y), so d/dy = 1 - 2y.
Value sigmoid_curvature(const Value& y, const Value& dy, const Value& g, const Attrs&) {
  return ops::mul3(dy, g, one_minus(ops::scale(y, 2.0)));
}

// elu'' is elu' where x <= 0 (alpha e^x) and 0 above: elu' minus the step relu' gives exactly that.
Value elu_curvature(const Value& x, const Value& dy, const Value& g, const Attrs& attrs) {
  Graph& graph = x.graph();
  const Value h = ops::mul(dy, g);
  return ops::sub(graph.apply1("elu_backward", {x, h}, attrs), graph.apply1("relu_backward", {x, h}));
}

// silu' = s (1 + x (1 - s)), s = sigmoid(x); silu'' = s (1 - s) (2 + x (1 - 2s)).
Value silu_curvature(const Value& x, const Value& dy, const Value& g, const Attrs&) {
  const Value s = ops::sigmoid(x);
  const Value ds = ops::mul(s, one_minus(s));
  const Value rest = ops::add(ops::scalar_like(x, 2.0), ops::mul(x, one_minus(ops::scale(s, 2.0))));
  return ops::mul3(dy, g, ops::mul(ds, rest));
}

// softplus' = s = sigmoid(beta x) (1 above the threshold); softplus'' = beta s (1 - s) (0 there).
Value softplus_curvature(const Value& x, const Value& dy, const Value& g, const Attrs& attrs) {
  const Value s = x.graph().apply1("softplus_backward", {x, ops::full_like(x, 1.0)}, attrs);
  return ops::mul3(dy, g, ops::mul(s, one_minus(s)), attrs.f("beta"));
}

// erf form: gelu'' = phi(x) (2 - x^2). tanh form, gelu = x (1 + t) / 2 with t = tanh(u),
// u = c (x + k x^3): gelu'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2).
Value gelu_curvature(const Value& x, const Value& dy, const Value& g, const Attrs& attrs) {
  const Value x2 = ops::mul(x, x);
  if (attrs.s("approximate") == "none") {
    const double inv_sqrt_2pi = 0.3989422804014327;
    const Value phi = ops::scale(ops::exp(ops::scale(x2, -0.5)), inv_sqrt_2pi);
    return ops::mul3(dy, g, ops::mul(phi, ops::sub(ops::scalar_like(x, 2.0), x2)));
  }
  const double c = 0.7978845608028654, k = 0.044715;  // sqrt(2 / pi)
  const Value t = ops::tanh(ops::scale(ops::add(x, ops::scale(ops::mul(x2, x), k)), c));
  const Value du = ops::scale(ops::add(ops::scalar_like(x, 1.0), ops::scale(x2, 3.0 * k)), c);
  const Value d2u = ops::scale(x, 6.0 * k * c);
  const Value inner = ops::sub(d2u, ops::scale(ops::mul(t, ops::mul(du, du)), 2.0));
  const Value sech2 = one_minus(ops::mul(t, t));
  return ops::mul3(dy, g, ops::mul(sech2, ops::add(du, ops::scale(ops::mul(x, inner), 0.5))));
}

// A numeric attribute may arrive as an integer (e.g. alpha=1 from Python): store it as a double,
// filling the default when absent, so kernels can read it with Attrs::f.
void normalize_number(const std::string& op, Attrs& attrs, const NumAttr& na) {
  double v = na.dflt;
  for (const auto& [key, val] : attrs.items()) {
    if (key != na.name) continue;
    if (const auto* d = std::get_if<double>(&val)) {
      v = *d;
    } else if (const auto* i = std::get_if<int64_t>(&val)) {
      v = static_cast<double>(*i);
    } else {
      throw_type_error(op, ": attribute '", na.name, "' must be a number");
    }
  }
  if (!std::isfinite(v)) throw_value_error(op, ": attribute '", na.name, "' must be finite, got ", v);
  attrs.set(na.name, v);
}

void check_gelu_attrs(const std::string& op, Attrs& attrs) {
  if (!attrs.has("approximate")) attrs.set("approximate", std::string("none"));
  for (const auto& [key, val] : attrs.items())
    if (key == "approximate" && !std::holds_alternative<std::string>(val))
      throw_type_error(op, ": attribute 'approximate' must be the string \"none\" or \"tanh\"");
  const std::string& mode = attrs.s("approximate");
  if (mode != "none" && mode != "tanh")
    throw_value_error(op, ": approximate must be \"none\" or \"tanh\", got \"", mode, "\"");
}

void check_softplus_attrs(const std::string& op, Attrs& attrs) {
  if (attrs.f("beta") == 0.0) throw_value_error(op, ": beta must be nonzero");
}

void normalize_attrs(const UnarySpec& spec, const std::string& op, Attrs& attrs) {
  for (const NumAttr& na : spec.num_attrs) normalize_number(op, attrs, na);
  if (spec.check) spec.check(op, attrs);
}

OpDef forward_def(const UnarySpec& spec) {
  OpDef d;
  d.name = spec.name;
  d.pointwise = true;
  d.infer = [spec](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(spec.name, in, 1);
    check_floating(spec.name, in[0]);
    normalize_attrs(spec, spec.name, attrs);
    return std::vector<TensorMeta>{same_as(in[0])};
  };
  d.grad = [spec](const GradContext& ctx) -> std::vector<Value> {
    if (!ctx.needs_grad.at(0) || !ctx.grad_outputs.at(0).defined()) return {Value()};
    const Value& saved = spec.backward_uses_output ? ctx.outputs.at(0) : ctx.inputs.at(0);
    return {ctx.graph.apply1(std::string(spec.name) + "_backward", {saved, ctx.grad_outputs[0]}, ctx.node.attrs)};
  };
  return d;
}

// (saved, dy) -> dx, differentiable with respect to both (see the top of the file).
OpDef backward_def(const UnarySpec& spec) {
  OpDef d;
  d.name = std::string(spec.name) + "_backward";
  d.pointwise = true;
  const std::string name = d.name;
  d.infer = [spec, name](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(name, in, 2);
    check_floating(name, in[0]);
    check_same_dtype(name, in);
    if (in[0].shape != in[1].shape)
      throw_value_error(name, ": gradient shape ", shape_str(in[1].shape), " does not match ",
                        spec.backward_uses_output ? "output" : "input", " shape ", shape_str(in[0].shape));
    normalize_attrs(spec, name, attrs);
    return std::vector<TensorMeta>{same_as(in[0])};
  };
  d.grad = [spec, name](const GradContext& c) -> std::vector<Value> {
    std::vector<Value> g(2);
    const Value& gout = c.grad_outputs.at(0);
    if (!gout.defined()) return g;
    const Value& saved = c.inputs[0];
    if (c.needs_grad[1]) g[1] = c.graph.apply1(name, {saved, gout}, c.node.attrs);
    if (c.needs_grad[0] && spec.curvature) g[0] = spec.curvature(saved, c.inputs[1], gout, c.node.attrs);
    return g;
  };
  return d;
}

const std::vector<UnarySpec>& activation_specs() {
  static const std::vector<UnarySpec> specs = {
      {"relu", "ReLU", "max(x, 0)", "Relu", true, {}},
      {"leaky_relu", "LeakyReLU", "max(x, 0) + negative_slope * min(x, 0)", "LeakyRelu", false,
       {{"negative_slope", 0.01, "alpha"}}},
      {"elu", "ELU", "x for x > 0, alpha * (exp(x) - 1) otherwise", "Elu", false, {{"alpha", 1.0, "alpha"}}, nullptr,
       &elu_curvature},
      {"gelu", nullptr, nullptr, nullptr, false, {}, &check_gelu_attrs, &gelu_curvature},
      {"silu", "SiLU", "x * sigmoid(x)", nullptr, false, {}, nullptr, &silu_curvature},
      {"tanh", "Tanh", "tanh(x)", "Tanh", true, {}, nullptr, &tanh_curvature},
      {"sigmoid", "Sigmoid", "1 / (1 + exp(-x))", "Sigmoid", true, {}, nullptr, &sigmoid_curvature},
      {"softplus", "Softplus", "log(1 + exp(beta * x)) / beta (x where beta * x > threshold)", nullptr, false,
       {{"beta", 1.0}, {"threshold", 20.0}}, &check_softplus_attrs, &softplus_curvature},
  };
  return specs;
}

Graph& graph_of(const char* op, const Value& x) {
  if (!x.defined()) throw_value_error(op, ": input is an undefined value");
  return x.graph();
}

}  // namespace

const std::vector<nn::ActivationModule>& nn::activation_modules() {
  static const std::vector<ActivationModule> modules = [] {
    std::vector<ActivationModule> out;
    for (const UnarySpec& spec : activation_specs()) {
      if (!spec.module) continue;
      ActivationModule m{spec.module, spec.name, spec.doc, {}, spec.onnx ? spec.onnx : "", {}};
      for (const NumAttr& a : spec.num_attrs) {
        m.params.emplace_back(a.name, a.dflt);
        if (spec.onnx) m.onnx_attributes.emplace_back(a.onnx);
      }
      out.push_back(std::move(m));
    }
    return out;
  }();
  return modules;
}

void register_activation_ops(OpRegistry& r) {
  for (const UnarySpec& spec : activation_specs()) {
    r.add(forward_def(spec));
    r.add(backward_def(spec));
  }
}

namespace ops {

Value relu(Value x) { return graph_of("relu", x).apply1("relu", {x}); }

Value leaky_relu(Value x, double negative_slope) {
  return graph_of("leaky_relu", x).apply1("leaky_relu", {x}, {{"negative_slope", negative_slope}});
}

Value elu(Value x, double alpha) { return graph_of("elu", x).apply1("elu", {x}, {{"alpha", alpha}}); }

Value gelu(Value x, bool tanh_approximation) {
  return graph_of("gelu", x).apply1("gelu", {x}, {{"approximate", std::string(tanh_approximation ? "tanh" : "none")}});
}

Value silu(Value x) { return graph_of("silu", x).apply1("silu", {x}); }

Value tanh(Value x) { return graph_of("tanh", x).apply1("tanh", {x}); }

Value sigmoid(Value x) { return graph_of("sigmoid", x).apply1("sigmoid", {x}); }

Value softplus(Value x, double beta, double threshold) {
  return graph_of("softplus", x).apply1("softplus", {x}, {{"beta", beta}, {"threshold", threshold}});
}

}  // namespace ops
}  // namespace treadle

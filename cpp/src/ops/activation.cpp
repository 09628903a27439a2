// Activation ops: relu, leaky_relu, elu, gelu (erf or tanh form), silu, tanh, sigmoid, softplus.
// Each forward op has a backward op of its own ("<name>_backward") taking (saved, dy) -> dx, where
// `saved` is the forward output when that is cheaper and at least as stable (relu, tanh, sigmoid)
// and the forward input otherwise. Attributes follow PyTorch's names and defaults.
#include <cmath>
#include <variant>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

struct NumAttr {
  const char* name;
  double dflt;
};

struct UnarySpec {
  const char* name;
  bool backward_uses_output;  // backward takes (y, dy) instead of (x, dy)
  std::vector<NumAttr> num_attrs;
  void (*check)(const std::string& op, Attrs& attrs) = nullptr;  // op-specific attribute checks
};

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

// (saved, dy) -> dx; not differentiable itself (no second derivatives).
OpDef backward_def(const UnarySpec& spec) {
  OpDef d;
  d.name = std::string(spec.name) + "_backward";
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
  return d;
}

const std::vector<UnarySpec>& activation_specs() {
  static const std::vector<UnarySpec> specs = {
      {"relu", true, {}},
      {"leaky_relu", false, {{"negative_slope", 0.01}}},
      {"elu", false, {{"alpha", 1.0}}},
      {"gelu", false, {}, &check_gelu_attrs},
      {"silu", false, {}},
      {"tanh", true, {}},
      {"sigmoid", true, {}},
      {"softplus", false, {{"beta", 1.0}, {"threshold", 20.0}}, &check_softplus_attrs},
  };
  return specs;
}

Graph& graph_of(const char* op, const Value& x) {
  if (!x.defined()) throw_value_error(op, ": input is an undefined value");
  return x.graph();
}

}  // namespace

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

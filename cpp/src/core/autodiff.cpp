// Reverse-mode autodiff over the recorded graph. Each op's gradient rule emits ordinary graph ops,
// so the backward pass is planned, dispatched and verified exactly like the forward pass.
#include <map>

#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

// Which values depend on a source (a value whose gradient is wanted). A source may be an
// intermediate value: it stays a source whatever its producer reads.
std::vector<bool> propagate_requires_grad(const Graph& g, int num_nodes, std::vector<bool> rg) {
  for (int n = 0; n < num_nodes; ++n) {
    const Node& node = g.nodes()[n];
    bool any = false;
    for (int in : node.inputs) any = any || rg[in];
    for (int out : node.outputs) rg[out] = rg[out] || any;
  }
  return rg;
}

// The values that ask for a gradient themselves: parameters (and inputs) with requires_grad.
std::vector<bool> flagged_sources(const Graph& g) {
  std::vector<bool> rg(g.values().size(), false);
  for (std::size_t v = 0; v < g.values().size(); ++v) rg[v] = g.values()[v].requires_grad;
  return rg;
}

void accumulate(Graph& g, std::map<int, Value>& grads, int value, Value grad) {
  const ValueInfo& info = g.info(value);
  if (grad.shape() != info.shape)
    throw_runtime_error("autodiff: gradient of shape ", shape_str(grad.shape()), " for a value of shape ",
                        shape_str(info.shape), " (an op's gradient rule is wrong)");
  auto it = grads.find(value);
  if (it == grads.end())
    grads.emplace(value, grad);
  else
    it->second = ops::add(it->second, grad);
}

[[noreturn]] void throw_not_differentiable(const std::string& op) {
  const bool is_gradient_op = op.size() > 9 && op.compare(op.size() - 9, 9, "_backward") == 0;
  if (is_gradient_op)
    throw_value_error("autodiff: op '", op, "' is not differentiable, so the derivative being taken through it ",
                      "(a derivative of a derivative, e.g. grad() inside a loss) is not supported; ",
                      "docs/second-derivatives.md lists the ops that are differentiable twice");
  throw_value_error("autodiff: op '", op, "' is not differentiable");
}

}  // namespace

std::vector<int> build_backward(Graph& g, int num_nodes, const std::vector<std::pair<int, int>>& seeds,
                                const std::vector<int>& wrt) {
  return build_backward_from(g, num_nodes, seeds, wrt, flagged_sources(g));
}

std::vector<int> build_backward_from(Graph& g, int num_nodes, const std::vector<std::pair<int, int>>& seeds,
                                     const std::vector<int>& wrt, std::vector<bool> sources) {
  const OpRegistry& reg = OpRegistry::instance();
  sources.resize(g.values().size(), false);
  std::vector<bool> rg = propagate_requires_grad(g, num_nodes, std::move(sources));
  std::map<int, Value> grads;
  for (const auto& [value, grad] : seeds) accumulate(g, grads, value, Value(&g, grad));

  for (int n = num_nodes - 1; n >= 0; --n) {
    const Node node = g.nodes()[n];  // copy: apply() below may grow the node list
    GradContext ctx{g, node, {}, {}, {}, {}};
    bool any_out = false, any_in = false;
    for (int out : node.outputs) {
      ctx.outputs.emplace_back(&g, out);
      auto it = grads.find(out);
      ctx.grad_outputs.push_back(it == grads.end() ? Value() : it->second);
      any_out = any_out || it != grads.end();
    }
    for (int in : node.inputs) {
      ctx.inputs.emplace_back(&g, in);
      ctx.needs_grad.push_back(rg[in]);
      any_in = any_in || rg[in];
    }
    if (!any_out || !any_in) continue;
    const OpDef& def = reg.at(node.op);
    if (!def.grad) throw_not_differentiable(def.name);
    g.push_scope(node.scope);  // gradient ops carry their forward node's module path (for errors)
    std::vector<Value> in_grads = def.grad(ctx);
    g.pop_scope();
    for (std::size_t i = 0; i < node.inputs.size() && i < in_grads.size(); ++i)
      if (ctx.needs_grad[i] && in_grads[i].defined()) accumulate(g, grads, node.inputs[i], in_grads[i]);
  }

  std::vector<int> result;
  for (int v : wrt) {
    auto it = grads.find(v);
    result.push_back(it == grads.end() ? -1 : it->second.id());
  }
  return result;
}

}  // namespace treadle

namespace treadle::ops {
namespace {

Graph& common_graph(const std::vector<Value>& outputs, const std::vector<Value>& inputs) {
  if (outputs.empty()) throw_value_error("grad: no outputs given");
  if (inputs.empty()) throw_value_error("grad: no inputs given");
  Graph* g = nullptr;
  auto check = [&](const Value& v, const char* what, std::size_t i) {
    if (!v.defined()) throw_value_error("grad: ", what, " ", i, " is an undefined value");
    if (!is_floating(v.dtype()))
      throw_type_error("grad: ", what, " ", i, " has dtype ", dtype_name(v.dtype()), "; only floating values have gradients");
    if (g && &v.graph() != g) throw_value_error("grad: ", what, " ", i, " belongs to another graph");
    g = &v.graph();
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) check(outputs[i], "output", i);
  for (std::size_t i = 0; i < inputs.size(); ++i) check(inputs[i], "input", i);
  return *g;
}

// The seed of each output: the given grad_outputs, or 1 for scalar outputs (torch's rule).
std::vector<std::pair<int, int>> seeds_of(const std::vector<Value>& outputs, const std::vector<Value>& grad_outputs) {
  if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
    throw_value_error("grad: ", grad_outputs.size(), " grad_outputs for ", outputs.size(), " outputs");
  std::vector<std::pair<int, int>> seeds;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Value& out = outputs[i];
    Value seed;
    if (grad_outputs.empty() || !grad_outputs[i].defined()) {
      if (shape_numel(out.shape()) != 1)
        throw_value_error("grad: output ", i, " has shape ", shape_str(out.shape()),
                          "; a gradient can be implied only for a scalar output (pass grad_outputs, e.g. ones_like)");
      seed = full_like(out, 1.0);
    } else {
      seed = grad_outputs[i];
      if (&seed.graph() != &out.graph()) throw_value_error("grad: grad_outputs ", i, " belongs to another graph");
      if (seed.shape() != out.shape() || seed.dtype() != out.dtype())
        throw_value_error("grad: grad_outputs ", i, " is ", shape_str(seed.shape()), " ", dtype_name(seed.dtype()),
                          " but output ", i, " is ", shape_str(out.shape()), " ", dtype_name(out.dtype()));
    }
    seeds.emplace_back(out.id(), seed.id());
  }
  return seeds;
}

// Whether any output depends on `input` (through nodes [0, num_nodes)).
bool reaches(const Graph& g, int num_nodes, int input, const std::vector<Value>& outputs) {
  std::vector<bool> src(g.values().size(), false);
  src[input] = true;
  const std::vector<bool> dep = propagate_requires_grad(g, num_nodes, std::move(src));
  for (const Value& out : outputs)
    if (dep[out.id()]) return true;
  return false;
}

}  // namespace

std::vector<Value> grad(const std::vector<Value>& outputs, const std::vector<Value>& inputs,
                        const std::vector<Value>& grad_outputs, bool allow_unused) {
  Graph& g = common_graph(outputs, inputs);
  const int num_nodes = static_cast<int>(g.nodes().size());  // before the seeds' constants
  std::vector<std::pair<int, int>> seeds = seeds_of(outputs, grad_outputs);
  std::vector<bool> sources(g.values().size(), false);
  std::vector<int> wrt;
  for (const Value& in : inputs) {
    sources[in.id()] = true;
    wrt.push_back(in.id());
  }
  const std::vector<int> ids = build_backward_from(g, num_nodes, seeds, wrt, std::move(sources));
  std::vector<Value> result;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (ids[i] >= 0) {
      result.emplace_back(&g, ids[i]);
    } else if (reaches(g, num_nodes, inputs[i].id(), outputs)) {
      result.push_back(full_like(inputs[i], 0.0));
    } else if (allow_unused) {
      result.emplace_back();
    } else {
      throw_value_error("grad: the outputs do not depend on input ", i, " (shape ", shape_str(inputs[i].shape()),
                        "); pass allow_unused=True to get None for it");
    }
  }
  return result;
}

}  // namespace treadle::ops

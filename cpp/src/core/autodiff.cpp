// Reverse-mode autodiff over the recorded graph. Each op's gradient rule emits ordinary graph ops,
// so the backward pass is planned, dispatched and verified exactly like the forward pass.
#include <map>

#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

// Which values depend on a value that wants a gradient.
std::vector<bool> propagate_requires_grad(const Graph& g, int num_nodes) {
  std::vector<bool> rg(g.values().size(), false);
  for (std::size_t v = 0; v < g.values().size(); ++v) rg[v] = g.values()[v].requires_grad;
  for (int n = 0; n < num_nodes; ++n) {
    const Node& node = g.nodes()[n];
    bool any = false;
    for (int in : node.inputs) any = any || rg[in];
    for (int out : node.outputs) rg[out] = any;
  }
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

}  // namespace

std::vector<int> build_backward(Graph& g, int num_nodes, const std::vector<std::pair<int, int>>& seeds,
                                const std::vector<int>& wrt) {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<bool> rg = propagate_requires_grad(g, num_nodes);
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
    if (!def.grad) throw_value_error("autodiff: op '", def.name, "' is not differentiable");
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

#include "ops/fusion.hpp"

#include <algorithm>

namespace treadle {
namespace {

// The activation node of a fused pair: a view of the fused node's output (no kernel).
std::vector<TensorMeta> infer_fused_activation(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("fused_activation", in, 1);
  check_activation_attr("fused_activation", attrs);
  return {same_as(in[0])};
}

// The fused node's output already is the activation's output: the gradient passes through.
std::vector<Value> grad_fused_activation(const GradContext& c) { return {c.grad_outputs[0]}; }

// Counts, for each value, the forward nodes that read it.
std::vector<int> readers(const Graph& g, int end) {
  std::vector<int> count(g.values().size(), 0);
  for (int n = 0; n < end; ++n)
    for (int v : g.nodes()[n].inputs) ++count[v];
  return count;
}

}  // namespace

Value activation_grad(const GradContext& c) {
  const std::string& act = fused_activation(c.node.attrs);
  if (act.empty()) return c.grad_outputs[0];
  return c.graph.apply1(act + "_backward", {c.outputs[0], c.grad_outputs[0]});
}

void register_fused_activation(OpRegistry& r) {
  OpDef fused;
  fused.name = "fused_activation";
  fused.infer = infer_fused_activation;
  fused.grad = grad_fused_activation;
  fused.view_of = 0;
  r.add(std::move(fused));
}

void fuse_activations(Graph& g, int end, const std::vector<int>& outputs) {
  const OpRegistry& reg = OpRegistry::instance();
  const int producers[] = {reg.id("linear"), reg.id("conv")}, fused = reg.id("fused_activation");
  const std::vector<int> count = readers(g, end);
  for (int n = 0; n < end; ++n) {
    Node& act = g.nodes()[n];
    const std::string& name = reg.at(act.op).name;
    if (!is_fusible_activation(name) || act.inputs.size() != 1) continue;
    const int z = act.inputs[0], producer = g.info(z).producer;
    if (g.info(z).kind != ValueKind::intermediate || producer < 0 || count[z] != 1) continue;
    if (std::find(outputs.begin(), outputs.end(), z) != outputs.end()) continue;
    Node& prod = g.nodes()[producer];
    if (std::find(std::begin(producers), std::end(producers), prod.op) == std::end(producers)) continue;
    if (prod.attrs.has(kActivationAttr) || prod.outputs.size() != 1) continue;
    prod.attrs.set(kActivationAttr, name);
    act.attrs = Attrs{{kActivationAttr, name}};
    act.op = fused;
  }
}

}  // namespace treadle

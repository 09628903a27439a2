#include "core/compile.hpp"

#include <algorithm>
#include <iterator>

#include "core/op_registry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

// Sets the compute precision of the forward's matrix products and convolutions (nodes [0, end)). Runs before the
// loss and the backward pass are added: losses keep float32, and the products of the gradient
// rules inherit the precision of the node they differentiate. Attributes are re-validated by the
// op's own check, so a non-float32 product is refused there with the op's name.
void set_product_precision(Graph& g, int end, const std::string& precision) {
  if (precision.empty() || precision == "float32") return;
  check_precision_name("compile_plan", precision);
  const OpRegistry& reg = OpRegistry::instance();
  const int ops[] = {reg.id("linear"), reg.id("matmul"), reg.id("bmm"), reg.id("conv"), reg.id("conv_backward_data")};
  for (int n = 0; n < end; ++n) {
    Node& node = g.nodes()[n];
    if (std::find(std::begin(ops), std::end(ops), node.op) == std::end(ops)) continue;
    node.attrs.set(kPrecisionAttr, precision);
    check_precision_attr(reg.at(node.op).name, node.attrs, g.info(node.inputs.at(0)).dtype);
  }
}

}  // namespace

std::shared_ptr<Plan> compile_plan(const PlanKey& key, const TraceFn& trace, const Loss* loss,
                                   const ParamOffsetFn& param_offset) {
  const bool training = key.mode == PlanMode::train_seeded || key.mode == PlanMode::train_loss;
  auto plan = std::make_shared<Plan>(training);
  Graph& g = plan->graph;
  std::vector<Value> inputs;
  for (std::size_t i = 0; i < key.input_shapes.size(); ++i) {
    inputs.push_back(g.add_input(key.input_shapes[i], key.input_dtypes[i]));
    if (key.input_grad) g.values()[inputs.back().id()].requires_grad = true;
    plan->inputs.push_back(inputs.back().id());
  }
  std::vector<Value> outputs = trace(g, inputs);
  if (outputs.empty()) throw_value_error("model: forward returned no outputs");
  for (const Value& v : outputs) plan->outputs.push_back(v.id());
  plan->forward_end = static_cast<int>(g.nodes().size());
  if (key.fuse) {
    std::vector<int> kept = plan->outputs;  // values the host reads keep their own memory
    for (const auto& named : g.observed()) kept.push_back(named.second);
    fuse_activations(g, plan->forward_end, kept);
  }
  set_product_precision(g, plan->forward_end, key.precision);

  std::vector<std::pair<int, int>> seeds;
  if (key.mode == PlanMode::train_loss || key.mode == PlanMode::eval_loss) {
    if (!loss) throw_runtime_error("compile_plan: a loss plan needs a loss");
    Value target = g.add_input(key.target_shape, key.target_dtype, ValueKind::target);
    plan->targets.push_back(target.id());
    Value l = loss->apply(outputs, target, inputs);
    plan->loss = l.id();
  }
  plan->observed = g.observed();
  if (key.mode == PlanMode::train_loss && key.loss_seed_input) {
    Value l(&g, plan->loss);
    Value seed = g.add_input(Shape{}, l.dtype(), ValueKind::seed);
    plan->seeds.push_back(seed.id());
    seeds.emplace_back(l.id(), seed.id());
  } else if (key.mode == PlanMode::train_loss) {
    Value l(&g, plan->loss);
    Value one = g.apply1("constant", {}, {{"shape", Shape{}}, {"value", 1.0}, {"dtype", std::string(dtype_name(l.dtype()))}});
    seeds.emplace_back(l.id(), one.id());
  } else if (key.mode == PlanMode::train_seeded) {
    for (const Value& out : outputs) {
      Value seed = g.add_input(out.shape(), out.dtype(), ValueKind::seed);
      plan->seeds.push_back(seed.id());
      seeds.emplace_back(out.id(), seed.id());
    }
  }

  std::vector<int64_t> offsets;
  for (const auto& p : g.parameters()) offsets.push_back(param_offset(p));
  if (training) {
    std::vector<int> wrt, param_slots;
    for (std::size_t v = 0; v < g.values().size(); ++v)
      if (g.values()[v].kind == ValueKind::parameter && g.values()[v].requires_grad) {
        wrt.push_back(static_cast<int>(v));
        param_slots.push_back(g.values()[v].slot);
      }
    const std::size_t num_params = wrt.size();
    if (key.input_grad)
      for (int in : plan->inputs) wrt.push_back(in);
    std::vector<int> grads = build_backward(g, static_cast<int>(g.nodes().size()), seeds, wrt);
    for (std::size_t k = 0; k < num_params; ++k)
      if (grads[k] >= 0) plan->param_grads.emplace_back(offsets[param_slots[k]], grads[k]);
    if (key.input_grad)
      plan->input_grads.assign(grads.begin() + static_cast<std::ptrdiff_t>(num_params), grads.end());
  }
  plan->fuse_elementwise = key.fuse;
  plan->finalize(offsets, key.backend, key.deterministic);
  return plan;
}

}  // namespace treadle

// run_op: one op on one backend, forward and optionally backward, outside any model.
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backends/device_runtime.hpp"
#include "backends/kernel.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/testing.hpp"

namespace treadle {

namespace {

// One op's plan: its graph, forward and (with gradient seeds) backward, ready to finalize.
struct OpPlan {
  std::unique_ptr<Plan> plan;
  std::vector<Value> outs;
  std::vector<int> returned;        // per output: its value id, or -1 when it is not returned
  std::vector<Tensor> held, seeds;  // contiguous copies of the inputs and of the gradient seeds
};

// `all_outputs` false leaves out the outputs that have no gradient seed and that the backward pass
// reads (a recurrent layer's `saved`): a device backend may keep those in a layout of its own.
OpPlan build_op_plan(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                     const std::vector<Tensor>& grad_outputs, bool training, bool all_outputs) {
  OpPlan r{std::make_unique<Plan>(training), {}, {}, {}, {}};
  Plan& plan = *r.plan;
  Graph& g = plan.graph;
  const bool backward = !grad_outputs.empty();
  std::vector<Value> in_values;
  for (const Tensor& t : inputs) {
    r.held.push_back(t.is_contiguous() ? t : t.clone());
    in_values.push_back(g.add_input(t.shape(), t.dtype()));
    if (backward && is_floating(t.dtype())) g.values()[in_values.back().id()].requires_grad = true;
    plan.inputs.push_back(in_values.back().id());
  }
  r.outs = g.apply(op, in_values, attrs);
  plan.forward_end = static_cast<int>(g.nodes().size());
  if (backward) {
    if (grad_outputs.size() != r.outs.size())
      throw_value_error("run_op: ", op, " has ", r.outs.size(), " outputs but ", grad_outputs.size(),
                        " gradients were given");
    std::vector<std::pair<int, int>> seeds;
    for (std::size_t k = 0; k < r.outs.size(); ++k) {
      if (!grad_outputs[k].defined()) continue;
      if (grad_outputs[k].shape() != r.outs[k].shape() || grad_outputs[k].dtype() != r.outs[k].dtype())
        throw_value_error("run_op: gradient ", k, " must be ", dtype_name(r.outs[k].dtype()),
                          shape_str(r.outs[k].shape()));
      Value s = g.add_input(r.outs[k].shape(), r.outs[k].dtype(), ValueKind::seed);
      plan.seeds.push_back(s.id());
      r.seeds.push_back(grad_outputs[k].is_contiguous() ? grad_outputs[k] : grad_outputs[k].clone());
      seeds.emplace_back(r.outs[k].id(), s.id());
    }
    plan.input_grads = build_backward(g, plan.forward_end, seeds, plan.inputs);
  }
  for (std::size_t k = 0; k < r.outs.size(); ++k) {
    const int id = r.outs[k].id();
    bool read_by_backward = false;
    for (std::size_t n = static_cast<std::size_t>(plan.forward_end); n < g.nodes().size(); ++n)
      for (int v : g.nodes()[n].inputs) read_by_backward = read_by_backward || v == id;
    const bool keep = all_outputs || !backward || grad_outputs[k].defined() || !read_by_backward;
    r.returned.push_back(keep ? id : -1);
    if (keep) plan.outputs.push_back(id);
  }
  return r;
}

// A plan compiled for a device: host tensors in, host tensors out (the op suite runs unchanged).
OpRunResult run_on_device(const DeviceRuntime& runtime, const OpPlan& p, bool backward, std::size_t num_inputs,
                          uint64_t seed) {
  std::vector<int> ids = p.returned;
  if (backward) ids.insert(ids.end(), p.plan->input_grads.begin(), p.plan->input_grads.end());
  Context ctx(nullptr, seed);
  std::vector<Tensor> got = runtime.run_on_host_data(*p.plan, ctx, p.held, p.seeds, ids);
  OpRunResult result;
  result.plan = p.plan->describe();
  result.outputs.assign(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(p.outs.size()));
  result.input_grads.assign(got.begin() + static_cast<std::ptrdiff_t>(p.outs.size()), got.end());
  if (!backward) result.input_grads.resize(num_inputs);
  return result;
}

// A device backend has no fallback: an op whose backward reads an output in the backend's own layout
// (the recurrent layers' `saved`, which only their backward op may read) cannot also return that
// output to the host. Such a run is retried without returning it (an undefined tensor in its place).
void finalize_on_device(OpPlan& p, const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                        const std::vector<Tensor>& grad_outputs, bool training, const std::string& backend) {
  try {
    p.plan->finalize({}, backend);
  } catch (const ValueError& e) {
    if (grad_outputs.empty() || std::string(e.what()).find("runs every node on the device") == std::string::npos)
      throw;
    OpPlan retry = build_op_plan(op, inputs, attrs, grad_outputs, training, false);
    if (retry.plan->outputs.size() == p.plan->outputs.size()) throw;  // nothing left out: the error stands
    retry.plan->finalize({}, backend);
    p = std::move(retry);
  }
}

}  // namespace

OpRunResult run_op(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                   const std::vector<Tensor>& grad_outputs, const std::string& backend, bool training,
                   uint64_t seed, int workers, bool all_kernels) {
  if (workers < 1) throw_value_error("run_op: workers must be >= 1, got ", workers);
  std::optional<AllKernelsScope> any_size;  // while the plan is finalized (kernels are chosen)
  if (all_kernels) any_size.emplace();
  const bool backward = !grad_outputs.empty();
  OpPlan p = build_op_plan(op, inputs, attrs, grad_outputs, training, true);
  if (const DeviceRuntime* runtime = device_runtime(plan_device(backend).kind)) {
    finalize_on_device(p, op, inputs, attrs, grad_outputs, training, backend);
    return run_on_device(*runtime, p, backward, inputs.size(), seed);
  }
  Plan& plan = *p.plan;
  plan.finalize({}, backend);

  ChunkingExecutor chunking(workers);
  Context ctx(workers > 1 ? &chunking : nullptr, seed);
  std::vector<void*> in_ptrs, seed_ptrs;
  for (Tensor& t : p.held) in_ptrs.push_back(t.data());
  for (Tensor& t : p.seeds) seed_ptrs.push_back(t.data());
  Bindings b{nullptr, in_ptrs, {}, seed_ptrs};
  plan.run(ctx, b, 0, plan.num_steps());

  OpRunResult result;
  result.plan = plan.describe();
  auto copy_out = [&](int id) {
    Tensor t(plan.graph.info(id).shape, plan.graph.info(id).dtype);
    std::memcpy(t.data(), plan.address(ctx, b, id), t.nbytes());
    return t;
  };
  for (const Value& v : p.outs) result.outputs.push_back(copy_out(v.id()));
  for (int id : plan.input_grads) result.input_grads.push_back(id >= 0 ? copy_out(id) : Tensor());
  if (!backward) result.input_grads.resize(inputs.size());
  return result;
}

}  // namespace treadle

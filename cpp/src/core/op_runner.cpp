// run_op: one op on one backend, forward and optionally backward, outside any model.
#include <cstring>
#include <functional>

#include "core/plan.hpp"
#ifdef TREADLE_WITH_CUDA
#include "backends/cuda/cuda_backend.hpp"
#endif
#include "treadle/error.hpp"
#include "treadle/testing.hpp"

namespace treadle {

#ifdef TREADLE_WITH_CUDA
namespace {

// A plan compiled for "cuda": host tensors in, host tensors out (the op suite runs unchanged).
OpRunResult run_on_device(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& seeds,
                          const std::vector<Value>& outs, bool backward, uint64_t seed) {
  std::vector<int> ids;
  for (const Value& v : outs) ids.push_back(v.id());
  if (backward) ids.insert(ids.end(), plan.input_grads.begin(), plan.input_grads.end());
  Context ctx(nullptr, seed);
  std::vector<Tensor> got = cuda::run_on_device(plan, ctx, inputs, seeds, ids);
  OpRunResult result;
  result.plan = plan.describe();
  result.outputs.assign(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(outs.size()));
  result.input_grads.assign(got.begin() + static_cast<std::ptrdiff_t>(outs.size()), got.end());
  if (!backward) result.input_grads.resize(inputs.size());
  return result;
}

}  // namespace
#endif

OpRunResult run_op(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                   const std::vector<Tensor>& grad_outputs, const std::string& backend, bool training,
                   uint64_t seed, int workers) {
  if (workers < 1) throw_value_error("run_op: workers must be >= 1, got ", workers);
  Plan plan(training);
  Graph& g = plan.graph;
  const bool backward = !grad_outputs.empty();
  std::vector<Tensor> held;  // contiguous copies of the inputs
  std::vector<Value> in_values;
  for (const Tensor& t : inputs) {
    held.push_back(t.is_contiguous() ? t : t.clone());
    in_values.push_back(g.add_input(t.shape(), t.dtype()));
    if (backward && is_floating(t.dtype())) g.values()[in_values.back().id()].requires_grad = true;
    plan.inputs.push_back(in_values.back().id());
  }
  std::vector<Value> outs = g.apply(op, in_values, attrs);
  for (const Value& v : outs) plan.outputs.push_back(v.id());
  plan.forward_end = static_cast<int>(g.nodes().size());

  std::vector<Tensor> seed_tensors;
  if (backward) {
    if (grad_outputs.size() != outs.size())
      throw_value_error("run_op: ", op, " has ", outs.size(), " outputs but ", grad_outputs.size(),
                        " gradients were given");
    std::vector<std::pair<int, int>> seeds;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      if (!grad_outputs[k].defined()) continue;
      if (grad_outputs[k].shape() != outs[k].shape() || grad_outputs[k].dtype() != outs[k].dtype())
        throw_value_error("run_op: gradient ", k, " must be ", dtype_name(outs[k].dtype()), shape_str(outs[k].shape()));
      Value s = g.add_input(outs[k].shape(), outs[k].dtype(), ValueKind::seed);
      plan.seeds.push_back(s.id());
      seed_tensors.push_back(grad_outputs[k].is_contiguous() ? grad_outputs[k] : grad_outputs[k].clone());
      seeds.emplace_back(outs[k].id(), s.id());
    }
    plan.input_grads = build_backward(g, plan.forward_end, seeds, plan.inputs);
  }
  plan.finalize({}, backend);
#ifdef TREADLE_WITH_CUDA
  if (plan.device().kind == DeviceKind::cuda) return run_on_device(plan, held, seed_tensors, outs, backward, seed);
#endif

  ChunkingExecutor chunking(workers);
  Context ctx(workers > 1 ? &chunking : nullptr, seed);
  std::vector<void*> in_ptrs, seed_ptrs;
  for (Tensor& t : held) in_ptrs.push_back(t.data());
  for (Tensor& t : seed_tensors) seed_ptrs.push_back(t.data());
  Bindings b{nullptr, in_ptrs, {}, seed_ptrs};
  plan.run(ctx, b, 0, plan.num_steps());

  OpRunResult result;
  result.plan = plan.describe();
  auto copy_out = [&](int id) {
    Tensor t(g.info(id).shape, g.info(id).dtype);
    std::memcpy(t.data(), plan.address(ctx, b, id), t.nbytes());
    return t;
  };
  for (const Value& v : outs) result.outputs.push_back(copy_out(v.id()));
  for (int id : plan.input_grads) result.input_grads.push_back(id >= 0 ? copy_out(id) : Tensor());
  if (!backward) result.input_grads.resize(inputs.size());
  return result;
}

}  // namespace treadle

// The device half of Plan (CUDA builds): kernel selection for plans compiled for "cuda", the arena
// they run in, the run-time check of their bindings, and the exported entry points that let a
// program drive a plan on data it placed on the device itself.
#include "backends/cuda/cuda_backend.hpp"
#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"

namespace treadle {

// Two passes: first every node must have a CUDA kernel (a host-only check, so a missing kernel is
// reported the same with or without a device), then the device is required and each node prepared.
// There is no fallback: another backend's kernel would read device pointers on the host.
void Plan::select_device_kernels(bool deterministic) {
  const OpRegistry& reg = OpRegistry::instance();
  const Backend& cuda = cuda_backend();
  for (PlanStep& s : steps) {
    const Node& node = graph.nodes()[s.node];
    const OpDef& def = reg.at(node.op);
    // In-place updates (running statistics) only of memory the host binds, as on the host.
    for (int k : def.writes_inputs) {
      const ValueKind kind = graph.info(node.inputs.at(k)).kind;
      if (!graph.training() || (kind != ValueKind::parameter && kind != ValueKind::input))
        throw_runtime_error("plan: op '", def.name, "' updates input ", k, " in place; only training plans may hold ",
                            "it, and only for a parameter or an input");
    }
    if (def.view_of >= 0) continue;
    const DType dt = node.inputs.empty() ? graph.info(node.outputs[0]).dtype : graph.info(node.inputs[0]).dtype;
    s.kernel = cuda.find(graph, node);
    if (!s.kernel)
      throw_value_error(def.name, ": no CUDA kernel for ", dtype_name(dt), " on ", device_name(device_), " (node ",
                        s.node, " in module '", node.scope.empty() ? "<root>" : node.scope,
                        "'; a plan for backend 'cuda' runs every node on the device)");
    if (deterministic && !cuda.deterministic(graph, node))
      throw_value_error(def.name, ": the CUDA kernel on ", device_name(device_), " is not deterministic (cuBLASLt ",
                        "may split the reduction), and the plan asks for deterministic kernels");
    s.backend = &cuda;
  }
  require_cuda_device(device_);
  for (PlanStep& s : steps) {
    if (!s.kernel) continue;
    const Node& node = graph.nodes()[s.node];
    PreparedNode prepared = cuda.prepare(graph, node);
    s.state = std::move(prepared.state);
    s.workspace = prepared.workspace;  // the op's own workspace is the reference kernels' scratch
    for (const auto& [k, bytes] : prepared.opaque_outputs) {  // cuDNN's spaces in a recurrent layer's `saved`
      ValueInfo& v = graph.values()[node.outputs.at(k)];
      v.layout_owner = cuda.name();
      v.layout_bytes = static_cast<int64_t>(bytes);
    }
  }
}

char* Plan::arena_base(Context& ctx) const {
  if (device_.kind == DeviceKind::cuda) return static_cast<char*>(ctx.device_arena(arena_bytes_));
  return static_cast<char*>(ctx.arena(arena_bytes_));
}

void Plan::check_run(const Context& ctx, const Bindings& b) const {
  if (!(b.device == device_))
    throw_value_error("plan: compiled for ", device_name(device_), " but run with bindings on ", device_name(b.device),
                      device_.kind == DeviceKind::cuda
                          ? " (a device plan runs only with device memory bound; the Trainer and Model::predict "
                            "upload host data themselves)"
                          : "");
  if (device_.kind == DeviceKind::cuda && ctx.check_numerics())
    throw_value_error("plan: check_numerics reads outputs on the host and is not available for ",
                      device_name(device_), " plans run directly (the Trainer and Model::predict check them on ",
                      "the device)");
}

namespace cuda {

void run_plan(const Plan& plan, Context& ctx, const Bindings& b) { plan.run(ctx, b, 0, plan.num_steps()); }

void* plan_value_address(const Plan& plan, Context& ctx, const Bindings& b, int value) {
  if (value < 0 || value >= static_cast<int>(plan.graph.values().size()))
    throw_value_error("plan_value_address: no value ", value, " in a plan of ", plan.graph.values().size(), " values");
  return plan.address(ctx, b, value);
}

Device plan_device_of(const Plan& plan) { return plan.device(); }

std::string describe_plan(const Plan& plan) { return plan.describe(); }

}  // namespace cuda
}  // namespace treadle

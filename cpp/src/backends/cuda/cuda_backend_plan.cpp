// Plans on a CUDA device: kernel selection for plans compiled for "cuda" (DeviceRuntime::
// select_kernels), and the exported entry points that let a program drive a plan on data it placed
// on the device itself.
#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

// Two passes: first every node must have a CUDA kernel (a host-only check, so a missing kernel is
// reported the same with or without a device), then the device is required and each node prepared.
// There is no fallback: another backend's kernel would read device pointers on the host.
void select_kernels(Plan& plan, Device device, bool deterministic) {
  const OpRegistry& reg = OpRegistry::instance();
  const Backend& cuda = cuda_backend();
  Graph& graph = plan.graph;
  for (PlanStep& s : plan.steps) {
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
      throw_value_error(def.name, ": no CUDA kernel for ", dtype_name(dt), " on ", device_name(device), " (node ",
                        s.node, " in module '", node.scope.empty() ? "<root>" : node.scope,
                        "'; a plan for backend 'cuda' runs every node on the device)");
    if (deterministic && !cuda.deterministic(graph, node))
      throw_value_error(def.name, ": the CUDA kernel on ", device_name(device), " is not deterministic (cuBLASLt ",
                        "may split the reduction), and the plan asks for deterministic kernels");
    s.backend = &cuda;
  }
  require_cuda_device(device);
  const DeviceGuard on_device(device.index);  // prepared state (cuBLASLt descriptors, handles) is per device
  for (PlanStep& s : plan.steps) {
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


void run_plan(const Plan& plan, Context& ctx, const Bindings& b) { plan.run(ctx, b, 0, plan.num_steps()); }

void* plan_value_address(const Plan& plan, Context& ctx, const Bindings& b, int value) {
  if (value < 0 || value >= static_cast<int>(plan.graph.values().size()))
    throw_value_error("plan_value_address: no value ", value, " in a plan of ", plan.graph.values().size(), " values");
  return plan.address(ctx, b, value);
}

Device plan_device_of(const Plan& plan) { return plan.device(); }

std::string describe_plan(const Plan& plan) { return plan.describe(); }

}  // namespace treadle::cuda

// Anomaly mode for device plans: Plan::run refuses it (its check reads outputs on the host), so the
// steps run one at a time with the context's flag off and a device kernel counts the non-finite
// values of each output.
#include "backends/cuda/cuda_backend_train.hpp"

#include <cmath>

#include "backends/cuda/device_copy.hpp"
#include "backends/device_runtime.hpp"
#include "core/op_registry.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Turns the context's anomaly flag off for the node-by-node run and back on, even on an exception.
class NumericsOff {
 public:
  explicit NumericsOff(Context& ctx) : ctx_(ctx) { ctx_.set_check_numerics(false); }
  ~NumericsOff() { ctx_.set_check_numerics(true); }
  NumericsOff(const NumericsOff&) = delete;
  NumericsOff& operator=(const NumericsOff&) = delete;

 private:
  Context& ctx_;
};

// The host check's pass names (Plan::pass_of is private): loss nodes end at the loss's producer.
const char* pass_of(const Plan& plan, int s) {
  if (s < plan.forward_end) return "forward";
  return plan.loss >= 0 && plan.steps[s].node <= plan.graph.info(plan.loss).producer ? "loss" : "backward";
}

void check_outputs(const Plan& plan, Context& ctx, const Bindings& b, int s, NonfiniteStats* stats) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.device_queue(plan.device()).stream());
  const Node& node = plan.graph.nodes()[plan.steps[s].node];
  for (std::size_t k = 0; k < node.outputs.size(); ++k) {
    const ValueInfo& info = plan.graph.info(node.outputs[k]);
    // Possibly never written, not numbers of ours, or not floating (max-pool indices).
    if (!info.read || info.layout_owner || info.dtype != DType::f32) continue;
    const auto* data = static_cast<const float*>(plan.address(ctx, b, node.outputs[k]));
    const int64_t n = shape_numel(info.shape);
    nonfinite_stats(data, n, stats, stream);
    unsigned long long count = 0;
    copy_to_host(&count, &stats->count, sizeof(count), stream);
    if (count == 0) continue;
    long long first = 0;
    float v = 0;
    copy_to_host(&first, &stats->first, sizeof(first), stream);
    copy_to_host(&v, data + first, sizeof(v), stream);
    throw_value_error("check_numerics: node ", plan.steps[s].node, " '", OpRegistry::instance().at(node.op).name,
                      "' in module '", node.scope.empty() ? "<root>" : node.scope, "' (", pass_of(plan, s),
                      " pass) produced ", std::isnan(v) ? "NaN" : "Inf", " in output ", k, " of shape ",
                      shape_str(info.shape), " (", count, " non-finite value(s), first at flat index ", first,
                      ") on ", device_name(plan.device()));
  }
}

}  // namespace

void run_device_steps(const Plan& plan, Context& ctx, const Bindings& b, int begin, int end, NonfiniteStats* stats) {
  if (!ctx.check_numerics()) {
    plan.run(ctx, b, begin, end);
    return;
  }
  NumericsOff off(ctx);
  const uint64_t counter = ctx.next_rng_counter();
  for (int s = begin; s < end; ++s) {
    plan.run_with_counter(ctx, b, s, s + 1, counter);
    if (plan.steps[s].kernel) check_outputs(plan, ctx, b, s, stats);
  }
}

}  // namespace treadle::cuda

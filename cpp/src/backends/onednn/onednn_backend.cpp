#include "backends/onednn/onednn_backend.hpp"

#include <unordered_map>

#include "backends/onednn/onednn_common.hpp"
#include "core/op_registry.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {
using namespace onednn;

class OnednnBackend final : public Backend {
 public:
  OnednnBackend() {
    const OpRegistry& reg = OpRegistry::instance();
    for (auto entries : {matmul_entries(), eltwise_entries(), softmax_entries()})
      for (const OpEntry& e : entries) plans_[reg.id(e.op)] = e.plan;
  }

  const char* name() const override { return "onednn"; }

  // Takes a node when oneDNN has an optimised implementation for its op, dtype and shapes.
  KernelFn find(const Graph& g, const Node& node) const override {
    auto it = plans_.find(node.op);
    if (it == plans_.end()) return nullptr;
    OmpSingleThread guard;
    return it->second(g, node) ? &run_chunked : nullptr;
  }

  PreparedNode prepare(const Graph& g, const Node& node) const override {
    OmpSingleThread guard;
    std::optional<ChunkPlan> plan = plans_.at(node.op)(g, node);
    if (!plan) throw_runtime_error("onednn: node ", op_name(node), " is no longer supported at prepare time");
    try {
      return make_prepared(*plan);
    } catch (const dnnl::error& e) {
      throw_runtime_error("onednn: creating the primitive for ", op_name(node), " failed: ", e.what());
    }
  }

 private:
  std::unordered_map<int, PlanFn> plans_;
};

}  // namespace

const Backend& onednn_backend() {
  static const OnednnBackend backend;
  return backend;
}

}  // namespace treadle

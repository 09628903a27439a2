#include "backends/onednn/onednn_backend.hpp"

#include <unordered_map>

#include "backends/onednn/onednn_common.hpp"
#include "core/op_registry.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {
using namespace onednn;

// oneDNN's name for the instruction set it dispatches to (ONEDNN_MAX_CPU_ISA's spelling, lower case).
std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2_vnni_2: return "avx2_vnni_2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_fp16: return "avx512_core_fp16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "default";
  }
}

class OnednnBackend final : public Backend {
 public:
  OnednnBackend() {
    const OpRegistry& reg = OpRegistry::instance();
    for (auto entries : {matmul_entries(), eltwise_entries(), softmax_entries(), conv_entries(), norm_entries(),
                         pool_entries(), rnn_entries()})
      for (const OpEntry& e : entries) entries_[reg.id(e.op)] = e;
  }

  const char* name() const override { return "onednn"; }

  // Takes a node when oneDNN has an optimised implementation for its op, dtype and shapes.
  // fp16 compute is declined: oneDNN's f16 products are optimised only on CPUs with native fp16
  // arithmetic, so Eigen's reference path (ops/precision.hpp) takes those nodes.
  KernelFn find(const Graph& g, const Node& node) const override {
    auto it = entries_.find(node.op);
    if (it == entries_.end() || is_fp16_compute(node.attrs)) return nullptr;
    OmpSingleThread guard;
    const OpEntry& e = it->second;
    if (e.plan) return e.plan(g, node) ? &run_chunked : nullptr;
    if (e.find) return e.find(g, node);
    return e.accepts(g, node) ? e.kernel : nullptr;
  }

  // Every family takes float32 nodes only (bf16 compute is an attribute of float32 nodes; fp16
  // compute nodes are left to Eigen).
  std::vector<OpSupport> supported_ops() const override {
    const OpRegistry& reg = OpRegistry::instance();
    std::vector<OpSupport> ops;
    for (const auto& [op, entry] : entries_) ops.push_back({reg.at(op).name, {"float32"}});
    return ops;
  }

  std::vector<std::pair<std::string, std::string>> build_info() const override {
    const dnnl_version_t* v = dnnl_version();
    return {{"version", std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch)},
            {"isa", isa_name(dnnl_get_effective_cpu_isa())}};
  }

  PreparedNode prepare(const Graph& g, const Node& node) const override {
    OmpSingleThread guard;
    const OpEntry& e = entries_.at(node.op);
    try {
      if (e.prepare) return e.prepare(g, node);
      std::optional<ChunkPlan> plan = e.plan(g, node);
      if (!plan) throw_runtime_error("onednn: node ", op_name(node), " is no longer supported at prepare time");
      return make_prepared(*plan);
    } catch (const dnnl::error& err) {
      throw_runtime_error("onednn: creating the primitive for ", op_name(node), " failed: ", err.what());
    }
  }

 private:
  std::unordered_map<int, OpEntry> entries_;
};

}  // namespace

const Backend& onednn_backend() {
  static const OnednnBackend backend;
  return backend;
}

}  // namespace treadle

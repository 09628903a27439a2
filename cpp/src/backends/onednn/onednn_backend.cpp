#include "backends/onednn/onednn_backend.hpp"

#include "backends/onednn/onednn_common.hpp"
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

class OnednnBackend final : public TableBackend {
 public:
  OnednnBackend() {
    for (auto entries : {matmul_entries(), eltwise_entries(), softmax_entries(), conv_entries(), norm_entries(),
                         pool_entries(), rnn_entries()})
      for (OpEntry& e : entries) table_.add(std::move(e));
  }

  const char* name() const override { return "onednn"; }

  // Takes a node when oneDNN has an optimised implementation for its op, dtype and shapes.
  // fp16 compute is declined: oneDNN's f16 products are optimised only on CPUs with native fp16
  // arithmetic, so Eigen's reference path (ops/precision.hpp) takes those nodes.
  KernelFn find(const Graph& g, const Node& node) const override {
    if (is_fp16_compute(node.attrs)) return nullptr;
    OmpSingleThread guard;
    return TableBackend::find(g, node);
  }

  // Every kernel of this backend is deterministic (no question to the entries, which would build
  // primitive descriptors).
  bool deterministic(const Graph& g, const Node& node) const override { return true; }

  std::vector<std::pair<std::string, std::string>> build_info() const override {
    const dnnl_version_t* v = dnnl_version();
    return {{"version", std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch)},
            {"isa", isa_name(dnnl_get_effective_cpu_isa())}};
  }

  PreparedNode prepare(const Graph& g, const Node& node) const override {
    OmpSingleThread guard;
    try {
      return TableBackend::prepare(g, node);
    } catch (const dnnl::error& err) {
      throw_runtime_error("onednn: creating the primitive for ", op_name(node), " failed: ", err.what());
    }
  }
};

}  // namespace

const Backend& onednn_backend() {
  static const OnednnBackend backend;
  return backend;
}

}  // namespace treadle

// CudaBackend: the table of op adapters (cuda_backend_ops.cpp) behind the core's Backend interface,
// and the device helpers the plan uses (plan_device, is_device_backend, require_cuda_device).
#include "backends/cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <unordered_map>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "core/op_registry.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    const OpRegistry& reg = OpRegistry::instance();
    for (std::vector<cuda::OpEntry> family : {cuda::op_entries(), cuda::cnn_op_entries(), cuda::rnn_op_entries(),
                                              cuda::norm_op_entries(), cuda::shape_op_entries(),
                                              cuda::elementwise_op_entries()})
      for (cuda::OpEntry& e : family) entries_[reg.id(e.op)] = std::move(e);
  }

  const char* name() const override { return "cuda"; }

  // Float32 nodes of the covered ops whose shapes the adapter handles.
  KernelFn find(const Graph& g, const Node& node) const override {
    auto it = entries_.find(node.op);
    if (it == entries_.end()) return nullptr;
    return it->second.accepts(g, node) ? it->second.kernel : nullptr;
  }

  // Builds the cuBLASLt products (algorithm choice included) once per node, on device 0.
  PreparedNode prepare(const Graph& g, const Node& node) const override {
    const cuda::OpEntry& e = entries_.at(node.op);
    if (!e.prepare) return {};
    cuda::DeviceGuard guard(0);
    return e.prepare(g, node);
  }

  bool deterministic(const Graph& g, const Node& node) const override {
    auto it = entries_.find(node.op);
    return it != entries_.end() && it->second.deterministic;
  }

  std::vector<OpSupport> supported_ops() const override {
    std::vector<OpSupport> ops;
    for (const auto& [op, entry] : entries_) ops.push_back({entry.op, {"float32"}});
    return ops;
  }

 private:
  std::unordered_map<int, cuda::OpEntry> entries_;
};

}  // namespace

const Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

Device plan_device(const std::string& backend) {
  return backend == "cuda" ? Device{DeviceKind::cuda, 0} : Device{};
}

bool is_device_backend(const Backend* b) { return b == &cuda_backend(); }

void require_cuda_device(Device d) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    cudaGetLastError();  // not sticky: a later call may succeed once a driver is there
    throw_value_error("plan: backend 'cuda' needs a CUDA device for ", device_name(d), ", but cudaGetDeviceCount ",
                      "failed: ", cudaGetErrorName(st), " (", cudaGetErrorString(st), ")");
  }
  if (d.index >= count)
    throw_value_error("plan: backend 'cuda' needs a CUDA device for ", device_name(d), ", but this machine has ",
                      count, " CUDA device(s)");
}

}  // namespace treadle

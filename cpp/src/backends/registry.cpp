#include "backends/kernel.hpp"

#include <algorithm>
#include <utility>

#include "core/op_registry.hpp"
#include "backends/eigen/eigen_backend.hpp"
#ifdef TREADLE_WITH_ONEDNN
#include "backends/onednn/onednn_backend.hpp"
#endif
#ifdef TREADLE_WITH_CUDA
#include "backends/cuda/cuda_backend.hpp"
#endif
#include "treadle/error.hpp"

namespace treadle {

void KernelTable::add(const std::string& op, DType dtype, KernelFn fn) {
  table_[OpRegistry::instance().id(op)][static_cast<int>(dtype)] = fn;
}

KernelFn KernelTable::find(int op_id, DType dtype) const {
  auto it = table_.find(op_id);
  return it == table_.end() ? nullptr : it->second[static_cast<int>(dtype)];
}

std::vector<OpSupport> KernelTable::list() const {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<OpSupport> ops;
  for (const auto& [op, kernels] : table_) {
    OpSupport s{reg.at(op).name, {}};
    for (std::size_t d = 0; d < kernels.size(); ++d)
      if (kernels[d]) s.dtypes.emplace_back(dtype_name(static_cast<DType>(d)));
    ops.push_back(std::move(s));
  }
  return ops;
}

namespace {
thread_local std::string cpu_decline;
}

void note_cpu_decline(std::string why) { cpu_decline = std::move(why); }

namespace {
thread_local bool any_size = false;
}  // namespace

KernelsForAnySize::KernelsForAnySize() : outer_(any_size) { any_size = true; }
KernelsForAnySize::~KernelsForAnySize() { any_size = outer_; }
bool size_thresholds_apply() { return !any_size; }

std::string take_cpu_decline() { return std::exchange(cpu_decline, std::string()); }

bool read_only_by(const Graph& g, int value, const std::string& op) {
  if (g.info(value).host_read) return false;
  const OpRegistry& reg = OpRegistry::instance();
  for (const Node& node : g.nodes())
    for (int in : node.inputs)
      if (in == value && reg.at(node.op).name != op) return false;
  return true;
}

const std::vector<const Backend*>& available_backends() {
  static const std::vector<const Backend*> backends = {
#ifdef TREADLE_WITH_CUDA
      &cuda_backend(),  // device plans only: host plans never take it (Plan::select_kernels)
#endif
#ifdef TREADLE_WITH_ONEDNN
      &onednn_backend(),
#endif
      &eigen_backend()};
  return backends;
}

const Backend* backend_by_name(const std::string& name) {
  std::string known;
  for (const Backend* b : available_backends()) {
    if (name == b->name()) return b;
    known += known.empty() ? b->name() : std::string(", ") + b->name();
  }
#ifndef TREADLE_WITH_CUDA
  if (name == "cuda")
    throw_value_error("unknown backend 'cuda': this build has no CUDA support (configure with ",
                      "-DTREADLE_WITH_CUDA=ON); available: ", known);
#endif
  throw_value_error("unknown backend '", name, "' (available: ", known, ")");
}

}  // namespace treadle

#include "treadle/backend.hpp"

std::vector<std::string> treadle::backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : available_backends()) names.emplace_back(b->name());
  return names;
}

std::vector<treadle::OpSupport> treadle::backend_ops(const std::string& backend) {
  std::vector<OpSupport> ops = backend_by_name(backend)->supported_ops();
  std::sort(ops.begin(), ops.end(), [](const OpSupport& a, const OpSupport& b) { return a.op < b.op; });
  return ops;
}

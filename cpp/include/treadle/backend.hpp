#pragma once
// Which compute backends this build has, fastest first; "eigen" (the reference) is always last.
#include <string>
#include <vector>

#include "treadle/dtype.hpp"
#include "treadle/export.hpp"

namespace treadle {
TREADLE_API std::vector<std::string> backend_names();

// The device a plan pinned to `backend` runs on: the CPU for a host backend, "" and "auto"; device N
// of a device backend for "<name>:N" (device 0 without an index: "cuda" is cuda:0). ValueError for an
// unknown backend or a malformed index, as Model::set_backend.
TREADLE_API Device backend_device(const std::string& backend);

// What one backend has kernels for: each op it may take and the dtypes of those kernels (the dtype
// of the node's first input). A backend other than the reference is partial: it takes a node only
// where its kernel is faster and as accurate (shapes, attributes and sizes decide, per node, when a
// plan is compiled: Model::describe_plans shows the choice); every other node falls back to Eigen.
struct OpSupport {
  std::string op;
  std::vector<std::string> dtypes;  // dtype names: "float32", "float64", ...
};
// Sorted by op name; throws ValueError naming the known backends for an unknown name.
TREADLE_API std::vector<OpSupport> backend_ops(const std::string& backend);

// The ops with a gradient rule, sorted. A gradient op ("<op>_backward", "conv_backward_data", ...)
// listed here can be differentiated again: second derivatives (ops::grad inside a loss) pass
// through it; one not listed is refused by name when a plan would need its derivative.
TREADLE_API std::vector<std::string> differentiable_ops();

// What this build is and what it runs on, as (key, value) pairs in a fixed order: "version",
// "backends", "compiled_for" (the instruction set the core's own kernels were compiled for:
// "native" or the portable baseline), "cpu_features" (of this CPU, as the kernels see them),
// "eigen", then each backend's own entries prefixed by its name ("onednn.version",
// "onednn.isa": the instruction set oneDNN dispatches to on this CPU, after ONEDNN_MAX_CPU_ISA).
struct BuildInfoEntry {
  std::string key, value;
};
TREADLE_API std::vector<BuildInfoEntry> build_info();
}  // namespace treadle

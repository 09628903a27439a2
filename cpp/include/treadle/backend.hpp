#pragma once
// Which compute backends this build has, fastest first; "eigen" (the reference) is always last.
#include <string>
#include <vector>

#include "treadle/export.hpp"

namespace treadle {
TREADLE_API std::vector<std::string> backend_names();

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
}  // namespace treadle

#pragma once
// The kernels around a device training step (train_kernels.hpp) and the CUDA-graph wrappers
// (cuda_graph.hpp), in isolation: part of the standalone project as well as the main build.
#include <string>
#include <vector>

#include "test_cuda_common.hpp"

namespace treadle::cuda::test {

// Argument checks on the host (no device needed).
std::string train_kernel_validation();
// add_into, nonfinite_stats, SGD against host arithmetic, the indirect updates bitwise against the
// launched ones, and a captured graph replayed with changing coefficients.
void add_train_kernel_tests(std::vector<TestCase>& out);

}  // namespace treadle::cuda::test

#pragma once
// The core's plans compiled for "cuda" (test_cuda_core.cpp): only in the main build, which links
// libtreadle (TREADLE_CUDA_TEST_CORE); the standalone project tests the kernel layer alone.
#include <vector>

#include "test_cuda_common.hpp"

namespace treadle::cuda::test {

// Checks that need no device: the errors of device plans, host plans untouched by the backend.
void add_core_host_tests(std::vector<TestCase>& out);
// Training plans (an MLP) on the device against the same plans on Eigen.
void add_core_device_tests(std::vector<TestCase>& out);
// The Trainer and Model::predict on backend "cuda" (test_cuda_core_train.cpp): host-side errors, and
// training on the device against Eigen.
void add_core_train_host_tests(std::vector<TestCase>& out);
void add_core_train_device_tests(std::vector<TestCase>& out);

}  // namespace treadle::cuda::test

#pragma once
// Registration of the cuDNN (convolution, pooling, batch norm, LSTM/GRU) and mixed-precision (loss scaling,
// fp16 conversion) tests of the GPU check program.
#include <string>
#include <vector>

#include "test_cuda_common.hpp"

namespace treadle::cuda::test {

// Host-side checks: no device needed (argument validation, the loss scaler's logic).
std::string conv_validation();
std::string pool_norm_validation();
std::string loss_scaler_logic();
std::string rnn_validation();
std::string layer_gap_validation();  // test_cuda_gaps.cpp

// Device tests.
void add_conv_tests(std::vector<TestCase>& out);
void add_pool_norm_tests(std::vector<TestCase>& out);
void add_loss_scale_tests(std::vector<TestCase>& out);
void add_rnn_tests(std::vector<TestCase>& out);
void add_cnn_tests(std::vector<TestCase>& out);
void add_gap_tests(std::vector<TestCase>& out);

}  // namespace treadle::cuda::test

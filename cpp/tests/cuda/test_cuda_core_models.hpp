#pragma once
// Models the core's device tests share (test_cuda_core.cpp: plans; test_cuda_core_train.cpp: the
// trainer), built with the C++ API over a traced forward.
#include <cstdint>
#include <memory>
#include <random>

#include "treadle/model.hpp"

namespace treadle::cuda::test {

inline constexpr int64_t kModelClasses = 10;

// A trainable float32 parameter, uniform in +-1/sqrt(fan in) (shape[0] outputs); a frozen constant.
std::shared_ptr<Parameter> uniform_parameter(std::mt19937_64& rng, const Shape& shape);
std::shared_ptr<Parameter> constant_parameter(const Shape& shape, float value);

// x (4, 3, 12, 12) -> conv 8 3x3 pad 1 + bias + relu -> max pool 2 -> conv 16 3x3 pad 1 (no bias) +
// tanh -> average pool 2 -> flatten -> linear 10.
std::shared_ptr<Model> small_cnn(uint64_t seed);
// x (4, 3, 12, 12) -> conv 8 3x3 pad 1 (no bias) -> batch norm (affine, momentum 0.1, running
// statistics and the batch counter in the parameter buffer) -> relu -> max pool 2 -> linear 10.
std::shared_ptr<Model> batch_norm_cnn(uint64_t seed);

// Recurrent models through nn::LSTM / nn::GRU (the modules' own graphs: zero initial states, the
// directions' outputs and final states concatenated), batch_first, hidden size kRnnHidden.
inline constexpr int64_t kRnnHidden = 16;
// x (16, 5, 12) -> LSTM 16, 2 layers, bidirectional (biases) -> flatten -> linear 10.
inline const Shape kBiLstmInput{16, 5, 12};
std::shared_ptr<Model> bidirectional_lstm(uint64_t seed);
// x (16, 7, 12) and lengths (16) int64 -> GRU 16, bidirectional, variable lengths -> [flatten(y), h_n of
// either direction] concatenated -> linear 10.
inline const Shape kVarGruInput{16, 7, 12};
std::shared_ptr<Model> variable_length_gru(uint64_t seed);

}  // namespace treadle::cuda::test

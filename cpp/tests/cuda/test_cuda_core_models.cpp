#include "test_cuda_core_models.hpp"

#include <cmath>
#include <vector>

#include "treadle/nn_conv.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/nn_recurrent.hpp"

namespace treadle::cuda::test {

std::shared_ptr<Parameter> uniform_parameter(std::mt19937_64& rng, const Shape& shape) {
  Tensor t(shape, DType::f32);
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape_numel(shape) / shape[0]));
  std::uniform_real_distribution<float> d(static_cast<float>(-bound), static_cast<float>(bound));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return std::make_shared<Parameter>(t);
}

std::shared_ptr<Parameter> constant_parameter(const Shape& shape, float value) {
  Tensor t(shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = value;
  return std::make_shared<Parameter>(t, false);
}

std::shared_ptr<Model> small_cnn(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NamedParameter> p = {{"c1.weight", uniform_parameter(rng, {8, 3, 3, 3})},
                                   {"c1.bias", uniform_parameter(rng, {8})},
                                   {"c2.weight", uniform_parameter(rng, {16, 8, 3, 3})},
                                   {"fc.weight", uniform_parameter(rng, {kModelClasses, 16 * 3 * 3})},
                                   {"fc.bias", uniform_parameter(rng, {kModelClasses})}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    Value h = ops::max_pool(ops::relu(ops::conv(in[0], w(0), w(1), {1}, {1})), {2, 2});
    h = ops::avg_pool(ops::tanh(ops::conv(h, w(2), Value(), {1}, {1})), {2, 2});
    return std::vector<Value>{ops::linear(ops::flatten(h), w(3), w(4))};
  };
  return std::make_shared<Model>(forward, p);
}

std::shared_ptr<Model> batch_norm_cnn(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NamedParameter> p = {{"conv.weight", uniform_parameter(rng, {8, 3, 3, 3})},
                                   {"bn.weight", uniform_parameter(rng, {8})},
                                   {"bn.bias", uniform_parameter(rng, {8})},
                                   {"fc.weight", uniform_parameter(rng, {kModelClasses, 8 * 6 * 6})},
                                   {"fc.bias", uniform_parameter(rng, {kModelClasses})},
                                   {"bn.running_mean", constant_parameter({8}, 0.f)},
                                   {"bn.running_var", constant_parameter({8}, 1.f)},
                                   {"bn.num_batches_tracked", constant_parameter({}, 0.f)}};
  auto forward = [p](Graph& g, const std::vector<Value>& in) {
    auto w = [&](int k) { return g.add_parameter(p[k].second); };
    Value h = ops::conv(in[0], w(0), Value(), {1}, {1});
    h = ops::batch_norm(h, w(5), w(6), w(1), w(2), w(7), g.training(), 0.1, 1e-5);
    h = ops::max_pool(ops::relu(h), {2, 2});
    return std::vector<Value>{ops::linear(ops::flatten(h), w(3), w(4))};
  };
  return std::make_shared<Model>(forward, p);
}

std::shared_ptr<Model> bidirectional_lstm(uint64_t seed) {
  manual_seed(seed);
  nn::RecurrentOptions o;
  o.num_layers = 2;
  o.bidirectional = true;
  o.batch_first = true;
  auto lstm = std::make_shared<nn::LSTM>(kBiLstmInput[2], kRnnHidden, o);
  std::mt19937_64 rng(seed);
  auto fc_w = uniform_parameter(rng, {kModelClasses, kBiLstmInput[1] * 2 * kRnnHidden});
  auto fc_b = uniform_parameter(rng, {kModelClasses});
  std::vector<NamedParameter> p = lstm->named_parameters("lstm.");
  p.push_back({"fc.weight", fc_w});
  p.push_back({"fc.bias", fc_b});
  auto forward = [lstm, fc_w, fc_b](Graph& g, const std::vector<Value>& in) {
    const Value h = lstm->forward_all(in[0]).output;
    return std::vector<Value>{ops::linear(ops::flatten(h), g.add_parameter(fc_w), g.add_parameter(fc_b))};
  };
  return std::make_shared<Model>(forward, p);
}

std::shared_ptr<Model> variable_length_gru(uint64_t seed) {
  manual_seed(seed);
  nn::RecurrentOptions o;
  o.bidirectional = true;
  o.batch_first = true;
  auto gru = std::make_shared<nn::GRU>(kVarGruInput[2], kRnnHidden, o);
  std::mt19937_64 rng(seed);
  const int64_t H = kRnnHidden;
  auto fc_w = uniform_parameter(rng, {kModelClasses, kVarGruInput[1] * 2 * H + 2 * H});
  auto fc_b = uniform_parameter(rng, {kModelClasses});
  std::vector<NamedParameter> p = gru->named_parameters("gru.");
  p.push_back({"fc.weight", fc_w});
  p.push_back({"fc.bias", fc_b});
  auto forward = [gru, fc_w, fc_b, H](Graph& g, const std::vector<Value>& in) {
    const int64_t n = in[0].dim(0);
    const nn::RecurrentOutput r = gru->forward_all(in[0], Value(), Value(), in[1]);
    const Value h_fwd = ops::reshape(ops::slice(r.h_n, 0, 0, 1), {n, H});
    const Value h_rev = ops::reshape(ops::slice(r.h_n, 0, 1, 2), {n, H});
    const Value features = ops::concat({ops::flatten(r.output), h_fwd, h_rev}, 1);
    return std::vector<Value>{ops::linear(features, g.add_parameter(fc_w), g.add_parameter(fc_b))};
  };
  return std::make_shared<Model>(forward, p);
}

}  // namespace treadle::cuda::test

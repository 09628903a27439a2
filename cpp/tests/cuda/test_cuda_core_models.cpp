#include "test_cuda_core_models.hpp"

#include <cmath>
#include <vector>

#include "treadle/nn_conv.hpp"
#include "treadle/nn_layers.hpp"

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

}  // namespace treadle::cuda::test

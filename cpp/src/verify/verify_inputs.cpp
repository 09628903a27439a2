// Input makers of the verification catalog: random arrays shaped so that central differences
// (h = 1e-6) never straddle a kink or a branch change.
#include "verify/verify_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace treadle::verify_detail {

Rng::Rng(uint64_t seed, uint64_t stream) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(stream >> 32)};
  gen_.seed(seq);
}

Tensor filled(const Shape& shape, const std::function<double()>& value) {
  Tensor t(shape, DType::f64);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value();
  return t;
}

Tensor normal(Rng& r, const Shape& shape, double scale, double shift) {
  return filled(shape, [&] { return shift + scale * r.normal(); });
}

Tensor away(Rng& r, const Shape& shape, const std::vector<double>& kinks, double scale, double gap) {
  Tensor t = normal(r, shape, scale);
  double* p = t.data_as<double>();
  for (double k : kinks)
    for (int64_t i = 0; i < t.numel(); ++i)
      if (std::abs(p[i] - k) < gap) p[i] = k + (p[i] >= k ? 1.0 : -1.0) * (gap + 0.1 * r.uniform(0.0, 1.0));
  return t;
}

Tensor distinct(Rng& r, const Shape& shape, double step) {
  const int64_t n = shape_numel(shape);
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::shuffle(order.begin(), order.end(), r.engine());
  Tensor t(shape, DType::f64);
  for (int64_t i = 0; i < n; ++i) t.data_as<double>()[i] = (static_cast<double>(order[i]) - n / 2.0) * step;
  return t;
}

Tensor positive(Rng& r, const Shape& shape, double low, double high) {
  return filled(shape, [&] { return r.uniform(low, high); });
}

Tensor grid(Rng& r, const Shape& shape, int64_t low, int64_t high, double divisor, double offset) {
  return filled(shape, [&] { return static_cast<double>(r.integer(low, high)) / divisor + offset; });
}

Tensor indices(Rng& r, const Shape& shape, int64_t n) {
  Tensor t(shape, DType::i64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int64_t>()[i] = r.integer(0, n);
  return t;
}

Tensor int_values(const std::vector<int64_t>& values) {
  Tensor t({static_cast<int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data_as<int64_t>());
  return t;
}

Tensor map(Tensor t, const std::function<double(double)>& f) {
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f(p[i]);
  return t;
}

Tensor softmax_rows(Tensor t, bool log) {
  const int64_t cols = t.dim(-1), rows = t.numel() / cols;
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < rows; ++i) {
    double* row = p + i * cols;
    const double top = *std::max_element(row, row + cols);
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - top);
    for (int64_t j = 0; j < cols; ++j) row[j] = log ? row[j] - top - std::log(sum) : std::exp(row[j] - top) / sum;
  }
  return t;
}

std::function<Inputs(Rng&)> floats(const std::vector<Shape>& shapes, double scale, double shift) {
  return [=](Rng& r) {
    Inputs in;
    for (const Shape& s : shapes) in.push_back(normal(r, s, scale, shift));
    return in;
  };
}

}  // namespace treadle::verify_detail

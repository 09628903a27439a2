#pragma once
// Input makers of the verification catalog (each takes the case's generator). Floating inputs are
// float64, indices int64.
#include <functional>
#include <vector>

#include "verify/verify_catalog.hpp"

namespace treadle::verify_detail {

Tensor filled(const Shape& shape, const std::function<double()>& value);
Tensor normal(Rng& r, const Shape& shape, double scale = 1.0, double shift = 0.0);
// Normal values moved at least `gap` away from each kink (central differences stay on one side).
Tensor away(Rng& r, const Shape& shape, const std::vector<double>& kinks = {0.0}, double scale = 1.0,
            double gap = 0.05);
// A shuffled ramp: every value distinct and `step` apart, so no max-pool window has a tie.
Tensor distinct(Rng& r, const Shape& shape, double step = 0.05);
Tensor positive(Rng& r, const Shape& shape, double low = 0.5, double high = 1.5);  // uniform in [low, high)
// Integers in [low, high) divided by `divisor`, plus `offset`: values on a grid.
Tensor grid(Rng& r, const Shape& shape, int64_t low, int64_t high, double divisor = 1.0, double offset = 0.0);
Tensor indices(Rng& r, const Shape& shape, int64_t n);  // int64 in [0, n)
Tensor int_values(const std::vector<int64_t>& values);  // a 1-d int64 tensor
Tensor map(Tensor t, const std::function<double(double)>& f);  // in place, returned
Tensor softmax_rows(Tensor t, bool log);  // (log-)softmax over the last axis, in place
// A maker giving independent normal arrays of the given shapes.
std::function<Inputs(Rng&)> floats(const std::vector<Shape>& shapes, double scale = 1.0, double shift = 0.0);

}  // namespace treadle::verify_detail

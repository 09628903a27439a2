#pragma once
// The catalog treadle::verify checks (verify_cases.cpp): its case type and the input makers.
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "treadle/graph.hpp"
#include "treadle/tensor.hpp"

namespace treadle::verify_detail {

// A case's generator: std::mt19937_64 seeded from (seed, case number), so each case's inputs are
// independent of which other cases run.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);
  double normal() { return normal_(gen_); }
  double uniform(double low, double high) { return std::uniform_real_distribution<double>(low, high)(gen_); }
  int64_t integer(int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high - 1)(gen_); }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
  std::normal_distribution<double> normal_;
};

using Inputs = std::vector<Tensor>;  // float64, indices int64
using Ints = std::vector<int>;

struct Case {
  std::string op, name;                 // name: unique, op name first
  std::function<Inputs(Rng&)> make_inputs;
  Attrs attrs;
  Ints wrt;                             // inputs whose gradient is checked
  bool training = true;
  std::optional<Ints> grad_outputs;     // outputs given an upstream gradient; unset: output 0 only
};

// Every case, in a fixed order; built once.
const std::vector<Case>& catalog();
// Forward ops of the reference with no case, and why (no outputs run_op can show).
const std::vector<std::pair<std::string, std::string>>& uncovered_ops();

}  // namespace treadle::verify_detail

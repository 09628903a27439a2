#pragma once
// A loss is a description (kind, reduction, parameters) that records its op on a prediction and a
// target; the trainer compiles it into the training plan.
#include <string>

#include "treadle/graph.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

struct TREADLE_API Loss {
  std::string kind = "mse";  // mse, l1, huber, cross_entropy, bce_with_logits
  std::string reduction = "mean";  // mean or sum
  double delta = 1.0;              // huber

  Value apply(Value pred, Value target) const;
  // The dtype the target must have for a prediction of dtype `pred` (class indices are int64).
  DType target_dtype(DType pred) const;
  // Checks a target against a prediction of shape `pred_shape`: shape, dtype, and for class
  // indices the range [0, C). Throws ValueError/TypeError naming the problem.
  void check_target(const Shape& pred_shape, DType pred_dtype, const Tensor& target) const;
  std::string key() const;  // identifies the loss in a plan key
};

namespace loss {
TREADLE_API Loss mse(const std::string& reduction = "mean");
TREADLE_API Loss l1(const std::string& reduction = "mean");
TREADLE_API Loss huber(double delta = 1.0, const std::string& reduction = "mean");
TREADLE_API Loss cross_entropy(const std::string& reduction = "mean");
TREADLE_API Loss bce_with_logits(const std::string& reduction = "mean");
}  // namespace loss

}  // namespace treadle

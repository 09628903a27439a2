#pragma once
// A loss is a description (kind, reduction, parameters) that records its op on a prediction and a
// target; the trainer compiles it into the training plan. A custom loss is a function traced like a
// forward, over every output of the model and the target, once per signature.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "treadle/graph.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

// A custom loss: records graph ops on the model's outputs and the target and returns a 0-d value.
using LossFn = std::function<Value(const std::vector<Value>& outputs, Value target)>;
// One that also reads the model's inputs, e.g. to differentiate the outputs with respect to them
// (ops::grad: a physics-informed residual such as u_t - nu * u_xx).
using InputLossFn =
    std::function<Value(const std::vector<Value>& outputs, Value target, const std::vector<Value>& inputs)>;

struct TREADLE_API Loss {
  std::string kind = "mse";  // mse, l1, huber, cross_entropy, bce_with_logits, custom
  std::string reduction = "mean";  // mean or sum
  double delta = 1.0;              // huber
  InputLossFn fn;                  // custom: the traced loss
  std::string name;                // custom: what errors call it
  uint64_t fn_id = 0;              // custom: tells plans of different functions apart

  bool custom() const { return static_cast<bool>(fn); }
  // Records the loss on a model's outputs. A built-in loss takes a single-output model; a custom
  // loss sees every output (and the model's inputs) and must return a 0-d floating value.
  Value apply(const std::vector<Value>& outputs, Value target, const std::vector<Value>& inputs = {}) const;
  Value apply(Value pred, Value target) const;
  // The dtype the target must have for a prediction of dtype `pred` (class indices are int64).
  // A custom loss takes a target of any dtype: its ops check it when the plan is compiled.
  DType target_dtype(DType pred) const;
  bool accepts_target_dtype(DType target, DType pred) const { return custom() || target == target_dtype(pred); }
  // Checks a target against a prediction of shape `pred_shape`: shape, dtype, and for class
  // indices the range [0, C). Throws ValueError/TypeError naming the problem. A custom loss's
  // ops have checked shapes and dtypes when its plan was compiled.
  void check_target(const Shape& pred_shape, DType pred_dtype, const Tensor& target) const;
  std::string key() const;  // identifies the loss in a plan key
};

namespace loss {
TREADLE_API Loss mse(const std::string& reduction = "mean");
TREADLE_API Loss l1(const std::string& reduction = "mean");
TREADLE_API Loss huber(double delta = 1.0, const std::string& reduction = "mean");
TREADLE_API Loss cross_entropy(const std::string& reduction = "mean");
TREADLE_API Loss bce_with_logits(const std::string& reduction = "mean");
// `fn` is called while a plan is compiled, once per input signature; `name` appears in errors.
TREADLE_API Loss custom(LossFn fn, const std::string& name = "custom loss");
TREADLE_API Loss custom(InputLossFn fn, const std::string& name = "custom loss");
}  // namespace loss

}  // namespace treadle

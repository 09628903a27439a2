// Loss descriptions: what the trainer records on (prediction, target) and checks every target
// against before a step runs, so that a bad batch is rejected before any weight or gradient moves.
#include "treadle/loss.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>

#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

const char* const kKinds = "mse, l1, huber, cross_entropy, bce_with_logits (or a custom loss)";

void check_reduction(const char* fn, const std::string& reduction) {
  if (reduction != "mean" && reduction != "sum")
    throw_value_error(fn, ": reduction must be one of 'mean', 'sum'; got '", reduction, "'");
}

Loss make(const char* kind, const std::string& reduction, double delta = 1.0) {
  Loss l;
  l.kind = kind;
  l.reduction = reduction;
  l.delta = delta;
  return l;
}

std::string index_str(int64_t flat, const Shape& shape) {
  if (shape.size() == 1) return std::to_string(flat);
  Shape idx(shape.size());
  for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
    idx[k] = shape[k] > 0 ? flat % shape[k] : 0;
    flat = shape[k] > 0 ? flat / shape[k] : 0;
  }
  return shape_str(idx);
}

// Labels: int64, the logits' shape without the class dimension, every value in [0, C).
void check_labels(const Shape& logits, const Tensor& labels) {
  if (logits.empty()) throw_value_error("cross_entropy: logits must have at least 1 dimension (classes), got shape ()");
  if (labels.dtype() != DType::i64)
    throw_type_error("cross_entropy: labels must be int64 class indices, got ", dtype_name(labels.dtype()),
                     " (logits ", shape_str(logits), ", labels ", shape_str(labels.shape()), ")");
  const std::size_t cdim = logits.size() == 1 ? 0 : 1;
  Shape expected = logits;
  expected.erase(expected.begin() + static_cast<std::ptrdiff_t>(cdim));
  if (labels.shape() != expected)
    throw_value_error("cross_entropy: labels of shape ", shape_str(labels.shape()), " do not match logits of shape ",
                      shape_str(logits), "; expected labels of shape ", shape_str(expected));
  const int64_t classes = logits[cdim];
  // Labels in device memory cannot be read here: the device kernel gives a NaN loss for a label out
  // of range, which the device trainer turns into this error's equivalent before any update.
  if (!labels.is_cpu()) return;
  const Tensor dense = labels.is_contiguous() ? labels : labels.clone();
  const int64_t* l = dense.data_as<int64_t>();
  for (int64_t i = 0, n = dense.numel(); i < n; ++i)
    if (l[i] < 0 || l[i] >= classes)
      throw_value_error("cross_entropy: label ", l[i], " out of range [0, ", classes, ") at index ",
                        index_str(i, labels.shape()));
}

void check_same(const std::string& op, const Shape& pred_shape, DType pred_dtype, const Tensor& target) {
  if (target.dtype() != pred_dtype)
    throw_type_error(op, ": target dtype ", dtype_name(target.dtype()), " does not match prediction dtype ",
                     dtype_name(pred_dtype));
  if (target.shape() != pred_shape)
    throw_value_error(op, ": target shape ", shape_str(target.shape()), " does not match prediction shape ",
                      shape_str(pred_shape));
}

}  // namespace

Value Loss::apply(const std::vector<Value>& outputs, Value target, const std::vector<Value>& inputs) const {
  if (outputs.empty()) throw_value_error("loss: the model returned no outputs");
  if (!custom()) {
    if (outputs.size() > 1)
      throw_value_error(kind, ": the model returns ", outputs.size(), " outputs, and a built-in loss takes one; ",
                        "give the trainer a loss function over all of them (tl.loss.Custom(fn) / loss::custom)");
    return apply(outputs[0], target);
  }
  Value l = fn(outputs, target, inputs);
  if (!l.defined()) throw_value_error(name, ": returned no value (expected a 0-d symbol)");
  if (l.ndim() != 0)
    throw_value_error(name, ": must return a 0-d (scalar) symbol, got shape ", shape_str(l.shape()),
                      " (reduce it, e.g. with .mean() or .sum())");
  if (!is_floating(l.dtype())) throw_type_error(name, ": must return a floating value, got ", dtype_name(l.dtype()));
  return l;
}

Value Loss::apply(Value pred, Value target) const {
  if (custom()) return apply(std::vector<Value>{pred}, target);
  if (kind == "mse") return ops::mse_loss(pred, target, reduction);
  if (kind == "l1") return ops::l1_loss(pred, target, reduction);
  if (kind == "huber") return ops::huber_loss(pred, target, delta, reduction);
  if (kind == "cross_entropy") return ops::cross_entropy(pred, target, reduction);
  if (kind == "bce_with_logits") return ops::bce_with_logits(pred, target, reduction);
  throw_value_error("Loss::apply: unknown loss kind '", kind, "'; expected one of ", kKinds);
}

DType Loss::target_dtype(DType pred) const { return kind == "cross_entropy" ? DType::i64 : pred; }

void Loss::check_target(const Shape& pred_shape, DType pred_dtype, const Tensor& target) const {
  if (!target.defined()) throw_value_error("Loss::check_target: ", kind, " target is undefined");
  if (custom()) return;
  if (kind == "cross_entropy") return check_labels(pred_shape, target);
  if (kind == "mse") return check_same("mse_loss", pred_shape, pred_dtype, target);
  if (kind == "l1") return check_same("l1_loss", pred_shape, pred_dtype, target);
  if (kind == "huber") return check_same("huber_loss", pred_shape, pred_dtype, target);
  if (kind == "bce_with_logits") return check_same("bce_with_logits", pred_shape, pred_dtype, target);
  throw_value_error("Loss::check_target: unknown loss kind '", kind, "'; expected one of ", kKinds);
}

std::string Loss::key() const {
  if (custom()) return "custom#" + std::to_string(fn_id);
  std::string k = kind + "/" + reduction;
  if (kind == "huber") {
    char buf[40];
    std::snprintf(buf, sizeof buf, "/delta=%.17g", delta);  // exact: plans for different deltas differ
    k += buf;
  }
  return k;
}

namespace loss {

Loss mse(const std::string& reduction) {
  check_reduction("loss::mse", reduction);
  return make("mse", reduction);
}

Loss l1(const std::string& reduction) {
  check_reduction("loss::l1", reduction);
  return make("l1", reduction);
}

Loss huber(double delta, const std::string& reduction) {
  check_reduction("loss::huber", reduction);
  if (!(delta > 0.0) || !std::isfinite(delta))
    throw_value_error("loss::huber: delta must be positive and finite, got ", delta);
  return make("huber", reduction, delta);
}

Loss cross_entropy(const std::string& reduction) {
  check_reduction("loss::cross_entropy", reduction);
  return make("cross_entropy", reduction);
}

Loss bce_with_logits(const std::string& reduction) {
  check_reduction("loss::bce_with_logits", reduction);
  return make("bce_with_logits", reduction);
}

Loss custom(LossFn fn, const std::string& name) {
  if (!fn) throw_value_error("loss::custom: the loss function is empty");
  return custom(InputLossFn([fn = std::move(fn)](const std::vector<Value>& outputs, Value target,
                                                 const std::vector<Value>&) { return fn(outputs, target); }),
                name);
}

Loss custom(InputLossFn fn, const std::string& name) {
  if (!fn) throw_value_error("loss::custom: the loss function is empty");
  static std::atomic<uint64_t> next_id{1};
  Loss l = make("custom", "mean");
  l.fn = std::move(fn);
  l.name = name;
  l.fn_id = next_id.fetch_add(1, std::memory_order_relaxed);
  return l;
}

}  // namespace loss
}  // namespace treadle

// Loss ops: mse_loss, l1_loss, huber_loss, cross_entropy, bce_with_logits, each reducing to a 0-d
// scalar ("mean" or "sum", as torch.nn.functional), and their "<loss>_backward" ops that take
// (pred, target, grad_scalar) and produce d/dpred. Kernels: backends/eigen/loss_kernels.cpp.
#include <cmath>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

const AttrValue* find_attr(const Attrs& attrs, const std::string& name) {
  for (const auto& [key, value] : attrs.items())
    if (key == name) return &value;
  return nullptr;
}

// Defaults "reduction" to "mean" and rejects anything but "mean" or "sum".
void normalize_reduction(const std::string& op, Attrs& attrs) {
  const AttrValue* v = find_attr(attrs, "reduction");
  if (!v) {
    attrs.set("reduction", std::string("mean"));
    return;
  }
  const auto* s = std::get_if<std::string>(v);
  if (!s) throw_type_error(op, ": attribute 'reduction' must be a string ('mean' or 'sum')");
  if (*s != "mean" && *s != "sum")
    throw_value_error(op, ": reduction must be one of 'mean', 'sum'; got '", *s, "'");
}

// Defaults "delta" to 1.0, stores it as a double, and requires a positive finite value (as torch).
void normalize_delta(const std::string& op, Attrs& attrs) {
  const AttrValue* v = find_attr(attrs, "delta");
  double delta = 1.0;
  if (v) {
    if (const auto* d = std::get_if<double>(v)) {
      delta = *d;
    } else if (const auto* i = std::get_if<int64_t>(v)) {
      delta = static_cast<double>(*i);
    } else {
      throw_type_error(op, ": attribute 'delta' must be a number");
    }
  }
  if (!(delta > 0.0) || !std::isfinite(delta)) throw_value_error(op, ": delta must be positive and finite, got ", delta);
  attrs.set("delta", delta);
}

void check_prediction(const std::string& op, const TensorMeta& pred) {
  if (pred.dtype != DType::f32 && pred.dtype != DType::f64)
    throw_type_error(op, ": prediction must be float32 or float64, got ", dtype_name(pred.dtype));
}

// Regression-style pair: the target has the prediction's shape and dtype.
void check_same_target(const std::string& op, const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_prediction(op, in[0]);
  if (in[1].dtype != in[0].dtype)
    throw_type_error(op, ": target dtype ", dtype_name(in[1].dtype), " does not match prediction dtype ",
                     dtype_name(in[0].dtype));
  if (in[1].shape != in[0].shape)
    throw_value_error(op, ": target shape ", shape_str(in[1].shape), " does not match prediction shape ",
                      shape_str(in[0].shape));
  normalize_reduction(op, attrs);
}

void check_huber(const std::string& op, const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_same_target(op, in, attrs);
  normalize_delta(op, attrs);
}

// Class indices: logits (C) or (N, C, d1, ...), labels int64 of the logits' shape without the
// class dimension (dimension 1, or 0 for unbatched 1-d logits), as torch.nn.functional.cross_entropy.
void check_class_target(const std::string& op, const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_prediction(op, in[0]);
  const Shape& logits = in[0].shape;
  if (logits.empty()) throw_value_error(op, ": logits must have at least 1 dimension (classes), got shape ()");
  if (in[1].dtype != DType::i64)
    throw_type_error(op, ": labels must be int64 class indices, got ", dtype_name(in[1].dtype), " (logits ",
                     shape_str(logits), ", labels ", shape_str(in[1].shape), ")");
  Shape expected = logits;
  expected.erase(expected.begin() + (logits.size() == 1 ? 0 : 1));
  if (in[1].shape != expected)
    throw_value_error(op, ": labels of shape ", shape_str(in[1].shape), " do not match logits of shape ",
                      shape_str(logits), "; expected labels of shape ", shape_str(expected));
  normalize_reduction(op, attrs);
}

using CheckFn = void (*)(const std::string& op, const std::vector<TensorMeta>& in, Attrs& attrs);
// d/dtarget, given the node and a thunk that records (once) the d/dpred op; null where the
// target gets no gradient.
using DpredFn = std::function<Value()>;
using TargetGradFn = Value (*)(const GradContext& ctx, const DpredFn& dpred);

// Losses of (pred - target) only: d/dtarget = -d/dpred.
Value negated(const GradContext&, const DpredFn& dpred) { return ops::scale(dpred(), -1.0); }

// bce_with_logits: d/dtarget of (max(x,0) - x*t + log1p(exp(-|x|))) is -x, times the upstream scalar.
Value bce_target_grad(const GradContext& ctx, const DpredFn&) {
  const Value& x = ctx.inputs[0];
  double norm = 1.0;
  if (ctx.node.attrs.s("reduction") == "mean") {
    const int64_t n = shape_numel(x.shape());
    norm = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  }
  return ops::scale(ops::mul(x, ctx.grad_outputs[0]), -norm);
}

std::vector<Value> loss_grad(const GradContext& ctx, const std::string& backward_op, TargetGradFn target_grad) {
  std::vector<Value> grads(2);
  const Value& go = ctx.grad_outputs.at(0);
  const bool want_pred = ctx.needs_grad.at(0);
  const bool want_target = target_grad != nullptr && ctx.needs_grad.at(1);
  if (!go.defined() || (!want_pred && !want_target)) return grads;
  Value recorded;
  const DpredFn dpred = [&] {
    if (!recorded.defined())
      recorded = ctx.graph.apply1(backward_op, {ctx.inputs[0], ctx.inputs[1], go}, ctx.node.attrs);
    return recorded;
  };
  if (want_pred) grads[0] = dpred();
  if (want_target) grads[1] = target_grad(ctx, dpred);
  return grads;
}

// Registers `name` (pred, target) -> scalar and `name`_backward (pred, target, grad) -> d/dpred.
void add_loss(OpRegistry& r, const std::string& name, CheckFn check, TargetGradFn target_grad) {
  const std::string backward = name + "_backward";
  OpDef fwd;
  fwd.name = name;
  fwd.infer = [name, check](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(name, in, 2);
    check(name, in, attrs);
    return std::vector<TensorMeta>{TensorMeta{Shape{}, in[0].dtype}};
  };
  fwd.grad = [backward, target_grad](const GradContext& ctx) { return loss_grad(ctx, backward, target_grad); };
  r.add(std::move(fwd));

  OpDef bwd;
  bwd.name = backward;
  bwd.infer = [backward, check](const std::vector<TensorMeta>& in, Attrs& attrs) {
    check_num_inputs(backward, in, 3);
    check(backward, {in[0], in[1]}, attrs);
    if (!in[2].shape.empty() || in[2].dtype != in[0].dtype)
      throw_value_error(backward, ": expected a 0-d ", dtype_name(in[0].dtype), " upstream gradient, got shape ",
                        shape_str(in[2].shape), " of ", dtype_name(in[2].dtype));
    return std::vector<TensorMeta>{in[0]};
  };
  r.add(std::move(bwd));
}

Value apply_loss(const std::string& op, Value pred, Value target, Attrs attrs) {
  if (!pred.defined() || !target.defined()) throw_value_error(op, ": prediction and target must be defined values");
  if (&pred.graph() != &target.graph()) throw_value_error(op, ": prediction and target belong to different graphs");
  return pred.graph().apply1(op, {pred, target}, std::move(attrs));
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  add_loss(r, "mse_loss", &check_same_target, &negated);
  add_loss(r, "l1_loss", &check_same_target, &negated);
  add_loss(r, "huber_loss", &check_huber, &negated);
  add_loss(r, "cross_entropy", &check_class_target, nullptr);  // class indices: never a gradient
  add_loss(r, "bce_with_logits", &check_same_target, &bce_target_grad);
}

namespace ops {

Value mse_loss(Value pred, Value target, const std::string& reduction) {
  return apply_loss("mse_loss", pred, target, Attrs{{"reduction", reduction}});
}

Value l1_loss(Value pred, Value target, const std::string& reduction) {
  return apply_loss("l1_loss", pred, target, Attrs{{"reduction", reduction}});
}

Value huber_loss(Value pred, Value target, double delta, const std::string& reduction) {
  return apply_loss("huber_loss", pred, target, Attrs{{"reduction", reduction}, {"delta", delta}});
}

Value cross_entropy(Value logits, Value labels, const std::string& reduction) {
  return apply_loss("cross_entropy", logits, labels, Attrs{{"reduction", reduction}});
}

Value bce_with_logits(Value logits, Value target, const std::string& reduction) {
  return apply_loss("bce_with_logits", logits, target, Attrs{{"reduction", reduction}});
}

}  // namespace ops
}  // namespace treadle

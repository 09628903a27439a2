// Normalisation ops: layer_norm, rms_norm, group_norm, batch_norm (training statistics, eval with
// running statistics, and the in-place running-statistics update). Each forward also outputs the
// statistics it computed (mean, rstd = 1/sqrt(var + eps)) so its backward op does not recompute them.
#include <cmath>
#include <limits>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

Shape leading(const Shape& s, int k) { return Shape(s.begin(), s.end() - k); }
Shape trailing(const Shape& s, int k) { return Shape(s.end() - k, s.end()); }

void check_param(const std::string& op, const char* what, const TensorMeta& m, const Shape& want) {
  if (m.shape != want)
    throw_value_error(op, ": ", what, " must have shape ", shape_str(want), ", got ", shape_str(m.shape));
}

void check_eps(const std::string& op, const Attrs& attrs) {
  double eps = attrs.f("eps");
  if (!(eps >= 0.0)) throw_value_error(op, ": eps must be >= 0, got ", eps);
}

int normalized_ndim(const std::string& op, const Attrs& attrs, const Shape& x) {
  int64_t k = attrs.i("normalized_ndim");
  if (k < 1 || k > static_cast<int64_t>(x.size()))
    throw_value_error(op, ": normalized_ndim must be in [1, ", x.size(), "] for input of shape ", shape_str(x),
                      ", got ", k);
  return static_cast<int>(k);
}

// x of shape (N, C, *): the channel count, and at least 2 dimensions.
int64_t channels(const std::string& op, const Shape& x) {
  if (x.size() < 2) throw_value_error(op, ": expected input of shape (N, C, *), got ", shape_str(x));
  return x[1];
}

Value zeros_like_shape(Graph& g, const Shape& shape, DType dt) {
  return g.apply1("constant", {}, {{"shape", shape}, {"value", 0.0}, {"dtype", std::string(dtype_name(dt))}});
}

// Gradient that reaches x through the saved statistics of groups of L elements. `xg` is x reshaped
// so that statistics reshaped to `stat_shape` broadcast against it. With xhat = (x - mean) * rstd:
// d mean/dx = 1/L and d rstd/dx = -rstd^2 * xhat / L (mean undefined: RMS statistics, mean = 0).
Value stats_backward(Value xg, Value mean, Value rstd, Value dmean, Value drstd, const Shape& stat_shape, int64_t L) {
  Graph& g = xg.graph();
  const double inv_l = 1.0 / static_cast<double>(L);
  Value r = ops::reshape(rstd, stat_shape);
  Value total;
  if (drstd.defined()) {
    Value centred = mean.defined() ? ops::sub(xg, ops::reshape(mean, stat_shape)) : xg;
    Value xhat = ops::mul(centred, r);
    Value coef = ops::scale(ops::mul(ops::reshape(drstd, stat_shape), ops::mul(r, r)), -inv_l);
    total = ops::mul(xhat, coef);
  }
  if (dmean.defined()) {
    Value t = ops::scale(ops::reshape(dmean, stat_shape), inv_l);
    total = total.defined() ? ops::add(total, t) : ops::add(zeros_like_shape(g, xg.shape(), xg.dtype()), t);
  }
  return total;
}

Value add_opt(Value a, Value b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return ops::add(a, b);
}

// ---- layer_norm: inputs (x, [weight, [bias]]), attrs normalized_ndim, eps -> (y, mean, rstd)
std::vector<TensorMeta> infer_layer_norm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "layer_norm";
  if (in.empty() || in.size() > 3) throw_value_error(op, ": expected 1 to 3 inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  check_eps(op, attrs);
  const int k = normalized_ndim(op, attrs, in[0].shape);
  const Shape norm = trailing(in[0].shape, k);
  if (in.size() > 1) check_param(op, "weight", in[1], norm);
  if (in.size() > 2) check_param(op, "bias", in[2], norm);
  const Shape lead = leading(in[0].shape, k);
  return {in[0], {lead, in[0].dtype}, {lead, in[0].dtype}};
}

std::vector<Value> grad_layer_norm(const GradContext& c) {
  const int k = static_cast<int>(c.node.attrs.i("normalized_ndim"));
  Value x = c.inputs[0];
  std::vector<Value> g(c.inputs.size());
  Value dx;
  if (c.grad_outputs[0].defined()) {
    std::vector<Value> in{c.grad_outputs[0], x, c.outputs[1], c.outputs[2]};
    if (c.inputs.size() > 1) in.push_back(c.inputs[1]);
    auto outs = c.graph.apply("layer_norm_backward", in, {{"normalized_ndim", int64_t{k}}});
    dx = outs[0];
    for (std::size_t i = 1; i < c.inputs.size(); ++i) g[i] = outs[i];
  }
  if (c.needs_grad[0] && (c.grad_outputs[1].defined() || c.grad_outputs[2].defined())) {
    Shape stat = leading(x.shape(), k);
    stat.resize(x.shape().size(), 1);
    const int64_t L = shape_numel(trailing(x.shape(), k));
    dx = add_opt(dx, stats_backward(x, c.outputs[1], c.outputs[2], c.grad_outputs[1], c.grad_outputs[2], stat, L));
  }
  g[0] = dx;
  return g;
}

// Shared by the *_backward ops: inputs (dy, x, stats..., [weight]) with dy shaped like x.
void check_backward_inputs(const std::string& op, const std::vector<TensorMeta>& in, std::size_t num_stats) {
  if (in.size() != 2 + num_stats && in.size() != 3 + num_stats)
    throw_value_error(op, ": expected ", 2 + num_stats, " or ", 3 + num_stats, " inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  if (in[0].shape != in[1].shape)
    throw_value_error(op, ": gradient of shape ", shape_str(in[0].shape), " for input of shape ",
                      shape_str(in[1].shape));
}

std::vector<TensorMeta> infer_layer_norm_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "layer_norm_backward";
  check_backward_inputs(op, in, 2);
  const int k = normalized_ndim(op, attrs, in[1].shape);
  const Shape lead = leading(in[1].shape, k), norm = trailing(in[1].shape, k);
  check_param(op, "mean", in[2], lead);
  check_param(op, "rstd", in[3], lead);
  if (in.size() == 4) return {in[1]};
  check_param(op, "weight", in[4], norm);
  return {in[1], in[4], in[4]};  // dx, dweight, dbias
}

// ---- rms_norm: inputs (x, [weight]), attrs normalized_ndim, eps (< 0 or absent: the dtype's
// machine epsilon, torch's default) -> (y, rstd)
std::vector<TensorMeta> infer_rms_norm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "rms_norm";
  if (in.empty() || in.size() > 2) throw_value_error(op, ": expected 1 or 2 inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  if (!attrs.has("eps") || attrs.f("eps") < 0)
    attrs.set("eps", in[0].dtype == DType::f32 ? double{std::numeric_limits<float>::epsilon()}
                                               : std::numeric_limits<double>::epsilon());
  const int k = normalized_ndim(op, attrs, in[0].shape);
  if (in.size() > 1) check_param(op, "weight", in[1], trailing(in[0].shape, k));
  return {in[0], {leading(in[0].shape, k), in[0].dtype}};
}

std::vector<Value> grad_rms_norm(const GradContext& c) {
  const int k = static_cast<int>(c.node.attrs.i("normalized_ndim"));
  Value x = c.inputs[0];
  std::vector<Value> g(c.inputs.size());
  Value dx;
  if (c.grad_outputs[0].defined()) {
    std::vector<Value> in{c.grad_outputs[0], x, c.outputs[1]};
    if (c.inputs.size() > 1) in.push_back(c.inputs[1]);
    auto outs = c.graph.apply("rms_norm_backward", in, {{"normalized_ndim", int64_t{k}}});
    dx = outs[0];
    if (c.inputs.size() > 1) g[1] = outs[1];
  }
  if (c.needs_grad[0] && c.grad_outputs[1].defined()) {
    Shape stat = leading(x.shape(), k);
    stat.resize(x.shape().size(), 1);
    const int64_t L = shape_numel(trailing(x.shape(), k));
    dx = add_opt(dx, stats_backward(x, Value(), c.outputs[1], Value(), c.grad_outputs[1], stat, L));
  }
  g[0] = dx;
  return g;
}

std::vector<TensorMeta> infer_rms_norm_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "rms_norm_backward";
  check_backward_inputs(op, in, 1);
  const int k = normalized_ndim(op, attrs, in[1].shape);
  check_param(op, "rstd", in[2], leading(in[1].shape, k));
  if (in.size() == 3) return {in[1]};
  check_param(op, "weight", in[3], trailing(in[1].shape, k));
  return {in[1], in[3]};
}

// ---- group_norm: inputs (x (N, C, *), [weight (C), bias (C)]), attrs num_groups, eps
// -> (y, mean (N, G), rstd (N, G))
int64_t check_groups(const std::string& op, const Attrs& attrs, const Shape& x) {
  const int64_t c = channels(op, x), groups = attrs.i("num_groups");
  if (groups <= 0) throw_value_error(op, ": num_groups must be positive, got ", groups);
  if (c % groups != 0)
    throw_value_error(op, ": num_channels ", c, " is not divisible by num_groups ", groups, " (input of shape ",
                      shape_str(x), ")");
  return groups;
}

std::vector<TensorMeta> infer_group_norm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "group_norm";
  if (in.size() != 1 && in.size() != 3) throw_value_error(op, ": expected 1 or 3 inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  check_eps(op, attrs);
  const int64_t groups = check_groups(op, attrs, in[0].shape);
  if (in.size() == 3) {
    check_param(op, "weight", in[1], {in[0].shape[1]});
    check_param(op, "bias", in[2], {in[0].shape[1]});
  }
  const Shape stat{in[0].shape[0], groups};
  return {in[0], {stat, in[0].dtype}, {stat, in[0].dtype}};
}

std::vector<Value> grad_group_norm(const GradContext& c) {
  const int64_t groups = c.node.attrs.i("num_groups");
  Value x = c.inputs[0];
  std::vector<Value> g(c.inputs.size());
  Value dx;
  if (c.grad_outputs[0].defined()) {
    std::vector<Value> in{c.grad_outputs[0], x, c.outputs[1], c.outputs[2]};
    if (c.inputs.size() > 1) in.push_back(c.inputs[1]);
    auto outs = c.graph.apply("group_norm_backward", in, {{"num_groups", groups}});
    dx = outs[0];
    for (std::size_t i = 1; i < c.inputs.size(); ++i) g[i] = outs[i];
  }
  if (c.needs_grad[0] && (c.grad_outputs[1].defined() || c.grad_outputs[2].defined())) {
    const int64_t n = x.dim(0), L = shape_numel(x.shape()) / (n * groups);
    Value xg = ops::reshape(x, {n, groups, L});
    Value s = stats_backward(xg, c.outputs[1], c.outputs[2], c.grad_outputs[1], c.grad_outputs[2], {n, groups, 1}, L);
    dx = add_opt(dx, ops::reshape(s, x.shape()));
  }
  g[0] = dx;
  return g;
}

std::vector<TensorMeta> infer_group_norm_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "group_norm_backward";
  check_backward_inputs(op, in, 2);
  const int64_t groups = check_groups(op, attrs, in[1].shape);
  check_param(op, "mean", in[2], {in[1].shape[0], groups});
  check_param(op, "rstd", in[3], {in[1].shape[0], groups});
  if (in.size() == 4) return {in[1]};
  check_param(op, "weight", in[4], {in[1].shape[1]});
  return {in[1], in[4], in[4]};
}

// ---- batch_norm (batch statistics): inputs (x (N, C, *), [weight (C), bias (C)]), attrs eps
// -> (y, mean (C), rstd (C))
std::vector<TensorMeta> infer_batch_norm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "batch_norm";
  if (in.size() != 1 && in.size() != 3) throw_value_error(op, ": expected 1 or 3 inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  check_eps(op, attrs);
  const int64_t c = channels(op, in[0].shape);
  if (in.size() == 3) {
    check_param(op, "weight", in[1], {c});
    check_param(op, "bias", in[2], {c});
  }
  return {in[0], {{c}, in[0].dtype}, {{c}, in[0].dtype}};
}

std::vector<Value> grad_batch_norm(const GradContext& c) {
  Value x = c.inputs[0];
  std::vector<Value> g(c.inputs.size());
  Value dx;
  if (c.grad_outputs[0].defined()) {
    std::vector<Value> in{c.grad_outputs[0], x, c.outputs[1], c.outputs[2]};
    if (c.inputs.size() > 1) in.push_back(c.inputs[1]);
    auto outs = c.graph.apply("batch_norm_backward", in);
    dx = outs[0];
    for (std::size_t i = 1; i < c.inputs.size(); ++i) g[i] = outs[i];
  }
  if (c.needs_grad[0] && (c.grad_outputs[1].defined() || c.grad_outputs[2].defined())) {
    const int64_t n = x.dim(0), ch = x.dim(1), s = shape_numel(x.shape()) / (n * ch);
    Value xg = ops::reshape(x, {n, ch, s});
    Value d = stats_backward(xg, c.outputs[1], c.outputs[2], c.grad_outputs[1], c.grad_outputs[2], {ch, 1}, n * s);
    dx = add_opt(dx, ops::reshape(d, x.shape()));
  }
  g[0] = dx;
  return g;
}

std::vector<TensorMeta> infer_batch_norm_backward(const std::vector<TensorMeta>& in, Attrs&) {
  const std::string op = "batch_norm_backward";
  check_backward_inputs(op, in, 2);
  const int64_t c = channels(op, in[1].shape);
  check_param(op, "mean", in[2], {c});
  check_param(op, "rstd", in[3], {c});
  if (in.size() == 4) return {in[1]};
  check_param(op, "weight", in[4], {c});
  return {in[1], in[4], in[4]};
}

// ---- batch_norm_eval (running statistics): inputs (x, running_mean, running_var, [weight, bias]),
// attrs eps -> y. The running statistics are state, not differentiable inputs.
std::vector<TensorMeta> infer_batch_norm_eval(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "batch_norm_eval";
  if (in.size() != 3 && in.size() != 5) throw_value_error(op, ": expected 3 or 5 inputs, got ", in.size());
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  check_eps(op, attrs);
  const int64_t c = channels(op, in[0].shape);
  const char* names[] = {"", "running_mean", "running_var", "weight", "bias"};
  for (std::size_t i = 1; i < in.size(); ++i) check_param(op, names[i], in[i], {c});
  return {in[0]};
}

std::vector<Value> grad_batch_norm_eval(const GradContext& c) {
  std::vector<Value> in{c.grad_outputs[0], c.inputs[0], c.inputs[1], c.inputs[2]};
  if (c.inputs.size() > 3) in.push_back(c.inputs[3]);
  auto outs = c.graph.apply("batch_norm_eval_backward", in, {{"eps", c.node.attrs.f("eps")}});
  std::vector<Value> g(c.inputs.size());
  g[0] = outs[0];
  if (c.inputs.size() > 3) {
    g[3] = outs[1];
    g[4] = outs[2];
  }
  return g;
}

std::vector<TensorMeta> infer_batch_norm_eval_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "batch_norm_eval_backward";
  check_backward_inputs(op, in, 2);
  check_eps(op, attrs);
  const int64_t c = channels(op, in[1].shape);
  check_param(op, "running_mean", in[2], {c});
  check_param(op, "running_var", in[3], {c});
  if (in.size() == 4) return {in[1]};
  check_param(op, "weight", in[4], {c});
  return {in[1], in[4], in[4]};
}

// ---- batch_norm_update_stats: inputs (mean, rstd, running_mean, running_var, num_batches_tracked),
// attrs eps, count (values per channel in the batch), momentum (< 0: cumulative average, torch's
// momentum=None). No outputs: updates inputs 2..4 in place (training plans only).
// batch_norm_update_running: the same without num_batches_tracked (F.batch_norm's statistics), a
// momentum >= 0 required; updates inputs 2 and 3.
std::vector<TensorMeta> infer_update_stats(const std::vector<TensorMeta>& in, Attrs& attrs, bool tracked) {
  const std::string op = tracked ? "batch_norm_update_stats" : "batch_norm_update_running";
  check_num_inputs(op, in, tracked ? 5 : 4);
  if (!tracked && !(attrs.f("momentum") >= 0))
    throw_value_error(op, ": momentum must be >= 0 without num_batches_tracked, got ", attrs.f("momentum"));
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  check_eps(op, attrs);
  const Shape c = in[0].shape;
  if (c.size() != 1) throw_value_error(op, ": mean must be 1-D, got ", shape_str(c));
  const char* names[] = {"mean", "rstd", "running_mean", "running_var"};
  for (int i = 1; i < 4; ++i) check_param(op, names[i], in[i], c);
  if (tracked) check_param(op, "num_batches_tracked", in[4], {});
  const int64_t count = attrs.i("count");
  if (count < 2)
    throw_value_error(op, ": expected more than 1 value per channel when training, got ", count);
  attrs.f("momentum");
  return {};
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  r.add({.name = "layer_norm", .infer = infer_layer_norm, .grad = grad_layer_norm});
  r.add({.name = "layer_norm_backward",
         .infer = infer_layer_norm_backward,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs& a) {
           // double accumulators for dweight and dbias
           const int64_t n = shape_numel(trailing(in[1].shape, static_cast<int>(a.i("normalized_ndim"))));
           return 2 * sizeof(double) * static_cast<std::size_t>(n);
         }});
  r.add({.name = "rms_norm", .infer = infer_rms_norm, .grad = grad_rms_norm});
  r.add({.name = "rms_norm_backward",
         .infer = infer_rms_norm_backward,
         .workspace = [](const std::vector<TensorMeta>& in, const Attrs& a) {
           const int64_t n = shape_numel(trailing(in[1].shape, static_cast<int>(a.i("normalized_ndim"))));
           return sizeof(double) * static_cast<std::size_t>(n);
         }});
  r.add({.name = "group_norm", .infer = infer_group_norm, .grad = grad_group_norm});
  r.add({.name = "group_norm_backward", .infer = infer_group_norm_backward});
  r.add({.name = "batch_norm", .infer = infer_batch_norm, .grad = grad_batch_norm});
  r.add({.name = "batch_norm_backward", .infer = infer_batch_norm_backward});
  r.add({.name = "batch_norm_eval", .infer = infer_batch_norm_eval, .grad = grad_batch_norm_eval});
  r.add({.name = "batch_norm_eval_backward", .infer = infer_batch_norm_eval_backward});
  r.add({.name = "batch_norm_update_stats",
         .infer = [](const std::vector<TensorMeta>& in, Attrs& a) { return infer_update_stats(in, a, true); },
         .writes_inputs = {2, 3, 4}});
  r.add({.name = "batch_norm_update_running",
         .infer = [](const std::vector<TensorMeta>& in, Attrs& a) { return infer_update_stats(in, a, false); },
         .writes_inputs = {2, 3}});
}

namespace ops {

Value layer_norm(Value x, int normalized_ndim, Value weight, Value bias, double eps) {
  std::vector<Value> in{x};
  if (weight.defined()) in.push_back(weight);
  if (bias.defined()) {
    if (!weight.defined()) throw_value_error("layer_norm: a bias needs a weight");
    in.push_back(bias);
  }
  return x.graph().apply("layer_norm", in, {{"normalized_ndim", int64_t{normalized_ndim}}, {"eps", eps}}).at(0);
}

Value rms_norm(Value x, int normalized_ndim, Value weight, double eps) {
  std::vector<Value> in{x};
  if (weight.defined()) in.push_back(weight);
  return x.graph().apply("rms_norm", in, {{"normalized_ndim", int64_t{normalized_ndim}}, {"eps", eps}}).at(0);
}

// The kernels take weight and bias together: a lone one gets its neutral partner (weight 1, bias 0),
// which changes no value (torch's weight or bias None).
static void complete_affine(Value& weight, Value& bias) {
  if (weight.defined() && !bias.defined()) bias = full_like(weight, 0.0);
  if (bias.defined() && !weight.defined()) weight = full_like(bias, 1.0);
}

Value group_norm(Value x, int64_t num_groups, Value weight, Value bias, double eps) {
  std::vector<Value> in{x};
  complete_affine(weight, bias);
  if (weight.defined()) in.insert(in.end(), {weight, bias});
  return x.graph().apply("group_norm", in, {{"num_groups", num_groups}, {"eps", eps}}).at(0);
}

Value batch_norm(Value x, Value running_mean, Value running_var, Value weight, Value bias,
                 Value num_batches_tracked, bool training, double momentum, double eps) {
  Graph& g = x.graph();
  complete_affine(weight, bias);
  const bool tracked = running_mean.defined() && running_var.defined();
  if (!training) {
    if (!tracked) throw_value_error("batch_norm: eval mode needs running_mean and running_var");
    std::vector<Value> in{x, running_mean, running_var};
    if (weight.defined()) in.insert(in.end(), {weight, bias});
    return g.apply1("batch_norm_eval", in, {{"eps", eps}});
  }
  std::vector<Value> in{x};
  if (weight.defined()) in.insert(in.end(), {weight, bias});
  std::vector<Value> outs = g.apply("batch_norm", in, {{"eps", eps}});
  if (tracked) {
    const int64_t count = shape_numel(x.shape()) / x.dim(1);
    const Attrs attrs{{"eps", eps}, {"count", count}, {"momentum", momentum}};
    if (num_batches_tracked.defined())
      g.apply("batch_norm_update_stats", {outs[1], outs[2], running_mean, running_var, num_batches_tracked}, attrs);
    else if (momentum >= 0)
      g.apply("batch_norm_update_running", {outs[1], outs[2], running_mean, running_var}, attrs);
    else
      throw_value_error("batch_norm: the cumulative average (momentum None) needs num_batches_tracked");
  }
  return outs[0];
}

}  // namespace ops
}  // namespace treadle

// Elementwise arithmetic (add, sub, mul, div) with numpy broadcasting, the scaled product of three
// same-shape values (mul3), the reduction that undoes broadcasting, and a constant fill (used to seed
// a loss's backward pass).
#include <limits>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {

Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b) {
  std::size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (std::size_t i = 0; i < nd; ++i) {
    int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    if (da != db && da != 1 && db != 1)
      throw_value_error(op, ": shapes ", shape_str(a), " and ", shape_str(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

std::vector<TensorMeta> infer_binary(const std::string& op, const std::vector<TensorMeta>& in) {
  check_num_inputs(op, in, 2);
  check_floating(op, in[0]);
  check_same_dtype(op, in);
  return {{broadcast_shapes(op, in[0].shape, in[1].shape), in[0].dtype}};
}

Value reduce_to(Value g, const Shape& shape) { return g.shape() == shape ? g : ops::sum_to(g, shape); }

std::vector<Value> grad_add(const GradContext& c) {
  Value dy = c.grad_outputs[0];
  return {c.needs_grad[0] ? reduce_to(dy, c.inputs[0].shape()) : Value(),
          c.needs_grad[1] ? reduce_to(dy, c.inputs[1].shape()) : Value()};
}

std::vector<Value> grad_sub(const GradContext& c) {
  Value dy = c.grad_outputs[0];
  return {c.needs_grad[0] ? reduce_to(dy, c.inputs[0].shape()) : Value(),
          c.needs_grad[1] ? reduce_to(ops::scale(dy, -1.0), c.inputs[1].shape()) : Value()};
}

std::vector<Value> grad_mul(const GradContext& c) {
  Value dy = c.grad_outputs[0], a = c.inputs[0], b = c.inputs[1];
  return {c.needs_grad[0] ? reduce_to(ops::mul(dy, b), a.shape()) : Value(),
          c.needs_grad[1] ? reduce_to(ops::mul(dy, a), b.shape()) : Value()};
}

// d(a/b) = da / b - db * (a/b) / b; y = a/b is the node's output.
std::vector<Value> grad_div(const GradContext& c) {
  Value dy = c.grad_outputs[0], a = c.inputs[0], b = c.inputs[1], y = c.outputs.at(0);
  return {c.needs_grad[0] ? reduce_to(ops::div(dy, b), a.shape()) : Value(),
          c.needs_grad[1] ? reduce_to(ops::scale(ops::div(ops::mul(dy, y), b), -1.0), b.shape()) : Value()};
}

std::vector<TensorMeta> infer_scale(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("scale", in, 1);
  check_floating("scale", in[0]);
  attrs.f("alpha");
  return {in[0]};
}

// mul3 = alpha * a * b * c over one shape: the curvature terms of second derivatives (tanh's
// -2 y dy g) in one memory pass instead of three. Its gradient is mul3 again, of the other two
// inputs and dy, so derivatives of any order stay one op per input.
std::vector<TensorMeta> infer_mul3(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("mul3", in, 3);
  check_floating("mul3", in[0]);
  check_same_dtype("mul3", in);
  for (int i = 1; i < 3; ++i)
    if (in[i].shape != in[0].shape)
      throw_value_error("mul3: input ", i, " has shape ", shape_str(in[i].shape), ", input 0 ", shape_str(in[0].shape),
                        " (mul3 does not broadcast)");
  attrs.f("alpha");
  return {in[0]};
}

std::vector<Value> grad_mul3(const GradContext& c) {
  const Value& dy = c.grad_outputs[0];
  const double alpha = c.node.attrs.f("alpha");
  std::vector<Value> g(3);
  for (int i = 0; i < 3; ++i)
    if (c.needs_grad[i]) g[i] = ops::mul3(c.inputs[(i + 1) % 3], c.inputs[(i + 2) % 3], dy, alpha);
  return g;
}

std::vector<TensorMeta> infer_sum_to(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("sum_to", in, 1);
  check_floating("sum_to", in[0]);
  const Shape& target = attrs.ints("shape");
  if (broadcast_shapes("sum_to", in[0].shape, target) != in[0].shape)
    throw_value_error("sum_to: ", shape_str(in[0].shape), " does not broadcast from ", shape_str(target));
  return {{target, in[0].dtype}};
}

std::vector<TensorMeta> infer_constant(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("constant", in, 0);
  attrs.f("value");
  return {{attrs.ints("shape"), dtype_from_name(attrs.s("dtype"))}};
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  r.add({.name = "add", .infer = [](const auto& in, Attrs&) { return infer_binary("add", in); },
         .grad = grad_add,
         .pointwise = true});
  r.add({.name = "sub", .infer = [](const auto& in, Attrs&) { return infer_binary("sub", in); },
         .grad = grad_sub,
         .pointwise = true});
  r.add({.name = "mul", .infer = [](const auto& in, Attrs&) { return infer_binary("mul", in); },
         .grad = grad_mul,
         .pointwise = true});
  r.add({.name = "div", .infer = [](const auto& in, Attrs&) { return infer_binary("div", in); },
         .grad = grad_div,
         .pointwise = true});
  r.add({.name = "scale",
         .infer = infer_scale,
         .grad = [](const GradContext& c) {
           return std::vector<Value>{ops::scale(c.grad_outputs[0], c.node.attrs.f("alpha"))};
         },
         .pointwise = true});
  r.add({.name = "mul3", .infer = infer_mul3, .grad = grad_mul3, .pointwise = true});
  r.add({.name = "sum_to",
         .infer = infer_sum_to,
         .grad = [](const GradContext& c) {
           // d(sum_to)/dx broadcasts the gradient back: dy * ones(x.shape) via a multiply by a constant.
           Value ones = c.graph.apply1("constant", {}, {{"shape", c.inputs[0].shape()}, {"value", 1.0},
                                                        {"dtype", std::string(dtype_name(c.inputs[0].dtype()))}});
           return std::vector<Value>{ops::mul(ones, c.grad_outputs[0])};
         }});
  r.add({.name = "constant", .infer = infer_constant});
}

namespace ops {
Value add(Value a, Value b) { return a.graph().apply1("add", {a, b}); }
Value sub(Value a, Value b) { return a.graph().apply1("sub", {a, b}); }
Value mul(Value a, Value b) { return a.graph().apply1("mul", {a, b}); }
Value div(Value a, Value b) { return a.graph().apply1("div", {a, b}); }
Value scale(Value a, double alpha) { return a.graph().apply1("scale", {a}, {{"alpha", alpha}}); }
Value mul3(Value a, Value b, Value c, double alpha) {
  return a.graph().apply1("mul3", {a, b, c}, {{"alpha", alpha}});
}
Value scalar_like(Value like, double value) {
  return like.graph().apply1("constant", {}, {{"shape", Shape{}}, {"value", value},
                                              {"dtype", std::string(dtype_name(like.dtype()))}});
}
Value full_like(Value like, double value) {
  return like.graph().apply1("constant", {}, {{"shape", like.shape()}, {"value", value},
                                              {"dtype", std::string(dtype_name(like.dtype()))}});
}
Value sum_to(Value a, const Shape& shape) {
  if (a.shape() == shape) return a;
  return a.graph().apply1("sum_to", {a}, {{"shape", shape}});
}
Value sum(Value a, int axis, bool keepdim) {
  const int nd = a.ndim();
  const int ax = normalize_axis("sum", axis, nd);
  Shape kept = a.shape();
  kept[ax] = 1;
  Value s = sum_to(a, kept);
  if (keepdim) return s;
  Shape dropped = a.shape();
  dropped.erase(dropped.begin() + ax);
  return reshape(s, dropped);
}
Value mean(Value a, int axis, bool keepdim) {
  const int ax = normalize_axis("mean", axis, a.ndim());
  return scale(sum(a, ax, keepdim), 1.0 / static_cast<double>(a.dim(ax)));
}

// The dims to reduce, normalised, each once; empty means all of them.
static std::vector<bool> reduced_dims(const char* op, const Value& a, const std::vector<int64_t>& dims) {
  std::vector<bool> reduce(a.ndim(), dims.empty());
  for (int64_t d : dims) {
    const int ax = normalize_axis(op, d, a.ndim());
    if (reduce[ax]) throw_value_error(op, ": dim ", ax, " appears more than once in ", shape_str(dims));
    reduce[ax] = true;
  }
  return reduce;
}

Value sum(Value a, const std::vector<int64_t>& dims, bool keepdim) {
  const std::vector<bool> reduce = reduced_dims("sum", a, dims);
  Shape kept = a.shape(), dropped;
  for (int d = 0; d < a.ndim(); ++d) {
    if (reduce[d]) kept[d] = 1;
    else dropped.push_back(kept[d]);
  }
  Value s = sum_to(a, kept);
  return keepdim || kept == dropped ? s : reshape(s, dropped);
}

Value mean(Value a, const std::vector<int64_t>& dims, bool keepdim) {
  const std::vector<bool> reduce = reduced_dims("mean", a, dims);
  int64_t count = 1;
  for (int d = 0; d < a.ndim(); ++d)
    if (reduce[d]) count *= a.dim(d);
  // As torch, the mean over no elements is NaN (0 * inf would hide it as 0).
  const double inv = count == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / static_cast<double>(count);
  return scale(sum(a, dims, keepdim), inv);
}
}  // namespace ops

}  // namespace treadle

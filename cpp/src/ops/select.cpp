// Selection: where(cond, a, b), the comparisons that make its masks (gt, lt, ge, le, eq, ne), and
// max_unpool (max pooling's indices written back into planes, gradient a gather), gather along a
// dimension with its scatter-add gradient (torch.gather / take_along_dim), the piece
// NLL and class-weighted losses are built from.
//
// treadle has no bool dtype: a comparison gives 1 or 0 in its operands' dtype, and where() takes
// any nonzero condition as true. Comparisons carry no gradient (as in torch). where and gather are
// linear in their data inputs, so their gradients are again where / gather ops and differentiate
// any number of times.
#include <algorithm>
#include <iterator>

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

const char* const kComparisons[] = {"gt", "lt", "ge", "le", "eq", "ne"};

std::vector<TensorMeta> infer_comparison(const std::string& op, const std::vector<TensorMeta>& in) {
  check_num_inputs(op, in, 2);
  if (in[0].dtype != in[1].dtype)
    throw_type_error(op, ": operands have dtypes ", dtype_name(in[0].dtype), " and ", dtype_name(in[1].dtype));
  if (in[0].dtype != DType::f32 && in[0].dtype != DType::f64 && in[0].dtype != DType::i64)
    throw_type_error(op, ": comparisons take float32, float64 or int64 operands, got ", dtype_name(in[0].dtype));
  return {{broadcast_shapes(op, in[0].shape, in[1].shape), in[0].dtype}};
}

// (a, b, cond) -> cond ? a : b, every operand already of the output's shape (ops::where broadcasts).
std::vector<TensorMeta> infer_where(const std::vector<TensorMeta>& in, Attrs&) {
  check_num_inputs("where", in, 3);
  if (!is_floating(in[0].dtype) && in[0].dtype != DType::i64)
    throw_type_error("where: the branches must be floating or int64, got ", dtype_name(in[0].dtype));
  if (in[1].dtype != in[0].dtype)
    throw_type_error("where: the two branches have dtypes ", dtype_name(in[0].dtype), " and ", dtype_name(in[1].dtype));
  if (in[2].dtype != DType::f32 && in[2].dtype != DType::f64 && in[2].dtype != DType::i64)
    throw_type_error("where: the condition must be float32, float64 or int64 (a comparison's 0/1), got ",
                     dtype_name(in[2].dtype));
  if (in[1].shape != in[0].shape || in[2].shape != in[0].shape)
    throw_value_error("where: operands of shapes ", shape_str(in[2].shape), ", ", shape_str(in[0].shape), ", ",
                      shape_str(in[1].shape), " (ops::where broadcasts them first)");
  return {same_as(in[0])};
}

std::vector<Value> grad_where(const GradContext& c) {
  std::vector<Value> g(3);
  const Value& gout = c.grad_outputs.at(0);
  if (!gout.defined()) return g;
  const Value zeros = ops::full_like(gout, 0.0);
  if (c.needs_grad[0]) g[0] = c.graph.apply1("where", {gout, zeros, c.inputs[2]});
  if (c.needs_grad[1]) g[1] = c.graph.apply1("where", {zeros, gout, c.inputs[2]});
  return g;
}

// (indices) -> indices.shape + (num_classes,) of 0/1 in `dtype`; torch.nn.functional.one_hot with the
// float dtype a model computes in. Integer input: nothing to differentiate.
std::vector<TensorMeta> infer_one_hot(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("one_hot", in, 1);
  if (in[0].dtype != DType::i64 && in[0].dtype != DType::i32)
    throw_type_error("one_hot: class values must be int64 (or int32), got ", dtype_name(in[0].dtype));
  const int64_t classes = attrs.i("num_classes");
  if (classes <= 0) throw_value_error("one_hot: num_classes must be positive, got ", classes);
  const DType dtype = dtype_from_name(attrs.s("dtype"));
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error("one_hot: dtype must be float32 or float64, got ", attrs.s("dtype"));
  Shape shape = in[0].shape;
  shape.push_back(classes);
  return {{shape, dtype}};
}

void check_index_dtype(const std::string& op, const TensorMeta& index) {
  if (index.dtype != DType::i64 && index.dtype != DType::i32)
    throw_type_error(op, ": index must be int64 (or int32), got ", dtype_name(index.dtype));
}

// gather(input, index): out[..., i, ...] = input[..., index[..., i, ...], ...] along attribute dim.
// index has input's rank, and every other dimension of index is at most input's (torch's rule).
std::vector<TensorMeta> infer_gather(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("gather", in, 2);
  check_floating("gather", in[0]);
  check_index_dtype("gather", in[1]);
  const int nd = static_cast<int>(in[0].shape.size());
  if (nd < 1 || nd > 8) throw_value_error("gather: input must have 1 to 8 dims, got ", nd);
  if (static_cast<int>(in[1].shape.size()) != nd)
    throw_value_error("gather: index has ", in[1].shape.size(), " dims, input ", nd, " (they must match)");
  const int dim = normalize_axis("gather", attrs.i("dim"), nd);
  attrs.set("dim", int64_t{dim});
  for (int d = 0; d < nd; ++d)
    if (d != dim && in[1].shape[d] > in[0].shape[d])
      throw_value_error("gather: index of shape ", shape_str(in[1].shape), " is larger than input of shape ",
                        shape_str(in[0].shape), " in dim ", d);
  return {{in[1].shape, in[0].dtype}};
}

// gather_backward(dy, index) with attribute shape: zeros of `shape` with dy added at the gathered places.
std::vector<TensorMeta> infer_gather_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("gather_backward", in, 2);
  check_floating("gather_backward", in[0]);
  check_index_dtype("gather_backward", in[1]);
  if (in[0].shape != in[1].shape)
    throw_value_error("gather_backward: gradient of shape ", shape_str(in[0].shape), " for index of shape ",
                      shape_str(in[1].shape));
  const Shape shape = attrs.ints("shape");
  normalize_axis("gather_backward", attrs.i("dim"), static_cast<int>(shape.size()));
  return {{shape, in[0].dtype}};
}

std::vector<Value> grad_gather(const GradContext& c) {
  if (!c.needs_grad.at(0) || !c.grad_outputs.at(0).defined()) return {Value(), Value()};
  return {c.graph.apply1("gather_backward", {c.grad_outputs[0], c.inputs[1]},
                         {{"dim", c.node.attrs.i("dim")}, {"shape", c.inputs[0].shape()}}),
          Value()};
}

std::vector<Value> grad_gather_backward(const GradContext& c) {
  if (!c.needs_grad.at(0) || !c.grad_outputs.at(0).defined()) return {Value(), Value()};
  return {c.graph.apply1("gather", {c.grad_outputs[0], c.inputs[1]}, {{"dim", c.node.attrs.i("dim")}}), Value()};
}

// max_unpool(x (N, C, L_in), indices (N, C, L_in)) with attribute length: zeros of (N, C, length) with
// out[n, c, indices[n, c, i]] = x[n, c, i] (torch's max_unpool on flattened planes: a repeated index,
// which only overlapping pooling windows give and which then carries one input element's value, is
// written, not added). The gradient gathers dy at the indices.
std::vector<TensorMeta> infer_max_unpool(const std::vector<TensorMeta>& in, Attrs& attrs) {
  check_num_inputs("max_unpool", in, 2);
  check_floating("max_unpool", in[0]);
  check_index_dtype("max_unpool", in[1]);
  if (in[0].shape.size() != 3 || in[1].shape != in[0].shape)
    throw_value_error("max_unpool: expected input and indices of one shape (N, C, L), got ", shape_str(in[0].shape),
                      " and ", shape_str(in[1].shape));
  const int64_t length = attrs.i("length");
  if (length <= 0) throw_value_error("max_unpool: output length must be positive, got ", length);
  return {{{in[0].shape[0], in[0].shape[1], length}, in[0].dtype}};
}

std::vector<Value> grad_max_unpool(const GradContext& c) {
  if (!c.needs_grad.at(0) || !c.grad_outputs.at(0).defined()) return {Value(), Value()};
  return {c.graph.apply1("gather", {c.grad_outputs[0], c.inputs[1]}, {{"dim", int64_t{2}}}), Value()};
}

Value constant_of(Graph& g, const Shape& shape, double value, DType dtype) {
  return g.apply1("constant", {}, {{"shape", shape}, {"value", value}, {"dtype", std::string(dtype_name(dtype))}});
}

// v broadcast to `shape` exactly: a constant (a number given to where) is made at that shape; any
// other floating value is multiplied by ones, which changes no value (-0 and NaN included).
Value expand(const Value& v, const Shape& shape) {
  if (v.shape() == shape) return v;
  Graph& g = v.graph();
  const int producer = g.info(v.id()).producer;
  if (producer >= 0 && g.nodes()[producer].op == OpRegistry::instance().id("constant"))
    return constant_of(g, shape, g.nodes()[producer].attrs.f("value"), v.dtype());
  if (!is_floating(v.dtype()))
    throw_value_error("where: an integer operand of shape ", shape_str(v.shape()), " must have the result's shape ",
                      shape_str(shape));
  return ops::mul(constant_of(g, shape, 1.0, v.dtype()), v);
}

}  // namespace

void register_select_ops(OpRegistry& r) {
  for (const char* name : kComparisons) {
    const std::string op = name;
    r.add({.name = op,
           .infer = [op](const std::vector<TensorMeta>& in, Attrs&) { return infer_comparison(op, in); },
           .grad = [](const GradContext&) { return std::vector<Value>(2); }});  // piecewise constant
  }
  r.add({.name = "where", .infer = infer_where, .grad = grad_where});
  r.add({.name = "one_hot", .infer = infer_one_hot,
         .grad = [](const GradContext&) { return std::vector<Value>(1); }});  // integer input
  r.add({.name = "gather", .infer = infer_gather, .grad = grad_gather});
  r.add({.name = "gather_backward", .infer = infer_gather_backward, .grad = grad_gather_backward});
  r.add({.name = "max_unpool", .infer = infer_max_unpool, .grad = grad_max_unpool});
}

namespace ops {

Value compare(const std::string& op, Value a, Value b) {
  if (std::find(std::begin(kComparisons), std::end(kComparisons), op) == std::end(kComparisons))
    throw_value_error("compare: '", op, "' is not a comparison (gt, lt, ge, le, eq, ne)");
  if (!a.defined() || !b.defined()) throw_value_error(op, ": an operand is an undefined value");
  return a.graph().apply1(op, {a, b});
}

Value one_hot(Value indices, int64_t num_classes, DType dtype) {
  if (!indices.defined()) throw_value_error("one_hot: indices is an undefined value");
  return indices.graph().apply1("one_hot", {indices}, {{"num_classes", num_classes},
                                                       {"dtype", std::string(dtype_name(dtype))}});
}

Value where(Value cond, Value a, Value b) {
  if (!cond.defined() || !a.defined() || !b.defined()) throw_value_error("where: an operand is an undefined value");
  const Shape out = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a.shape()), b.shape());
  return a.graph().apply1("where", {expand(a, out), expand(b, out), expand(cond, out)});
}

Value gather(Value input, int dim, Value index) {
  if (!input.defined() || !index.defined()) throw_value_error("gather: an operand is an undefined value");
  return input.graph().apply1("gather", {input, index}, {{"dim", int64_t{dim}}});
}

Value max_unpool(Value x, Value indices, const Shape& output_size) {
  if (!x.defined() || !indices.defined()) throw_value_error("max_unpool: an operand is an undefined value");
  const Shape& xs = x.shape();
  const int nd = static_cast<int>(output_size.size());
  if (nd < 1 || nd > 3 || static_cast<int>(xs.size()) != nd + 2)
    throw_value_error("max_unpool: expected input (N, C, *spatial) with ", nd, " spatial dims for output size ",
                      shape_str(output_size), ", got ", shape_str(xs));
  if (indices.shape() != xs)
    throw_value_error("max_unpool: indices of shape ", shape_str(indices.shape()), " do not match input of shape ",
                      shape_str(xs));
  int64_t in_len = 1, out_len = 1;
  for (int i = 0; i < nd; ++i) in_len *= xs[2 + i], out_len *= output_size[i];
  const Shape flat{xs[0], xs[1], in_len};
  Value y = x.graph().apply1("max_unpool", {reshape(x, flat), reshape(indices, flat)}, {{"length", out_len}});
  Shape out{xs[0], xs[1]};
  out.insert(out.end(), output_size.begin(), output_size.end());
  return reshape(y, out);
}

}  // namespace ops
}  // namespace treadle

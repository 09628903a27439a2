// Embedding: rows of a weight table picked by integer indices of any shape. The gradient is a
// scatter-add of the output gradient into the table's rows (none into the padding row).
#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_layers.hpp"

namespace treadle {
namespace {

void check_indices(const std::string& op, const TensorMeta& m) {
  if (!is_integer(m.dtype))
    throw_type_error(op, ": indices must be int64 or int32, got ", dtype_name(m.dtype));
}

// padding_idx: absent or negative means none; otherwise a row of the table.
void check_padding(const std::string& op, const Attrs& attrs, int64_t num) {
  const int64_t p = attrs.i_or("padding_idx", -1);
  if (p >= num) throw_value_error(op, ": padding_idx ", p, " out of range for ", num, " embeddings");
}

// inputs (weight (num, dim), indices) -> indices.shape + (dim,)
std::vector<TensorMeta> infer_embedding(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "embedding";
  check_num_inputs(op, in, 2);
  check_floating(op, in[0]);
  check_indices(op, in[1]);
  if (in[0].shape.size() != 2)
    throw_value_error(op, ": weight must be 2-D (num_embeddings, embedding_dim), got ", shape_str(in[0].shape));
  check_padding(op, attrs, in[0].shape[0]);
  Shape out = in[1].shape;
  out.push_back(in[0].shape[1]);
  return {{out, in[0].dtype}};
}

std::vector<Value> grad_embedding(const GradContext& c) {
  std::vector<Value> g(2);
  if (c.needs_grad[0])
    g[0] = c.graph.apply1("embedding_backward", {c.grad_outputs[0], c.inputs[1]},
                          {{"num_embeddings", c.inputs[0].dim(0)},
                           {"padding_idx", c.node.attrs.i_or("padding_idx", -1)}});
  return g;  // indices have no gradient
}

// inputs (dy (indices.shape + (dim,)), indices), attrs num_embeddings, padding_idx -> (num, dim)
std::vector<TensorMeta> infer_embedding_backward(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "embedding_backward";
  check_num_inputs(op, in, 2);
  check_floating(op, in[0]);
  check_indices(op, in[1]);
  const int64_t num = attrs.i("num_embeddings");
  if (num <= 0) throw_value_error(op, ": num_embeddings must be positive, got ", num);
  check_padding(op, attrs, num);
  Shape expect = in[1].shape;
  if (in[0].shape.empty()) throw_value_error(op, ": gradient must have at least 1 dimension");
  expect.push_back(in[0].shape.back());
  if (in[0].shape != expect)
    throw_value_error(op, ": gradient of shape ", shape_str(in[0].shape), " does not match indices of shape ",
                      shape_str(in[1].shape));
  return {{{num, in[0].shape.back()}, in[0].dtype}};
}

}  // namespace

void register_embedding_ops(OpRegistry& r) {
  r.add({.name = "embedding", .infer = infer_embedding, .grad = grad_embedding});
  r.add({.name = "embedding_backward", .infer = infer_embedding_backward});
}

namespace ops {
Value embedding(Value indices, Value weight, int64_t padding_idx) {
  Attrs attrs;
  if (padding_idx >= 0) attrs.set("padding_idx", padding_idx);
  return weight.graph().apply1("embedding", {weight, indices}, attrs);
}
}  // namespace ops

}  // namespace treadle

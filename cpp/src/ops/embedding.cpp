// Embedding: rows of a weight table picked by integer indices of any shape. The gradient is a
// scatter-add of the output gradient into the table's rows (none into the padding row; divided by
// each index's count with scale_grad_by_freq). max_norm: embedding_renorm rescales the looked-up rows
// in place (training plans), row_renorm the returned rows (prediction plans).
#include <cmath>

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
                           {"padding_idx", c.node.attrs.i_or("padding_idx", -1)},
                           {"scale_grad_by_freq", c.node.attrs.i_or("scale_grad_by_freq", 0)}});
  return g;  // indices have no gradient
}

void check_max_norm(const std::string& op, const Attrs& attrs) {
  const double max_norm = attrs.f("max_norm"), p = attrs.f_or("norm_type", 2.0);
  if (!std::isfinite(max_norm) || max_norm < 0) throw_value_error(op, ": max_norm must be finite and >= 0, got ", max_norm);
  if (!(p > 0)) throw_value_error(op, ": norm_type must be positive (or inf), got ", p);
}

// inputs (weight (num, dim), indices), attrs max_norm, norm_type; no outputs: weight's looked-up rows
// are rescaled in place (training plans only).
std::vector<TensorMeta> infer_embedding_renorm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "embedding_renorm";
  check_num_inputs(op, in, 2);
  check_floating(op, in[0]);
  check_indices(op, in[1]);
  if (in[0].shape.size() != 2)
    throw_value_error(op, ": weight must be 2-D (num_embeddings, embedding_dim), got ", shape_str(in[0].shape));
  check_max_norm(op, attrs);
  return {};
}

// inputs (rows (..., dim)), attrs max_norm, norm_type -> each row scaled down to max_norm where its
// norm exceeds it (the values a renormed table gives, without writing it; no gradient: prediction plans).
std::vector<TensorMeta> infer_row_renorm(const std::vector<TensorMeta>& in, Attrs& attrs) {
  const std::string op = "row_renorm";
  check_num_inputs(op, in, 1);
  check_floating(op, in[0]);
  if (in[0].shape.empty()) throw_value_error(op, ": expected rows (..., dim), got a scalar");
  check_max_norm(op, attrs);
  return {in[0]};
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
  r.add({.name = "embedding_backward",
         .infer = infer_embedding_backward,
         .workspace = [](const std::vector<TensorMeta>&, const Attrs& a) -> std::size_t {
           // per-row counts of the indices, for scale_grad_by_freq
           return a.i_or("scale_grad_by_freq", 0) ? sizeof(int64_t) * static_cast<std::size_t>(a.i("num_embeddings")) : 0;
         }});
  r.add({.name = "embedding_renorm", .infer = infer_embedding_renorm, .writes_inputs = {0}});
  r.add({.name = "row_renorm", .infer = infer_row_renorm});
}

namespace ops {
Value embedding(Value indices, Value weight, int64_t padding_idx) { return embedding(indices, weight, padding_idx, {}); }

Value embedding(Value indices, Value weight, int64_t padding_idx, const EmbeddingOptions& options) {
  Graph& g = weight.graph();
  Attrs attrs;
  if (padding_idx >= 0) attrs.set("padding_idx", padding_idx);
  if (options.scale_grad_by_freq) attrs.set("scale_grad_by_freq", int64_t{1});
  if (!options.max_norm) return g.apply1("embedding", {weight, indices}, attrs);
  const Attrs renorm{{"max_norm", *options.max_norm}, {"norm_type", options.norm_type}};
  if (!g.training()) return g.apply1("row_renorm", {g.apply1("embedding", {weight, indices}, attrs)}, renorm);
  g.apply("embedding_renorm", {weight, indices}, renorm);
  return g.apply1("embedding", {weight, indices}, attrs);
}
}  // namespace ops

}  // namespace treadle

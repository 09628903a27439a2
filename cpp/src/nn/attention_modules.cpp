#include <cmath>

#include "treadle/error.hpp"
#include "treadle/nn_attention.hpp"
#include "treadle/ops.hpp"

namespace treadle::nn {

namespace {
Tensor uniform(Shape shape, DType dtype, double bound) {
  Tensor t(std::move(shape), DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = init_uniform(-bound, bound);
  return dtype == DType::f64 ? t : t.to(dtype);
}
}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                       bool batch_first, DType dtype)
    : embed_dim_(embed_dim), num_heads_(num_heads), dropout_(dropout), batch_first_(batch_first) {
  if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads != 0)
    throw_value_error("MultiheadAttention: embed_dim (", embed_dim, ") must be a positive multiple of num_heads (",
                      num_heads, ")");
  if (!(dropout >= 0.0 && dropout <= 1.0))
    throw_value_error("MultiheadAttention: dropout must be in [0, 1], got ", dropout);
  // torch: xavier_uniform_ on in_proj_weight, zero biases, out_proj.weight as a default Linear.
  const int64_t qkv_dim = shape_numel({3, embed_dim});  // checked: an absurd embed_dim raises
  const double xavier = std::sqrt(6.0 / (4.0 * static_cast<double>(embed_dim)));
  in_proj_weight_ = std::make_shared<Parameter>(uniform({qkv_dim, embed_dim}, dtype, xavier));
  register_parameter("in_proj_weight", in_proj_weight_);
  if (bias) {
    in_proj_bias_ = std::make_shared<Parameter>(Tensor({qkv_dim}, dtype));
    register_parameter("in_proj_bias", in_proj_bias_);
  }
  out_proj_ = std::make_shared<Linear>(embed_dim, embed_dim, bias, dtype);
  for (auto& [name, p] : out_proj_->named_parameters())
    if (name == "bias") p->rebind(Tensor({embed_dim}, dtype));
  register_module("out_proj", out_proj_);
}

Value MultiheadAttention::split_heads(Value x) const {
  const int64_t n = x.dim(0), len = x.dim(1), d = embed_dim_ / num_heads_;
  Value h = ops::permute(ops::reshape(x, {n, len, num_heads_, d}), {0, 2, 1, 3});
  return ops::reshape(h, {n * num_heads_, len, d});
}

std::array<Value, 3> MultiheadAttention::project(Value query, Value key, Value value) {
  Graph& g = query.graph();
  const int64_t e = embed_dim_;
  Value w = g.add_parameter(in_proj_weight_);
  Value b = in_proj_bias_ ? g.add_parameter(in_proj_bias_) : Value();
  if (query.id() == key.id() && key.id() == value.id()) {  // self-attention: one GEMM for Q, K and V
    Value qkv = ops::linear(query, w, b);
    return {split_heads(ops::slice(qkv, 2, 0, e)), split_heads(ops::slice(qkv, 2, e, 2 * e)),
            split_heads(ops::slice(qkv, 2, 2 * e, 3 * e))};
  }
  std::array<Value, 3> out;
  Value inputs[3] = {query, key, value};
  for (int i = 0; i < 3; ++i) {
    Value wi = ops::slice(w, 0, i * e, (i + 1) * e);
    Value bi = b.defined() ? ops::slice(b, 0, i * e, (i + 1) * e) : Value();
    out[i] = split_heads(ops::linear(inputs[i], wi, bi));
  }
  return out;
}

std::pair<Value, Value> MultiheadAttention::attend(Value query, Value key, Value value, const AttentionMasks& masks,
                                                   bool need_weights) {
  // Checked here so that a wrong dtype names this module and the input, not an inner op.
  const DType dtype = in_proj_weight_->value().dtype();
  struct Named {
    const char* name;
    Value value;
    bool mask;
  };
  const Named inputs[] = {{"query", query, false},
                          {"key", key, false},
                          {"value", value, false},
                          {"attn_mask", masks.attn_mask, true},
                          {"key_padding_mask", masks.key_padding_mask, true}};
  for (const Named& in : inputs)
    if (in.value.defined() && in.value.dtype() != dtype)
      throw_type_error("MultiheadAttention: ", in.name, " must be ", dtype_name(dtype),
                       in.mask ? " (an additive mask: 0 keeps a position, -inf drops it)" : "", ", got ",
                       dtype_name(in.value.dtype()));
  for (Value v : {query, key, value})
    if (v.ndim() != 3 || v.dim(2) != embed_dim_)
      throw_value_error("MultiheadAttention: expected inputs of shape ", batch_first_ ? "(N, L, " : "(L, N, ",
                        embed_dim_, "), got ", shape_str(v.shape()));
  if (!batch_first_) {
    const bool same_kv = key.id() == value.id(), self = query.id() == key.id() && same_kv;
    query = ops::permute(query, {1, 0, 2});
    key = self ? query : ops::permute(key, {1, 0, 2});
    value = same_kv ? key : ops::permute(value, {1, 0, 2});
  }
  const int64_t n = query.dim(0), l = query.dim(1), s = key.dim(1), h = num_heads_;
  if (key.dim(0) != n || value.dim(0) != n || value.dim(1) != s)
    throw_value_error("MultiheadAttention: query, key and value batch/length mismatch: ", shape_str(query.shape()),
                      ", ", shape_str(key.shape()), ", ", shape_str(value.shape()));
  auto [q, k, v] = project(query, key, value);
  const double scale = 1.0 / std::sqrt(static_cast<double>(embed_dim_ / h));
  Value scores = ops::scale(ops::bmm(q, k, false, true), scale);  // (N*H, L, S)
  if (masks.attn_mask.defined()) {
    const Shape m = masks.attn_mask.shape();
    if (m != Shape{l, s} && m != Shape{n * h, l, s})
      throw_value_error("MultiheadAttention: attn_mask must have shape (", l, ", ", s, ") or (", n * h, ", ", l, ", ",
                        s, "), got ", shape_str(m));
    scores = ops::add(scores, masks.attn_mask);
  }
  if (masks.is_causal) scores = ops::add(scores, ops::causal_mask(query.graph(), l, s, scores.dtype()));
  if (masks.key_padding_mask.defined()) {
    if (masks.key_padding_mask.shape() != Shape{n, s})
      throw_value_error("MultiheadAttention: key_padding_mask must have shape (", n, ", ", s, "), got ",
                        shape_str(masks.key_padding_mask.shape()));
    Value s4 = ops::reshape(scores, {n, h, l, s});
    scores = ops::reshape(ops::add(s4, ops::reshape(masks.key_padding_mask, {n, 1, 1, s})), {n * h, l, s});
  }
  Value p = ops::softmax(scores, -1);
  Value weights;
  if (need_weights)
    weights = ops::reshape(ops::scale(ops::sum_to(ops::reshape(p, {n, h, l, s}), {n, 1, l, s}), 1.0 / h), {n, l, s});
  p = ops::dropout(p, dropout_);
  Value o = ops::bmm(p, v);  // (N*H, L, D)
  o = ops::reshape(ops::permute(ops::reshape(o, {n, h, l, embed_dim_ / h}), {0, 2, 1, 3}), {n, l, embed_dim_});
  o = out_proj_->forward(o);
  if (!batch_first_) o = ops::permute(o, {1, 0, 2});
  return {o, weights};
}

}  // namespace treadle::nn

#include "treadle/nn_layers.hpp"

namespace treadle::nn {

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                 double dropout, const std::string& activation, double layer_norm_eps,
                                                 bool batch_first, bool norm_first, bool bias, DType dtype)
    : dropout_(dropout), activation_(activation), norm_first_(norm_first) {
  if (activation != "relu" && activation != "gelu")
    throw_value_error("TransformerEncoderLayer: activation must be 'relu' or 'gelu', got '", activation, "'");
  if (dim_feedforward <= 0)
    throw_value_error("TransformerEncoderLayer: dim_feedforward must be positive, got ", dim_feedforward);
  // Registration order gives torch's state_dict order.
  self_attn_ = std::make_shared<MultiheadAttention>(d_model, nhead, dropout, bias, batch_first, dtype);
  register_module("self_attn", self_attn_);
  linear1_ = std::make_shared<Linear>(d_model, dim_feedforward, bias, dtype);
  register_module("linear1", linear1_);
  linear2_ = std::make_shared<Linear>(dim_feedforward, d_model, bias, dtype);
  register_module("linear2", linear2_);
  norm1_ = std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, bias, dtype);
  register_module("norm1", norm1_);
  norm2_ = std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, bias, dtype);
  register_module("norm2", norm2_);
}

Value TransformerEncoderLayer::self_attention_block(Value x, const AttentionMasks& masks) {
  return ops::dropout(self_attn_->attend(x, x, x, masks).first, dropout_);
}

Value TransformerEncoderLayer::feed_forward_block(Value x) {
  Value h = linear1_->forward(x);
  h = activation_ == "relu" ? ops::relu(h) : ops::gelu(h, false);
  return ops::dropout(linear2_->forward(ops::dropout(h, dropout_)), dropout_);
}

Value TransformerEncoderLayer::encode(Value src, const AttentionMasks& masks) {
  Value x = src;
  if (norm_first_) {
    x = ops::add(x, self_attention_block(norm1_->forward(x), masks));
    return ops::add(x, feed_forward_block(norm2_->forward(x)));
  }
  x = norm1_->forward(ops::add(x, self_attention_block(x, masks)));
  return norm2_->forward(ops::add(x, feed_forward_block(x)));
}

}  // namespace treadle::nn

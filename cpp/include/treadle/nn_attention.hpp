#pragma once
// Multi-head attention, composed from linear, bmm, permute and softmax ops (so its gradients are
// theirs). Names, layouts and initialisation follow torch.nn.MultiheadAttention: in_proj_weight
// (3E, E), in_proj_bias (3E), out_proj.weight (E, E), out_proj.bias (E).
#include <array>
#include <memory>
#include <utility>

#include "treadle/module.hpp"

namespace treadle::nn {

struct AttentionMasks {
  Value key_padding_mask;  // (N, S), additive (0 keeps, -inf drops); undefined: none
  Value attn_mask;         // (L, S) or (N*H, L, S), additive; undefined: none
  bool is_causal = false;  // adds -inf above the diagonal of (L, S)
};

class TREADLE_API MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false, DType dtype = DType::f32);
  Value forward(Value x) override { return attend(x, x, x).first; }
  // Returns (output, attention weights averaged over heads (N, L, S) when need_weights, else undefined).
  std::pair<Value, Value> attend(Value query, Value key, Value value, const AttentionMasks& masks = {},
                                 bool need_weights = false);
  std::string type_name() const override { return "MultiheadAttention"; }
  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }

 private:
  // Q, K, V as (N*H, len, D) head-major batches.
  std::array<Value, 3> project(Value query, Value key, Value value);
  Value split_heads(Value x) const;  // (N, len, E) -> (N*H, len, D)
  int64_t embed_dim_, num_heads_;
  double dropout_;
  bool batch_first_;
  std::shared_ptr<Parameter> in_proj_weight_, in_proj_bias_;
  std::shared_ptr<Module> out_proj_;
};

// torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a residual
// connection and LayerNorm, post-norm (norm_first=false, torch's default) or pre-norm.
class TREADLE_API TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1,
                          const std::string& activation = "relu", double layer_norm_eps = 1e-5,
                          bool batch_first = false, bool norm_first = false, bool bias = true,
                          DType dtype = DType::f32);
  Value forward(Value x) override { return encode(x, {}); }
  Value encode(Value src, const AttentionMasks& masks);
  std::string type_name() const override { return "TransformerEncoderLayer"; }

 private:
  Value self_attention_block(Value x, const AttentionMasks& masks);
  Value feed_forward_block(Value x);
  double dropout_;
  std::string activation_;
  bool norm_first_;
  std::shared_ptr<MultiheadAttention> self_attn_;
  std::shared_ptr<Module> linear1_, linear2_, norm1_, norm2_;
};

}  // namespace treadle::nn

#pragma once
// Normalisation, embedding and small layers: LayerNorm, GroupNorm, RMSNorm, BatchNorm1d/2d/3d,
// Embedding, Unflatten, Upsample, Identity and OutputTransform. Arguments, parameter names and
// default initialisation follow torch.nn, so a model ports by renaming the import.
//
// State that is not trained (BatchNorm's running_mean / running_var / num_batches_tracked, the
// OutputTransform's scale and shift) is held as parameters with requires_grad=false: it lives in the
// model's flat buffer and its state_dict under torch's names, receives no gradient, and only training
// plans write it (through an op that declares the write, see OpDef::writes_inputs).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "treadle/module.hpp"

namespace treadle {
namespace ops {

// Normalises over the last `normalized_ndim` dimensions; weight and bias (may be undefined) have
// that trailing shape.
TREADLE_API Value layer_norm(Value x, int normalized_ndim, Value weight, Value bias, double eps = 1e-5);
// x * rsqrt(mean(x^2) + eps) * weight over the last `normalized_ndim` dimensions; eps < 0 means
// the machine epsilon of x's dtype (torch's default eps=None).
TREADLE_API Value rms_norm(Value x, int normalized_ndim, Value weight, double eps = -1.0);
// x of shape (N, C, *), statistics per sample and group of C / num_groups channels. In group_norm and
// batch_norm a weight without a bias (or a bias without a weight) is fine: the missing one is neutral.
TREADLE_API Value group_norm(Value x, int64_t num_groups, Value weight, Value bias, double eps = 1e-5);
// x of shape (N, C, *). Training: batch statistics, and when running statistics are given they are
// updated in place (unbiased variance, momentum < 0: cumulative average as torch's momentum=None).
// Eval (training=false): the running statistics.
TREADLE_API Value batch_norm(Value x, Value running_mean, Value running_var, Value weight, Value bias,
                             Value num_batches_tracked, bool training, double momentum = 0.1, double eps = 1e-5);
// Rows of weight (num_embeddings, dim) picked by integer indices of any shape -> indices.shape + (dim,).
// No gradient reaches the row padding_idx (< 0: none). Out-of-range indices raise ValueError.
TREADLE_API Value embedding(Value indices, Value weight, int64_t padding_idx = -1);
// torch's options beyond the lookup. max_norm: each looked-up row whose norm_type-norm (p > 0, or
// infinity) exceeds it is scaled to max_norm / (norm + 1e-7); in a training plan the rows of weight
// are rescaled in place before the lookup, as torch's embedding_renorm_ does (the gradient is the
// lookup's), while a plan that serves predictions scales the rows it returns and leaves weight as it
// is (such plans never write parameters). scale_grad_by_freq: each index's gradient is divided by
// how often it occurs in the batch.
struct EmbeddingOptions {
  std::optional<double> max_norm;
  double norm_type = 2.0;
  bool scale_grad_by_freq = false;
};
TREADLE_API Value embedding(Value indices, Value weight, int64_t padding_idx, const EmbeddingOptions& options);
// 4-D NCHW resampling to `size` (H_out, W_out), mode "nearest" or "bilinear". scale_h/scale_w are the
// user's scale factors (0: derived from the sizes), used for the coordinate mapping as torch does.
TREADLE_API Value upsample(Value x, const Shape& size, const std::string& mode, bool align_corners = false,
                           double scale_h = 0.0, double scale_w = 0.0);

// Per-output activation of OutputTransform (the op's "activations" attribute holds these codes).
enum class OutputActivation : int64_t { identity = 0, softplus = 1, sigmoid = 2, tanh = 3 };
TREADLE_API OutputActivation output_activation_from_name(const std::string& name);
// y[..., j] = act_j(x[..., j]) * scale[j] + shift[j]; scale, shift of shape (D,) or (1,), activations
// of length D or 1 (broadcast over the last dimension D of x).
TREADLE_API Value output_transform(Value x, Value scale, Value shift, const std::vector<OutputActivation>& activations);

}  // namespace ops

namespace nn {

class TREADLE_API LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "LayerNorm"; }

 private:
  Shape shape_;
  double eps_;
  std::shared_ptr<Parameter> weight_, bias_;
};

class TREADLE_API RMSNorm : public Module {
 public:
  // eps: nullopt -> machine epsilon of the input's dtype (torch.finfo(x.dtype).eps).
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true,
                   DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "RMSNorm"; }

 private:
  Shape shape_;
  std::optional<double> eps_;
  std::shared_ptr<Parameter> weight_;
};

class TREADLE_API GroupNorm : public Module {
 public:
  // bias=false (torch's keyword): an affine weight without a bias.
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true, DType dtype = DType::f32,
            bool bias = true);
  Value forward(Value x) override;
  std::string type_name() const override { return "GroupNorm"; }

 private:
  int64_t groups_, channels_;
  double eps_;
  std::shared_ptr<Parameter> weight_, bias_;
};

// BatchNorm1d (spatial_dims = 1: input (N, C) or (N, C, L)), BatchNorm2d (2: (N, C, H, W)),
// BatchNorm3d (3: (N, C, D, H, W)). Training plans use batch statistics and update the running
// statistics; inference and evaluation use the running statistics (torch's train() / eval()).
class TREADLE_API BatchNorm : public Module {
 public:
  BatchNorm(int spatial_dims, int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
            bool affine = true, bool track_running_stats = true, DType dtype = DType::f32, bool bias = true);
  Value forward(Value x) override;
  std::string type_name() const override { return "BatchNorm" + std::to_string(dims_) + "d"; }

 private:
  void check_input(const Shape& x) const;
  int dims_;
  int64_t features_;
  double eps_;
  std::optional<double> momentum_;
  std::shared_ptr<Parameter> weight_, bias_, running_mean_, running_var_, num_batches_;
};

class TREADLE_API Embedding : public Module {
 public:
  // Weight ~ N(0, 1) with the padding row zeroed, as torch. padding_idx may be negative (from the end).
  // options: torch's max_norm, norm_type and scale_grad_by_freq (ops::EmbeddingOptions).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt,
            DType dtype = DType::f32, ops::EmbeddingOptions options = {});
  Value forward(Value indices) override;
  std::string type_name() const override { return "Embedding"; }
  int64_t padding_idx() const { return padding_; }
  const ops::EmbeddingOptions& options() const { return options_; }

 private:
  int64_t num_, dim_, padding_ = -1;
  ops::EmbeddingOptions options_;
  std::shared_ptr<Parameter> weight_;
};

class TREADLE_API Unflatten : public Module {
 public:
  Unflatten(int dim, Shape sizes);  // one entry of sizes may be -1
  Value forward(Value x) override;
  std::string type_name() const override { return "Unflatten"; }

 private:
  int dim_;
  Shape sizes_;
};

class TREADLE_API Upsample : public Module {
 public:
  // Exactly one of size (1 or 2 entries) and scale_factor (1 or 2 entries) is non-empty.
  // align_corners only for mode "bilinear" (default false). recompute_scale_factor: map coordinates
  // with the ratio of the sizes instead of the given scale factor (torch's option of that name).
  Upsample(Shape size, std::vector<double> scale_factor, std::string mode = "nearest",
           std::optional<bool> align_corners = std::nullopt, bool recompute_scale_factor = false);
  Value forward(Value x) override;
  std::string type_name() const override { return "Upsample"; }

 private:
  Shape size_;
  std::vector<double> scale_;
  std::string mode_;
  bool align_corners_, recompute_;
};

class TREADLE_API Identity : public Module {
 public:
  Value forward(Value x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

// Maps network outputs onto bounded targets: y_j = act_j(x_j) * scale_j + shift_j per output j,
// act_j in {identity, softplus, sigmoid, tanh}. scale, shift and activations each have length D
// (outputs) or 1 (same for all). scale and shift are fixed (requires_grad=false): they are saved
// in the state_dict ("scale", "shift") but never trained.
class TREADLE_API OutputTransform : public Module {
 public:
  OutputTransform(std::vector<double> scale, std::vector<double> shift, std::vector<std::string> activations,
                  DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "OutputTransform"; }
  int64_t num_outputs() const { return size_; }

 private:
  int64_t size_;
  std::vector<ops::OutputActivation> acts_;
  std::shared_ptr<Parameter> scale_, shift_;
};

}  // namespace nn
}  // namespace treadle

// Modules for the normalisation, embedding and small layers (cpp/include/treadle/nn_layers.hpp).
// Each forward validates the input against the layer's configuration first, so a mistake names the
// layer and both shapes, then records the op.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "treadle/error.hpp"
#include "treadle/nn_layers.hpp"

namespace treadle::nn {
namespace {

void check_dtype(const char* layer, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error(layer, ": dtype must be float32 or float64, got ", dtype_name(dtype));
}

std::shared_ptr<Parameter> filled(Shape shape, DType dtype, double value, bool requires_grad = true) {
  Tensor t(std::move(shape), DType::f64);
  std::fill(t.data_as<double>(), t.data_as<double>() + t.numel(), value);
  return std::make_shared<Parameter>(dtype == DType::f64 ? t : t.to(dtype), requires_grad);
}

void check_normalized_shape(const char* layer, const Shape& shape) {
  if (shape.empty()) throw_value_error(layer, ": normalized_shape must not be empty");
  for (int64_t d : shape)
    if (d <= 0) throw_value_error(layer, ": normalized_shape must be positive, got ", shape_str(shape));
}

// "(*, 4, 5)" for error messages.
std::string trailing_str(const Shape& shape) {
  std::string s = "(*";
  for (int64_t d : shape) s += ", " + std::to_string(d);
  return s + ")";
}

void check_trailing(const char* layer, const Value& x, const Shape& want) {
  const Shape xs = x.shape();
  const auto k = static_cast<std::ptrdiff_t>(want.size());
  const bool ok = xs.size() >= want.size() && Shape(xs.end() - k, xs.end()) == want;
  if (!ok) throw_value_error(layer, ": expected input of shape ", trailing_str(want), ", got ", shape_str(xs));
}

Value param(Value x, const std::shared_ptr<Parameter>& p) { return p ? x.graph().add_parameter(p) : Value(); }

}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias, DType dtype)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_normalized_shape("LayerNorm", shape_);
  check_dtype("LayerNorm", dtype);
  if (!(eps >= 0)) throw_value_error("LayerNorm: eps must be >= 0, got ", eps);
  if (elementwise_affine) {
    weight_ = filled(shape_, dtype, 1.0);
    register_parameter("weight", weight_);
    if (bias) {
      bias_ = filled(shape_, dtype, 0.0);
      register_parameter("bias", bias_);
    }
  }
}

Value LayerNorm::forward(Value x) {
  check_trailing("LayerNorm", x, shape_);
  return ops::layer_norm(x, static_cast<int>(shape_.size()), param(x, weight_), param(x, bias_), eps_);
}

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine, DType dtype)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_normalized_shape("RMSNorm", shape_);
  check_dtype("RMSNorm", dtype);
  if (eps && !(*eps >= 0)) throw_value_error("RMSNorm: eps must be >= 0, got ", *eps);
  if (elementwise_affine) {
    weight_ = filled(shape_, dtype, 1.0);
    register_parameter("weight", weight_);
  }
}

Value RMSNorm::forward(Value x) {
  check_trailing("RMSNorm", x, shape_);
  return ops::rms_norm(x, static_cast<int>(shape_.size()), param(x, weight_), eps_.value_or(-1.0));
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, double eps, bool affine, DType dtype, bool bias)
    : groups_(num_groups), channels_(num_channels), eps_(eps) {
  check_dtype("GroupNorm", dtype);
  if (num_groups <= 0 || num_channels <= 0)
    throw_value_error("GroupNorm: num_groups and num_channels must be positive, got (", num_groups, ", ", num_channels,
                      ")");
  if (num_channels % num_groups != 0)
    throw_value_error("GroupNorm: num_channels ", num_channels, " must be divisible by num_groups ", num_groups);
  if (!(eps >= 0)) throw_value_error("GroupNorm: eps must be >= 0, got ", eps);
  if (affine) {
    weight_ = filled({num_channels}, dtype, 1.0);
    register_parameter("weight", weight_);
    if (bias) {
      bias_ = filled({num_channels}, dtype, 0.0);
      register_parameter("bias", bias_);
    }
  }
}


Value GroupNorm::forward(Value x) {
  if (x.ndim() < 2 || x.dim(1) != channels_)
    throw_value_error("GroupNorm: expected input of shape (N, ", channels_, ", *), got ", shape_str(x.shape()));
  return ops::group_norm(x, groups_, param(x, weight_), param(x, bias_), eps_);
}

BatchNorm::BatchNorm(int spatial_dims, int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                     bool track_running_stats, DType dtype, bool bias)
    : dims_(spatial_dims), features_(num_features), eps_(eps), momentum_(momentum) {
  const std::string name = type_name();
  if (spatial_dims < 1 || spatial_dims > 3) throw_value_error("BatchNorm: spatial_dims must be 1, 2 or 3");
  check_dtype(name.c_str(), dtype);
  if (num_features <= 0) throw_value_error(name, ": num_features must be positive, got ", num_features);
  if (!(eps >= 0)) throw_value_error(name, ": eps must be >= 0, got ", eps);
  if (momentum && !(*momentum >= 0 && *momentum <= 1))
    throw_value_error(name, ": momentum must be in [0, 1] (or None), got ", *momentum);
  if (affine) {
    weight_ = filled({num_features}, dtype, 1.0);
    register_parameter("weight", weight_);
    if (bias) {
      bias_ = filled({num_features}, dtype, 0.0);
      register_parameter("bias", bias_);
    }
  }
  if (track_running_stats) {
    // State, not trained: requires_grad=false keeps them out of the gradient and the backward pass.
    running_mean_ = filled({num_features}, dtype, 0.0, false);
    running_var_ = filled({num_features}, dtype, 1.0, false);
    num_batches_ = filled({}, dtype, 0.0, false);
    register_parameter("running_mean", running_mean_);
    register_parameter("running_var", running_var_);
    register_parameter("num_batches_tracked", num_batches_);
  }
}

void BatchNorm::check_input(const Shape& x) const {
  const bool rank_ok = dims_ == 1 ? (x.size() == 2 || x.size() == 3) : x.size() == static_cast<std::size_t>(dims_ + 2);
  if (rank_ok && x[1] == features_) return;
  const std::string f = std::to_string(features_);
  const std::string want = dims_ == 1   ? "(N, " + f + ") or (N, " + f + ", L)"
                           : dims_ == 2 ? "(N, " + f + ", H, W)"
                                        : "(N, " + f + ", D, H, W)";
  throw_value_error(type_name(), ": expected input of shape ", want, ", got ", shape_str(x));
}

Value BatchNorm::forward(Value x) {
  const Shape xs = x.shape();
  check_input(xs);
  const bool tracked = running_mean_ != nullptr;
  const bool batch_stats = x.graph().training() || !tracked;
  if (batch_stats && shape_numel(xs) / features_ < 2)
    throw_value_error(type_name(), ": expected more than 1 value per channel when training, got input of shape ",
                      shape_str(xs));
  // With batch statistics a constant channel has variance 0: eps = 0 would divide by zero (torch refuses too).
  if (batch_stats && !(eps_ > 0))
    throw_value_error(type_name(), ": eps must be positive when normalising with batch statistics, got ", eps_);
  const bool update = x.graph().training() && tracked;
  return ops::batch_norm(x, update || !batch_stats ? param(x, running_mean_) : Value(),
                         update || !batch_stats ? param(x, running_var_) : Value(), param(x, weight_),
                         param(x, bias_), update ? param(x, num_batches_) : Value(), batch_stats,
                         momentum_.value_or(-1.0), eps_);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx, DType dtype,
                     ops::EmbeddingOptions options)
    : num_(num_embeddings), dim_(embedding_dim), options_(options) {
  check_dtype("Embedding", dtype);
  if (options_.max_norm && !(std::isfinite(*options_.max_norm) && *options_.max_norm >= 0))
    throw_value_error("Embedding: max_norm must be finite and >= 0, got ", *options_.max_norm);
  if (!(options_.norm_type > 0)) throw_value_error("Embedding: norm_type must be positive (or inf), got ", options_.norm_type);
  if (num_embeddings <= 0 || embedding_dim <= 0)
    throw_value_error("Embedding: num_embeddings and embedding_dim must be positive, got (", num_embeddings, ", ",
                      embedding_dim, ")");
  if (padding_idx) {
    if (*padding_idx >= num_embeddings || *padding_idx < -num_embeddings)
      throw_value_error("Embedding: padding_idx must be within num_embeddings (", num_embeddings, "), got ",
                        *padding_idx);
    padding_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  // N(0, 1) by Box-Muller from the shared initialisation generator (torch's init.normal_).
  Tensor t({num_embeddings, embedding_dim}, DType::f64);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); i += 2) {
    const double u1 = 1.0 - init_uniform(0.0, 1.0), u2 = init_uniform(0.0, 1.0);  // u1 in (0, 1]
    const double r = std::sqrt(-2.0 * std::log(u1)), phi = 2.0 * std::numbers::pi * u2;
    p[i] = r * std::cos(phi);
    if (i + 1 < t.numel()) p[i + 1] = r * std::sin(phi);
  }
  if (padding_ >= 0) std::fill(p + padding_ * embedding_dim, p + (padding_ + 1) * embedding_dim, 0.0);
  weight_ = std::make_shared<Parameter>(dtype == DType::f64 ? t : t.to(dtype));
  register_parameter("weight", weight_);
}

Value Embedding::forward(Value indices) {
  if (!is_integer(indices.dtype()))
    throw_type_error("Embedding: expected integer indices (int64), got ", dtype_name(indices.dtype()), " of shape ",
                     shape_str(indices.shape()));
  return ops::embedding(indices, indices.graph().add_parameter(weight_), padding_, options_);
}

Unflatten::Unflatten(int dim, Shape sizes) : dim_(dim), sizes_(std::move(sizes)) {
  if (sizes_.empty()) throw_value_error("Unflatten: sizes must not be empty");
  int unknown = 0;
  for (int64_t s : sizes_) {
    if (s == -1) ++unknown;
    else if (s <= 0) throw_value_error("Unflatten: sizes must be positive (one may be -1), got ", shape_str(sizes_));
  }
  if (unknown > 1) throw_value_error("Unflatten: only one size may be -1, got ", shape_str(sizes_));
}

Value Unflatten::forward(Value x) {
  const Shape xs = x.shape();
  const int nd = static_cast<int>(xs.size());
  const int d = dim_ < 0 ? dim_ + nd : dim_;
  if (d < 0 || d >= nd) throw_value_error("Unflatten: dim ", dim_, " out of range for input of shape ", shape_str(xs));
  int64_t known = 1;
  for (int64_t s : sizes_) known *= s == -1 ? 1 : s;
  const bool has_unknown = std::find(sizes_.begin(), sizes_.end(), -1) != sizes_.end();
  if (has_unknown ? xs[d] % known != 0 : known != xs[d])
    throw_value_error("Unflatten: sizes ", shape_str(sizes_), " do not fit dimension ", dim_, " of size ", xs[d],
                      " (input of shape ", shape_str(xs), ")");
  Shape out(xs.begin(), xs.begin() + d);
  for (int64_t s : sizes_) out.push_back(s == -1 ? xs[d] / known : s);
  out.insert(out.end(), xs.begin() + d + 1, xs.end());
  return ops::reshape(x, out);
}

Upsample::Upsample(Shape size, std::vector<double> scale_factor, std::string mode, std::optional<bool> align_corners,
                   bool recompute_scale_factor)
    : size_(std::move(size)),
      scale_(std::move(scale_factor)),
      mode_(std::move(mode)),
      recompute_(recompute_scale_factor) {
  if (mode_ != "nearest" && mode_ != "nearest-exact" && mode_ != "bilinear" && mode_ != "bicubic")
    throw_value_error("Upsample: mode must be 'nearest', 'nearest-exact', 'bilinear' or 'bicubic' for 4-D input, got '",
                      mode_, "'");
  if (size_.empty() == scale_.empty()) throw_value_error("Upsample: give exactly one of size and scale_factor");
  if (size_.size() > 2 || scale_.size() > 2)
    throw_value_error("Upsample: size and scale_factor take 1 or 2 values (H, W) for 4-D input");
  for (int64_t s : size_)
    if (s <= 0) throw_value_error("Upsample: size must be positive, got ", shape_str(size_));
  for (double s : scale_)
    if (!(s > 0)) throw_value_error("Upsample: scale_factor must be positive, got ", s);
  if (recompute_ && scale_.empty())
    throw_value_error("Upsample: recompute_scale_factor needs a scale_factor, not a size");
  if (align_corners && (mode_ == "nearest" || mode_ == "nearest-exact"))
    throw_value_error("Upsample: align_corners can only be set with mode 'bilinear' or 'bicubic'");
  align_corners_ = align_corners.value_or(false);
  if (size_.size() == 1) size_.push_back(size_[0]);
  if (scale_.size() == 1) scale_.push_back(scale_[0]);
}

Value Upsample::forward(Value x) {
  const Shape xs = x.shape();
  if (xs.size() != 4) throw_value_error("Upsample: expected input of shape (N, C, H, W), got ", shape_str(xs));
  if (xs[2] < 1 || xs[3] < 1)
    throw_value_error("Upsample: input of shape ", shape_str(xs), " has an empty spatial dimension");
  Shape out = size_;
  if (out.empty())  // torch: floor(input_size * scale_factor)
    out = {static_cast<int64_t>(std::floor(static_cast<double>(xs[2]) * scale_[0])),
           static_cast<int64_t>(std::floor(static_cast<double>(xs[3]) * scale_[1]))};
  if (out[0] <= 0 || out[1] <= 0)
    throw_value_error("Upsample: output size ", shape_str(out), " is empty for input of shape ", shape_str(xs));
  const bool given = !scale_.empty() && !recompute_;  // 0: the op maps coordinates by the size ratio
  const double sh = given ? scale_[0] : 0.0, sw = given ? scale_[1] : 0.0;
  return ops::upsample(x, out, mode_, align_corners_, sh, sw);
}

OutputTransform::OutputTransform(std::vector<double> scale, std::vector<double> shift,
                                 std::vector<std::string> activations, DType dtype) {
  check_dtype("OutputTransform", dtype);
  if (scale.empty() || shift.empty() || activations.empty())
    throw_value_error("OutputTransform: scale, shift and activations must each have at least one entry");
  size_ = static_cast<int64_t>(std::max({scale.size(), shift.size(), activations.size()}));
  for (auto n : {scale.size(), shift.size(), activations.size()})
    if (n != 1 && static_cast<int64_t>(n) != size_)
      throw_value_error("OutputTransform: scale, shift and activations must have length 1 or ", size_, ", got ",
                        scale.size(), ", ", shift.size(), " and ", activations.size());
  for (double v : scale)
    if (!std::isfinite(v)) throw_value_error("OutputTransform: scale must be finite, got ", v);
  for (double v : shift)
    if (!std::isfinite(v)) throw_value_error("OutputTransform: shift must be finite, got ", v);
  for (const std::string& a : activations) acts_.push_back(ops::output_activation_from_name(a));
  auto make = [&](const std::vector<double>& v) {
    Tensor t({size_}, DType::f64);
    for (int64_t j = 0; j < size_; ++j) t.data_as<double>()[j] = v[v.size() == 1 ? 0 : j];
    return std::make_shared<Parameter>(dtype == DType::f64 ? t : t.to(dtype), false);  // fixed, not trained
  };
  scale_ = make(scale);
  shift_ = make(shift);
  register_parameter("scale", scale_);
  register_parameter("shift", shift_);
}

Value OutputTransform::forward(Value x) {
  const Shape xs = x.shape();
  if (xs.empty() || (size_ > 1 && xs.back() != size_))
    throw_value_error("OutputTransform: expected input of shape (N, ", size_, "), got ", shape_str(xs));
  Graph& g = x.graph();
  return ops::output_transform(x, g.add_parameter(scale_), g.add_parameter(shift_), acts_);
}

}  // namespace treadle::nn

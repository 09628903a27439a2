// Convolution and pooling modules. Constructors validate their arguments once; forward checks the
// input against the layer (channel count, rank, spatial size) so that errors name the layer and the
// expected and given shapes before any op is recorded. Unbatched inputs (C, *spatial) are accepted
// as in PyTorch.
#include <cmath>
#include <functional>
#include <limits>

#include "ops/conv_geometry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_conv.hpp"

namespace treadle::nn {
namespace {

// PyTorch's default for convolutions: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), +), bias the same.
Tensor uniform_init(const Shape& shape, DType dtype, double bound) {
  Tensor t(shape, DType::f64);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = init_uniform(-bound, bound);
  return dtype == DType::f64 ? t : t.to(dtype);
}

// One value for every dim, or one per dim, each >= min_value.
Shape expand(const std::string& layer, const char* name, const Shape& v, int nd, int64_t min_value) {
  if (v.size() != 1 && v.size() != static_cast<std::size_t>(nd))
    throw_value_error(layer, ": ", name, " must have 1 or ", nd, " values, got ", shape_str(v));
  Shape out(nd);
  for (int i = 0; i < nd; ++i) {
    out[i] = v.size() == 1 ? v[0] : v[i];
    if (out[i] < min_value) throw_value_error(layer, ": ", name, " must be >= ", min_value, ", got ", shape_str(v));
  }
  return out;
}

void check_dtype(const std::string& layer, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error(layer, ": dtype must be float32 or float64, got ", dtype_name(dtype));
}

void check_channels(const std::string& layer, int64_t in, int64_t out, int64_t groups) {
  if (in <= 0 || out <= 0)
    throw_value_error(layer, ": in_channels and out_channels must be positive, got (", in, ", ", out, ")");
  if (groups <= 0) throw_value_error(layer, ": groups must be positive, got ", groups);
  if (in % groups != 0)
    throw_value_error(layer, ": in_channels must be divisible by groups, got in_channels=", in, ", groups=", groups);
  if (out % groups != 0)
    throw_value_error(layer, ": out_channels must be divisible by groups, got out_channels=", out, ", groups=", groups);
}

std::string spatial_names(int nd) { return nd == 1 ? "L" : nd == 2 ? "H, W" : "D, H, W"; }

int64_t product(const Shape& s) { return shape_numel(s); }  // checked: absurd kernel sizes raise

// Checks the rank and (when channels > 0) the channel count; runs `body` on a batched view and
// restores an unbatched input's shape afterwards.
Value batched(const std::string& layer, Value x, int nd, int64_t channels, const std::function<Value(Value)>& body) {
  const bool unbatched = x.ndim() == nd + 1;
  const std::string c = channels > 0 ? std::to_string(channels) : "C";
  if (x.ndim() != nd + 2 && !unbatched)
    throw_value_error(layer, ": expected input of shape (N, ", c, ", ", spatial_names(nd), ") or (", c, ", ",
                      spatial_names(nd), "), got ", shape_str(x.shape()));
  const int64_t got = x.dim(unbatched ? 0 : 1);
  if (channels > 0 && got != channels)
    throw_value_error(layer, ": expected input of shape (N, ", c, ", ", spatial_names(nd), "), got ",
                      shape_str(x.shape()));
  // Padding alone would otherwise make an output out of nothing (torch refuses these too).
  for (int64_t i = x.ndim() - nd; i < x.ndim(); ++i)
    if (x.dim(i) < 1)
      throw_value_error(layer, ": input ", shape_str(x.shape()), " has an empty spatial dimension");
  if (!unbatched) return body(x);
  Shape s = x.shape();
  s.insert(s.begin(), 1);
  Value y = body(ops::reshape(x, s));
  Shape ys = y.shape();
  ys.erase(ys.begin());
  return ops::reshape(y, ys);
}

Shape spatial(const Value& x) {
  Shape s = x.shape();
  return Shape(s.begin() + 2, s.end());
}

// The smallest spatial size a window fits: dilation * (kernel - 1) + 1 - padding, computed wide
// (absurd kernel sizes must not wrap around to a size that "fits"), saturated to int64.
int64_t window_need(int64_t kernel, int64_t dilation, __int128 padding) {
  const __int128 need = static_cast<__int128>(dilation) * (kernel - 1) + 1 - padding;
  return need > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(need);
}

void too_small(const std::string& layer, const Value& x, const Shape& k, const Shape& pad, const Shape& dil,
               const Shape& need) {
  throw_value_error(layer, ": input ", shape_str(x.shape()), " is too small for kernel_size ", shape_str(k),
                    " with padding ", shape_str(pad), " and dilation ", shape_str(dil),
                    ": each spatial size must be at least ", shape_str(need));
}

}  // namespace

ConvNd::ConvNd(int nd, int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride,
               ConvPadding padding, Shape dilation, int64_t groups, bool bias, DType dtype)
    : nd_(nd), in_(in_channels), out_(out_channels), groups_(groups) {
  if (nd < 1 || nd > 3) throw_value_error("ConvNd: 1 to 3 spatial dimensions are supported, got ", nd);
  const std::string layer = type_name();
  check_channels(layer, in_channels, out_channels, groups);
  check_dtype(layer, dtype);
  kernel_ = expand(layer, "kernel_size", kernel_size, nd, 1);
  stride_ = expand(layer, "stride", stride, nd, 1);
  dilation_ = expand(layer, "dilation", dilation, nd, 1);
  if (padding.mode.empty()) {
    pad_begin_ = pad_end_ = expand(layer, "padding", padding.values, nd, 0);
  } else if (padding.mode == "valid") {
    pad_begin_ = pad_end_ = Shape(nd, 0);
  } else if (padding.mode == "same") {
    for (int64_t s : stride_)
      if (s != 1) throw_value_error(layer, ": padding='same' is not supported for strided convolutions");
    // PyTorch puts the odd extra element of an even total padding at the end.
    for (int i = 0; i < nd; ++i) {
      int64_t total = 0;
      if (__builtin_mul_overflow(dilation_[i], kernel_[i] - 1, &total))
        throw_value_error(layer, ": dilation ", shape_str(dilation_), " times kernel_size ", shape_str(kernel_),
                          " overflows");
      pad_begin_.push_back(total / 2);
      pad_end_.push_back(total - total / 2);
    }
  } else {
    throw_value_error(layer, ": padding must be an int, a tuple, 'same' or 'valid', got '", padding.mode, "'");
  }
  Shape w{out_channels, in_channels / groups};
  w.insert(w.end(), kernel_.begin(), kernel_.end());
  shape_numel(w);  // a weight too large to count raises here, before any arithmetic on its sizes
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels / groups) * static_cast<double>(product(kernel_)));
  weight_ = std::make_shared<Parameter>(uniform_init(w, dtype, bound));
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = std::make_shared<Parameter>(uniform_init({out_channels}, dtype, bound));
    register_parameter("bias", bias_);
  }
}

Value ConvNd::forward(Value x) {
  const std::string layer = type_name();
  return batched(layer, x, nd_, in_, [&](Value xb) {
    const Shape s = spatial(xb);
    Shape need(nd_);
    bool small = false;
    for (int i = 0; i < nd_; ++i) {
      need[i] = window_need(kernel_[i], dilation_[i], static_cast<__int128>(pad_begin_[i]) + pad_end_[i]);
      small = small || s[i] < need[i];
    }
    if (small) too_small(layer, xb, kernel_, pad_begin_, dilation_, need);
    Graph& g = xb.graph();
    Value b = bias_ ? g.add_parameter(bias_) : Value();
    return ops::conv(xb, g.add_parameter(weight_), b, stride_, pad_begin_, dilation_, groups_, pad_end_);
  });
}

ConvTransposeNd::ConvTransposeNd(int nd, int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride,
                                 Shape padding, Shape output_padding, int64_t groups, bool bias, Shape dilation,
                                 DType dtype)
    : nd_(nd), in_(in_channels), out_(out_channels), groups_(groups) {
  if (nd < 1 || nd > 3) throw_value_error("ConvTransposeNd: 1 to 3 spatial dimensions are supported, got ", nd);
  const std::string layer = type_name();
  check_channels(layer, in_channels, out_channels, groups);
  check_dtype(layer, dtype);
  kernel_ = expand(layer, "kernel_size", kernel_size, nd, 1);
  stride_ = expand(layer, "stride", stride, nd, 1);
  padding_ = expand(layer, "padding", padding, nd, 0);
  output_padding_ = expand(layer, "output_padding", output_padding, nd, 0);
  dilation_ = expand(layer, "dilation", dilation, nd, 1);
  for (int i = 0; i < nd; ++i)
    if (output_padding_[i] >= std::max(stride_[i], dilation_[i]))
      throw_value_error(layer, ": output_padding must be smaller than either stride or dilation, got output_padding ",
                        shape_str(output_padding_), ", stride ", shape_str(stride_), ", dilation ",
                        shape_str(dilation_));
  // Weight (in, out/groups, *k); PyTorch computes fan_in from dim 1 of this layout.
  Shape w{in_channels, out_channels / groups};
  w.insert(w.end(), kernel_.begin(), kernel_.end());
  shape_numel(w);  // a weight too large to count raises here, before any arithmetic on its sizes
  const double bound =
      1.0 / std::sqrt(static_cast<double>(out_channels / groups) * static_cast<double>(product(kernel_)));
  weight_ = std::make_shared<Parameter>(uniform_init(w, dtype, bound));
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = std::make_shared<Parameter>(uniform_init({out_channels}, dtype, bound));
    register_parameter("bias", bias_);
  }
}

Value ConvTransposeNd::forward(Value x) {
  const std::string layer = type_name();
  return batched(layer, x, nd_, in_, [&](Value xb) {
    const Shape s = spatial(xb);
    for (int i = 0; i < nd_; ++i)
      if (static_cast<__int128>(s[i] - 1) * stride_[i] - static_cast<__int128>(2) * padding_[i] +
              static_cast<__int128>(dilation_[i]) * (kernel_[i] - 1) + output_padding_[i] + 1 <
          1)
        throw_value_error(layer, ": input ", shape_str(xb.shape()), " with padding ", shape_str(padding_),
                          " gives an empty output");
    Graph& g = xb.graph();
    Value b = bias_ ? g.add_parameter(bias_) : Value();
    return ops::conv_transpose(xb, g.add_parameter(weight_), b, stride_, padding_, output_padding_, dilation_,
                               groups_);
  });
}

namespace {

void check_pool_padding(const std::string& layer, const Shape& pad, const Shape& kernel) {
  for (std::size_t i = 0; i < pad.size(); ++i)
    if (pad[i] > kernel[i] / 2)
      throw_value_error(layer, ": padding should be at most half of kernel size, got padding ", shape_str(pad),
                        " and kernel_size ", shape_str(kernel));
}

void check_pool_fits(const std::string& layer, const Value& x, const Shape& k, const Shape& s, const Shape& p,
                     const Shape& d, bool ceil_mode) {
  const Shape in = spatial(x);
  Shape need(in.size());
  bool small = false;
  for (std::size_t i = 0; i < in.size(); ++i) {
    need[i] = window_need(k[i], d[i], static_cast<__int128>(2) * p[i]);
    small = small || pool_output_size(in[i], k[i], s[i], p[i], d[i], ceil_mode) < 1;
  }
  if (small) too_small(layer, x, k, p, d, need);
}

}  // namespace

MaxPoolNd::MaxPoolNd(int nd, Shape kernel_size, Shape stride, Shape padding, Shape dilation, bool ceil_mode)
    : nd_(nd), ceil_mode_(ceil_mode) {
  if (nd < 1 || nd > 3) throw_value_error("MaxPoolNd: 1 to 3 spatial dimensions are supported, got ", nd);
  const std::string layer = type_name();
  kernel_ = expand(layer, "kernel_size", kernel_size, nd, 1);
  stride_ = stride.empty() ? kernel_ : expand(layer, "stride", stride, nd, 1);
  padding_ = expand(layer, "padding", padding, nd, 0);
  dilation_ = expand(layer, "dilation", dilation, nd, 1);
  check_pool_padding(layer, padding_, kernel_);
}

Value MaxPoolNd::forward(Value x) {
  const std::string layer = type_name();
  return batched(layer, x, nd_, 0, [&](Value xb) {
    check_pool_fits(layer, xb, kernel_, stride_, padding_, dilation_, ceil_mode_);
    return ops::max_pool(xb, kernel_, stride_, padding_, dilation_, ceil_mode_);
  });
}

AvgPoolNd::AvgPoolNd(int nd, Shape kernel_size, Shape stride, Shape padding, bool ceil_mode, bool count_include_pad,
                     int64_t divisor_override)
    : nd_(nd), ceil_mode_(ceil_mode), count_include_pad_(count_include_pad), divisor_override_(divisor_override) {
  if (nd < 1 || nd > 3) throw_value_error("AvgPoolNd: 1 to 3 spatial dimensions are supported, got ", nd);
  const std::string layer = type_name();
  kernel_ = expand(layer, "kernel_size", kernel_size, nd, 1);
  stride_ = stride.empty() ? kernel_ : expand(layer, "stride", stride, nd, 1);
  padding_ = expand(layer, "padding", padding, nd, 0);
  check_pool_padding(layer, padding_, kernel_);
  if (divisor_override < 0) throw_value_error(layer, ": divisor_override must be positive, got ", divisor_override);
}

Value AvgPoolNd::forward(Value x) {
  const std::string layer = type_name();
  return batched(layer, x, nd_, 0, [&](Value xb) {
    check_pool_fits(layer, xb, kernel_, stride_, padding_, Shape(nd_, 1), ceil_mode_);
    return ops::avg_pool(xb, kernel_, stride_, padding_, ceil_mode_, count_include_pad_, divisor_override_);
  });
}

AdaptiveAvgPoolNd::AdaptiveAvgPoolNd(int nd, Shape output_size) : nd_(nd) {
  if (nd < 1 || nd > 3) throw_value_error("AdaptiveAvgPoolNd: 1 to 3 spatial dimensions are supported, got ", nd);
  const std::string layer = type_name();
  if (output_size.size() != 1 && output_size.size() != static_cast<std::size_t>(nd))
    throw_value_error(layer, ": output_size must have 1 or ", nd, " values, got ", shape_str(output_size));
  for (int i = 0; i < nd; ++i) {
    output_size_.push_back(output_size.size() == 1 ? output_size[0] : output_size[i]);
    if (output_size_.back() < 1 && output_size_.back() != -1)
      throw_value_error(layer, ": output_size must be positive (or None), got ", shape_str(output_size));
  }
}

Value AdaptiveAvgPoolNd::forward(Value x) {
  const std::string layer = type_name();
  return batched(layer, x, nd_, 0, [&](Value xb) {
    const Shape in = spatial(xb);
    Shape out = output_size_;
    for (int i = 0; i < nd_; ++i) {
      if (out[i] == -1) out[i] = in[i];
      if (in[i] < 1) throw_value_error(layer, ": input ", shape_str(xb.shape()), " has an empty spatial dimension");
    }
    return ops::adaptive_avg_pool(xb, out);
  });
}

Value GlobalAvgPool2d::forward(Value x) {
  if (x.ndim() != 4)
    throw_value_error("GlobalAvgPool2d: expected input of shape (N, C, H, W), got ", shape_str(x.shape()));
  if (x.dim(2) < 1 || x.dim(3) < 1)
    throw_value_error("GlobalAvgPool2d: input ", shape_str(x.shape()), " has an empty spatial dimension");
  return ops::reshape(ops::adaptive_avg_pool(x, {1, 1}), {x.dim(0), x.dim(1)});
}

}  // namespace treadle::nn

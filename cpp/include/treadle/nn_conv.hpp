#pragma once
// Convolution and pooling: the symbolic ops and the modules (Conv1d/2d/3d, ConvTranspose, MaxPool,
// AvgPool, AdaptiveAvgPool, GlobalAvgPool2d). Layout is PyTorch's channels-first (N, C, *spatial);
// argument names, parameter names/shapes and default initialisation follow torch.nn.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "treadle/module.hpp"

namespace treadle {
namespace ops {

// N-d convolution, 1 to 3 spatial dims. x: (N, C, *S), weight: (O, C/groups, *k), bias: (O,) or undefined.
// stride/padding/dilation: one value for all dims or one per dim; padding_end (optional) pads the
// end of each dim differently from its start (PyTorch's padding='same' with an even kernel).
TREADLE_API Value conv(Value x, Value weight, Value bias, const Shape& stride = {1}, const Shape& padding = {0},
                       const Shape& dilation = {1}, int64_t groups = 1, const Shape& padding_end = {});
// Transposed convolution (the adjoint of conv in x). weight: (C, O/groups, *k) as in PyTorch.
TREADLE_API Value conv_transpose(Value x, Value weight, Value bias, const Shape& stride = {1},
                                 const Shape& padding = {0}, const Shape& output_padding = {0},
                                 const Shape& dilation = {1}, int64_t groups = 1);
// Max pooling (the gradient goes to the first maximum of each window, as in PyTorch).
// An empty stride means stride = kernel_size.
TREADLE_API Value max_pool(Value x, const Shape& kernel_size, const Shape& stride = {}, const Shape& padding = {0},
                           const Shape& dilation = {1}, bool ceil_mode = false);
// The same, with the int64 index of each window's maximum within its flattened input plane (torch's
// return_indices=True: what max_unpool takes). The indices carry no gradient.
TREADLE_API std::pair<Value, Value> max_pool_with_indices(Value x, const Shape& kernel_size, const Shape& stride = {},
                                                          const Shape& padding = {0}, const Shape& dilation = {1},
                                                          bool ceil_mode = false);
// Average pooling with PyTorch's divisor rules; divisor_override 0 means none.
TREADLE_API Value avg_pool(Value x, const Shape& kernel_size, const Shape& stride = {}, const Shape& padding = {0},
                           bool ceil_mode = false, bool count_include_pad = true, int64_t divisor_override = 0);
// Adaptive average pooling to `output_size` (one entry per spatial dim), PyTorch's window formula.
TREADLE_API Value adaptive_avg_pool(Value x, const Shape& output_size);

}  // namespace ops

namespace nn {

// Explicit per-dimension padding, or one of PyTorch's modes "same" / "valid".
struct TREADLE_API ConvPadding {
  ConvPadding() : values{0} {}
  ConvPadding(int p) : values{p} {}      // NOLINT: implicit like PyTorch's int argument
  ConvPadding(int64_t p) : values{p} {}  // NOLINT
  ConvPadding(Shape p) : values(std::move(p)) {}  // NOLINT
  ConvPadding(const char* m) : mode(m) {}  // NOLINT
  ConvPadding(std::string m) : mode(std::move(m)) {}  // NOLINT
  std::string mode;  // "" (explicit values), "same" or "valid"
  Shape values;
};

// Conv1d / Conv2d / Conv3d share this implementation; `nd` is the number of spatial dims.
class TREADLE_API ConvNd : public Module {
 public:
  ConvNd(int nd, int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
         ConvPadding padding = {}, Shape dilation = {1}, int64_t groups = 1, bool bias = true,
         DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "Conv" + std::to_string(nd_) + "d"; }
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  const Shape& kernel_size() const { return kernel_; }
  const Shape& stride() const { return stride_; }
  const Shape& padding() const { return pad_begin_; }  // start padding per dim
  const Shape& dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }

 private:
  int nd_;
  int64_t in_, out_, groups_;
  Shape kernel_, stride_, pad_begin_, pad_end_, dilation_;
  std::shared_ptr<Parameter> weight_, bias_;
};

class TREADLE_API Conv1d : public ConvNd {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1}, ConvPadding padding = {},
         Shape dilation = {1}, int64_t groups = 1, bool bias = true, DType dtype = DType::f32)
      : ConvNd(1, in_channels, out_channels, std::move(kernel_size), std::move(stride), std::move(padding),
               std::move(dilation), groups, bias, dtype) {}
};
class TREADLE_API Conv2d : public ConvNd {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1}, ConvPadding padding = {},
         Shape dilation = {1}, int64_t groups = 1, bool bias = true, DType dtype = DType::f32)
      : ConvNd(2, in_channels, out_channels, std::move(kernel_size), std::move(stride), std::move(padding),
               std::move(dilation), groups, bias, dtype) {}
};
class TREADLE_API Conv3d : public ConvNd {
 public:
  Conv3d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1}, ConvPadding padding = {},
         Shape dilation = {1}, int64_t groups = 1, bool bias = true, DType dtype = DType::f32)
      : ConvNd(3, in_channels, out_channels, std::move(kernel_size), std::move(stride), std::move(padding),
               std::move(dilation), groups, bias, dtype) {}
};

// ConvTranspose1d/2d/3d; argument order as PyTorch's ConvTranspose2d.
class TREADLE_API ConvTransposeNd : public Module {
 public:
  ConvTransposeNd(int nd, int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
                  Shape padding = {0}, Shape output_padding = {0}, int64_t groups = 1, bool bias = true,
                  Shape dilation = {1}, DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "ConvTranspose" + std::to_string(nd_) + "d"; }

 private:
  int nd_;
  int64_t in_, out_, groups_;
  Shape kernel_, stride_, padding_, output_padding_, dilation_;
  std::shared_ptr<Parameter> weight_, bias_;
};

class TREADLE_API ConvTranspose2d : public ConvTransposeNd {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
                  Shape padding = {0}, Shape output_padding = {0}, int64_t groups = 1, bool bias = true,
                  Shape dilation = {1}, DType dtype = DType::f32)
      : ConvTransposeNd(2, in_channels, out_channels, std::move(kernel_size), std::move(stride), std::move(padding),
                        std::move(output_padding), groups, bias, std::move(dilation), dtype) {}
};

// MaxPool1d/2d (and 3d); an empty stride means stride = kernel_size.
class TREADLE_API MaxPoolNd : public Module {
 public:
  MaxPoolNd(int nd, Shape kernel_size, Shape stride = {}, Shape padding = {0}, Shape dilation = {1},
            bool ceil_mode = false);
  Value forward(Value x) override;
  std::string type_name() const override { return "MaxPool" + std::to_string(nd_) + "d"; }

 private:
  int nd_;
  Shape kernel_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

// AvgPool1d/2d (and 3d); divisor_override 0 means none.
class TREADLE_API AvgPoolNd : public Module {
 public:
  AvgPoolNd(int nd, Shape kernel_size, Shape stride = {}, Shape padding = {0}, bool ceil_mode = false,
            bool count_include_pad = true, int64_t divisor_override = 0);
  Value forward(Value x) override;
  std::string type_name() const override { return "AvgPool" + std::to_string(nd_) + "d"; }

 private:
  int nd_;
  Shape kernel_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
  int64_t divisor_override_;
};

// AdaptiveAvgPool1d/2d/3d; an output size of -1 keeps that input dim (PyTorch's None).
class TREADLE_API AdaptiveAvgPoolNd : public Module {
 public:
  AdaptiveAvgPoolNd(int nd, Shape output_size);
  Value forward(Value x) override;
  std::string type_name() const override { return "AdaptiveAvgPool" + std::to_string(nd_) + "d"; }

 private:
  int nd_;
  Shape output_size_;
};

// Mean over H and W, flattened to (N, C): AdaptiveAvgPool2d(1) followed by Flatten.
class TREADLE_API GlobalAvgPool2d : public Module {
 public:
  Value forward(Value x) override;
  std::string type_name() const override { return "GlobalAvgPool2d"; }
};

}  // namespace nn
}  // namespace treadle

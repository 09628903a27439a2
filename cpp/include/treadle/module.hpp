#pragma once
// Modules: named parameters plus a forward that records graph ops. Names follow PyTorch's
// state_dict keys ("0.weight"), layouts follow PyTorch (Linear weight is (out, in)), and default
// initialisation matches PyTorch's for each layer.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "treadle/graph.hpp"
#include "treadle/ops.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

class TREADLE_API Parameter {
 public:
  explicit Parameter(Tensor value, bool requires_grad = true) : value_(std::move(value)), requires_grad_(requires_grad) {}
  // A tied parameter (tie_to) is its target: one value, one slot in the flat buffer, one gradient.
  const Tensor& value() const { return tied_ ? tied_->value() : value_; }
  // Rebinds the parameter to other memory (the model's flat buffer); shape must match.
  void rebind(Tensor value);
  bool requires_grad() const { return tied_ ? tied_->requires_grad() : requires_grad_; }
  void set_requires_grad(bool r);
  // The model whose flat buffer holds this parameter (a parameter belongs to one model at a time).
  const void* owner() const { return tied_ ? tied_->owner() : owner_; }
  void set_owner(const void* owner);
  // Weight tying (torch's `decoder.weight = encoder.weight`): from now on this parameter stands for
  // `target`. Shapes and dtypes must match; a tie that would close a cycle is refused.
  void tie_to(std::shared_ptr<Parameter> target);
  // The parameter that holds the value: `p` itself, or the end of its chain of ties.
  static const std::shared_ptr<Parameter>& resolve(const std::shared_ptr<Parameter>& p);
 private:
  Tensor value_;
  bool requires_grad_;
  const void* owner_ = nullptr;
  std::shared_ptr<Parameter> tied_;
};
using NamedParameter = std::pair<std::string, std::shared_ptr<Parameter>>;

// The process-wide generator used for parameter initialisation (like torch.manual_seed).
TREADLE_API void manual_seed(uint64_t seed);
TREADLE_API double init_uniform(double low, double high);  // one draw, thread-safe
// n draws from that generator into out: U(a, b), or N(a, b^2) when `normal` (tl.nn.init uses them).
TREADLE_API void init_draws(double* out, int64_t n, bool normal, double a, double b);

class TREADLE_API Module {
 public:
  virtual ~Module() = default;
  virtual Value forward(Value x) = 0;
  virtual std::string type_name() const = 0;

  Value operator()(Value x) { return forward(x); }
  std::vector<NamedParameter> named_parameters(const std::string& prefix = "") const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  void register_parameter(const std::string& name, std::shared_ptr<Parameter> p);
  void register_module(const std::string& name, std::shared_ptr<Module> m);
  // Ties this module's own parameter `name` ("weight") to `target` (Parameter::tie_to).
  void tie_parameter(const std::string& name, std::shared_ptr<Parameter> target);

 protected:
  std::vector<NamedParameter> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

namespace nn {

class TREADLE_API Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32);
  Value forward(Value x) override;
  std::string type_name() const override { return "Linear"; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  std::shared_ptr<Parameter> weight_, bias_;
};

// A parameter-free module applying one activation op (ReLU, Tanh, GELU, ...).
// The pointwise activation modules, one per activation op whose options are numbers: torch.nn's
// class name, the op, what it computes, and the op's attributes (torch's keyword names and defaults)
// in order. nn::Activation, the architecture format (treadle/architecture.hpp) and the Python
// classes (tl.nn.ReLU, ...) are made from this list, so a new pointwise activation is its op
// (ops/activation.cpp), its kernels and its tests. GELU, Softmax and LogSoftmax are written by hand.
// onnx_op: the ONNX operator computing it, each param given as the attribute named in onnx_attributes
// (in order); empty where the ONNX export composes operators (treadle.io).
struct ActivationModule {
  std::string module;
  std::string op;
  std::string doc;
  std::vector<std::pair<std::string, double>> params;
  std::string onnx_op;
  std::vector<std::string> onnx_attributes;
};
TREADLE_API const std::vector<ActivationModule>& activation_modules();

class TREADLE_API Activation : public Module {
 public:
  // kind: the op of an activation_modules() entry (relu, leaky_relu, elu, silu, tanh, sigmoid,
  // softplus), gelu, gelu_tanh, softmax or log_softmax. param/param2: the entry's attributes in order
  // (negative_slope 0.01; alpha 1; beta 1 and threshold 20), or the axis (-1) of softmax/log_softmax;
  // NaN selects the default.
  explicit Activation(std::string kind, double param = kDefault, double param2 = kDefault);
  static constexpr double kDefault = std::numeric_limits<double>::quiet_NaN();
  Value forward(Value x) override;
  std::string type_name() const override { return kind_; }

 private:
  std::string kind_;
  double param_, param2_;
};

class TREADLE_API Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Value forward(Value x) override { return ops::dropout(x, p_); }
  std::string type_name() const override { return "Dropout"; }

 private:
  double p_;
};

class TREADLE_API Flatten : public Module {
 public:
  Flatten(int start_dim = 1, int end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Value forward(Value x) override { return ops::flatten(x, start_, end_); }
  std::string type_name() const override { return "Flatten"; }

 private:
  int start_, end_;
};

class TREADLE_API Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  Sequential& add(std::shared_ptr<Module> m);
  Value forward(Value x) override;
  std::string type_name() const override { return "Sequential"; }
  std::size_t size() const { return children_.size(); }
};

}  // namespace nn
}  // namespace treadle

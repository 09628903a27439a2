#include "treadle/module.hpp"

#include <cmath>
#include <mutex>
#include <random>

#include "treadle/error.hpp"

namespace treadle {

namespace {
std::mutex g_init_mutex;
std::mt19937_64& init_generator() {
  static std::mt19937_64 gen(0x7472656164ULL);
  return gen;
}

// PyTorch's default for Linear (kaiming_uniform with a=sqrt(5), and the bias rule): U(-1/sqrt(fan_in), +).
Tensor uniform_tensor(Shape shape, DType dtype, double bound) {
  Tensor t(std::move(shape), DType::f64);
  double* p = t.data_as<double>();
  {
    std::lock_guard<std::mutex> lock(g_init_mutex);
    std::uniform_real_distribution<double> dist(-bound, bound);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(init_generator());
  }
  return dtype == DType::f64 ? t : t.to(dtype);
}
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  init_generator().seed(seed);
}

double init_uniform(double low, double high) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  return std::uniform_real_distribution<double>(low, high)(init_generator());
}

void init_draws(double* out, int64_t n, bool normal, double a, double b) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (normal) {
    std::normal_distribution<double> dist(a, b);
    for (int64_t i = 0; i < n; ++i) out[i] = dist(init_generator());
  } else {
    std::uniform_real_distribution<double> dist(a, b);
    for (int64_t i = 0; i < n; ++i) out[i] = dist(init_generator());
  }
}

void Parameter::rebind(Tensor value) {
  if (tied_) return tied_->rebind(std::move(value));
  if (value.shape() != value_.shape())
    throw_value_error("Parameter.rebind: expected shape ", shape_str(value_.shape()), ", got ", shape_str(value.shape()));
  value_ = std::move(value);
}

void Parameter::set_requires_grad(bool r) {
  if (tied_) return tied_->set_requires_grad(r);
  requires_grad_ = r;
}

void Parameter::set_owner(const void* owner) {
  if (tied_) return tied_->set_owner(owner);
  owner_ = owner;
}

void Parameter::tie_to(std::shared_ptr<Parameter> target) {
  if (!target) throw_value_error("Parameter.tie_to: the target is null");
  const std::shared_ptr<Parameter>& root = resolve(target);
  if (root.get() == this) return;  // already the same parameter
  for (const Parameter* p = root.get(); p; p = p->tied_.get())
    if (p == this) throw_value_error("Parameter.tie_to: the tie would close a cycle");
  if (owner() || root->owner())
    throw_value_error("Parameter.tie_to: a parameter already packed into a model cannot be tied; tie before "
                      "the model's first use");
  if (root->value().shape() != value().shape() || root->value().dtype() != value().dtype())
    throw_value_error("Parameter.tie_to: shapes and dtypes must match: ", shape_str(value().shape()), " ",
                      dtype_name(value().dtype()), " vs ", shape_str(root->value().shape()), " ",
                      dtype_name(root->value().dtype()));
  tied_ = root;
  value_ = Tensor();  // the value is the target's from now on
}

const std::shared_ptr<Parameter>& Parameter::resolve(const std::shared_ptr<Parameter>& p) {
  const std::shared_ptr<Parameter>* at = &p;
  while (*at && (*at)->tied_) at = &(*at)->tied_;
  return *at;
}

std::vector<NamedParameter> Module::named_parameters(const std::string& prefix) const {
  std::vector<NamedParameter> out;
  for (const auto& [name, p] : params_) out.emplace_back(prefix + name, Parameter::resolve(p));
  for (const auto& [name, child] : children_) {
    auto sub = child->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

void Module::register_parameter(const std::string& name, std::shared_ptr<Parameter> p) {
  for (auto& [n, old] : params_)
    if (n == name) {
      old = std::move(p);
      return;
    }
  params_.emplace_back(name, std::move(p));
}

void Module::tie_parameter(const std::string& name, std::shared_ptr<Parameter> target) {
  for (auto& [n, p] : params_)
    if (n == name) return p->tie_to(std::move(target));
  throw_value_error(type_name(), " has no parameter named '", name, "'");
}

void Module::register_module(const std::string& name, std::shared_ptr<Module> m) {
  if (!m) throw_value_error("register_module: module '", name, "' is null");
  for (auto& [n, old] : children_)
    if (n == name) {
      old = std::move(m);
      return;
    }
  children_.emplace_back(name, std::move(m));
}

namespace nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype) : in_(in_features), out_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    throw_value_error("Linear: in_features and out_features must be positive, got (", in_features, ", ",
                      out_features, ")");
  if (dtype != DType::f32 && dtype != DType::f64)
    throw_type_error("Linear: dtype must be float32 or float64, got ", dtype_name(dtype));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = std::make_shared<Parameter>(uniform_tensor({out_features, in_features}, dtype, bound));
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = std::make_shared<Parameter>(uniform_tensor({out_features}, dtype, bound));
    register_parameter("bias", bias_);
  }
}

Value Linear::forward(Value x) {
  Graph& g = x.graph();
  Value b = bias_ ? g.add_parameter(bias_) : Value();
  return ops::linear(x, g.add_parameter(weight_), b);
}

namespace {

const ActivationModule* pointwise_activation(const std::string& op) {
  for (const ActivationModule& m : activation_modules())
    if (m.op == op) return &m;
  return nullptr;
}

double or_default(double v, double d) { return std::isnan(v) ? d : v; }

}  // namespace

Activation::Activation(std::string kind, double param, double param2)
    : kind_(std::move(kind)), param_(param), param2_(param2) {
  if (const ActivationModule* m = pointwise_activation(kind_)) {
    if (m->params.size() > 2)
      throw_runtime_error("Activation: '", kind_, "' has ", m->params.size(), " options; the module holds two");
    return;
  }
  for (const char* k : {"gelu", "gelu_tanh", "softmax", "log_softmax"})
    if (kind_ == k) return;
  std::string known;
  for (const ActivationModule& m : activation_modules()) known += m.op + ", ";
  throw_value_error("Activation: unknown kind '", kind_, "' (known: ", known, "gelu, gelu_tanh, softmax, log_softmax)");
}

Value Activation::forward(Value x) {
  if (const ActivationModule* m = pointwise_activation(kind_)) {  // the op with the module's options
    if (!x.defined()) throw_value_error(kind_, ": input is an undefined value");
    Attrs attrs;
    for (std::size_t i = 0; i < m->params.size(); ++i)
      attrs.set(m->params[i].first, or_default(i == 0 ? param_ : param2_, m->params[i].second));
    return x.graph().apply1(kind_, {x}, std::move(attrs));
  }
  if (kind_ == "gelu") return ops::gelu(x, false);
  if (kind_ == "gelu_tanh") return ops::gelu(x, true);
  const int axis = static_cast<int>(or_default(param_, -1.0));
  if (kind_ == "softmax") return ops::softmax(x, axis);
  return ops::log_softmax(x, axis);
}

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0.0 && p <= 1.0)) throw_value_error("Dropout: p must be in [0, 1], got ", p);
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& m : layers) add(std::move(m));
}

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  register_module(std::to_string(children_.size()), std::move(m));
  return *this;
}

Value Sequential::forward(Value x) {
  for (auto& [name, m] : children_) {
    ScopeGuard scope(x.graph(), name);
    x = m->forward(x);
  }
  return x;
}

}  // namespace nn
}  // namespace treadle

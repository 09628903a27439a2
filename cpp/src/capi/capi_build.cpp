// The C API's factories: modules from architecture JSON (the format tl.save writes), optimizers from
// names and torch.optim keyword arguments, losses from names.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capi/capi_internal.hpp"
#include "nn/json.hpp"
#include "treadle/error.hpp"

namespace treadle::capi {
namespace {

constexpr const char* kFormat = "treadle-architecture/1";

// A JSON number as a finite double: 1e999 is refused (ValueError naming it), not an internal error.
double finite_number(const std::string& text, const std::string& who, const char* key) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || !std::isfinite(v) || end != text.c_str() + text.size())
    throw_value_error(who, ": ", key, " is ", text, ", outside the range of a finite double");
  return v;
}

int64_t integer_number(const std::string& text, const std::string& who, const char* key) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size())
    throw_value_error(who, ": ", key, " is ", text, ", outside the range of a 64-bit integer");
  return v;
}

// Reads the "config" members of one layer, refusing members the layer does not know (a typo must
// not silently fall back to a default).
class Config {
 public:
  Config(const json::Value* config, std::string where) : config_(config), where_(std::move(where)) {
    if (config_ && config_->kind != json::Kind::object && config_->kind != json::Kind::null)
      throw_value_error("treadle_model_from_json: config of ", where_, " is not an object");
  }
  double number(const char* key, double fallback) {
    const json::Value* v = take(key);
    if (!v || v->kind == json::Kind::null) return fallback;
    if (v->kind != json::Kind::number)
      throw_value_error("treadle_model_from_json: ", where_, ".", key, " must be a number, got ", json::kind_name(v->kind));
    return finite_number(v->text, "treadle_model_from_json: " + where_, key);
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) {
    const json::Value* v = take(key);
    if (!v && fallback) return *fallback;
    if (!v) throw_value_error("treadle_model_from_json: ", where_, " needs config.", key);
    return to_int(*v, key);
  }
  bool boolean(const char* key, bool fallback) {
    const json::Value* v = take(key);
    if (!v) return fallback;
    if (v->kind != json::Kind::boolean)
      throw_value_error("treadle_model_from_json: ", where_, ".", key, " must be true or false");
    return v->boolean;
  }
  std::string string(const char* key, const std::string& fallback) {
    const json::Value* v = take(key);
    if (!v) return fallback;
    if (v->kind != json::Kind::string) throw_value_error("treadle_model_from_json: ", where_, ".", key, " must be a string");
    return v->text;
  }
  Shape shape(const char* key) {
    const json::Value* v = take(key);
    if (!v) throw_value_error("treadle_model_from_json: ", where_, " needs config.", key);
    if (v->kind == json::Kind::number) return {to_int(*v, key)};
    if (v->kind != json::Kind::array) throw_value_error("treadle_model_from_json: ", where_, ".", key, " must be a list");
    Shape s;
    for (const auto& item : v->items) s.push_back(to_int(item, key));
    return s;
  }
  // Every member must have been read.
  void finish() const {
    if (!config_ || config_->kind != json::Kind::object) return;
    for (const auto& [name, value] : config_->members) {
      bool known = false;
      for (const auto& t : taken_) known = known || t == name;
      if (!known) throw_value_error("treadle_model_from_json: ", where_, " has no argument '", name, "'");
    }
  }

 private:
  const json::Value* take(const char* key) {
    taken_.emplace_back(key);
    return config_ ? config_->find(key) : nullptr;
  }
  int64_t to_int(const json::Value& v, const char* key) const {
    if (v.kind != json::Kind::number || v.text.find_first_of(".eE") != std::string::npos)
      throw_value_error("treadle_model_from_json: ", where_, ".", key, " must be an integer");
    return integer_number(v.text, "treadle_model_from_json: " + where_, key);
  }
  const json::Value* config_;
  std::string where_;
  std::vector<std::string> taken_;
};


std::shared_ptr<Module> build_layer(const std::string& type, Config& c) {
  using namespace nn;
  if (type == "Linear")
    return std::make_shared<Linear>(c.integer("in_features"), c.integer("out_features"), c.boolean("bias", true));
  static const std::map<std::string, std::string> plain = {{"ReLU", "relu"}, {"SiLU", "silu"}, {"Tanh", "tanh"},
                                                           {"Sigmoid", "sigmoid"}};
  if (auto it = plain.find(type); it != plain.end()) return std::make_shared<Activation>(it->second);
  if (type == "LeakyReLU") return std::make_shared<Activation>("leaky_relu", c.number("negative_slope", 0.01));
  if (type == "ELU") return std::make_shared<Activation>("elu", c.number("alpha", 1.0));
  if (type == "Softplus")
    return std::make_shared<Activation>("softplus", c.number("beta", 1.0), c.number("threshold", 20.0));
  if (type == "GELU") {
    std::string approximate = c.string("approximate", "none");
    if (approximate != "none" && approximate != "tanh")
      throw_value_error("treadle_model_from_json: GELU approximate must be 'none' or 'tanh', got '", approximate, "'");
    return std::make_shared<Activation>(approximate == "none" ? "gelu" : "gelu_tanh");
  }
  if (type == "Softmax" || type == "LogSoftmax")
    return std::make_shared<Activation>(type == "Softmax" ? "softmax" : "log_softmax",
                                        static_cast<double>(c.integer("dim", -1)));
  if (type == "Dropout") return std::make_shared<Dropout>(c.number("p", 0.5));
  if (type == "LayerNorm")
    return std::make_shared<LayerNorm>(c.shape("normalized_shape"), c.number("eps", 1e-5),
                                       c.boolean("elementwise_affine", true), c.boolean("bias", true));
  if (type == "Flatten")
    return std::make_shared<Flatten>(static_cast<int>(c.integer("start_dim", 1)), static_cast<int>(c.integer("end_dim", -1)));
  if (type == "Identity") return std::make_shared<Identity>();
  return nullptr;
}

std::shared_ptr<Module> build_node(const json::Value& node, const std::string& where) {
  const json::Value* type = node.find("type");
  if (node.kind != json::Kind::object || !type || type->kind != json::Kind::string)
    throw_value_error("treadle_model_from_json: ", where, " is not a layer description {\"type\": ...}");
  if (type->text == "Sequential") {
    const json::Value* layers = node.find("layers");
    if (!layers || layers->kind != json::Kind::array)
      throw_value_error("treadle_model_from_json: ", where, " (Sequential) has no list of layers");
    auto seq = std::make_shared<nn::Sequential>();
    for (std::size_t i = 0; i < layers->items.size(); ++i)
      seq->add(build_node(layers->items[i], where + "." + std::to_string(i)));
    return seq;
  }
  Config config(node.find("config"), where + " (" + type->text + ")");
  std::shared_ptr<Module> layer;
  try {
    layer = build_layer(type->text, config);
  } catch (const ValueError& e) {  // the layer's own refusal (an absurd size): say which layer
    const std::string message = e.what();
    if (message.rfind("treadle_model_from_json", 0) == 0) throw;
    throw_value_error("treadle_model_from_json: ", where, " (", type->text, "): ", message);
  }
  if (!layer)
    throw_value_error("treadle_model_from_json: unknown layer type '", type->text, "' at ", where,
                      " (the C API builds Sequential, Linear, activations, Dropout, LayerNorm, Flatten, Identity)");
  config.finish();
  return layer;
}

}  // namespace

std::shared_ptr<Module> build_module(const std::string& text, std::string* canonical) {
  json::Value doc = json::parse(text, "treadle_model_from_json");
  const json::Value* node = &doc;
  if (const json::Value* format = doc.find("format")) {
    if (format->kind != json::Kind::string || format->text != kFormat)
      throw_value_error("treadle_model_from_json: expected format '", kFormat, "', got '", format->text, "'");
    node = doc.find("model");
    if (!node) throw_value_error("treadle_model_from_json: the description has no \"model\"");
  }
  auto module = build_node(*node, "model");
  if (canonical)
    *canonical = node == &doc ? std::string("{\"format\":\"") + kFormat + "\",\"model\":" + text + "}" : text;
  return module;
}

namespace {

// Reads the known torch.optim keyword arguments of one optimizer; unknown keys are errors.
struct OptionReader {
  json::Value doc;
  std::string who;
  std::vector<std::string> taken;
  void read(const char* key, double& out) {
    taken.emplace_back(key);
    if (const json::Value* v = doc.find(key)) {
      if (v->kind != json::Kind::number) throw_value_error(who, ": option '", key, "' must be a number");
      out = finite_number(v->text, who, key);
    }
  }
  void read(const char* key, bool& out) {
    taken.emplace_back(key);
    if (const json::Value* v = doc.find(key)) {
      if (v->kind != json::Kind::boolean) throw_value_error(who, ": option '", key, "' must be true or false");
      out = v->boolean;
    }
  }
  void read_betas(double& b1, double& b2) {
    taken.emplace_back("betas");
    if (const json::Value* v = doc.find("betas")) {
      if (v->kind != json::Kind::array || v->items.size() != 2 || v->items[0].kind != json::Kind::number ||
          v->items[1].kind != json::Kind::number)
        throw_value_error(who, ": option 'betas' must be a list of two numbers");
      b1 = finite_number(v->items[0].text, who, "betas[0]");
      b2 = finite_number(v->items[1].text, who, "betas[1]");
    }
  }
  void finish() const {
    for (const auto& [name, value] : doc.members) {
      bool known = false;
      for (const auto& t : taken) known = known || t == name;
      if (!known) throw_value_error(who, ": unknown option '", name, "'");
    }
  }
};

}  // namespace

std::shared_ptr<Optimizer> build_optimizer(const std::string& name, const std::string& options_json) {
  OptionReader r{json::parse(options_json.empty() ? "{}" : options_json, "treadle_trainer_create"),
                 "treadle_trainer_create (" + name + ")", {}};
  if (r.doc.kind != json::Kind::object) throw_value_error("treadle_trainer_create: options must be a JSON object");
  std::shared_ptr<Optimizer> opt;
  if (name == "sgd") {
    optim::SGDOptions o;
    r.read("lr", o.lr), r.read("momentum", o.momentum), r.read("dampening", o.dampening);
    r.read("weight_decay", o.weight_decay), r.read("nesterov", o.nesterov);
    r.finish();
    opt = optim::sgd(o);
  } else if (name == "adam" || name == "adamw") {
    optim::AdamOptions o;
    if (name == "adamw") o.weight_decay = 1e-2;  // torch.optim.AdamW's default
    r.read("lr", o.lr), r.read_betas(o.beta1, o.beta2), r.read("eps", o.eps);
    r.read("weight_decay", o.weight_decay), r.read("amsgrad", o.amsgrad);
    r.finish();
    opt = name == "adam" ? optim::adam(o) : optim::adamw(o);
  } else if (name == "rmsprop") {
    optim::RMSpropOptions o;
    r.read("lr", o.lr), r.read("alpha", o.alpha), r.read("eps", o.eps), r.read("weight_decay", o.weight_decay);
    r.read("momentum", o.momentum), r.read("centered", o.centered);
    r.finish();
    opt = optim::rmsprop(o);
  } else if (name == "adagrad") {
    optim::AdagradOptions o;
    r.read("lr", o.lr), r.read("lr_decay", o.lr_decay), r.read("weight_decay", o.weight_decay);
    r.read("initial_accumulator_value", o.initial_accumulator_value), r.read("eps", o.eps);
    r.finish();
    opt = optim::adagrad(o);
  } else {
    throw_value_error("treadle_trainer_create: unknown optimizer '", name, "' (sgd, adam, adamw, rmsprop, adagrad)");
  }
  return opt;
}

Loss build_loss(const std::string& name) {
  if (name == "mse") return loss::mse();
  if (name == "l1") return loss::l1();
  if (name == "huber") return loss::huber();
  if (name == "cross_entropy") return loss::cross_entropy();
  if (name == "bce_with_logits") return loss::bce_with_logits();
  throw_value_error("treadle_trainer_create: unknown loss '", name, "' (mse, l1, huber, cross_entropy, bce_with_logits)");
}

}  // namespace treadle::capi

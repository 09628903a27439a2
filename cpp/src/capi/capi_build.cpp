// The C API's factories: modules from architecture JSON (treadle/architecture.hpp, the format tl.save
// writes), optimizers from names and torch.optim keyword arguments, losses from names.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capi/capi_internal.hpp"
#include "treadle/architecture.hpp"
#include "nn/json.hpp"
#include "treadle/error.hpp"

namespace treadle::capi {
namespace {

// A JSON number as a finite double: 1e999 is refused (ValueError naming it), not an internal error.
double finite_number(const std::string& text, const std::string& who, const char* key) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || !std::isfinite(v) || end != text.c_str() + text.size())
    throw_value_error(who, ": ", key, " is ", text, ", outside the range of a finite double");
  return v;
}

}  // namespace

std::shared_ptr<Module> build_module(const std::string& text, std::string* canonical) {
  const architecture::Node root = architecture::parse(text, "treadle_model_from_json", {}, /*allow_bare=*/true);
  auto module = architecture::build(root, "treadle_model_from_json");
  if (canonical) *canonical = architecture::write(root);
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

// The architecture description format (treadle/architecture.hpp): the layer catalog with each type's
// keys, types and defaults, and the reader and writer built on it. The C API and the Python package
// both go through here, so a file one of them writes is read the same way by the other.
#include "treadle/architecture.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "nn/json.hpp"
#include "treadle/error.hpp"
#include "treadle/module.hpp"

namespace treadle::architecture {
namespace {

enum class Type {
  integer,
  number,
  boolean,
  string,         // one of `choices` ("a|b|c"), or any string when choices is null
  dims,           // an integer or a list of integers (a size per spatial dimension)
  int_list,       // a list of integers
  dims_or_mode,   // dims, or one of `choices` (Conv padding: "same", "valid")
  numbers,        // a number or a list of numbers
  strings,        // a string or a list of strings
  sizes_or_none,  // an integer or null, or a list of them (AdaptiveAvgPool output_size)
};

struct Key {
  const char* name;
  Type type;
  const char* fallback;  // the default as JSON text; nullptr: the key is required
  bool nullable = false;
  const char* choices = nullptr;
};

using Catalog = std::vector<std::pair<std::string, std::vector<Key>>>;

// A number as the catalog's defaults write it (as Python's repr does: 0.01, 1.0, 20.0).
std::string number_text(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // an integral value keeps its ".0"
  return s;
}

// The pointwise activations' types come from their one list (nn::activation_modules()): a number
// key per option, with its default.
void add_pointwise_activations(Catalog& c) {
  static std::deque<std::string> defaults;  // the keys' text, alive as long as the catalog
  for (const nn::ActivationModule& m : nn::activation_modules()) {
    std::vector<Key> keys;
    for (const auto& [name, value] : m.params) {
      defaults.push_back(name);
      const char* key = defaults.back().c_str();
      defaults.push_back(number_text(value));
      keys.push_back({key, Type::number, defaults.back().c_str()});
    }
    c.push_back({m.module, std::move(keys)});
  }
}

// Every layer type and its keys, in the order descriptions write them. Defaults are torch.nn's
// (Softmax's dim: the last axis, as a description cannot express torch's implicit choice).
const Catalog& catalog() {
  static const Catalog kinds = [] {
    const Key bias{"bias", Type::boolean, "true"};
    Catalog c = {
        {"Linear", {{"in_features", Type::integer, nullptr}, {"out_features", Type::integer, nullptr}, bias}},
        {"GELU", {{"approximate", Type::string, "\"none\"", false, "none|tanh"}}},
        {"Softmax", {{"dim", Type::integer, "-1"}}},
        {"LogSoftmax", {{"dim", Type::integer, "-1"}}},
        {"Dropout", {{"p", Type::number, "0.5"}}},
        {"Flatten", {{"start_dim", Type::integer, "1"}, {"end_dim", Type::integer, "-1"}}},
        {"Identity", {}},
        {"LayerNorm", {{"normalized_shape", Type::dims, nullptr}, {"eps", Type::number, "1e-05"},
                       {"elementwise_affine", Type::boolean, "true"}, bias}},
        {"RMSNorm", {{"normalized_shape", Type::dims, nullptr}, {"eps", Type::number, "null", true},
                     {"elementwise_affine", Type::boolean, "true"}}},
        {"GroupNorm", {{"num_groups", Type::integer, nullptr}, {"num_channels", Type::integer, nullptr},
                       {"eps", Type::number, "1e-05"}, {"affine", Type::boolean, "true"}, bias}},
        {"Embedding", {{"num_embeddings", Type::integer, nullptr}, {"embedding_dim", Type::integer, nullptr},
                       {"padding_idx", Type::integer, "null", true}, {"max_norm", Type::number, "null", true},
                       {"norm_type", Type::number, "2.0"}, {"scale_grad_by_freq", Type::boolean, "false"},
                       {"sparse", Type::boolean, "false"}}},
        {"Unflatten", {{"dim", Type::integer, nullptr}, {"unflattened_size", Type::int_list, nullptr}}},
        {"OutputTransform", {{"scale", Type::numbers, "1.0"}, {"shift", Type::numbers, "0.0"},
                             {"activations", Type::strings, "\"identity\""}}},
        {"GlobalAvgPool2d", {}},
        {"MultiheadAttention", {{"embed_dim", Type::integer, nullptr}, {"num_heads", Type::integer, nullptr},
                                {"dropout", Type::number, "0.0"}, bias, {"batch_first", Type::boolean, "false"}}},
    };
    for (const char* d : {"1", "2", "3"}) {
      const std::string nd = d;
      c.push_back({"BatchNorm" + nd + "d",
                   {{"num_features", Type::integer, nullptr}, {"eps", Type::number, "1e-05"},
                    {"momentum", Type::number, "0.1", true}, {"affine", Type::boolean, "true"},
                    {"track_running_stats", Type::boolean, "true"}, bias}});
      c.push_back({"Conv" + nd + "d",
                   {{"in_channels", Type::integer, nullptr}, {"out_channels", Type::integer, nullptr},
                    {"kernel_size", Type::dims, nullptr}, {"stride", Type::dims, "1"},
                    {"padding", Type::dims_or_mode, "0", false, "same|valid"}, {"dilation", Type::dims, "1"},
                    {"groups", Type::integer, "1"}, bias,
                    {"padding_mode", Type::string, "\"zeros\"", false, "zeros|reflect|replicate|circular"}}});
      c.push_back({"ConvTranspose" + nd + "d",
                   {{"in_channels", Type::integer, nullptr}, {"out_channels", Type::integer, nullptr},
                    {"kernel_size", Type::dims, nullptr}, {"stride", Type::dims, "1"}, {"padding", Type::dims, "0"},
                    {"output_padding", Type::dims, "0"}, {"groups", Type::integer, "1"}, bias,
                    {"dilation", Type::dims, "1"}}});
      c.push_back({"MaxPool" + nd + "d",
                   {{"kernel_size", Type::dims, nullptr}, {"stride", Type::dims, "null", true},
                    {"padding", Type::dims, "0"}, {"dilation", Type::dims, "1"},
                    {"return_indices", Type::boolean, "false"}, {"ceil_mode", Type::boolean, "false"}}});
      c.push_back({"MaxUnpool" + nd + "d", {{"kernel_size", Type::dims, nullptr},
                                            {"stride", Type::dims, "null", true}, {"padding", Type::dims, "0"}}});
      std::vector<Key> avg = {{"kernel_size", Type::dims, nullptr}, {"stride", Type::dims, "null", true},
                              {"padding", Type::dims, "0"}, {"ceil_mode", Type::boolean, "false"},
                              {"count_include_pad", Type::boolean, "true"}};
      if (nd != "1") avg.push_back({"divisor_override", Type::integer, "null", true});  // torch's AvgPool1d has none
      c.push_back({"AvgPool" + nd + "d", avg});
      c.push_back({"AdaptiveAvgPool" + nd + "d", {{"output_size", Type::sizes_or_none, nullptr}}});
    }
    const std::vector<Key> recurrent = {{"input_size", Type::integer, nullptr}, {"hidden_size", Type::integer, nullptr},
                                        {"num_layers", Type::integer, "1"}, bias,
                                        {"batch_first", Type::boolean, "false"}, {"dropout", Type::number, "0.0"},
                                        {"bidirectional", Type::boolean, "false"}};
    std::vector<Key> rnn = recurrent;
    rnn.push_back({"nonlinearity", Type::string, "\"tanh\"", false, "tanh|relu"});
    std::vector<Key> projected = recurrent;
    projected.push_back({"proj_size", Type::integer, nullptr});
    c.push_back({"RNN", rnn});
    c.push_back({"GRU", recurrent});
    c.push_back({"LSTM", recurrent});
    c.push_back({"ProjectedLSTM", projected});  // tl.nn.LSTM(proj_size > 0), composed in Python
    const std::vector<Key> layer = {
        {"d_model", Type::integer, nullptr}, {"nhead", Type::integer, nullptr},
        {"dim_feedforward", Type::integer, "2048"}, {"dropout", Type::number, "0.1"},
        {"activation", Type::string, "\"relu\"", false, "relu|gelu"}, {"layer_norm_eps", Type::number, "1e-05"},
        {"batch_first", Type::boolean, "false"}, {"norm_first", Type::boolean, "false"}, bias};
    c.push_back({"TransformerEncoderLayer", layer});
    c.push_back({"TransformerDecoderLayer", layer});
    c.push_back({"Transformer",
                 {{"d_model", Type::integer, "512"}, {"nhead", Type::integer, "8"},
                  {"num_encoder_layers", Type::integer, "6"}, {"num_decoder_layers", Type::integer, "6"},
                  {"dim_feedforward", Type::integer, "2048"}, {"dropout", Type::number, "0.1"},
                  {"activation", Type::string, "\"relu\"", false, "relu|gelu"},
                  {"layer_norm_eps", Type::number, "1e-05"}, {"batch_first", Type::boolean, "false"},
                  {"norm_first", Type::boolean, "false"}, bias}});
    add_pointwise_activations(c);
    return c;
  }();
  return kinds;
}

const std::vector<Key>* find_kind(const std::string& type) {
  for (const auto& [name, keys] : catalog())
    if (name == type) return &keys;
  return nullptr;
}

// Constructor arguments that a layer takes but an architecture does not hold: the dtype is the
// file's own, the device is the host's, inplace changes nothing in a plan, initial weights are the
// file's tensors.
bool outside_architecture(const std::string& name) {
  for (const char* n : {"dtype", "device", "inplace", "_weight", "_freeze"})
    if (name == n) return true;
  return false;
}

bool is_integer_literal(const json::Value& v) {
  return v.kind == json::Kind::number && v.text.find_first_of(".eE") == std::string::npos;
}

// Checks one value against its key and appends its canonical text; `at` names it in messages.
class Checker {
 public:
  explicit Checker(std::string at) : at_(std::move(at)) {}

  void value(const json::Value& v, const Key& k, std::string& out) const {
    if (v.kind == json::Kind::null && (k.nullable || (k.type == Type::sizes_or_none))) {
      out += "null";
      return;
    }
    switch (k.type) {
      case Type::integer: return integer(v, out);
      case Type::number: return number(v, out);
      case Type::boolean:
        if (v.kind != json::Kind::boolean) fail("must be true or false, got ", shown(v));
        out += v.boolean ? "true" : "false";
        return;
      case Type::string: return string(v, k.choices, out);
      case Type::dims:
        if (v.kind == json::Kind::number) return integer(v, out);
        return list(v, out, "an integer or a list of integers", [&](const json::Value& e) { integer(e, out); });
      case Type::int_list:
        return list(v, out, "a list of integers", [&](const json::Value& e) { integer(e, out); });
      case Type::dims_or_mode:
        if (v.kind == json::Kind::string) return string(v, k.choices, out);
        if (v.kind == json::Kind::number) return integer(v, out);
        return list(v, out, std::string("an integer, a list of integers or one of ") + quoted(k.choices),
                    [&](const json::Value& e) { integer(e, out); });
      case Type::numbers:
        if (v.kind == json::Kind::number) return number(v, out);
        return list(v, out, "a number or a list of numbers", [&](const json::Value& e) { number(e, out); });
      case Type::strings:
        if (v.kind == json::Kind::string) return string(v, nullptr, out);
        return list(v, out, "a string or a list of strings", [&](const json::Value& e) { string(e, nullptr, out); });
      case Type::sizes_or_none: {
        auto one = [&](const json::Value& e) { e.kind == json::Kind::null ? void(out += "null") : integer(e, out); };
        if (v.kind == json::Kind::number) return integer(v, out);
        return list(v, out, "an integer, null or a list of them", one);
      }
    }
  }

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw_value_error(at_, " ", args...);
  }

 private:
  void integer(const json::Value& v, std::string& out) const {
    if (!is_integer_literal(v)) fail("must be an integer, got ", shown(v));
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(v.text.c_str(), &end, 10);
    if (errno == ERANGE || end != v.text.c_str() + v.text.size())
      throw_value_error(at_, " is ", v.text, ", outside the range of a 64-bit integer");
    out += std::to_string(n);
  }
  void number(const json::Value& v, std::string& out) const {
    if (v.kind != json::Kind::number) fail("must be a number, got ", shown(v));
    errno = 0;
    char* end = nullptr;
    const double d = std::strtod(v.text.c_str(), &end);
    if (errno == ERANGE || !std::isfinite(d) || end != v.text.c_str() + v.text.size())
      throw_value_error(at_, " is ", v.text, ", outside the range of a finite double");
    out += v.text;
  }
  void string(const json::Value& v, const char* choices, std::string& out) const {
    if (v.kind != json::Kind::string) fail("must be a string, got ", shown(v));
    if (choices) {
      bool ok = false;
      std::string rest = choices;
      for (std::size_t at = 0; at <= rest.size();) {
        const std::size_t bar = rest.find('|', at);
        ok = ok || rest.substr(at, bar == std::string::npos ? std::string::npos : bar - at) == v.text;
        if (bar == std::string::npos) break;
        at = bar + 1;
      }
      if (!ok) fail("must be ", quoted(choices), ", got '", v.text, "'");
    }
    json::write_string(out, v.text);
  }
  template <typename Fn>
  void list(const json::Value& v, std::string& out, const std::string& what, Fn each) const {
    if (v.kind != json::Kind::array) fail("must be ", what, ", got ", shown(v));
    out += '[';
    for (std::size_t i = 0; i < v.items.size(); ++i) {
      if (i) out += ',';
      each(v.items[i]);
    }
    out += ']';
  }
  static std::string shown(const json::Value& v) {
    if (v.kind == json::Kind::number) return v.text;
    if (v.kind == json::Kind::string) return "'" + v.text + "'";
    return json::kind_name(v.kind);
  }
  static std::string quoted(const char* choices) {
    std::string s = "'";
    for (const char* c = choices; *c; ++c) s += *c == '|' ? std::string("' or '") : std::string(1, *c);
    return s + "'";
  }
  std::string at_;
};

// Writes any JSON value back (a registered layer's config), refusing numbers that are no finite double.
void write_any(const json::Value& v, const std::string& at, std::string& out) {
  switch (v.kind) {
    case json::Kind::null: out += "null"; return;
    case json::Kind::boolean: out += v.boolean ? "true" : "false"; return;
    case json::Kind::number: {
      const double d = std::strtod(v.text.c_str(), nullptr);
      if (!std::isfinite(d)) throw_value_error(at, " is ", v.text, ", outside the range of a finite double");
      out += v.text;
      return;
    }
    case json::Kind::string: json::write_string(out, v.text); return;
    case json::Kind::array:
      out += '[';
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ',';
        write_any(v.items[i], at + "[" + std::to_string(i) + "]", out);
      }
      out += ']';
      return;
    case json::Kind::object:
      out += '{';
      for (std::size_t i = 0; i < v.members.size(); ++i) {
        if (i) out += ',';
        json::write_string(out, v.members[i].first);
        out += ':';
        write_any(v.members[i].second, at + "." + v.members[i].first, out);
      }
      out += '}';
      return;
  }
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  for (const auto& n : names)
    if (n == name) return true;
  return false;
}

// The canonical config of one layer: every key of its type, checked, defaults filled in.
std::string complete_config(const std::string& who, const std::string& where, const std::string& type,
                            const json::Value* config, bool registered) {
  const std::string at = who + ": " + where + " (" + type + ")";
  if (config && config->kind != json::Kind::object && config->kind != json::Kind::null)
    throw_value_error(who, ": config of ", where, " (", type, ") is not an object, got ", json::kind_name(config->kind));
  const bool present = config && config->kind == json::Kind::object;
  std::string out;
  if (registered) {
    if (!present) return "{}";
    write_any(*config, at + ".config", out);
    return out;
  }
  const std::vector<Key>& keys = *find_kind(type);
  if (present) {
    for (const auto& [name, value] : config->members) {
      bool known = false;
      for (const Key& k : keys) known = known || name == k.name;
      if (known) continue;
      std::string takes;
      for (const Key& k : keys) takes += (takes.empty() ? "" : ", ") + std::string(k.name);
      throw_value_error(at, " has no argument '", name, "' (", type,
                        takes.empty() ? " takes none" : " takes " + takes, ")");
    }
  }
  out += '{';
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Key& k = keys[i];
    const json::Value* v = present ? config->find(k.name) : nullptr;
    json::Value fallback;
    if (!v) {
      if (!k.fallback) throw_value_error(at, " needs config.", k.name);
      fallback = json::parse(k.fallback, "architecture defaults");
      v = &fallback;
    }
    if (i) out += ',';
    json::write_string(out, k.name);
    out += ':';
    Checker(at + "." + k.name).value(*v, k, out);
  }
  out += '}';
  return out;
}

std::string known_types() {
  std::string s = "Sequential";
  for (const auto& [name, keys] : catalog()) s += ", " + name;
  return s;
}

Node read_node(const json::Value& node, const std::string& where, const std::string& who,
               const std::vector<std::string>& registered) {
  const json::Value* type = node.find("type");
  if (node.kind != json::Kind::object || !type || type->kind != json::Kind::string)
    throw_value_error(who, ": ", where, " is not a layer description {\"type\": ...}, got ",
                      node.kind == json::Kind::object ? "an object without a string \"type\"" : json::kind_name(node.kind));
  Node out;
  out.type = type->text;
  out.where = where;
  out.sequential = type->text == "Sequential";
  for (const auto& [name, value] : node.members)
    if (name != "type" && name != (out.sequential ? "layers" : "config"))
      throw_value_error(who, ": ", where, " (", type->text, ") has an unknown member '", name, "' (a node holds \"type\" and ",
                        out.sequential ? "\"layers\"" : "\"config\"", ")");
  if (out.sequential) {
    const json::Value* layers = node.find("layers");
    if (!layers || layers->kind != json::Kind::array)
      throw_value_error(who, ": ", where, " (Sequential) has no list of layers");
    for (std::size_t i = 0; i < layers->items.size(); ++i)
      out.layers.push_back(read_node(layers->items[i], where + "." + std::to_string(i), who, registered));
    return out;
  }
  const bool is_registered = !find_kind(out.type) && contains(registered, out.type);
  if (!find_kind(out.type) && !is_registered)
    throw_value_error(who, ": unknown layer type '", out.type, "' at ", where, " (the format knows ", known_types(),
                      "; in Python, tl.io.register_layer adds a type before loading)");
  out.config = complete_config(who, where, out.type, node.find("config"), is_registered);
  return out;
}

void write_node(const Node& node, std::string& out) {
  out += "{\"type\":";
  json::write_string(out, node.type);
  if (node.sequential) {
    out += ",\"layers\":[";
    for (std::size_t i = 0; i < node.layers.size(); ++i) {
      if (i) out += ',';
      write_node(node.layers[i], out);
    }
    out += "]}";
    return;
  }
  out += ",\"config\":" + node.config + "}";
}

Node describe_node(const Layer& layer, const std::string& where) {
  Node out;
  out.where = where;
  if (layer.sequential) {
    out.sequential = true;
    out.type = "Sequential";
    for (std::size_t i = 0; i < layer.layers.size(); ++i)
      out.layers.push_back(describe_node(layer.layers[i], where + "." + std::to_string(i)));
    return out;
  }
  const bool builtin = !layer.type.empty() && !layer.registered && find_kind(layer.type);
  if (!builtin && !layer.registered)
    throw_value_error("describe: ", layer.class_name, " is a custom module; register it with "
                      "tl.io.register_layer(cls, config) or save weights only and load them with "
                      "tl.load(path, model=net)");
  out.type = layer.type;
  std::string text = "{";
  bool first = true;
  for (const Argument& a : layer.arguments) {
    if (builtin && outside_architecture(a.name)) continue;
    if (a.json.empty())
      throw_value_error("describe: ", where, " (", layer.type, ").", a.name, " is ", a.not_json,
                        ", which an architecture description cannot hold");
    if (!first) text += ',';
    first = false;
    json::write_string(text, a.name);
    text += ':' + a.json;
  }
  text += '}';
  const json::Value config = json::parse(text, "describe: " + where + " (" + layer.type + ")");
  out.config = complete_config("describe", where, layer.type, &config, layer.registered);
  return out;
}

}  // namespace

std::vector<std::string> layer_types() {
  std::vector<std::string> names;
  for (const auto& [name, keys] : catalog()) names.push_back(name);
  return names;
}

Node parse(std::string_view text, const std::string& who, const std::vector<std::string>& registered, bool allow_bare) {
  const json::Value doc = json::parse(text, who);
  const json::Value* format = doc.find("format");
  if (!format) {
    if (allow_bare && doc.kind == json::Kind::object) return read_node(doc, "model", who, registered);
    throw_value_error(who, ": expected an architecture description {\"format\": \"", kFormat,
                      "\", \"model\": ...}, got ", doc.kind == json::Kind::object ? "an object without \"format\""
                                                                                   : json::kind_name(doc.kind));
  }
  if (format->kind != json::Kind::string || format->text != kFormat) {
    std::string shown;
    write_any(*format, who, shown);
    throw_value_error(who, ": expected an architecture description of format '", kFormat, "', got ", shown);
  }
  for (const auto& [name, value] : doc.members)
    if (name != "format" && name != "model")
      throw_value_error(who, ": the description has an unknown member '", name, "' (it holds \"format\" and \"model\")");
  const json::Value* model = doc.find("model");
  if (!model) throw_value_error(who, ": the description has no \"model\"");
  return read_node(*model, "model", who, registered);
}

std::string describe(const Layer& root) { return write(describe_node(root, "model")); }

std::string write(const Node& root) {
  std::string out = "{\"format\":";
  json::write_string(out, kFormat);
  out += ",\"model\":";
  write_node(root, out);
  return out + "}";
}

}  // namespace treadle::architecture

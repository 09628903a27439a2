// C++ modules from a checked architecture description (treadle/architecture.hpp): what the C API
// builds. The configs are complete and checked by parse(), so this only maps keys to constructors;
// a module's own refusal (an absurd size) is reported with the node it came from.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "nn/json.hpp"
#include "treadle/architecture.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_attention.hpp"
#include "treadle/nn_conv.hpp"
#include "treadle/nn_layers.hpp"
#include "treadle/nn_recurrent.hpp"

namespace treadle::architecture {
namespace {

// Typed access to a complete, checked config.
class Config {
 public:
  explicit Config(const Node& node) : v_(json::parse(node.config, "architecture")) {}
  int64_t integer(const char* key) const { return std::strtoll(get(key).text.c_str(), nullptr, 10); }
  std::optional<int64_t> optional_integer(const char* key) const {
    return get(key).kind == json::Kind::null ? std::nullopt : std::optional<int64_t>(integer(key));
  }
  double number(const char* key) const { return std::strtod(get(key).text.c_str(), nullptr); }
  std::optional<double> optional_number(const char* key) const {
    return get(key).kind == json::Kind::null ? std::nullopt : std::optional<double>(number(key));
  }
  bool boolean(const char* key) const { return get(key).boolean; }
  const std::string& string(const char* key) const { return get(key).text; }
  bool is_null(const char* key) const { return get(key).kind == json::Kind::null; }
  bool is_string(const char* key) const { return get(key).kind == json::Kind::string; }
  // An integer or a list of integers (null: empty).
  Shape shape(const char* key) const {
    const json::Value& v = get(key);
    if (v.kind == json::Kind::number) return {std::strtoll(v.text.c_str(), nullptr, 10)};
    Shape s;
    for (const auto& item : v.items) s.push_back(std::strtoll(item.text.c_str(), nullptr, 10));
    return s;
  }
  // AdaptiveAvgPool's output_size: null entries (keep the input's size) are -1.
  Shape sizes(const char* key) const {
    const json::Value& v = get(key);
    if (v.kind != json::Kind::array) return {v.kind == json::Kind::null ? -1 : integer(key)};
    Shape s;
    for (const auto& item : v.items)
      s.push_back(item.kind == json::Kind::null ? -1 : std::strtoll(item.text.c_str(), nullptr, 10));
    return s;
  }
  std::vector<double> numbers(const char* key) const {
    const json::Value& v = get(key);
    if (v.kind == json::Kind::number) return {number(key)};
    std::vector<double> out;
    for (const auto& item : v.items) out.push_back(std::strtod(item.text.c_str(), nullptr));
    return out;
  }
  std::vector<std::string> strings(const char* key) const {
    const json::Value& v = get(key);
    if (v.kind == json::Kind::string) return {v.text};
    std::vector<std::string> out;
    for (const auto& item : v.items) out.push_back(item.text);
    return out;
  }

 private:
  const json::Value& get(const char* key) const {
    const json::Value* v = v_.find(key);
    if (!v) throw_runtime_error("architecture: an unchecked config lacks '", key, "'");
    return *v;
  }
  json::Value v_;
};

std::shared_ptr<Module> activation(const std::string& type, const Config& c) {
  using nn::Activation;
  for (const nn::ActivationModule& m : nn::activation_modules()) {  // the pointwise ones, from their list
    if (type != m.module) continue;
    double p[2] = {Activation::kDefault, Activation::kDefault};
    for (std::size_t i = 0; i < m.params.size() && i < 2; ++i) p[i] = c.number(m.params[i].first.c_str());
    return std::make_shared<Activation>(m.op, p[0], p[1]);
  }
  if (type == "GELU") return std::make_shared<Activation>(c.string("approximate") == "none" ? "gelu" : "gelu_tanh");
  if (type == "Softmax" || type == "LogSoftmax")
    return std::make_shared<Activation>(type == "Softmax" ? "softmax" : "log_softmax",
                                        static_cast<double>(c.integer("dim")));
  return nullptr;
}

std::shared_ptr<Module> layer(const std::string& type, const Config& c) {
  using namespace nn;
  if (auto a = activation(type, c)) return a;
  if (type == "Linear") return std::make_shared<Linear>(c.integer("in_features"), c.integer("out_features"), c.boolean("bias"));
  if (type == "Dropout") return std::make_shared<Dropout>(c.number("p"));
  if (type == "Flatten")
    return std::make_shared<Flatten>(static_cast<int>(c.integer("start_dim")), static_cast<int>(c.integer("end_dim")));
  if (type == "Identity") return std::make_shared<Identity>();
  if (type == "LayerNorm")
    return std::make_shared<LayerNorm>(c.shape("normalized_shape"), c.number("eps"), c.boolean("elementwise_affine"),
                                       c.boolean("bias"));
  if (type == "RMSNorm")
    return std::make_shared<RMSNorm>(c.shape("normalized_shape"), c.optional_number("eps"), c.boolean("elementwise_affine"));
  if (type == "GroupNorm")
    return std::make_shared<GroupNorm>(c.integer("num_groups"), c.integer("num_channels"), c.number("eps"),
                                       c.boolean("affine"), DType::f32, c.boolean("bias"));
  if (type.rfind("BatchNorm", 0) == 0)
    return std::make_shared<BatchNorm>(type[9] - '0', c.integer("num_features"), c.number("eps"),
                                       c.optional_number("momentum"), c.boolean("affine"),
                                       c.boolean("track_running_stats"), DType::f32, c.boolean("bias"));
  if (type == "Embedding")
    return std::make_shared<Embedding>(
        c.integer("num_embeddings"), c.integer("embedding_dim"), c.optional_integer("padding_idx"), DType::f32,
        ops::EmbeddingOptions{c.optional_number("max_norm"), c.number("norm_type"), c.boolean("scale_grad_by_freq")});
  if (type == "Unflatten") return std::make_shared<Unflatten>(static_cast<int>(c.integer("dim")), c.shape("unflattened_size"));
  if (type == "OutputTransform")
    return std::make_shared<OutputTransform>(c.numbers("scale"), c.numbers("shift"), c.strings("activations"));
  if (type == "GlobalAvgPool2d") return std::make_shared<GlobalAvgPool2d>();
  if (type == "MultiheadAttention")
    return std::make_shared<MultiheadAttention>(c.integer("embed_dim"), c.integer("num_heads"), c.number("dropout"),
                                                c.boolean("bias"), c.boolean("batch_first"));
  if (type == "TransformerEncoderLayer")
    return std::make_shared<TransformerEncoderLayer>(
        c.integer("d_model"), c.integer("nhead"), c.integer("dim_feedforward"), c.number("dropout"),
        c.string("activation"), c.number("layer_norm_eps"), c.boolean("batch_first"), c.boolean("norm_first"),
        c.boolean("bias"));
  if (type == "RNN" || type == "GRU" || type == "LSTM") {
    RecurrentOptions o;
    o.num_layers = c.integer("num_layers"), o.bias = c.boolean("bias"), o.batch_first = c.boolean("batch_first");
    o.dropout = c.number("dropout"), o.bidirectional = c.boolean("bidirectional");
    if (type == "RNN") return std::make_shared<RNN>(c.integer("input_size"), c.integer("hidden_size"), o, c.string("nonlinearity"));
    if (type == "GRU") return std::make_shared<GRU>(c.integer("input_size"), c.integer("hidden_size"), o);
    return std::make_shared<LSTM>(c.integer("input_size"), c.integer("hidden_size"), o);
  }
  return nullptr;
}

// Convolutions and pooling: the spatial rank is the type's last digit before "d".
std::shared_ptr<Module> spatial(const std::string& type, const Config& c, const std::string& at) {
  using namespace nn;
  const int nd = type[type.size() - 2] - '0';
  const std::string base = type.substr(0, type.size() - 2);
  if (base == "Conv") {
    if (c.string("padding_mode") != "zeros")
      throw_value_error(at, " padding_mode '", c.string("padding_mode"), "' is composed by the Python package only");
    ConvPadding pad = c.is_string("padding") ? ConvPadding(c.string("padding")) : ConvPadding(c.shape("padding"));
    return std::make_shared<ConvNd>(nd, c.integer("in_channels"), c.integer("out_channels"), c.shape("kernel_size"),
                                    c.shape("stride"), pad, c.shape("dilation"), c.integer("groups"), c.boolean("bias"));
  }
  if (base == "ConvTranspose")
    return std::make_shared<ConvTransposeNd>(nd, c.integer("in_channels"), c.integer("out_channels"),
                                             c.shape("kernel_size"), c.shape("stride"), c.shape("padding"),
                                             c.shape("output_padding"), c.integer("groups"), c.boolean("bias"),
                                             c.shape("dilation"));
  if (base == "MaxPool") {
    if (c.boolean("return_indices")) throw_value_error(at, " return_indices=true is built by the Python package only");
    return std::make_shared<MaxPoolNd>(nd, c.shape("kernel_size"), c.is_null("stride") ? Shape{} : c.shape("stride"),
                                       c.shape("padding"), c.shape("dilation"), c.boolean("ceil_mode"));
  }
  if (base == "AvgPool")
    return std::make_shared<AvgPoolNd>(nd, c.shape("kernel_size"), c.is_null("stride") ? Shape{} : c.shape("stride"),
                                       c.shape("padding"), c.boolean("ceil_mode"), c.boolean("count_include_pad"),
                                       nd == 1 ? 0 : c.optional_integer("divisor_override").value_or(0));
  if (base == "AdaptiveAvgPool") return std::make_shared<AdaptiveAvgPoolNd>(nd, c.sizes("output_size"));
  return nullptr;
}

std::shared_ptr<Module> build_node(const Node& node, const std::string& who) {
  if (node.sequential) {
    auto seq = std::make_shared<nn::Sequential>();
    for (const Node& child : node.layers) seq->add(build_node(child, who));
    return seq;
  }
  const std::string at = who + ": " + node.where + " (" + node.type + ")";
  std::shared_ptr<Module> module;
  try {
    const Config config(node);
    module = layer(node.type, config);
    if (!module && node.type.size() > 2 && node.type.back() == 'd') module = spatial(node.type, config, at);
  } catch (const ValueError& e) {  // the module's own refusal (an absurd size): say which node
    const std::string message = e.what();
    if (message.rfind(who, 0) == 0) throw;
    throw_value_error(at, ": ", message);
  }
  if (!module)
    throw_value_error(at, " is a layer that only the Python package composes (tl.load builds it; the C API "
                      "builds the layers that are C++ modules)");
  return module;
}

}  // namespace

std::shared_ptr<Module> build(const Node& root, const std::string& who) { return build_node(root, who); }

}  // namespace treadle::architecture

#pragma once
// The architecture description format "treadle-architecture/1": the JSON a model file carries so
// that a loader rebuilds the model (tl.save / tl.load, treadle_model_from_json, treadle_model_load).
//
//   {"format": "treadle-architecture/1", "model": node}
//   node = {"type": "Sequential", "layers": [node, ...]} | {"type": name, "config": {...}}
//
// `config` holds the layer's constructor arguments under torch.nn's keyword names. This file is the
// one implementation of the format: which layer types exist, which keys each takes, their types and
// defaults, and the checks with their messages. The C API builds C++ modules from it; the Python
// package builds tl.nn objects from the checked, completed configurations it returns, and describes
// a model by handing each layer's constructor arguments here.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "treadle/module.hpp"

namespace treadle::architecture {

inline constexpr const char* kFormat = "treadle-architecture/1";

// A checked node: a Sequential (its layers) or one layer, whose `config` is a JSON object holding
// every key of that layer type (defaults filled in) in the format's order.
struct Node {
  bool sequential = false;
  std::string type;
  std::string config;  // JSON object text (layers only)
  std::string where;   // "model", "model.0", ...: where the node sits, for messages
  std::vector<Node> layers;
};

// The layer types the format knows, besides Sequential.
TREADLE_API std::vector<std::string> layer_types();

// Reads and checks a description (JSON text). `registered`: type names a host added (their config
// is any JSON object, kept as given). `allow_bare`: a bare node without the format wrapper is
// accepted (the C API's shorthand). Errors are ValueError "<who>: <problem>", naming the node and
// key: unknown layer types, unknown or missing keys, values of the wrong type, numbers outside the
// range of a 64-bit integer or a finite double, a wrong format string.
TREADLE_API Node parse(std::string_view text, const std::string& who, const std::vector<std::string>& registered = {},
                       bool allow_bare = false);

// The compact JSON text of a checked description, with the format wrapper (what model files hold).
TREADLE_API std::string write(const Node& root);

// One constructor argument of a layer as a host holds it: its value as JSON text, or (`json` empty)
// what the value is that JSON cannot hold ("a function", "nan").
struct Argument {
  std::string name;
  std::string json;
  std::string not_json;
};

// A module to describe: a Sequential (its layers) or a layer with its constructor arguments.
// `type` is empty for a module the host cannot name (a custom class, `class_name` says which).
struct Layer {
  bool sequential = false;
  std::string type;
  std::string class_name;
  bool registered = false;  // a host-registered type: its arguments are written as given
  std::vector<Argument> arguments;
  std::vector<Layer> layers;
};

// The description of `root` (JSON text, compact). Arguments that are not part of an architecture
// (dtype: a file's own; device; inplace; initial weights) are left out; every other argument is
// checked as parse() checks it. ValueError "describe: ..." for a custom module or a value the format
// cannot hold.
TREADLE_API std::string describe(const Layer& root);

// C++ modules for a checked description (the C API's models). Layers that only the Python package
// composes (ProjectedLSTM, MaxUnpool, TransformerDecoderLayer, Transformer, convolutions with a
// padding_mode other than "zeros", ...) are refused by name.
TREADLE_API std::shared_ptr<Module> build(const Node& root, const std::string& who);

}  // namespace treadle::architecture

// Bindings for files (treadle/serialize.hpp): safetensors reading and writing, model files and
// training checkpoints; architecture descriptions (treadle/architecture.hpp). Format errors are ValueError; failures of the file system are OSError with
// the errno, so `FileNotFoundError` and friends work as usual.
#include <cmath>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "bindings.hpp"
#include "treadle/architecture.hpp"
#include "treadle/error.hpp"
#include "treadle/serialize.hpp"

namespace treadle::py_bind {
namespace {

// Runs `fn` without the GIL, turning std::system_error into OSError(errno, message).
template <typename Fn>
auto io_call(Fn&& fn) -> decltype(fn()) {
  int err = 0;
  std::string what;
  try {
    py::gil_scoped_release release;
    return fn();
  } catch (const std::system_error& e) {
    err = e.code().value();
    what = e.what();
  }
  PyErr_SetObject(PyExc_OSError, py::make_tuple(err, what).ptr());
  throw py::error_already_set();
}

Metadata metadata_from(const py::handle& obj) {
  Metadata m;
  if (obj.is_none()) return m;
  for (auto [k, v] : py::cast<py::dict>(obj)) {
    if (!py::isinstance<py::str>(k) || !py::isinstance<py::str>(v))
      throw_type_error("metadata: keys and values must be strings, got ", std::string(py::repr(k)), ": ",
                       std::string(py::repr(v)));
    m.emplace(k.cast<std::string>(), v.cast<std::string>());
  }
  return m;
}

py::dict metadata_to(const Metadata& m) {
  py::dict d;
  for (const auto& [k, v] : m) d[py::str(k)] = py::str(v);
  return d;
}

// (name, array) pairs or a dict; arrays are wrapped without copying (the caller keeps them alive).
NamedTensors tensors_from(const py::handle& obj) {
  NamedTensors out;
  py::object items = py::isinstance<py::dict>(obj) ? obj.attr("items")() : py::reinterpret_borrow<py::object>(obj);
  for (const py::handle item : items) {
    auto pair = py::cast<py::tuple>(item);
    if (pair.size() != 2) throw_value_error("save_safetensors: expected (name, array) pairs");
    std::string name = py::cast<std::string>(pair[0]);
    out.emplace_back(name, tensor_from_numpy(pair[1], ("save_safetensors['" + name + "']").c_str()));
  }
  return out;
}

py::tuple file_to_python(const TensorFile& f) {
  py::dict tensors;
  for (const auto& [name, t] : f.tensors) tensors[py::str(name)] = numpy_copy(t);
  return py::make_tuple(tensors, metadata_to(f.metadata));
}


// A Python value as JSON text; nullopt with `what` saying what the value is when JSON cannot hold it
// (a function, an array, a non-finite float) and `at` where it sits inside `v`.
std::optional<std::string> json_of(const py::handle& v, std::string& what, std::string& at) {
  if (v.is_none()) return std::string("null");
  if (py::isinstance<py::bool_>(v) || std::string(py::type::of(v).attr("__name__").cast<std::string>()) == "bool_")
    return std::string(PyObject_IsTrue(v.ptr()) ? "true" : "false");
  if (py::isinstance<py::str>(v)) return py::module_::import("json").attr("dumps")(v).cast<std::string>();
  if (PyIndex_Check(v.ptr())) return std::string(py::str(py::int_(py::reinterpret_borrow<py::object>(v))));
  if (PyFloat_Check(v.ptr()) || py::hasattr(v, "__float__") && !py::hasattr(v, "__len__")) {
    const double d = py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
    if (!std::isfinite(d)) {
      what = std::string(py::repr(py::float_(d))) + " (not a finite number)";
      return std::nullopt;
    }
    return std::string(py::repr(py::float_(d)));
  }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out = "[";
    std::size_t i = 0;
    for (const auto& item : v) {
      auto text = json_of(item, what, at);
      if (!text) {
        at = "[" + std::to_string(i) + "]" + at;
        return std::nullopt;
      }
      out += (i++ ? "," : "") + *text;
    }
    return out + "]";
  }
  if (py::isinstance<py::dict>(v)) {
    std::string out = "{";
    bool first = true;
    for (auto [key, item] : py::reinterpret_borrow<py::dict>(v)) {
      if (!py::isinstance<py::str>(key)) {
        what = "a dict with the key " + std::string(py::repr(key)) + " (JSON keys are strings)";
        return std::nullopt;
      }
      auto text = json_of(item, what, at);
      if (!text) {
        at = "." + key.cast<std::string>() + at;
        return std::nullopt;
      }
      out += (first ? "" : ",") + py::module_::import("json").attr("dumps")(key).cast<std::string>() + ":" + *text;
      first = false;
    }
    return out + "}";
  }
  what = "a " + py::type::of(v).attr("__name__").cast<std::string>();
  return std::nullopt;
}

// A module tree as the Python package walks it: a list (a Sequential's layers) or a tuple
// (type, class name, registered, constructor arguments).
architecture::Layer layer_of(const py::handle& node) {
  architecture::Layer layer;
  if (py::isinstance<py::list>(node)) {
    layer.sequential = true;
    for (const auto& child : node) layer.layers.push_back(layer_of(child));
    return layer;
  }
  const auto t = py::cast<py::tuple>(node);
  if (t.size() != 4) throw_type_error("architecture_describe: a layer is (type, class name, registered, arguments)");
  layer.type = t[0].is_none() ? "" : t[0].cast<std::string>();
  layer.class_name = t[1].cast<std::string>();
  layer.registered = t[2].cast<bool>();
  for (auto [key, value] : py::cast<py::dict>(t[3])) {
    std::string what, at;
    auto text = json_of(value, what, at);
    std::string name = py::str(key);
    layer.arguments.push_back({name, text.value_or(""), text ? "" : what + (at.empty() ? "" : " at " + name + at)});
  }
  return layer;
}

// A checked node for the Python package: a list (a Sequential's layers) or a tuple (type,
// constructor arguments, where).
py::object to_python(const architecture::Node& node, const py::object& loads) {
  if (node.sequential) {
    py::list layers;
    for (const auto& child : node.layers) layers.append(to_python(child, loads));
    return std::move(layers);
  }
  return py::make_tuple(node.type, loads(node.config), node.where);
}

}  // namespace

void bind_serialize(py::module_& m) {
  m.def("save_safetensors", [](const std::string& path, const py::handle& tensors, const py::object& metadata) {
    NamedTensors t = tensors_from(tensors);
    Metadata md = metadata_from(metadata);
    io_call([&] { save_safetensors(path, t, md); });
  }, py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
     "Writes tensors (dict or (name, array) pairs) and string metadata to a safetensors file, atomically.");
  m.def("safetensors_bytes", [](const py::handle& tensors, const py::object& metadata) {
    NamedTensors t = tensors_from(tensors);
    std::string out = safetensors_bytes(t, metadata_from(metadata));
    return py::bytes(out);
  }, py::arg("tensors"), py::arg("metadata") = py::none());
  m.def("load_safetensors", [](const std::string& path) {
    TensorFile f = io_call([&] { return load_safetensors(path); });
    return file_to_python(f);
  }, py::arg("path"), "Reads and verifies a safetensors file: ({name: array}, {key: value}) in payload order.");
  m.def("parse_safetensors", [](const py::bytes& data) {
    std::string_view view(data);
    TensorFile f;
    {
      py::gil_scoped_release release;
      f = parse_safetensors(view.data(), view.size());
    }
    return file_to_python(f);
  }, py::arg("data"), "The checks of load_safetensors on bytes in memory.");
  m.def("read_safetensors_metadata", [](const std::string& path) {
    return metadata_to(io_call([&] { return read_safetensors_metadata(path); }));
  }, py::arg("path"));
  m.def("serialize_version", &serialize_version);

  m.def("save_model", [](const std::string& path, const Model& model, const py::object& metadata) {
    Metadata md = metadata_from(metadata);
    io_call([&] { save_model(path, model, md); });
  }, py::arg("path"), py::arg("model"), py::arg("metadata") = py::none());
  m.def("load_model", [](const std::string& path, Model& model) {
    return metadata_to(io_call([&] { return load_model(path, model); }));
  }, py::arg("path"), py::arg("model"));
  m.def("load_model_tensors", [](Model& model, const py::dict& tensors, const py::object& metadata,
                                 const std::string& source) {
    TensorFile f;
    f.source = source;
    f.metadata = metadata_from(metadata);
    for (auto [k, v] : tensors) {
      std::string name = py::cast<std::string>(k);
      f.tensors.emplace_back(name, tensor_from_numpy(v, ("load_model['" + name + "']").c_str()));
    }
    py::gil_scoped_release release;
    load_model(f, model);
  }, py::arg("model"), py::arg("tensors"), py::arg("metadata"), py::arg("source"),
     "load_model on tensors already read (and verified) by load_safetensors.");
  // buffers: {name: ReplayBuffer} saved and restored with the trainer (treadle/serialize.hpp).
  const auto replay_buffers = [](const py::dict& buffers) {
    ReplayBuffers out;
    for (auto [name, buffer] : buffers) out.emplace_back(py::str(name), buffer.cast<ReplayBuffer*>());
    return out;
  };
  m.def("save_checkpoint", [replay_buffers](const std::string& path, Trainer& trainer, const py::object& metadata,
                                            const py::dict& buffers) {
    Metadata md = metadata_from(metadata);
    ReplayBuffers bufs = replay_buffers(buffers);
    io_call([&] { save_checkpoint(path, trainer, md, bufs); });
  }, py::arg("path"), py::arg("trainer"), py::arg("metadata") = py::none(), py::arg("buffers") = py::dict());
  m.def("load_checkpoint", [replay_buffers](const std::string& path, Trainer& trainer, const py::dict& buffers) {
    ReplayBuffers bufs = replay_buffers(buffers);
    return metadata_to(io_call([&] { return load_checkpoint(path, trainer, bufs); }));
  }, py::arg("path"), py::arg("trainer"), py::arg("buffers") = py::dict());

  // Architecture descriptions: the format lives in C++ (treadle/architecture.hpp); Python builds
  // tl.nn objects from the checked, complete configurations and hands each layer here to describe.
  m.def("architecture_types", [] { return architecture::layer_types(); });
  m.def("architecture_parse", [](const py::object& description, const std::vector<std::string>& registered) {
    std::string text;
    if (py::isinstance<py::str>(description)) {
      text = description.cast<std::string>();
    } else if (py::isinstance<py::dict>(description)) {
      std::string what, at;
      auto json = json_of(description, what, at);
      if (!json) throw_value_error("build: the description holds ", what, " at description", at, ", not a JSON value");
      text = *json;
    } else {
      throw_value_error("build: expected an architecture description (a dict or JSON text), got ",
                        py::type::of(description).attr("__name__").cast<std::string>());
    }
    architecture::Node root;
    {
      py::gil_scoped_release release;
      root = architecture::parse(text, "build", registered);
    }
    return to_python(root, py::module_::import("json").attr("loads"));
  });
  m.def("architecture_describe", [](const py::object& tree) {
    const architecture::Layer root = layer_of(tree);
    py::gil_scoped_release release;
    return architecture::describe(root);
  });
}

}  // namespace treadle::py_bind

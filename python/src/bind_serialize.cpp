// Bindings for files (treadle/serialize.hpp): safetensors reading and writing, model files and
// training checkpoints. Format errors are ValueError; failures of the file system are OSError with
// the errno, so `FileNotFoundError` and friends work as usual.
#include <system_error>

#include "bindings.hpp"
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
}

}  // namespace treadle::py_bind

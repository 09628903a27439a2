// ReplayBuffer (treadle/replay.hpp): push copies numpy arrays in, sample fills numpy arrays; the GIL
// is released while the buffer copies.
#include <string>

#include "bindings.hpp"
#include "treadle/replay.hpp"

namespace treadle::py_bind {

void bind_replay(py::module_& m) {
  py::class_<ReplayBuffer, std::shared_ptr<ReplayBuffer>>(m, "ReplayBuffer")
      .def(py::init([](const py::list& fields, const std::string& policy, int64_t capacity, int64_t min_size,
                       int64_t max_reuse, uint64_t seed) {
             std::vector<ReplayField> fs;
             for (auto f : fields) {
               auto t = f.cast<py::tuple>();
               fs.push_back({t[0].cast<std::string>(), t[1].cast<Shape>(), dtype_from_py(t[2])});
             }
             return std::make_shared<ReplayBuffer>(
                 std::move(fs), ReplayOptions{replay_policy_from_name(policy), capacity, min_size, max_reuse, seed});
           }),
           py::arg("fields"), py::arg("policy"), py::arg("capacity"), py::arg("min_size") = 0,
           py::arg("max_reuse") = -1, py::arg("seed") = 0)
      .def("push",
           [](ReplayBuffer& b, const py::list& arrays) {
             std::vector<Tensor> batch;
             for (auto a : arrays) batch.push_back(tensor_from_numpy(a, "ReplayBuffer.push"));
             py::gil_scoped_release release;
             b.push(batch);
           },
           py::arg("arrays"))
      .def("sample",
           [](ReplayBuffer& b, int64_t batch_size, const py::list& out) {
             std::vector<Tensor> outs;
             for (auto a : out) outs.push_back(tensor_from_numpy(a, "ReplayBuffer.sample out", true));
             py::gil_scoped_release release;
             b.sample(batch_size, outs);
           },
           py::arg("batch_size"), py::arg("out"))
      .def("ready", &ReplayBuffer::ready, py::arg("batch_size"))
      .def_property_readonly("size", &ReplayBuffer::size)
      .def_property_readonly("capacity", &ReplayBuffer::capacity)
      .def_property_readonly("min_size", &ReplayBuffer::min_size)
      .def_property_readonly("max_reuse", &ReplayBuffer::max_reuse)
      .def_property_readonly("pushed", &ReplayBuffer::pushed)
      .def_property_readonly("dropped", &ReplayBuffer::dropped)
      .def_property_readonly("sampled", &ReplayBuffer::sampled)
      .def_property_readonly("layout", &ReplayBuffer::layout)
      .def_property_readonly("policy", [](const ReplayBuffer& b) { return std::string(replay_policy_name(b.policy())); })
      .def("state",
           [](const ReplayBuffer& b) {
             std::vector<std::pair<std::string, Tensor>> tensors;
             std::map<std::string, std::string> metadata;
             b.export_state("", "", tensors, metadata);
             py::dict arrays;
             for (const auto& [name, t] : tensors) arrays[py::str(name)] = numpy_copy(t);
             return py::make_tuple(arrays, metadata);
           },
           "(arrays, metadata): the buffer's whole state, copied.")
      .def("load_state",
           [](ReplayBuffer& b, const py::dict& arrays, const std::map<std::string, std::string>& metadata) {
             std::map<std::string, Tensor> tensors;
             for (auto [name, a] : arrays) tensors.emplace(py::str(name), tensor_from_numpy(a, "ReplayBuffer state").clone());
             b.import_state("", "", tensors, metadata);
           },
           py::arg("arrays"), py::arg("metadata"));
}

}  // namespace treadle::py_bind

#pragma once
// The Python face of DataParallelCore (treadle/data_parallel.hpp), shared by the two modules that bind
// it: treadle._core over an mpi4py Comm (bind_data_parallel.cpp, no MPI link) and the optional
// treadle._distributed over treadle::DataParallel (src/distributed/bind_distributed.cpp). Here the
// Python arguments become DataParallelOptions and the members treadle/distributed.py calls are bound,
// once; the checks of the values are the core's.
//
// Collective members release the GIL: the communicator takes it back only inside its calls (mpi4py),
// so other Python threads run while this rank waits for the others.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cmath>
#include <string>
#include <utility>

#include "treadle/data_parallel.hpp"

namespace treadle::py_bind {

namespace py = pybind11;

inline std::string py_repr(py::handle h) { return py::repr(h).cast<std::string>(); }

// An int (or numpy integer) that fits int64, never a bool.
inline bool as_integer(py::handle h, long long& out) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr())) return false;
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!index) return PyErr_Clear(), false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || (out == -1 && PyErr_Occurred())) return PyErr_Clear(), false;
  return true;
}

// The constructor's Python arguments. A value of the wrong kind becomes host.error, which the core's
// constructor reports on every rank (raising here would leave the other ranks waiting).
// timeout: None (no timeout) or a positive number of seconds.
inline std::pair<DataParallelOptions, DataParallelHost> data_parallel_options(int size, py::handle root,
                                                                              py::handle buffers, py::handle transport,
                                                                              py::handle timeout, py::handle setup) {
  DataParallelOptions o;
  DataParallelHost host;
  std::string error;
  long long r = 0;
  if (!as_integer(root, r) || r < INT_MIN || r > INT_MAX)  // the core checks the range of an int
    error = "root must be a rank in [0, " + std::to_string(size) + "), got " + py_repr(root);
  else
    o.root = static_cast<int>(r);
  const std::string b = py::isinstance<py::str>(buffers) ? buffers.cast<std::string>() : std::string();
  if (b == "root" || b == "average" || b == "local")
    o.buffers = b == "root" ? BufferSync::root : b == "average" ? BufferSync::average : BufferSync::local;
  else if (error.empty())
    error = "buffers must be one of ('root', 'average', 'local'), got " + py_repr(buffers);
  if (py::isinstance<py::str>(transport))
    o.transport = transport.cast<std::string>();
  else if (error.empty())
    error = "transport must be one of ('auto', 'mpi', 'nccl'), got " + py_repr(transport);
  if (!timeout.is_none()) {
    double t = std::nan("");
    if (!PyBool_Check(timeout.ptr()) && !PyUnicode_Check(timeout.ptr()) && PyNumber_Check(timeout.ptr())) {
      t = PyFloat_AsDouble(timeout.ptr());
      if (t == -1.0 && PyErr_Occurred()) PyErr_Clear(), t = std::nan("");
    }
    if (t > 0 && std::isfinite(t))
      o.timeout = t;
    else if (error.empty())
      error = "timeout must be a positive number of seconds or None, got " + py_repr(timeout);
  }
  host.error = std::move(error);
  if (!setup.is_none()) host.setup = setup.cast<SetupItems>();
  return {o, host};
}

// (count, error) for an exchange: a count that is not an integer is this rank's failure.
inline int64_t exchange_count(py::handle count, std::string& error) {
  long long n = 0;
  if (!error.empty()) return 0;
  if (!as_integer(count, n)) error = "count must be a non-negative integer, got " + py_repr(count);
  return error.empty() ? static_cast<int64_t>(n) : 0;  // negative: the core says so
}

// The members of treadle._core.DataParallel and treadle._distributed.DataParallel; `core` gives the
// DataParallelCore of a Holder.
template <typename Holder, typename Core>
void bind_data_parallel_members(py::class_<Holder>& c, Core core) {
  c.def("begin_step",
        [core](Holder& h, const std::string& where) {
          py::gil_scoped_release release;
          core(h).begin_step(where.c_str());
        })
      .def("end_step",
           [core](Holder& h, py::handle count, double loss, std::string error, const std::string& where) {
             const int64_t n = exchange_count(count, error);
             py::gil_scoped_release release;
             return core(h).end_step(n, loss, error, where.c_str());
           })
      .def(
          "allreduce_gradients",
          [core](Holder& h, py::handle count, double loss, std::string error, const std::string& where) {
            const int64_t n = exchange_count(count, error);
            py::gil_scoped_release release;
            return core(h).allreduce_gradients(n, loss, error, where.c_str());
          },
          py::arg("count"), py::arg("loss") = 0.0, py::arg("error") = "",
          py::arg("where") = "DataParallel.allreduce_gradients")
      .def_static("shard_count", &DataParallelCore::shard_count, py::arg("x_shape"), py::arg("y_shape"))
      .def("broadcast_state",
           [core](Holder& h) {
             py::gil_scoped_release release;
             core(h).broadcast_state();
           })
      .def("sync_buffers",
           [core](Holder& h) {
             py::gil_scoped_release release;
             core(h).sync_buffers();
           })
      .def("parameter_divergence",
           [core](Holder& h) {
             py::gil_scoped_release release;
             return core(h).parameter_divergence();
           })
      .def_property_readonly("rank", [core](Holder& h) { return core(h).rank(); })
      .def_property_readonly("size", [core](Holder& h) { return core(h).size(); })
      .def_property_readonly("root", [core](Holder& h) { return core(h).root(); })
      .def_property_readonly("buffers", [core](Holder& h) { return buffer_sync_name(core(h).buffers()); })
      .def_property_readonly("timeout", [core](Holder& h) { return core(h).timeout(); })
      .def_property_readonly("steps", [core](Holder& h) { return core(h).steps(); })
      .def_property_readonly("allreduce_seconds", [core](Holder& h) { return core(h).allreduce_seconds(); })
      .def_property_readonly("last_allreduce_seconds",
                             [core](Holder& h) { return core(h).last_allreduce_seconds(); })
      .def_property_readonly("wait_seconds", [core](Holder& h) { return core(h).wait_seconds(); })
      .def_property_readonly("transport", [core](Holder& h) { return std::string(core(h).transport()); });
}

}  // namespace treadle::py_bind

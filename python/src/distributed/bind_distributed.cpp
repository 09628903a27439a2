// treadle._distributed: the C++ DataParallel (treadle::distributed) for Python hosts that use mpi4py.
// Optional: built only with -DTREADLE_WITH_MPI=ON and mpi4py found at configure time (python/
// CMakeLists.txt). It is the way to the NCCL transport from Python; treadle/distributed.py decides
// when to use it and keeps the pure-Python class's arguments, errors and step.
//
// The communicator comes out of an mpi4py Comm through mpi4py's C API, so mpi4py and this module
// must use the same MPI library. It is borrowed: never duplicated, never freed, and MPI is never
// initialised here (mpi4py did that when the host imported mpi4py.MPI).
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "treadle/distributed.hpp"
#include "treadle/error.hpp"

namespace py = pybind11;

namespace {

// mpi4py's C API is imported on first use rather than at module import, so importing this module
// neither requires mpi4py nor starts MPI.
MPI_Comm comm_of(const py::handle& obj) {
  static bool imported = false;
  if (!imported) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    imported = true;
  }
  MPI_Comm* comm = PyMPIComm_Get(obj.ptr());  // raises TypeError for anything but an mpi4py Comm
  if (comm == nullptr) throw py::error_already_set();
  return *comm;
}

treadle::BufferSync buffer_sync_of(const std::string& name) {
  if (name == "root") return treadle::BufferSync::root;
  if (name == "average") return treadle::BufferSync::average;
  if (name == "local") return treadle::BufferSync::local;
  treadle::throw_value_error("DataParallel: buffers must be one of ('root', 'average', 'local'), got '", name, "'");
}

// The C++ DataParallel with what it borrows kept alive: it holds a Trainer& and an MPI_Comm, so the
// trainer (shared with the Python Trainer) and the mpi4py Comm live as long as it does. Members are
// destroyed in reverse order: the DataParallel (and its NCCL communicator) first.
struct BoundDataParallel {
  std::shared_ptr<treadle::Trainer> trainer;
  py::object comm;
  std::unique_ptr<treadle::DataParallel> dp;
};

std::unique_ptr<BoundDataParallel> make(std::shared_ptr<treadle::Trainer> trainer, const py::object& comm, int root,
                                        const std::string& buffers, const std::string& transport, double timeout) {
  if (!trainer) treadle::throw_type_error("DataParallel: trainer is None");
  auto bound = std::make_unique<BoundDataParallel>();
  bound->trainer = std::move(trainer);
  bound->comm = comm;
  const MPI_Comm c = comm_of(comm);
  const treadle::DataParallelOptions options{root, buffer_sync_of(buffers), transport, timeout};
  py::gil_scoped_release release;  // collective: other Python threads run while this rank waits
  bound->dp = std::make_unique<treadle::DataParallel>(*bound->trainer, c, options);
  return bound;
}

treadle::DataParallel& dp_of(BoundDataParallel& b) { return *b.dp; }

}  // namespace

PYBIND11_MODULE(_distributed, m) {
  m.doc() = "treadle's C++ DataParallel over an mpi4py communicator (optional; see docs/distributed.md)";
  // Whether treadle::distributed was built with the NCCL transport (-DTREADLE_WITH_NCCL=ON).
#ifdef TREADLE_DISTRIBUTED_NCCL
  m.attr("has_nccl") = true;
#else
  m.attr("has_nccl") = false;
#endif
  // treadle::ValueError / TypeError raised here become Python ValueError / TypeError through the
  // translators treadle._core registers (pybind11 shares them across modules); importing _core
  // first makes sure they exist and that the Trainer type is known.
  py::module_::import("treadle._core");

  py::class_<BoundDataParallel>(m, "DataParallel")
      .def(py::init(&make), py::arg("trainer"), py::arg("comm"), py::arg("root") = 0, py::arg("buffers") = "root",
           py::arg("transport") = "auto", py::arg("timeout") = 0.0)
      .def("allreduce_gradients",
           [](BoundDataParallel& b, int64_t count, double loss, const std::string& error) {
             py::gil_scoped_release release;
             return dp_of(b).allreduce_gradients(count, loss, error);
           },
           py::arg("count"), py::arg("loss") = 0.0, py::arg("error") = "")
      .def("broadcast_state", [](BoundDataParallel& b) {
        py::gil_scoped_release release;
        dp_of(b).broadcast_state();
      })
      .def("sync_buffers", [](BoundDataParallel& b) {
        py::gil_scoped_release release;
        dp_of(b).sync_buffers();
      })
      .def("parameter_divergence", [](BoundDataParallel& b) {
        py::gil_scoped_release release;
        return dp_of(b).parameter_divergence();
      })
      .def_property_readonly("rank", [](BoundDataParallel& b) { return dp_of(b).rank(); })
      .def_property_readonly("size", [](BoundDataParallel& b) { return dp_of(b).size(); })
      .def_property_readonly("root", [](BoundDataParallel& b) { return dp_of(b).root(); })
      .def_property_readonly("steps", [](BoundDataParallel& b) { return dp_of(b).steps(); })
      .def_property_readonly("allreduce_seconds", [](BoundDataParallel& b) { return dp_of(b).allreduce_seconds(); })
      .def_property_readonly("transport", [](BoundDataParallel& b) { return dp_of(b).transport(); });
}

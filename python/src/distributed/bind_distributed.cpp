// treadle._distributed: the C++ DataParallel (treadle::distributed) for Python hosts that use mpi4py.
// Optional: built only with -DTREADLE_WITH_MPI=ON and mpi4py found at configure time (python/
// CMakeLists.txt). It is the way to the NCCL transport from Python; its members are those of
// treadle._core.DataParallel (data_parallel_binding.hpp: the same DataParallelCore, here over
// treadle::DataParallel's MPI communicator), and treadle/distributed.py decides which one runs.
//
// The communicator comes out of an mpi4py Comm through mpi4py's C API, so mpi4py and this module
// must use the same MPI library. It is borrowed: never duplicated, never freed, and MPI is never
// initialised here (mpi4py did that when the host imported mpi4py.MPI).
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "../data_parallel_binding.hpp"
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

// The C++ DataParallel with what it borrows kept alive: it holds a Trainer& and an MPI_Comm, so the
// trainer (shared with the Python Trainer) and the mpi4py Comm live as long as it does. Members are
// destroyed in reverse order: the DataParallel (and its NCCL communicator) first.
struct BoundDataParallel {
  std::shared_ptr<treadle::Trainer> trainer;
  py::object comm;
  std::unique_ptr<treadle::DataParallel> dp;
};

std::unique_ptr<BoundDataParallel> make(std::shared_ptr<treadle::Trainer> trainer, const py::object& comm,
                                        py::handle root, py::handle buffers, py::handle transport, py::handle timeout,
                                        py::handle setup) {
  if (!trainer) treadle::throw_type_error("DataParallel: trainer is None");
  auto bound = std::make_unique<BoundDataParallel>();
  bound->trainer = std::move(trainer);
  bound->comm = comm;
  const MPI_Comm c = comm_of(comm);
  const int size = comm.attr("Get_size")().cast<int>();
  const auto [options, host] = treadle::py_bind::data_parallel_options(size, root, buffers, transport, timeout, setup);
  py::gil_scoped_release release;  // collective: other Python threads run while this rank waits
  bound->dp = std::make_unique<treadle::DataParallel>(*bound->trainer, c, options, host);
  return bound;
}

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

  py::class_<BoundDataParallel> c(m, "DataParallel");
  c.def(py::init(&make), py::arg("trainer"), py::arg("comm"), py::arg("root") = 0, py::arg("buffers") = "root",
        py::arg("transport") = "auto", py::arg("timeout") = py::none(), py::arg("setup") = py::none());
  treadle::py_bind::bind_data_parallel_members(
      c, [](BoundDataParallel& b) -> treadle::DataParallelCore& { return b.dp->core(); });
}

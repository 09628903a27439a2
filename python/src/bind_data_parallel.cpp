// treadle._core.DataParallel: DataParallelCore (the data-parallel algorithm of the core library) over
// an mpi4py communicator, in every build: the collectives are mpi4py calls on numpy views of the
// core's buffers, so _core links no MPI and works with whichever MPI library mpi4py uses.
// treadle/distributed.py wraps it (or, where built and asked for, treadle._distributed's class).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "data_parallel_binding.hpp"
#include "treadle/communicator.hpp"
#include "treadle/data_parallel.hpp"
#include "treadle/error.hpp"
#include "treadle/trainer.hpp"

namespace treadle::py_bind {
namespace {

// The Communicator over an mpi4py Comm. The core calls it with the GIL released; each call takes the
// GIL for the mpi4py call alone. A Python exception there becomes a RuntimeError naming the call.
class Mpi4pyCommunicator final : public Communicator {
 public:
  explicit Mpi4pyCommunicator(py::object comm) : comm_(std::move(comm)) {  // with the GIL
    mpi_ = py::module_::import("mpi4py.MPI");
    if (!py::isinstance(comm_, mpi_.attr("Comm")))
      throw_type_error("DataParallel: comm must be an mpi4py communicator, got ",
                       py::type::of(comm_).attr("__name__").cast<std::string>());
    if (comm_.equal(mpi_.attr("COMM_NULL")))
      throw_value_error("DataParallel: comm is MPI.COMM_NULL (this rank is not in the group)");
    if (comm_.attr("Is_inter")().cast<bool>()) throw_value_error("DataParallel: comm must be an intra-communicator");
    rank_ = comm_.attr("Get_rank")().cast<int>();
    size_ = comm_.attr("Get_size")().cast<int>();
  }
  ~Mpi4pyCommunicator() override {  // the holder's owner runs this with the GIL (pybind11's dealloc)
    request_ = py::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(void* data, int64_t n, DType dtype, ReduceOp op) override {
    call("Allreduce", [&] {
      comm_.attr("Allreduce")(mpi_.attr("IN_PLACE"), view(data, n, dtype),
                              py::arg("op") = mpi_.attr(op == ReduceOp::sum ? "SUM" : "MAX"));
    });
  }
  void broadcast(void* data, int64_t n, DType dtype, int root) override {
    call("Bcast", [&] { comm_.attr("Bcast")(view(data, n, dtype), py::arg("root") = root); });
  }
  void allgather(const void* mine, int64_t bytes, void* all) override {
    call("Allgather", [&] {
      const py::object byte = mpi_.attr("BYTE");
      comm_.attr("Allgather")(py::make_tuple(bytes_view(const_cast<void*>(mine), bytes), byte),
                              py::make_tuple(bytes_view(all, bytes * size_), byte));
    });
  }
  void start_allreduce(double* data, int n) override {
    call("Iallreduce", [&] {
      request_ = comm_.attr("Iallreduce")(mpi_.attr("IN_PLACE"), view(data, n, DType::f64),
                                          py::arg("op") = mpi_.attr("SUM"));
    });
  }
  bool test_allreduce() override {
    bool done = false;
    call("Request.Test", [&] { done = request_.attr("Test")().cast<bool>(); });
    return done;
  }

 private:
  template <typename F>
  void call(const char* what, F&& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      throw_runtime_error("DataParallel: mpi4py ", what, " failed: ", e.what());
    }
  }
  // numpy arrays over the core's memory (no copy, no owner: they live for one call, or as long as the
  // pending request that holds them, while the core keeps the memory).
  static py::array view(void* data, int64_t n, DType dtype) {
    return py::array(numpy_dtype(dtype), {static_cast<py::ssize_t>(n)}, {}, data, py::none());
  }
  static py::array bytes_view(void* data, int64_t n) {
    return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(n)}, {}, data, py::none());
  }

  py::object comm_, mpi_, request_;
  int rank_ = 0, size_ = 1;
};

// What the Python object holds, destroyed in reverse order: the core, then the communicator, then
// the trainer it borrowed (shared with the Python Trainer).
struct BoundCore {
  std::shared_ptr<Trainer> trainer;
  std::unique_ptr<Mpi4pyCommunicator> comm;
  std::unique_ptr<DataParallelCore> core;
};

std::unique_ptr<BoundCore> make(std::shared_ptr<Trainer> trainer, py::object comm, py::handle root,
                                py::handle buffers, py::handle transport, py::handle timeout, py::handle setup) {
  if (!trainer) throw_type_error("DataParallel: trainer is None");
  auto bound = std::make_unique<BoundCore>();
  bound->comm = std::make_unique<Mpi4pyCommunicator>(std::move(comm));
  bound->trainer = std::move(trainer);
  const auto [options, host] = data_parallel_options(bound->comm->size(), root, buffers, transport, timeout, setup);
  py::gil_scoped_release release;  // collective
  bound->core = std::make_unique<DataParallelCore>(*bound->trainer, *bound->comm, options, host);
  return bound;
}

}  // namespace

void bind_data_parallel(py::module_& m) {
  py::class_<BoundCore> c(m, "DataParallel");
  c.def(py::init(&make), py::arg("trainer"), py::arg("comm"), py::arg("root") = 0, py::arg("buffers") = "root",
        py::arg("transport") = "auto", py::arg("timeout") = py::none(), py::arg("setup") = py::none());
  bind_data_parallel_members(c, [](BoundCore& b) -> DataParallelCore& { return *b.core; });
  // The communicator checks alone (TypeError, ValueError), for a caller that communicates before it
  // constructs a DataParallel.
  m.def("data_parallel_check_comm", [](py::object comm) { Mpi4pyCommunicator checked(std::move(comm)); });
  // The failure text of the ranks' errors ("" for a rank that did not fail), as the core words it.
  m.def("data_parallel_failure", [](const std::vector<std::string>& errors, const std::string& where) {
    return DataParallelCore::failure_text(errors, where.c_str());
  });
}

}  // namespace treadle::py_bind

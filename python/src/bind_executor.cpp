// A Python host lends its workers: PoolExecutor wraps a concurrent.futures executor the host owns
// (treadle starts no thread). Each parallel_for submits all chunks but the first to the pool and
// runs the first on the calling thread; chunks run C++ with the GIL released.
#include <exception>
#include <mutex>

#include "bindings.hpp"
#include "treadle/context.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"

namespace treadle::py_bind {
namespace {

class PoolExecutor final : public Executor {
 public:
  PoolExecutor(py::object pool, int workers) : pool_(std::move(pool)), workers_(workers) {
    if (workers < 1) throw_value_error("PoolExecutor: num_workers must be >= 1, got ", workers);
    if (!py::hasattr(pool_, "submit")) throw_type_error("PoolExecutor: pool must have a submit() method");
  }
  ~PoolExecutor() override {
    py::gil_scoped_acquire gil;
    pool_ = py::object();
  }
  int num_workers() const override { return workers_; }

  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    const int64_t pieces = std::min<int64_t>(n, workers_);
    const int64_t size = (n + pieces - 1) / pieces;
    if (pieces == 1) return body(0, n);
    std::mutex m;
    std::exception_ptr error;
    auto run = [&](int64_t b, int64_t e) {
      try {
        body(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
    };
    {
      // Every Python object lives inside this block, with the GIL held; chunks run without it.
      py::gil_scoped_acquire gil;
      py::list futures;
      for (int64_t b = size; b < n; b += size) {
        const int64_t e = std::min(n, b + size);
        futures.append(pool_.attr("submit")(py::cpp_function([&run, b, e] {
          py::gil_scoped_release release;
          run(b, e);
        })));
      }
      {
        py::gil_scoped_release release;
        run(0, std::min(n, size));
      }
      for (auto f : futures) f.attr("result")();
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  py::object pool_;
  int workers_;
};

}  // namespace

void bind_executor(py::module_& m) {
  py::class_<Executor>(m, "Executor").def_property_readonly("num_workers", &Executor::num_workers);
  py::class_<PoolExecutor, Executor>(m, "PoolExecutor",
                                     "Lends a host-owned concurrent.futures executor's workers to treadle.")
      .def(py::init<py::object, int>(), py::arg("pool"), py::arg("num_workers"), py::keep_alive<1, 2>());
}

}  // namespace treadle::py_bind

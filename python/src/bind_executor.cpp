// A Python host lends its workers: PoolExecutor wraps a concurrent.futures executor the host owns
// (treadle starts no thread). Each parallel_for submits all chunks but the first to the pool and
// runs the first on the calling thread; chunks run C++ with the GIL released.
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

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
      // Every chunk runs exactly once whatever the pool does: a chunk the pool refuses (submit
      // raises) or drops (a cancelled future) runs here, and all submitted chunks finish before
      // this frame, which they reference, is left. A kernel's output is therefore whole even when
      // the call then raises the pool's error.
      py::gil_scoped_acquire gil;
      py::list futures;
      std::vector<std::pair<int64_t, int64_t>> submitted;
      std::vector<char> ran;  // written by each submitted chunk; read after its future is done
      submitted.reserve(static_cast<std::size_t>(pieces));
      ran.assign(static_cast<std::size_t>(pieces), 0);
      std::exception_ptr pool_error;
      for (int64_t b = size; b < n; b += size) {
        const int64_t e = std::min(n, b + size);
        if (!pool_error) {
          try {
            const std::size_t k = submitted.size();
            futures.append(pool_.attr("submit")(py::cpp_function([&run, &ran, k, b, e] {
              py::gil_scoped_release release;
              run(b, e);
              ran[k] = 1;
            })));
            submitted.emplace_back(b, e);
            continue;
          } catch (...) {
            pool_error = std::current_exception();
          }
        }
        py::gil_scoped_release release;
        run(b, e);
      }
      {
        py::gil_scoped_release release;
        run(0, std::min(n, size));
      }
      for (auto f : futures) {
        try {
          f.attr("result")();
        } catch (...) {
          if (!pool_error) pool_error = std::current_exception();
        }
      }
      for (std::size_t k = 0; k < submitted.size(); ++k)
        if (!ran[k]) {
          py::gil_scoped_release release;
          run(submitted[k].first, submitted[k].second);
        }
      if (pool_error) std::rethrow_exception(pool_error);
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

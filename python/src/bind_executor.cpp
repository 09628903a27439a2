// A Python host lends its workers: PoolExecutor wraps a concurrent.futures executor the host owns
// (treadle starts no thread). Each parallel_for submits all chunks but the first to the pool,
// runs the first on the calling thread and then takes any chunk no worker has started; chunks
// run C++ with the GIL released.
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "treadle/context.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"

namespace treadle::py_bind {
namespace {

// Which chunks of one parallel_for have been taken, and which have finished.
class Claims {
 public:
  explicit Claims(std::size_t n) : state_(n, kFree), by_pool_(n, 0) {}
  bool claim(int64_t k, bool by_pool = false) {
    std::lock_guard<std::mutex> lock(m_);
    if (state_[k] != kFree) return false;
    state_[k] = kRunning;
    by_pool_[k] = by_pool;
    return true;
  }
  // After wait_all: whether a pool worker ran chunk k (so its future completes now).
  bool ran_by_pool(int64_t k) {
    std::lock_guard<std::mutex> lock(m_);
    return by_pool_[k] != 0;
  }
  template <typename F>
  void done(int64_t k, F&& work) {
    work();
    {
      std::lock_guard<std::mutex> lock(m_);
      state_[k] = kDone;
    }
    cv_.notify_all();
  }
  void wait_all() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return std::all_of(state_.begin(), state_.end(), [](char s) { return s == kDone; }); });
  }

 private:
  static constexpr char kFree = 0, kRunning = 1, kDone = 2;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<char> state_;
  std::vector<char> by_pool_;
};

class PoolExecutor final : public Executor {
 public:
  PoolExecutor(py::object pool, int workers) : pool_(std::move(pool)), workers_(workers) {
    if (workers < 1) throw_value_error("PoolExecutor: num_workers must be >= 1, got ", workers);
    if (!py::hasattr(pool_, "submit")) throw_type_error("PoolExecutor: pool must have a submit() method");
    // submit is not tried here: a host's submit may block until the host gets to it (a bounded
    // queue, a gate), and the first parallel kernel checks what it returns anyway.
  }
  static void check_future(const py::object& future) {
    if (!py::hasattr(future, "result"))
      throw_type_error("PoolExecutor: pool.submit returned ",
                       std::string(py::str(py::type::of(future).attr("__name__"))),
                       ", not a future with result(); lend a concurrent.futures executor");
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
    // Chunks 1.. go to the pool; whoever claims a chunk first (a pool worker or this thread, once
    // its own chunk is done) runs it, so every chunk runs exactly once whatever the pool does:
    // refuses it (submit raises), drops it, runs it late, or returns no future at all. The claims
    // live on the heap: a pool that calls a chunk after this frame is gone finds it claimed and
    // touches nothing else. A kernel's output is therefore whole even when the call then raises
    // the pool's error.
    const int64_t chunks = (n + size - 1) / size;  // can be fewer than pieces (n = 4 over 3 workers: 2)
    auto claims = std::make_shared<Claims>(static_cast<std::size_t>(chunks));
    {
      py::gil_scoped_acquire gil;  // every Python object lives inside this block
      py::list futures;
      std::exception_ptr pool_error;
      for (int64_t b = size, k = 1; b < n && !pool_error; b += size, ++k) {
        const int64_t e = std::min(n, b + size);
        try {
          py::object future = pool_.attr("submit")(py::cpp_function([claims, &run, k, b, e] {
            py::gil_scoped_release release;
            if (claims->claim(k, true)) claims->done(k, [&] { run(b, e); });
          }));
          check_future(future);
          futures.append(std::move(future));
        } catch (...) {
          pool_error = std::current_exception();
        }
      }
      {
        py::gil_scoped_release release;
        claims->claim(0);
        claims->done(0, [&] { run(0, std::min(n, size)); });
        for (int64_t b = size, k = 1; b < n; b += size, ++k)
          if (claims->claim(k)) claims->done(k, [&] { run(b, std::min(n, b + size)); });
        claims->wait_all();
      }
      // A pool's own failure, from the futures of the chunks its workers ran (those complete now).
      // A chunk this thread took may never be run by the pool (a pool the host drains later): its
      // future is not waited for.
      for (std::size_t i = 0; i < futures.size(); ++i) {
        if (!claims->ran_by_pool(static_cast<int64_t>(i) + 1)) continue;
        try {
          futures[i].attr("result")();
        } catch (...) {
          if (!pool_error) pool_error = std::current_exception();
        }
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

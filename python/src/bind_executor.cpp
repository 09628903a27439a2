// A Python host lends its workers: PoolExecutor wraps a concurrent.futures executor the host owns
// (treadle starts no thread). Submitting a task costs tens of microseconds under the GIL, more than
// many kernels take, so the workers are called in once per run of kernels (Executor::begin_run: a
// training step, an inference), not once per parallel_for: the run's first parallel_for submits
// num_workers - 1 helper tasks, each of which releases the GIL and serves the run's WorkTeam in C++
// until the run ends. A run with no parallel work (a small model) submits nothing, and helpers stay
// a moment after a run (the linger), so steps called in a loop find them still there. The calling
// thread posts each parallel_for to the team and runs chunks too, so a run never waits for a helper
// the pool has not started (a busy pool, a pool that runs tasks late or never).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "bindings.hpp"
#include "treadle/context.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"
#include "treadle/executors/work_team.hpp"

namespace treadle::py_bind {
namespace {

using executors::WorkTeam;

class PoolExecutor final : public Executor {
 public:
  PoolExecutor(py::object pool, int workers, double linger)
      : pool_(std::move(pool)), workers_(workers), linger_(to_microseconds(linger)) {
    if (workers < 1) throw_value_error("PoolExecutor: num_workers must be >= 1, got ", workers);
    if (!py::hasattr(pool_, "submit")) throw_type_error("PoolExecutor: pool must have a submit() method");
    // submit is not tried here: a host's submit may block until the host gets to it (a bounded
    // queue, a gate), and the first run checks what it returns anyway.
  }
  ~PoolExecutor() override {
    py::gil_scoped_acquire gil;
    pool_ = py::object();
  }
  int num_workers() const override { return workers_; }

  void begin_run() override {
    if (workers_ == 1) return;
    Lease& lease = this_threads_lease();
    if (lease.depth > 0) {  // nested: this executor's run goes on; inside another's, this one runs serially
      if (lease.owner == id_) ++lease.depth;
      return;
    }
    if (lease.owner != id_ && lease.team) {  // the last run here was another executor's
      lease.team->close();
      lease.team.reset();
    }
    lease.owner = id_;
    lease.depth = 1;
    lease.called_in = false;  // the helpers are called in (or found lingering) by the first parallel_for
  }

  void end_run() noexcept override {
    Lease& lease = this_threads_lease();
    if (lease.owner != id_ || lease.depth == 0 || --lease.depth > 0 || !lease.team) return;
    if (linger_.count() > 0) return lease.team->release();  // helpers linger for the next run
    lease.team->close();  // helpers go back to the pool now
    lease.team.reset();
  }

  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    const int64_t chunks = std::min<int64_t>(n, workers_);
    if (chunks == 1 || WorkTeam::inside_chunk()) return body(0, n);
    Lease& lease = this_threads_lease();
    if (lease.owner == id_ && lease.depth > 0) return run_in_lease(lease, n, chunks, body);
    ExecutorRun run(*this);  // outside a run (or inside another executor's): a run of one call
    if (lease.owner != id_ || lease.depth == 0) return body(0, n);
    run_in_lease(lease, n, chunks, body);
  }

 private:
  // This thread's run of one executor (nested runs count depth) and its team, which outlives the
  // run by the team's linger time so that the next run finds the helpers still there.
  struct Lease {
    uint64_t owner = 0;  // the executor's id (an address could be reused by a new executor)
    int depth = 0;
    bool called_in = false;
    std::shared_ptr<WorkTeam> team;
    ~Lease() {
      if (team) team->close();
    }
  };
  static Lease& this_threads_lease() {
    thread_local Lease lease;
    return lease;
  }
  static constexpr std::chrono::microseconds kSpin{100};
  static std::chrono::microseconds to_microseconds(double seconds) {
    if (!(seconds >= 0.0 && seconds <= 1.0))
      throw_value_error("PoolExecutor: linger must be between 0 and 1 second, got ", seconds);
    return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  }
  static uint64_t next_id() {
    static std::atomic<uint64_t> ids{0};
    return ++ids;
  }

  // Runs the job on the lease's team, calling the helpers in first if this is the run's first job
  // and none is lingering. A pool that refuses them fails the job only after the calling thread has
  // run all of it, so a kernel's output is whole when the pool's error propagates.
  void run_in_lease(Lease& lease, int64_t n, int64_t chunks, const std::function<void(int64_t, int64_t)>& body) {
    if (!lease.called_in) {
      lease.called_in = true;
      if (!lease.team) lease.team = std::make_shared<WorkTeam>(kSpin, linger_);
      if (!lease.team->reopen()) {
        try {
          call_in_helpers(lease.team);
        } catch (...) {
          body(0, n);
          throw;
        }
      }
    }
    lease.team->run(n, chunks, body);
  }

  static void check_future(const py::object& future) {
    if (!py::hasattr(future, "result"))
      throw_type_error("PoolExecutor: pool.submit returned ",
                       std::string(py::str(py::type::of(future).attr("__name__"))),
                       ", not a future with result(); lend a concurrent.futures executor");
  }

  // Submits num_workers - 1 helpers serving `team`. A pool that refuses (submit raises or returns
  // no future) raises here; helpers already submitted serve the team like the others.
  void call_in_helpers(const std::shared_ptr<WorkTeam>& team) {
    const std::thread::id caller = std::this_thread::get_id();
    py::gil_scoped_acquire gil;
    for (int k = 1; k < workers_; ++k) {
      py::object future = pool_.attr("submit")(py::cpp_function([team, caller] {
        if (std::this_thread::get_id() == caller) return;  // a pool that runs tasks inline, in submit
        py::gil_scoped_release release;
        team->serve();
      }));
      check_future(future);
    }
  }

  py::object pool_;
  int workers_;
  std::chrono::microseconds linger_;
  uint64_t id_ = next_id();
};

}  // namespace

void bind_executor(py::module_& m) {
  py::class_<Executor>(m, "Executor").def_property_readonly("num_workers", &Executor::num_workers);
  py::class_<PoolExecutor, Executor>(m, "PoolExecutor",
                                     "Lends a host-owned concurrent.futures executor's workers to treadle.")
      .def(py::init<py::object, int, double>(), py::arg("pool"), py::arg("num_workers"), py::arg("linger") = 0.002,
           py::keep_alive<1, 2>(),
           "pool: a concurrent.futures executor the host owns; num_workers: how many threads a run may use, "
           "the calling thread included (num_workers - 1 tasks are submitted per run of kernels); linger: "
           "seconds the submitted helpers wait after a run for the next one before they return to the pool "
           "(0: at once)");
}

}  // namespace treadle::py_bind

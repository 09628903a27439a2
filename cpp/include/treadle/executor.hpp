#pragma once
// The execution hook: how a host lends its workers to treadle. treadle never starts a thread.
// A kernel splits its work into `n` independent items and calls parallel_for; the executor decides
// how the range is chunked and which of the host's workers run the chunks. parallel_for returns
// only when every chunk is done. Kernels are written so that results do not depend on chunking.
#include <cstdint>
#include <functional>

#include "treadle/export.hpp"

namespace treadle {

class TREADLE_API Executor {
 public:
  virtual ~Executor() = default;
  virtual int num_workers() const = 0;
  // Run body(begin, end) over disjoint chunks covering [0, n). Must not return before all are done.
  // An exception thrown by a chunk must be rethrown on the calling thread, after every other chunk
  // has run (a kernel's result is all-or-nothing: the optimizer relies on it).
  virtual void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) = 0;
  // A run of parallel_for calls from the calling thread begins (a plan's forward and backward, an
  // optimizer update): an executor whose workers are costly to call in (a Python pool: one task
  // submission each, under the GIL) may call them in once here and keep them until end_run, instead
  // of once per parallel_for. Calls pair up on one thread and may nest; begin_run may throw (before
  // treadle changes anything), end_run must not. Default: nothing.
  virtual void begin_run() {}
  virtual void end_run() noexcept {}
};

// Brackets a scope with exec.begin_run() / exec.end_run().
class ExecutorRun {
 public:
  explicit ExecutorRun(Executor& exec) : exec_(exec) { exec_.begin_run(); }
  ~ExecutorRun() { exec_.end_run(); }
  ExecutorRun(const ExecutorRun&) = delete;
  ExecutorRun& operator=(const ExecutorRun&) = delete;

 private:
  Executor& exec_;
};

// The default: everything on the calling thread.
class TREADLE_API SerialExecutor final : public Executor {
 public:
  int num_workers() const override { return 1; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n > 0) body(0, n);
  }
};

TREADLE_API Executor& serial_executor();

}  // namespace treadle

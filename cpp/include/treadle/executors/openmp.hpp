#pragma once
// An Executor over the host's OpenMP runtime. Header-only on purpose: the HOST compiles it with its
// own OpenMP flags, so libtreadle links no threading runtime and the threads that run treadle's
// chunks are exactly the host's OpenMP team.
//
//   #include <treadle/executors/openmp.hpp>
//   treadle::executors::OpenMPExecutor omp;            // omp_get_max_threads() workers
//   treadle::Trainer trainer(model, loss, opt, {}, &omp);
//
// parallel_for(n, body) splits [0, n) into num_workers() contiguous chunks (static schedule, one
// chunk per thread) inside a `#pragma omp parallel for`. Called from inside an active parallel
// region, OpenMP runs it on the calling thread alone (unless the host enabled nesting); results are
// identical either way, because treadle's kernels make results independent of chunking.
// The first exception thrown by a chunk is rethrown on the calling thread after the region ends
// (an exception must never leave an OpenMP structured block).
#ifndef _OPENMP
#error "treadle/executors/openmp.hpp needs OpenMP: compile the host with -fopenmp (CMake: OpenMP::OpenMP_CXX)"
#endif

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>

#include "treadle/executor.hpp"

namespace treadle::executors {

class OpenMPExecutor final : public Executor {
 public:
  // workers <= 0: omp_get_max_threads() at each call (follows omp_set_num_threads / OMP_NUM_THREADS).
  explicit OpenMPExecutor(int workers = 0) : workers_(workers) {}

  int num_workers() const override { return workers_ > 0 ? workers_ : std::max(1, omp_get_max_threads()); }

  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    const int64_t chunks = std::min<int64_t>(n, num_workers());
    if (chunks == 1) {  // no region to open: run on the calling thread
      body(0, n);
      return;
    }
    std::exception_ptr first;
    std::mutex guard;
#pragma omp parallel for schedule(static, 1) num_threads(static_cast<int>(chunks))
    for (int64_t c = 0; c < chunks; ++c) {
      try {
        body(n * c / chunks, n * (c + 1) / chunks);
      } catch (...) {
        std::lock_guard<std::mutex> lock(guard);
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  int workers_;
};

}  // namespace treadle::executors

#pragma once
// A small std::thread pool that the HOST creates and owns, usable as treadle's Executor.
// Header-only: the threads are started by the host's code (treadle itself never starts one), when
// the pool is constructed, and joined when it is destroyed.
//
//   treadle::executors::ThreadPool pool(8);   // 8 workers: the calling thread + 7 pool threads
//   treadle::Trainer trainer(model, loss, opt, {}, &pool);
//
// parallel_for(n, body) splits [0, n) into min(n, num_workers()) contiguous chunks; the calling
// thread runs chunks too and returns when all are done. Between jobs the pool's threads spin for
// a moment (work_team.hpp) before they sleep. The first exception thrown by a chunk is
// rethrown on the calling thread. Calls from several host threads are served one at a time; a
// parallel_for issued from inside a chunk runs serially on that thread (no deadlock). Results do not
// depend on which thread runs which chunk: treadle's kernels make them independent of chunking.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "treadle/executor.hpp"
#include "treadle/executors/work_team.hpp"

namespace treadle::executors {

class ThreadPool final : public Executor {
 public:
  explicit ThreadPool(int workers) : workers_(workers) {
    if (workers < 1) throw std::invalid_argument("ThreadPool: workers must be >= 1, got " + std::to_string(workers));
    threads_.reserve(workers - 1);
    for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { team_.serve(); });
  }
  ~ThreadPool() override {
    team_.close();
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_workers() const override { return workers_; }

  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    const int64_t chunks = std::min<int64_t>(n, workers_);
    if (chunks == 1 || WorkTeam::inside_chunk()) {  // nested call from a chunk: the pool is busy with the outer one
      body(0, n);
      return;
    }
    std::lock_guard<std::mutex> one_job(call_mutex_);
    team_.run(n, chunks, body);
  }

 private:
  const int workers_;
  WorkTeam team_;  // before threads_: the threads serve it until the destructor closes it
  std::vector<std::thread> threads_;
  std::mutex call_mutex_;  // one parallel_for at a time
};

}  // namespace treadle::executors

#pragma once
// A small std::thread pool that the HOST creates and owns, usable as treadle's Executor.
// Header-only: the threads are started by the host's code (treadle itself never starts one), when
// the pool is constructed, and joined when it is destroyed.
//
//   treadle::executors::ThreadPool pool(8);   // 8 workers: the calling thread + 7 pool threads
//   treadle::Trainer trainer(model, loss, opt, {}, &pool);
//
// parallel_for(n, body) splits [0, n) into min(n, num_workers()) contiguous chunks; the calling
// thread runs chunks too and returns when all are done. The first exception thrown by a chunk is
// rethrown on the calling thread. Calls from several host threads are served one at a time; a
// parallel_for issued from inside a chunk runs serially on that thread (no deadlock). Results do not
// depend on which thread runs which chunk: treadle's kernels make them independent of chunking.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "treadle/executor.hpp"

namespace treadle::executors {

class ThreadPool final : public Executor {
 public:
  explicit ThreadPool(int workers) : workers_(workers) {
    if (workers < 1) throw std::invalid_argument("ThreadPool: workers must be >= 1, got " + std::to_string(workers));
    threads_.reserve(workers - 1);
    for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~ThreadPool() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_workers() const override { return workers_; }

  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    if (n <= 0) return;
    const int64_t chunks = std::min<int64_t>(n, workers_);
    if (chunks == 1 || inside_chunk()) {  // nested call from a chunk: the pool is busy with the outer one
      body(0, n);
      return;
    }
    std::lock_guard<std::mutex> one_job(call_mutex_);
    std::unique_lock<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    chunks_ = chunks;
    next_ = 0;
    remaining_ = chunks;
    error_ = nullptr;
    wake_.notify_all();
    while (next_ < chunks_) run_one(lock);  // the caller works too
    done_.wait(lock, [this] { return remaining_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  static bool& inside_chunk() {
    thread_local bool inside = false;
    return inside;
  }

  // Takes the next chunk of the current job and runs it with the lock released. Lock held on entry/exit.
  void run_one(std::unique_lock<std::mutex>& lock) {
    const int64_t c = next_++;
    const auto* body = body_;
    const int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
    lock.unlock();
    std::exception_ptr error;
    inside_chunk() = true;
    try {
      (*body)(begin, end);
    } catch (...) {
      error = std::current_exception();
    }
    inside_chunk() = false;
    lock.lock();
    if (error && !error_) error_ = error;
    if (--remaining_ == 0) done_.notify_all();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || (body_ && next_ < chunks_); });
      if (stop_) return;
      run_one(lock);
    }
  }

  const int workers_;
  std::vector<std::thread> threads_;
  std::mutex call_mutex_;  // one parallel_for at a time
  std::mutex mutex_;       // guards everything below
  std::condition_variable wake_, done_;
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, chunks_ = 0, next_ = 0, remaining_ = 0;
  std::exception_ptr error_;
};

}  // namespace treadle::executors

#pragma once
// A job board shared by one calling thread and any number of helper threads: the building block of
// the executors whose workers are host threads lent for a while (treadle::executors::ThreadPool, the
// Python package's PoolExecutor). Header-only, like the adapters that use it.
//
//   caller:  team.run(n, chunks, body)   posts a job, runs chunks itself, returns when all are done
//   helper:  team.serve()                claims chunks of posted jobs until team.close()
//
// Chunks are claimed, never assigned: a job finishes even when no helper ever shows up (the caller
// runs every chunk), so a team never waits for a thread it was only promised. A helper that finds
// no work spins for `spin` before it sleeps: a training step posts a job every few microseconds,
// and waking a sleeping thread costs about as much as a small kernel. A team can be released
// between runs of jobs (release(), then reopen()): its helpers then stay for `linger` more, so a
// host calling steps in a loop calls its workers in once, not once per step. Chunk k covers
// [n*k/chunks, n*(k+1)/chunks); treadle's kernels make results independent of the chunking.
// One job at a time: run() must not be called by two threads at once (the users serialise it).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace treadle::executors {

class WorkTeam {
 public:
  using Body = std::function<void(int64_t, int64_t)>;

  explicit WorkTeam(std::chrono::microseconds spin = std::chrono::microseconds(100),
                    std::chrono::microseconds linger = std::chrono::microseconds(2000))
      : spin_(spin), linger_(linger) {}
  WorkTeam(const WorkTeam&) = delete;
  WorkTeam& operator=(const WorkTeam&) = delete;

  // True on a thread that is running a chunk of some team's job: a parallel_for issued there runs
  // inline (the team is busy with the outer job).
  static bool& inside_chunk() {
    thread_local bool inside = false;
    return inside;
  }

  // Runs body over `chunks` chunks of [0, n) on the calling thread and whichever helpers serve; the
  // first exception a chunk throws is rethrown here, after every chunk has run.
  void run(int64_t n, int64_t chunks, const Body& body) {
    std::unique_lock<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    chunks_ = chunks;
    next_ = 0;
    remaining_.store(chunks, std::memory_order_relaxed);
    error_ = nullptr;
    posted_.fetch_add(1, std::memory_order_release);
    if (sleepers_ > 0) wake_.notify_all();
    while (next_ < chunks_) run_one(lock);  // the caller works too
    if (remaining_.load(std::memory_order_acquire) != 0) {
      lock.unlock();
      spin_until([&] { return remaining_.load(std::memory_order_acquire) == 0; });
      lock.lock();
      done_.wait(lock, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
    }
    body_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  // A helper's loop: claims chunks of posted jobs until close(), or until the team has been
  // released for `linger` with no job. Returns at once after close().
  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++serving_;
    for (;;) {
      if (closed_.load(std::memory_order_relaxed)) break;
      if (body_ && next_ < chunks_) {
        run_one(lock);
        continue;
      }
      const uint64_t seen = posted_.load(std::memory_order_relaxed);
      auto news = [&] {
        return closed_.load(std::memory_order_acquire) || posted_.load(std::memory_order_acquire) != seen;
      };
      lock.unlock();
      const bool woke = spin_until(news);
      lock.lock();
      if (woke) continue;
      ++sleepers_;
      if (open_) {
        wake_.wait(lock, [&] { return news() || !open_; });
      } else if (!wake_.wait_until(lock, released_at_ + linger_, [&] { return news() || open_; })) {
        --sleepers_;
        break;  // released and idle for `linger`: back to the host
      }
      --sleepers_;
    }
    --serving_;
  }

  // Between runs of jobs: helpers stay `linger` longer, then leave.
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
    released_at_ = std::chrono::steady_clock::now();
    if (sleepers_ > 0) wake_.notify_all();  // sleeping helpers start their linger now
  }

  // A new run: true when helpers are still serving (they stay until the next release), false when
  // every helper has left (the caller calls new ones in, or runs alone).
  bool reopen() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    return serving_ > 0;
  }

  // Ends serve() on every helper (a job in progress is finished first by its caller).
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_.store(true, std::memory_order_release);
    wake_.notify_all();
  }

 private:
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  // True as soon as `ready()` holds; false once `spin_` has passed without it.
  template <typename Ready>
  bool spin_until(Ready ready) const {
    const auto deadline = std::chrono::steady_clock::now() + spin_;
    for (unsigned i = 0;; ++i) {
      if (ready()) return true;
      if ((i & 63u) == 63u && std::chrono::steady_clock::now() >= deadline) return false;
      relax();
    }
  }

  // Takes the next chunk of the current job and runs it with the lock released. Lock held on entry/exit.
  void run_one(std::unique_lock<std::mutex>& lock) {
    const int64_t c = next_++;
    const Body* body = body_;
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
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.notify_all();
  }

  const std::chrono::microseconds spin_, linger_;
  std::mutex mutex_;  // guards the job (body_ .. error_), sleepers_, serving_, open_, released_at_
  std::condition_variable wake_, done_;
  const Body* body_ = nullptr;
  int64_t n_ = 0, chunks_ = 0, next_ = 0;
  std::exception_ptr error_;
  int sleepers_ = 0, serving_ = 0;
  bool open_ = true;
  std::chrono::steady_clock::time_point released_at_{};
  std::atomic<int64_t> remaining_{0};  // chunks not finished; read without the lock while spinning
  std::atomic<uint64_t> posted_{0};    // jobs posted so far
  std::atomic<bool> closed_{false};
};

}  // namespace treadle::executors

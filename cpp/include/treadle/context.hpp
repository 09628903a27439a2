#pragma once
// Everything one step needs that is not a parameter: the activation arena, the executor the host
// lends, and the dropout RNG. Caller-owned; one per concurrent caller. A context is not shared
// between threads at the same time, but many contexts may run one plan concurrently.
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "treadle/dtype.hpp"
#include "treadle/executor.hpp"

namespace treadle {

class Profiler;
class DeviceQueue;  // a device backend's queue and arena (internal: backends/device_runtime.hpp)

class TREADLE_API Context {
 public:
  explicit Context(Executor* executor = nullptr, uint64_t seed = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Held by a prediction on a caller's context for its duration: a context used by two threads at
  // once raises RuntimeError naming `who` instead of two plans sharing one arena. A thread may nest.
  class TREADLE_API Use {
   public:
    Use(Context& ctx, const char* who);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    Context& ctx_;
    bool outer_ = false;
  };

  Executor& executor() const { return executor_ ? *executor_ : serial_executor(); }
  void set_executor(Executor* e) { executor_ = e; }

  uint64_t seed() const { return seed_; }
  uint64_t rng_counter() const { return counter_; }
  void set_rng_state(uint64_t seed, uint64_t counter) { seed_ = seed; counter_ = counter; }
  uint64_t next_rng_counter() { return counter_++; }

  // Arena memory, grown (never shrunk) to the largest plan run on this context: allocation
  // happens only the first time a larger plan runs.
  void* arena(std::size_t bytes);
  std::size_t arena_bytes() const { return arena_bytes_; }

  // Anomaly mode (off by default; slow): after each kernel, plans check its floating outputs for
  // NaN/Inf and throw ValueError naming the node, its op, module scope and pass.
  bool check_numerics() const { return check_numerics_; }
  void set_check_numerics(bool on) { check_numerics_ = on; }
  // Arena budget in bytes (0: none). A plan whose activations and workspace need more is refused
  // with ValueError before any of its kernels runs, instead of failing an allocation mid-step.
  std::size_t memory_budget() const { return memory_budget_; }
  void set_memory_budget(std::size_t bytes) { memory_budget_ = bytes; }
  // Per-node timing of the plans run on this context (null: the process-wide one, if any;
  // treadle/profile.hpp). The profiler is the caller's and must outlive its use here.
  Profiler* profiler() const { return profiler_; }
  void set_profiler(Profiler* p) { profiler_ = p; }

  // The device side, used by plans compiled for a device backend ("cuda" or "cuda:N"). Every build
  // declares it; without a device backend the stream calls raise ValueError and the counts are 0.
  // The stream every kernel of this context is enqueued on: the host's (a cudaStream_t, set between
  // steps; work still queued on the previous stream is waited for first), or null for the
  // context's own non-blocking stream, created on first device use. The legacy default stream
  // (stream 0) is never used: a null argument selects the context's own stream. A context serves
  // one device: `device` is its index ("cuda:1" is 1); -1 is the device the context already serves,
  // or device 0 before its first device use.
  void set_cuda_stream(void* stream, int device = -1);
  void* cuda_stream(int device = -1);
  // Device arena, grown (never shrunk) like arena() from a caching device allocator this context
  // owns; the memory budget applies to it too.
  void* device_arena(std::size_t bytes);
  std::size_t device_arena_bytes() const;
  // Device allocations this context's allocator has made so far: constant once steps are steady.
  uint64_t device_allocations() const;
  // The queue of device `d`, made on first use (ValueError in a build without its backend); a
  // context serves one device. Internal: what device plans and the trainer enqueue on.
  DeviceQueue& device_queue(Device d);

 private:
  Executor* executor_;
  uint64_t seed_, counter_ = 0;
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::size_t memory_budget_ = 0;
  Profiler* profiler_ = nullptr;
  bool check_numerics_ = false;
  std::atomic<std::thread::id> user_{};
  struct DeviceQueueDeleter {
    void operator()(DeviceQueue* q) const noexcept;
  };
  std::unique_ptr<DeviceQueue, DeviceQueueDeleter> device_;  // null until the first device use
  Device cuda_device(int index) const;  // set_cuda_stream's and cuda_stream's device
};

}  // namespace treadle

#pragma once
// Where the random kernels of a device plan (dropout) find the step's RNG state when it lives in
// device memory. A kernel normally takes the seed and the counter as arguments (KernelArgs), which a
// CUDA graph freezes at its capture. The trainer's captured step instead writes {seed, counter} into
// its upload buffer every step and, while capturing, names that slot for the stream: the dropout
// adapter then launches the kernel form that reads the slot (dropout_forward_indirect), so every
// replay draws the mask of the counter its own upload wrote.
//
// A scope is per calling thread (plans enqueue on the thread that runs them) and per stream; scopes
// nest and restore what they replaced. No CUDA call here: host-testable.
#include <cuda_runtime_api.h>

#include "backends/cuda/elementwise_kernels.hpp"

namespace treadle::cuda {

class DeviceRngScope {
 public:
  // `state`: device memory holding the step's {seed, counter} whenever the kernels enqueued on
  // `stream` run.
  DeviceRngScope(cudaStream_t stream, const DeviceRngState* state) : saved_(current()) { current() = {stream, state}; }
  ~DeviceRngScope() { current() = saved_; }
  DeviceRngScope(const DeviceRngScope&) = delete;
  DeviceRngScope& operator=(const DeviceRngScope&) = delete;

  // The state a live scope of this thread names for `stream`, else null.
  static const DeviceRngState* lookup(cudaStream_t stream) {
    const Binding& b = current();
    return b.state != nullptr && b.stream == stream ? b.state : nullptr;
  }

 private:
  struct Binding {
    cudaStream_t stream = nullptr;
    const DeviceRngState* state = nullptr;
  };
  static Binding& current() {
    thread_local Binding binding;
    return binding;
  }
  Binding saved_;
};

// The RNG state named for `stream` by a live DeviceRngScope of this thread, else null (the kernel
// takes the counter by value).
inline const DeviceRngState* device_rng_for(cudaStream_t stream) { return DeviceRngScope::lookup(stream); }

}  // namespace treadle::cuda

// Context's device side (CUDA builds): the stream its kernels enqueue on and a device arena from a
// caching allocator the context owns. Created on first device use, so a context that only runs
// host plans never touches the CUDA runtime.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "treadle/context.hpp"
#include "treadle/error.hpp"

namespace treadle {

// Destroyed in reverse order: the arena goes back to the allocator, the allocator frees the device
// memory, then the context's own stream is destroyed.
struct Context::DeviceState {
  static constexpr int kDevice = 0;  // plans for "cuda" run on cuda:0
  std::unique_ptr<cuda::CudaStream> own_stream;
  cudaStream_t host_stream = nullptr;  // the host's, when it lent one
  std::unique_ptr<cuda::CachingDeviceAllocator> allocator;
  cuda::DeviceBuffer arena;
  std::size_t arena_bytes = 0;

  cudaStream_t stream() {
    if (host_stream) return host_stream;
    if (!own_stream) own_stream = std::make_unique<cuda::CudaStream>(kDevice);
    return own_stream->get();
  }
};

void Context::DeviceStateDeleter::operator()(DeviceState* d) const noexcept { delete d; }

Context::DeviceState& Context::device_state() {
  if (!device_) device_.reset(new DeviceState());
  return *device_;
}

void Context::set_cuda_stream(void* stream) {
  DeviceState& d = device_state();
  cudaStream_t next = static_cast<cudaStream_t>(stream);
  const cudaStream_t previous = d.host_stream ? d.host_stream : d.own_stream ? d.own_stream->get() : nullptr;
  if (next == d.host_stream) return;
  // The arena's last users were queued on the previous stream: they finish before another stream
  // may write the same memory.
  if (d.arena.data() && previous) TREADLE_CUDA_CHECK(cudaStreamSynchronize(previous));
  d.host_stream = next;
}

void* Context::cuda_stream() { return device_state().stream(); }

void* Context::device_arena(std::size_t bytes) {
  DeviceState& d = device_state();
  if (bytes > d.arena_bytes) {
    if (memory_budget_ && bytes > memory_budget_)
      throw_value_error("Context: a plan needs ", bytes, " bytes of device activations and workspace, over this ",
                        "context's memory_budget of ", memory_budget_, " bytes");
    cuda::DeviceGuard guard(DeviceState::kDevice);
    cudaStream_t s = d.stream();
    if (!d.allocator) d.allocator = std::make_unique<cuda::CachingDeviceAllocator>(DeviceState::kDevice);
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    d.arena.reset();  // back to the free list of its stream, whose queued work is ordered before reuse
    d.arena = d.allocator->buffer(rounded, s);
    cuda::fill_zero_async(d.arena.data(), rounded, s);  // as the host arena: no stale bits from earlier owners
    d.arena_bytes = rounded;
  }
  return d.arena.data();
}

std::size_t Context::device_arena_bytes() const { return device_ ? device_->arena_bytes : 0; }

uint64_t Context::device_allocations() const {
  return device_ && device_->allocator ? device_->allocator->stats().misses : 0;
}

}  // namespace treadle

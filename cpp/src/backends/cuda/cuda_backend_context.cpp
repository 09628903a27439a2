// A context's queue on a CUDA device (DeviceQueue): the stream its kernels enqueue on and a device
// arena from a caching allocator the queue owns. Made on the context's first device use, so a
// context that only runs host plans never touches the CUDA runtime.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "backends/cuda/train_kernels.hpp"
#include "backends/device_runtime.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Destroyed in reverse order: the arena goes back to the allocator, the allocator frees the device
// memory, then the queue's own stream is destroyed.
class CudaQueue final : public DeviceQueue {
 public:
  explicit CudaQueue(Device d) : device_(d) {}

  Device device() const override { return device_; }

  // The legacy default stream (stream 0) is never used: a null argument selects the queue's own.
  void set_stream(void* stream) override {
    cudaStream_t next = static_cast<cudaStream_t>(stream);
    const cudaStream_t previous = host_stream_ ? host_stream_ : own_stream_ ? own_stream_->get() : nullptr;
    if (next == host_stream_) return;
    // The arena's last users were queued on the previous stream: they finish before another stream
    // may write the same memory.
    if (arena_.data() && previous) TREADLE_CUDA_CHECK(cudaStreamSynchronize(previous));
    host_stream_ = next;
  }

  void* stream() override {
    if (host_stream_) return host_stream_;
    if (!own_stream_) own_stream_ = std::make_unique<CudaStream>(device_.index);
    return own_stream_->get();
  }

  void add_into(void* dst, const void* src, int64_t n, DType dtype) override {
    if (dtype != DType::f32)
      throw_type_error("gradient accumulation on ", device_name(device_), ": float32 only, got ", dtype_name(dtype));
    cuda::add_into(static_cast<float*>(dst), static_cast<const float*>(src), n, static_cast<cudaStream_t>(stream()));
  }

  int make_current() override {
    const int previous = current_device();
    if (previous != device_.index) TREADLE_CUDA_CHECK(cudaSetDevice(device_.index));
    return previous;
  }

  void restore(int previous) noexcept override {
    if (previous != device_.index) cudaSetDevice(previous);
  }

  void* arena(std::size_t bytes, std::size_t budget) override {
    if (bytes > arena_bytes_) {
      if (budget && bytes > budget)
        throw_value_error("Context: a plan needs ", bytes, " bytes of device activations and workspace, over this ",
                          "context's memory_budget of ", budget, " bytes");
      DeviceGuard guard(device_.index);
      cudaStream_t s = static_cast<cudaStream_t>(stream());
      if (!allocator_) allocator_ = std::make_unique<CachingDeviceAllocator>(device_.index);
      const std::size_t rounded = (bytes + 255) / 256 * 256;
      arena_.reset();  // back to the free list of its stream, whose queued work is ordered before reuse
      arena_ = allocator_->buffer(rounded, s);
      fill_zero_async(arena_.data(), rounded, s);  // as the host arena: no stale bits from earlier owners
      arena_bytes_ = rounded;
    }
    return arena_.data();
  }

  std::size_t arena_bytes() const override { return arena_bytes_; }
  uint64_t allocations() const override { return allocator_ ? allocator_->stats().misses : 0; }

 private:
  Device device_;
  std::unique_ptr<CudaStream> own_stream_;
  cudaStream_t host_stream_ = nullptr;  // the host's, when it lent one
  std::unique_ptr<CachingDeviceAllocator> allocator_;
  DeviceBuffer arena_;
  std::size_t arena_bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceQueue> make_queue(Device d) { return std::make_unique<CudaQueue>(d); }

}  // namespace treadle::cuda

#pragma once
// Host <-> device copies, always on an explicit stream. The "sync" forms enqueue on the stream and
// wait for that stream only (never cudaMemcpy, which runs on the legacy default stream and would
// serialise with every other blocking stream of the process).
// Asynchronous copies from or to pageable host memory are staged by the driver and return only
// once the host side was read/written; for truly asynchronous transfers use PinnedHostBuffer.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace treadle::cuda {

void copy_to_device_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
void copy_to_host_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
void copy_device_to_device_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
void copy_to_device(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
void copy_to_host(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
void fill_zero_async(void* dst, std::size_t bytes, cudaStream_t stream);

// Page-locked host memory (cudaMallocHost), for overlapping transfers with compute.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(std::size_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(PinnedHostBuffer&& o) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& o) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  void* data() const { return ptr_; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace treadle::cuda

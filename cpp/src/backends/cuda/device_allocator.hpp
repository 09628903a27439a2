#pragma once
// A caching device allocator: device memory is taken with cudaMalloc once per size class and stream,
// then recycled through free lists, so a steady state of steps (the same sizes every step) calls
// neither cudaMalloc nor cudaFree, nor the host heap. The caller owns the allocator (one per
// device, or one per Context) and decides its lifetime; there is no global instance.
//
// Stream semantics: a block freed on stream S is handed out again only to requests on stream S, so
// work queued on S before the free is ordered before any later use. Memory that another stream
// still reads must not be freed until that stream is synchronised (or an event waited on).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace treadle::cuda {

struct AllocatorStats {
  std::size_t reserved_bytes = 0;       // held from the device (in use + cached)
  std::size_t in_use_bytes = 0;         // handed out (size classes, not requested sizes)
  std::size_t peak_reserved_bytes = 0;
  std::size_t peak_in_use_bytes = 0;
  std::size_t cached_blocks = 0;        // blocks on the free lists
  uint64_t hits = 0;                    // requests served from a free list
  uint64_t misses = 0;                  // requests that called cudaMalloc
  uint64_t device_frees = 0;            // cudaFree calls (release_cached, retries after OOM)
};

class DeviceBuffer;

class CachingDeviceAllocator {
 public:
  // Serves `device` (-1: the device current at construction).
  explicit CachingDeviceAllocator(int device = -1);
  // Frees all device memory it reserved. Buffers from it must not outlive it.
  ~CachingDeviceAllocator();
  CachingDeviceAllocator(const CachingDeviceAllocator&) = delete;
  CachingDeviceAllocator& operator=(const CachingDeviceAllocator&) = delete;

  // At least `bytes` (rounded up to the size class), 256-byte aligned, for use on `stream`.
  // bytes == 0 gives nullptr. Throws RuntimeError when the device is out of memory even after
  // returning the cache to it (the message carries the request and the statistics).
  void* allocate(std::size_t bytes, cudaStream_t stream);
  // Returns a block to its free list. Throws ValueError for a pointer this allocator did not hand
  // out or already took back.
  void deallocate(void* ptr);
  DeviceBuffer buffer(std::size_t bytes, cudaStream_t stream);

  // cudaFree every cached block (synchronises the device): for handing memory to another library.
  void release_cached();
  AllocatorStats stats() const;
  int device() const { return device_; }

  // The size class of a request: multiples of 512 bytes up to 4 KiB, then four classes per power
  // of two (at most 25% over the request).
  static std::size_t size_class(std::size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;
    cudaStream_t stream = nullptr;
    bool in_use = false;
  };
  using Key = std::pair<cudaStream_t, std::size_t>;

  void* device_malloc(std::size_t size);
  void release_cached_locked();

  int device_ = 0;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;                    // every block ever taken; records are reused
  std::vector<std::size_t> dead_records_;        // records whose block went back to the device
  std::unordered_map<void*, std::size_t> index_;  // pointer -> record, filled at cudaMalloc only
  std::map<Key, std::vector<std::size_t>> free_;  // (stream, class) -> cached records
  AllocatorStats stats_;
};

// Move-only ownership of one block; returns it to its allocator on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(CachingDeviceAllocator* allocator, void* ptr, std::size_t bytes)
      : allocator_(allocator), ptr_(ptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : allocator_(std::exchange(o.allocator_, nullptr)), ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }  // as requested
  void reset() noexcept;

 private:
  CachingDeviceAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace treadle::cuda

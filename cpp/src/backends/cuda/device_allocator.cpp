// The caching device allocator (see the header for its contract).
#include "backends/cuda/device_allocator.hpp"

#include <bit>

#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

std::size_t CachingDeviceAllocator::size_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 512;
  if (bytes <= 4096) return (bytes + kSmall - 1) / kSmall * kSmall;
  // Quarter steps of the power of two just below: 4096 < bytes <= 2^(k+1) rounds to a multiple of 2^(k-2).
  const int k = std::bit_width(bytes - 1) - 1;
  const std::size_t step = std::size_t{1} << (k - 2);
  return (bytes + step - 1) / step * step;
}

CachingDeviceAllocator::CachingDeviceAllocator(int device) : device_(device < 0 ? current_device() : device) {}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  // No DeviceGuard: it may throw. Errors are ignored (a lost device has nothing left to free).
  int previous = -1;
  const bool switch_device = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
  if (switch_device) cudaSetDevice(device_);
  for (const Block& b : blocks_)
    if (b.ptr != nullptr) cudaFree(b.ptr);
  if (switch_device) cudaSetDevice(previous);
  cudaGetLastError();
}

void* CachingDeviceAllocator::device_malloc(std::size_t size) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation) {  // give the cache back to the device and try once more
    cudaGetLastError();
    release_cached_locked();
    status = cudaMalloc(&ptr, size);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError(detail::concat(
        "CachingDeviceAllocator::allocate: cudaMalloc of ", size, " bytes on device ", device_, " failed: ",
        cudaGetErrorName(status), " (", cudaGetErrorString(status), "); reserved ", stats_.reserved_bytes,
        " bytes, in use ", stats_.in_use_bytes, " bytes"));
  }
  return ptr;
}

void* CachingDeviceAllocator::allocate(std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t rec;
  auto it = free_.find(Key{stream, size});
  if (it != free_.end() && !it->second.empty()) {
    rec = it->second.back();
    it->second.pop_back();
    --stats_.cached_blocks;
    ++stats_.hits;
  } else {
    void* ptr = device_malloc(size);
    if (!dead_records_.empty()) {
      rec = dead_records_.back();
      dead_records_.pop_back();
    } else {
      rec = blocks_.size();
      blocks_.emplace_back();
    }
    blocks_[rec] = Block{ptr, size, stream, false};
    index_.emplace(ptr, rec);
    free_.try_emplace(Key{stream, size});  // the list exists before its first free: no map insert then
    stats_.reserved_bytes += size;
    ++stats_.misses;
  }
  Block& b = blocks_[rec];
  b.in_use = true;
  stats_.in_use_bytes += b.size;
  if (stats_.in_use_bytes > stats_.peak_in_use_bytes) stats_.peak_in_use_bytes = stats_.in_use_bytes;
  if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
  return b.ptr;
}

void CachingDeviceAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(ptr);
  if (it == index_.end() || !blocks_[it->second].in_use)
    throw_value_error("CachingDeviceAllocator::deallocate: pointer ", ptr, " is not a block in use from this allocator",
                      it == index_.end() ? "" : " (already freed)");
  Block& b = blocks_[it->second];
  b.in_use = false;
  stats_.in_use_bytes -= b.size;
  std::vector<std::size_t>& list = free_[Key{b.stream, b.size}];
  list.push_back(it->second);  // capacity stays after warm-up: no host allocation in steady state
  ++stats_.cached_blocks;
}

DeviceBuffer CachingDeviceAllocator::buffer(std::size_t bytes, cudaStream_t stream) {
  return DeviceBuffer(this, allocate(bytes, stream), bytes);
}

void CachingDeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  release_cached_locked();
}

void CachingDeviceAllocator::release_cached_locked() {
  for (auto& [key, list] : free_) {
    for (std::size_t rec : list) {
      Block& b = blocks_[rec];
      cudaFree(b.ptr);  // a failure here means a lost device; the next call reports it
      index_.erase(b.ptr);
      stats_.reserved_bytes -= b.size;
      ++stats_.device_frees;
      b = Block{};
      dead_records_.push_back(rec);
    }
    list.clear();
  }
  stats_.cached_blocks = 0;
}

AllocatorStats CachingDeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    allocator_ = std::exchange(o.allocator_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (allocator_ != nullptr && ptr_ != nullptr) {
    try {
      allocator_->deallocate(ptr_);
    } catch (...) {  // destructors never throw; a foreign pointer cannot reach here through buffer()
    }
  }
  allocator_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace treadle::cuda

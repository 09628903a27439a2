// Copies on the caller's stream, with argument checks that name the function and the values.
#include "backends/cuda/device_copy.hpp"

#include <utility>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

void check_args(const char* fn, void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0 && (dst == nullptr || src == nullptr))
    throw_value_error(fn, ": null pointer for a copy of ", bytes, " bytes (dst ", dst, ", src ", src, ")");
}

void copy_async(const char* fn, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                cudaStream_t stream) {
  check_args(fn, dst, src, bytes);
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream), fn);
}

}  // namespace

void copy_to_device_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copy_async("copy_to_device_async", dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

void copy_to_host_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copy_async("copy_to_host_async", dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

void copy_device_to_device_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copy_async("copy_device_to_device_async", dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copy_async("copy_to_device", dst, src, bytes, cudaMemcpyHostToDevice, stream);
  check_cuda(cudaStreamSynchronize(stream), "copy_to_device: cudaStreamSynchronize");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  copy_async("copy_to_host", dst, src, bytes, cudaMemcpyDeviceToHost, stream);
  check_cuda(cudaStreamSynchronize(stream), "copy_to_host: cudaStreamSynchronize");
}

void fill_zero_async(void* dst, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0 && dst == nullptr) throw_value_error("fill_zero_async: null pointer for ", bytes, " bytes");
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(dst, 0, bytes, stream), "fill_zero_async: cudaMemsetAsync");
}

PinnedHostBuffer::PinnedHostBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes != 0) TREADLE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace treadle::cuda

// Streams, events, device selection and library handles. Destructors never throw: a failure to
// release a resource at teardown (typically a device already lost) is ignored.
#include "backends/cuda/cuda_stream.hpp"

#include <utility>

#include "backends/cuda/cuda_status.hpp"

namespace treadle::cuda {

DeviceGuard::DeviceGuard(int device) {
  if (device < 0) return;
  TREADLE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    TREADLE_CUDA_CHECK(cudaSetDevice(device));
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
}

int current_device() {
  int d = 0;
  TREADLE_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller, just no GPU
    return 0;
  }
  return n;
}

CudaStream::CudaStream(int device) {
  device_ = device < 0 ? current_device() : device;
  DeviceGuard guard(device_);
  TREADLE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  owned_ = true;
}

CudaStream CudaStream::borrow(cudaStream_t stream, int device) {
  return CudaStream(stream, device < 0 ? current_device() : device, false);
}

CudaStream::~CudaStream() { reset(); }

void CudaStream::reset() noexcept {
  if (owned_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  owned_ = false;
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_),
      owned_(std::exchange(other.owned_, false)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void CudaStream::synchronize() const { TREADLE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

CudaEvent::CudaEvent(bool timing) {
  TREADLE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void CudaEvent::record(cudaStream_t stream) { TREADLE_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void CudaEvent::synchronize() const { TREADLE_CUDA_CHECK(cudaEventSynchronize(event_)); }

float CudaEvent::elapsed_ms(const CudaEvent& start, const CudaEvent& end) {
  float ms = 0.0f;
  TREADLE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

CublasLtHandle::CublasLtHandle() { TREADLE_CUBLAS_CHECK(cublasLtCreate(&handle_)); }

CublasLtHandle::~CublasLtHandle() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

CudnnHandle::CudnnHandle(cudaStream_t stream) {
  TREADLE_CUDNN_CHECK(cudnnCreate(&handle_));
  try {
    set_stream(stream);
  } catch (...) {
    cudnnDestroy(handle_);
    throw;
  }
}

CudnnHandle::~CudnnHandle() {
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

void CudnnHandle::set_stream(cudaStream_t stream) { TREADLE_CUDNN_CHECK(cudnnSetStream(handle_, stream)); }

}  // namespace treadle::cuda

#pragma once
// RAII wrappers for what a step on the GPU runs with: the stream (the caller's, one per Context),
// events (ordering and timing), and the library handles bound to a stream.
// Nothing here uses the legacy default stream implicitly: a CudaStream either creates a
// non-blocking stream (which does not synchronise with stream 0) or wraps one the host passes in.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

namespace treadle::cuda {

// Restores the calling thread's current device on scope exit: the library never leaves the host's
// device selection changed.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

int current_device();
int device_count();  // 0 when there is no device or no driver (never throws for those)

class CudaStream {
 public:
  // A new non-blocking stream on `device` (-1: the current device), destroyed with this object.
  explicit CudaStream(int device = -1);
  // The host's stream, used as is and never destroyed here (stream 0 only when passed explicitly).
  static CudaStream borrow(cudaStream_t stream, int device = -1);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  bool owned() const { return owned_; }
  void synchronize() const;  // throws RuntimeError with the first asynchronous failure, if any

 private:
  CudaStream(cudaStream_t stream, int device, bool owned) : stream_(stream), device_(device), owned_(owned) {}
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// An event without blocking-sync; timing on by default (benchmarks), off for pure ordering.
class CudaEvent {
 public:
  explicit CudaEvent(bool timing = true);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  void synchronize() const;
  // Milliseconds between two recorded events (both complete: synchronize on `end` first).
  static float elapsed_ms(const CudaEvent& start, const CudaEvent& end);

 private:
  cudaEvent_t event_ = nullptr;
};

// cuBLASLt handle: thread-safe to share; the stream is an argument of every matmul.
class CublasLtHandle {
 public:
  CublasLtHandle();
  ~CublasLtHandle();
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// cuDNN handle: bound to one stream (cudnnSetStream), so one per Context, not shared by threads.
class CudnnHandle {
 public:
  explicit CudnnHandle(cudaStream_t stream);
  ~CudnnHandle();
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }
  void set_stream(cudaStream_t stream);

 private:
  cudnnHandle_t handle_ = nullptr;
};

}  // namespace treadle::cuda

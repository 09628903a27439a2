// Tensor::to(Device) in a CUDA build: copies between the host and a CUDA device into fresh memory of
// the target side. Device memory comes from cudaMalloc and goes back with the storage's last owner:
// a tensor the host keeps, not a step's buffer (steps use the caching allocators of the context,
// the trainer and the model).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_copy.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Owned device memory for a tensor's storage; freeing never throws (a failure, e.g. at process exit
// after the driver shut down, is cleared so that it does not surface in a later call).
std::shared_ptr<void> device_memory(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc(Tensor.to)");
  return std::shared_ptr<void>(p, [](void* q) {
    if (cudaFree(q) != cudaSuccess) cudaGetLastError();
  });
}

}  // namespace

Tensor copy_tensor_between_devices(const Tensor& t, Device device, void* stream) {
  for (Device d : {device, t.device()})
    if (d.kind == DeviceKind::cuda) require_cuda_device(d);
  const Tensor src = t.is_cpu() && !t.is_contiguous() ? t.clone() : t;
  if (!src.is_contiguous())
    throw_value_error("Tensor.to: a non-contiguous tensor on ", device_name(src.device()), " cannot be copied");
  const int index = device.kind == DeviceKind::cuda ? device.index : src.device().index;
  DeviceGuard guard(index);
  std::optional<CudaStream> own;  // never the default stream implicitly
  const cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : own.emplace(index).get();
  const std::size_t bytes = src.nbytes();
  if (device.kind == DeviceKind::cpu) {
    Tensor out(src.shape(), src.dtype());
    if (bytes > 0) copy_to_host(out.data(), src.data(), bytes, s);
    return out;
  }
  std::shared_ptr<void> memory = device_memory(bytes);
  if (bytes > 0) {
    if (src.is_cpu())
      copy_to_device(memory.get(), src.data(), bytes, s);
    else
      check_cuda(cudaMemcpyPeerAsync(memory.get(), device.index, src.data(), src.device().index, bytes, s),
                 "cudaMemcpyPeerAsync(Tensor.to)");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize(Tensor.to)");
  }
  void* data = memory.get();
  return Tensor::wrap_device(data, src.shape(), src.dtype(), device, std::move(memory));
}

}  // namespace treadle::cuda

// treadle/cuda.hpp: the device of a foreign pointer and the wait for a foreign stream.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/cuda.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

Device device_of_pointer(const void* ptr, const char* what) {
  if (ptr == nullptr) throw_value_error(what, ": the CUDA array's data pointer is null");
  cudaPointerAttributes attrs{};
  check_cuda(cudaPointerGetAttributes(&attrs, ptr), "cudaPointerGetAttributes(CUDA array data)");
  if (attrs.type != cudaMemoryTypeDevice && attrs.type != cudaMemoryTypeManaged)
    throw_value_error(what, ": the CUDA array's data at ", ptr, " is not device memory (cudaMemoryType ",
                      static_cast<int>(attrs.type), ")");
  return Device{DeviceKind::cuda, attrs.device};
}

void wait_for_stream(std::uintptr_t stream, const char* what) {
  if (stream == 0)
    throw_value_error(what, ": the CUDA array interface's stream must not be 0 (version 3: 1 is the legacy ",
                      "default stream, 2 the per-thread default stream)");
  const cudaStream_t s = stream == 1   ? cudaStreamLegacy
                         : stream == 2 ? cudaStreamPerThread
                                       : reinterpret_cast<cudaStream_t>(stream);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize(CUDA array's stream)");
}

}  // namespace treadle::cuda

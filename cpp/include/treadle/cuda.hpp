#pragma once
// Device memory the host owns (CUDA builds, -DTREADLE_WITH_CUDA=ON): what a binding needs to take
// another library's CUDA arrays (CuPy, torch, Numba: the CUDA array interface) as tensors of a model
// on backend "cuda" (Tensor::wrap_device). Declares nothing in a build without CUDA.
#include "treadle/config.hpp"  // TREADLE_WITH_CUDA as the library was built
#ifdef TREADLE_WITH_CUDA
#include <cstdint>

#include "treadle/dtype.hpp"
#include "treadle/export.hpp"

namespace treadle::cuda {

// The device that holds `ptr` (cudaPointerGetAttributes): ValueError naming `what` when it is host or
// unregistered memory, RuntimeError when the CUDA runtime fails (no driver or device).
TREADLE_API Device device_of_pointer(const void* ptr, const char* what);

// Waits until the work queued on a foreign stream is done, so data it produces can be read: `stream`
// as the CUDA array interface (version 3) gives it: 1 the legacy default stream, 2 the per-thread
// default stream, else a cudaStream_t's value. ValueError for 0 (the interface forbids it).
TREADLE_API void wait_for_stream(std::uintptr_t stream, const char* what);

}  // namespace treadle::cuda
#endif

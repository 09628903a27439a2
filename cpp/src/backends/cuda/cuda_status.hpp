#pragma once
// Status checking for the CUDA runtime, cuBLAS(Lt) and cuDNN: every failed call becomes a
// treadle::RuntimeError whose message names the call (its source text) and the library's status
// name and description, e.g.
//   "cudaMalloc(&ptr, bytes): cudaErrorMemoryAllocation (out of memory)".
// Use the macros so that the call's text is captured; the functions are for statuses obtained
// otherwise (and for tests of the message format).
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <string>

#include "treadle/error.hpp"

namespace treadle::cuda {

// The message a failed status turns into (no throw), for logs and tests.
std::string cuda_status_message(cudaError_t status, const char* call);
std::string cublas_status_message(cublasStatus_t status, const char* call);
std::string cudnn_status_message(cudnnStatus_t status, const char* call);

// Throw treadle::RuntimeError unless the status is success. A failed CUDA runtime call leaves its
// error in the thread's "last error" slot; check_cuda clears it (cudaGetLastError) so that a caught
// error does not resurface from the next, unrelated launch check.
void check_cuda(cudaError_t status, const char* call);
void check_cublas(cublasStatus_t status, const char* call);
void check_cudnn(cudnnStatus_t status, const char* call);

// After a kernel launch: configuration errors (too many threads, bad grid) surface here; faults
// inside the kernel surface at the next synchronizing call.
void check_launch(const char* kernel);

}  // namespace treadle::cuda

#define TREADLE_CUDA_CHECK(call) ::treadle::cuda::check_cuda((call), #call)
#define TREADLE_CUBLAS_CHECK(call) ::treadle::cuda::check_cublas((call), #call)
#define TREADLE_CUDNN_CHECK(call) ::treadle::cuda::check_cudnn((call), #call)

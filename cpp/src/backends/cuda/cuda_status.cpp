// Status -> message -> treadle::RuntimeError for the three NVIDIA libraries the backend calls.
#include "backends/cuda/cuda_status.hpp"

#include <cublasLt.h>

namespace treadle::cuda {

std::string cuda_status_message(cudaError_t status, const char* call) {
  return detail::concat(call, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

std::string cublas_status_message(cublasStatus_t status, const char* call) {
  // cuBLASLt's names are the same statuses as cuBLAS's; it needs no handle and no device.
  return detail::concat(call, ": ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ")");
}

std::string cudnn_status_message(cudnnStatus_t status, const char* call) {
  // cuDNN 9 keeps a per-thread description of the last failure, more specific than the status.
  char detail_text[512] = {0};
  cudnnGetLastErrorString(detail_text, sizeof(detail_text));
  std::string msg = detail::concat(call, ": ", cudnnGetErrorString(status));
  if (detail_text[0] != '\0') msg += detail::concat(" (", detail_text, ")");
  return msg;
}

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw RuntimeError(cuda_status_message(status, call));
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) throw RuntimeError(cublas_status_message(status, call));
}

void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) throw RuntimeError(cudnn_status_message(status, call));
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw RuntimeError(cuda_status_message(status, kernel));
}

}  // namespace treadle::cuda

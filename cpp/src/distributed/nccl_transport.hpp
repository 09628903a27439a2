#pragma once
// The NCCL transport of treadle::DataParallel (nccl_transport.cpp, builds with -DTREADLE_WITH_NCCL=ON).
#include <mpi.h>

#include <memory>
#include <string>

#include "treadle/data_parallel.hpp"

namespace treadle {

// Collective over `comm` (the core's communicator): the device transport that `requested` ("auto" or
// "nccl") resolves to on every rank, or null for "mpi" (always null in a build without NCCL). Throws
// the same ValueError on every rank where "nccl" cannot run.
std::unique_ptr<DeviceTransport> choose_nccl_transport(DataParallelCore& core, MPI_Comm comm,
                                                       const std::string& requested);

inline std::string backend_text(const std::string& backend) {
  return backend.empty() ? std::string("automatic host dispatch") : "'" + backend + "'";
}

}  // namespace treadle

#pragma once
// The collectives that data-parallel training needs, as a small interface with no MPI in it: the core
// library's DataParallelCore (treadle/data_parallel.hpp) is written against it once, and each way of
// reaching the host's communicator implements it - treadle::distributed over an MPI_Comm (C++, C,
// Fortran hosts), the Python module over an mpi4py Comm (calling mpi4py, so the core never links MPI).
//
// Every member except rank() and size() is collective over the communicator: all of its ranks call it,
// in the same order, with the same counts, dtypes and root. Failures of the underlying library throw
// treadle::RuntimeError naming the call.
#include <cstdint>
#include <string>
#include <vector>

#include "treadle/dtype.hpp"
#include "treadle/export.hpp"

namespace treadle {

enum class ReduceOp { sum, max };

class TREADLE_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank ends with the element-wise `op` over the ranks' `n` values of `dtype`
  // (f32, f64 or i64).
  virtual void allreduce(void* data, int64_t n, DType dtype, ReduceOp op) = 0;
  // Root's `n` values of `dtype` (f32, f64 or i64) to every rank, in place.
  virtual void broadcast(void* data, int64_t n, DType dtype, int root) = 0;
  // Every rank's `bytes` bytes, in rank order, into `all` (size() * bytes of them).
  virtual void allgather(const void* mine, int64_t bytes, void* all) = 0;

  // The one collective that may be left waiting: a non-blocking in-place sum of `n` float64 values,
  // then tested until it completes. `data` must stay valid until test_allreduce() returned true (after
  // a timeout, for as long as the communicator lives). One such allreduce at a time.
  virtual void start_allreduce(double* data, int n) = 0;
  virtual bool test_allreduce() = 0;
};

}  // namespace treadle

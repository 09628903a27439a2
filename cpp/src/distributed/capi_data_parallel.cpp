// The C API of data-parallel training (treadle/treadle_distributed.h): thin wrappers over
// treadle::DataParallel, sharing the core C API's error channel (treadle_last_error) and its checks of
// caller arrays (capi_internal.hpp).
#include "treadle/treadle_distributed.h"

#include <exception>
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "treadle/distributed.hpp"
#include "treadle/error.hpp"

struct treadle_data_parallel {
  treadle_trainer* trainer = nullptr;
  std::unique_ptr<treadle::DataParallel> dp;
};

using treadle::capi::guarded_call;
using treadle::capi::need;

namespace {

treadle::BufferSync buffer_sync(const char* name) {
  const std::string n = name ? name : "root";
  if (n == "root") return treadle::BufferSync::root;
  if (n == "average") return treadle::BufferSync::average;
  if (n == "local") return treadle::BufferSync::local;
  throw treadle::capi::ArgumentError("buffers must be \"root\", \"average\" or \"local\", got \"" + n + "\"");
}

void create(treadle_trainer* trainer, MPI_Comm comm, int root, const char* buffers, treadle_data_parallel** out) {
  need(out, "out") = nullptr;
  auto handle = std::make_unique<treadle_data_parallel>();
  handle->trainer = &need(trainer, "trainer");
  handle->dp = std::make_unique<treadle::DataParallel>(*trainer->trainer, comm, root, buffer_sync(buffers));
  *out = handle.release();
}

}  // namespace

extern "C" {

int treadle_data_parallel_create(treadle_trainer* trainer, MPI_Comm comm, int root, const char* buffers,
                                 treadle_data_parallel** out) {
  return guarded_call("treadle_data_parallel_create", [&] { create(trainer, comm, root, buffers, out); });
}

int treadle_data_parallel_create_f(treadle_trainer* trainer, MPI_Fint comm, int root, const char* buffers,
                                   treadle_data_parallel** out) {
  return guarded_call("treadle_data_parallel_create_f", [&] {
    treadle::check_host_mpi();  // MPI_Comm_f2c of another library, or before MPI_Init, is undefined
    create(trainer, MPI_Comm_f2c(comm), root, buffers, out);
  });
}

void treadle_data_parallel_free(treadle_data_parallel* dp) { delete dp; }

int treadle_data_parallel_step(treadle_data_parallel* dp, const void* x, int x_ndim, const int64_t* x_shape,
                               const void* y, int y_ndim, const int64_t* y_shape, double* loss) {
  return guarded_call("treadle_data_parallel_step", [&] {
    treadle_data_parallel& h = need(dp, "dp");
    treadle::Tensor xt, yt;
    std::string bad_arrays;
    try {
      xt = treadle::capi::step_input(*h.trainer, x, x_ndim, x_shape);
      yt = treadle::capi::step_target(*h.trainer, y, y_ndim, y_shape);
    } catch (const std::exception& e) {
      bad_arrays = std::string("treadle_data_parallel_step: ") + e.what();
    }
    // Arrays this rank cannot read still take part in the step, as a failure that every rank reports:
    // the other ranks are waiting in it.
    if (!bad_arrays.empty()) h.dp->fail_step(bad_arrays);
    const double l = h.dp->step(xt, yt);
    if (loss) *loss = l;
  });
}

int treadle_data_parallel_fail(treadle_data_parallel* dp, const char* error) {
  return guarded_call("treadle_data_parallel_fail", [&] {
    need(dp, "dp").dp->fail_step(error && *error ? error : "the host reported a failure");
  });
}

int treadle_data_parallel_set_timeout(treadle_data_parallel* dp, double seconds) {
  return guarded_call("treadle_data_parallel_set_timeout", [&] { need(dp, "dp").dp->set_timeout(seconds); });
}

int treadle_data_parallel_divergence(treadle_data_parallel* dp, double* divergence) {
  return guarded_call("treadle_data_parallel_divergence", [&] {
    need(divergence, "divergence") = need(dp, "dp").dp->parameter_divergence();
  });
}

int treadle_data_parallel_rank(const treadle_data_parallel* dp, int* rank, int* size) {
  return guarded_call("treadle_data_parallel_rank", [&] {
    const treadle_data_parallel& h = need(dp, "dp");
    if (rank) *rank = h.dp->rank();
    if (size) *size = h.dp->size();
  });
}

}  // extern "C"

// DataParallel's NCCL transport (builds with -DTREADLE_WITH_NCCL=ON): the gradient buffer of a model
// on backend "cuda" is allreduced in place on the device, on the trainer context's stream, with no
// host copy; the per-step (count, loss, error) exchange, the setup check and the state broadcast
// stay with DataParallelCore on the MPI communicator (data_parallel.cpp).
//
// The NCCL communicator is made from the host's MPI communicator: the root asks NCCL for a unique
// id, MPI_Bcast hands it to every rank, and every rank joins with its model's device ("cuda:N";
// "cuda" is cuda:0). Each process needs a GPU of its own: NCCL refuses two ranks on one device, and
// this file refuses it first, with the same ValueError on every rank. The weighting of uneven shards is the
// host path's "scale, then sum", as NCCL's pre-multiplied sum (ncclRedOpCreatePreMulSum): each rank's
// float32 gradients are multiplied by its float32 weight before the sum, with no extra kernel.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nccl_transport.hpp"
#include "treadle/backend.hpp"
#include "treadle/distributed.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

std::string nccl_message(ncclResult_t rc, const char* call, ncclComm_t comm) {
  std::string text = std::string("DataParallel: ") + call + " failed: " + ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);  // NCCL's own account of the failure, when it kept one
  if (last && *last) text += std::string(" (") + last + ")";
  return text;
}

// Every NCCL status goes through this: a RuntimeError naming the call (as cuda_status.hpp does).
void check_nccl(ncclResult_t rc, const char* call, ncclComm_t comm) {
  if (rc != ncclSuccess && rc != ncclInProgress) throw_runtime_error(nccl_message(rc, call, comm));
}

void check_mpi_call(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw_runtime_error("DataParallel: ", call, " failed: ", std::string(text, len));
}

// This rank's view: whether its model is on a CUDA device, whether that device is usable, and which
// GPU it is.
struct Probe {
  int32_t on_cuda = 0;
  int32_t device_ok = 0;
  char bus_id[64] = {};
};

std::string probe_device(Probe& p, int device) {
  const std::string name = "cuda:" + std::to_string(device);
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no error behind for the next, unrelated call
    return "transport 'nccl' needs a CUDA device for " + name + ", but cudaGetDeviceCount failed: " +
           cudaGetErrorName(st) + " (" + cudaGetErrorString(st) + ")";
  }
  if (count <= device)
    return "transport 'nccl' needs a CUDA device for " + name + ", but this machine has " + std::to_string(count) +
           " CUDA device(s)";
  const cudaError_t id = cudaDeviceGetPCIBusId(p.bus_id, sizeof p.bus_id - 1, device);
  if (id != cudaSuccess) {
    cudaGetLastError();
    return "transport 'nccl': cudaDeviceGetPCIBusId(" + name + ") failed: " + cudaGetErrorName(id);
  }
  p.device_ok = 1;
  return {};
}

// Makes the model's device current for ncclCommInitRank (NCCL binds the communicator to the current
// device) and restores the host's device afterwards.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1, cudaGetLastError();
    if (previous_ != device_ && cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  }
  ~CurrentDevice() {
    if (previous_ >= 0 && previous_ != device_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// The NCCL communicator over `comm`: the root's unique id (or its failure) to every rank over MPI,
// then every rank joins with `device`. Null, with `error` set, where this rank's join failed.
ncclComm_t join_nccl(MPI_Comm comm, int rank, int size, int root, int device, std::string& error) {
  struct {
    int32_t status = ncclSuccess;
    ncclUniqueId id{};
  } hello;
  if (rank == root) hello.status = ncclGetUniqueId(&hello.id);
  check_mpi_call(MPI_Bcast(&hello, sizeof hello, MPI_BYTE, root, comm), "MPI_Bcast");
  if (hello.status != ncclSuccess)  // the same message on every rank
    throw_runtime_error("DataParallel: ncclGetUniqueId failed on root rank ", root, ": ",
                        ncclGetErrorString(static_cast<ncclResult_t>(hello.status)));
  ncclComm_t nccl = nullptr;
  ncclResult_t rc;
  {
    CurrentDevice on_device(device);
    rc = ncclCommInitRank(&nccl, size, hello.id, rank);
  }
  if (rc == ncclSuccess) return nccl;
  error = nccl_message(rc, "ncclCommInitRank", nccl);
  return nullptr;
}

// NCCL in place in the model's device buffers, on the trainer context's stream.
class NcclTransport final : public DeviceTransport {
 public:
  NcclTransport(Trainer& trainer, ncclComm_t comm, Device device) : trainer_(trainer), comm_(comm), device_(device) {}
  ~NcclTransport() override { ncclCommDestroy(comm_); }  // a failure here has nobody left to tell
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  const char* name() const override { return "nccl"; }

  // The communicator is bound to the device it was made on.
  std::string problem() const override {
    const std::string& backend = trainer_.model().backend();
    const Device now = backend_device(backend);
    if (now == device_) return {};
    if (now.kind == DeviceKind::cuda)
      return "transport 'nccl' was set up on " + device_name(device_) + ", but the model is now on " + device_name(now);
    return "transport 'nccl' needs the model on backend 'cuda', but its backend is now " + backend_text(backend);
  }

  void allreduce_gradients(double weight) override {
    Model& model = trainer_.model();
    void* stream = trainer_.context().cuda_stream(device_.index);
    const Model::DeviceBuffers d = model.device_buffers(stream);  // after the step's work, host writes uploaded
    const auto n = static_cast<std::size_t>(model.num_trainable());
    ncclRedOp_t op = ncclSum;
    float w = static_cast<float>(weight);  // as the host path, which multiplies float32 gradients by float32(w)
    const bool weighted = weight != 1.0;
    ncclResult_t made = ncclSuccess, rc = ncclSuccess, freed = ncclSuccess;
    if (weighted) made = ncclRedOpCreatePreMulSum(&op, &w, ncclFloat, ncclScalarHostImmediate, comm_);
    if (made == ncclSuccess) {
      rc = ncclAllReduce(d.grads, d.grads, n, ncclFloat, op, comm_, static_cast<cudaStream_t>(stream));
      if (weighted) freed = ncclRedOpDestroy(op, comm_);  // allowed once the call that used it has returned
    }
    model.device_written(stream, false, true);  // the update (queued next on the stream) reads them
    check_nccl(made, "ncclRedOpCreatePreMulSum", comm_);
    check_nccl(rc, "ncclAllReduce", comm_);
    check_nccl(freed, "ncclRedOpDestroy", comm_);
  }

  void sync_buffers(const std::vector<std::pair<int64_t, int64_t>>& spans, BufferSync mode, int root) override {
    Model& model = trainer_.model();
    void* stream = trainer_.context().cuda_stream(device_.index);
    const Model::DeviceBuffers d = model.device_buffers(stream);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    // One group: the non-trained slots (running statistics) go together, in place in the device
    // parameter buffer; "average" is NCCL's mean (each rank's value times 1/size, summed).
    ncclResult_t rc = ncclGroupStart();
    const char* call = "ncclGroupStart";
    for (std::size_t i = 0; rc == ncclSuccess && i < spans.size(); ++i) {
      float* p = static_cast<float*>(d.params) + spans[i].first;
      const auto n = static_cast<std::size_t>(spans[i].second);
      rc = mode == BufferSync::root ? ncclBroadcast(p, p, n, ncclFloat, root, comm_, s)
                                    : ncclAllReduce(p, p, n, ncclFloat, ncclAvg, comm_, s);
      call = mode == BufferSync::root ? "ncclBroadcast" : "ncclAllReduce";
    }
    const ncclResult_t end = ncclGroupEnd();  // closes the group whatever happened inside
    model.device_written(stream, true, false);
    check_nccl(rc, call, comm_);
    check_nccl(end, "ncclGroupEnd", comm_);
  }

 private:
  Trainer& trainer_;
  ncclComm_t comm_;
  Device device_;
};

}  // namespace

std::unique_ptr<DeviceTransport> choose_nccl_transport(DataParallelCore& core, MPI_Comm comm,
                                                       const std::string& requested) {
  if (requested == "mpi") return nullptr;
  const int size = core.size();
  Probe mine;
  std::string error;
  const Device device = backend_device(core.trainer().model().backend());
  mine.on_cuda = device.kind == DeviceKind::cuda ? 1 : 0;
  if (mine.on_cuda || requested == "nccl") error = probe_device(mine, device.index);
  std::vector<Probe> all(static_cast<std::size_t>(size));
  check_mpi_call(MPI_Allgather(&mine, sizeof(Probe), MPI_BYTE, all.data(), sizeof(Probe), MPI_BYTE, comm),
                 "MPI_Allgather");
  bool every_cuda = true, every_device = true;
  int first = -1, second = -1;  // two ranks on the same GPU
  for (int r = 0; r < size; ++r) {
    every_cuda = every_cuda && all[r].on_cuda;
    every_device = every_device && all[r].device_ok;
    for (int q = 0; q < r && first < 0 && all[r].device_ok; ++q)
      if (all[q].device_ok && std::strcmp(all[q].bus_id, all[r].bus_id) == 0) first = q, second = r;
  }
  if (requested == "auto" && !(every_cuda && every_device && first < 0)) return nullptr;
  if (!every_device) core.raise_failure(error, "DataParallel");  // every rank takes this branch: same message
  if (first >= 0)
    throw_value_error("DataParallel: transport 'nccl' needs one GPU per process, but ranks ", first, " and ", second,
                      " share the GPU at PCI bus ", all[first].bus_id,
                      "; processes sharing a GPU must use transport 'mpi'");
  ncclComm_t nccl = join_nccl(comm, core.rank(), size, core.root(), device.index, error);
  // Agree, so that no rank trains on a communicator its peers failed to join.
  int failed = nccl ? 0 : 1;
  check_mpi_call(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, comm), "MPI_Allreduce");
  if (failed) {
    if (nccl) ncclCommAbort(nccl);
    throw_runtime_error(core.failure_message(error, "DataParallel"));
  }
  return std::make_unique<NcclTransport>(core.trainer(), nccl, device);
}

}  // namespace treadle

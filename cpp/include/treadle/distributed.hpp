#pragma once
// Data-parallel training over an MPI communicator that the host lends (optional component
// treadle::distributed, built with -DTREADLE_WITH_MPI=ON; the core library never links MPI).
//
// treadle is a guest in the host's MPI job: it never calls MPI_Init/MPI_Finalize and never uses
// MPI_COMM_WORLD on its own. Every member below except rank()/size() is collective over the
// communicator: all of its ranks call it, in the same order.
//
//   treadle::DataParallel dp(trainer, comm);   // checks the setup, broadcasts root's state
//   double loss = dp.step(x_local, y_local);   // global mean loss; same update on every rank
//
// The algorithm is DataParallelCore (treadle/data_parallel.hpp, in the core library); this class gives
// it an MPI communicator, and the Python treadle.distributed.DataParallel runs the same core over mpi4py.
//
// Transports for the gradient buffer (DataParallelOptions::transport): "mpi" moves it through host
// memory (a model on backend "cuda" downloads its gradients, the allreduce runs on the host, the
// update uploads them); "nccl" (builds with -DTREADLE_WITH_NCCL=ON, models on "cuda", one GPU per
// process) allreduces the device gradient buffer in place on the trainer's stream; "auto" picks
// nccl where every rank qualifies, else mpi. The small per-step exchange always uses MPI.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "treadle/data_parallel.hpp"  // BufferSync, DataParallelOptions and the algorithm, DataParallelCore
#include "treadle/export.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// Throws ValueError naming the problem unless the MPI library in this process is the implementation
// treadle::distributed was built for (the MPICH ABI or Open MPI: a handle of one means nothing to the
// other), initialized and not finalized. DataParallel's constructors call it first; a host passing a
// Fortran handle (MPI_Fint) calls it before MPI_Comm_f2c.
TREADLE_API void check_host_mpi();

// DataParallelCore over an MPI communicator, plus the NCCL transport where it was built in.
class TREADLE_API DataParallel {
 public:
  // Collective. Checks that every rank holds the same parameter layout, dtype, loss, optimizer
  // (name and lr) and clipping, else throws the same ValueError on every rank naming the first
  // difference; then broadcasts root's parameters, optimizer state and step count. The trainer and
  // the communicator must outlive this object; the communicator is used, never duplicated or freed.
  DataParallel(Trainer& trainer, MPI_Comm comm, int root = 0, BufferSync buffers = BufferSync::root);
  // The same with the transport chosen (see DataParallelOptions). With "nccl" the constructor also
  // makes the NCCL communicator (collective), which the destructor destroys. `host`: a binding's own
  // checks and settings (DataParallelHost).
  DataParallel(Trainer& trainer, MPI_Comm comm, const DataParallelOptions& options,
               const DataParallelHost& host = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // zero_grad + compute_gradients on the local shard + allreduce_gradients + update. Shards may
  // differ in size or be empty. If any rank throws (bad input, model error), no rank updates and
  // every rank throws ValueError("DataParallel::step: rank R failed: ...").
  // Throws TimeoutError (on the ranks that arrived) when not every rank arrives within the timeout.
  double step(const Tensor& x, const Tensor& y) { return core_->step(x, y); }
  // Collective with the other ranks' step(): this rank takes part as one that failed with `error` (a
  // check of the host's own, arrays it could not pass), and every rank, this one included, throws the
  // ValueError step() throws for a failing rank. Nothing changes on any rank.
  [[noreturn]] void fail_step(const std::string& error) { core_->fail_step(error); }

  // For a host running the phases itself: after compute_gradients (or forward + backward) on the
  // local shard, sums the gradients into those of the global loss, then the host calls update().
  // `count`: terms the local mean loss averaged over (0 for an empty shard); `loss`: the local loss;
  // `error`: non-empty if this rank failed, making every rank throw. Returns the global loss.
  double allreduce_gradients(int64_t count, double loss, const std::string& error = {}) {
    return core_->allreduce_gradients(count, loss, error);
  }

  // Copies root's parameters, optimizer state buffers and step count to every rank (through the
  // host with either transport; a model on "cuda" uploads them before its next device use).
  void broadcast_state() { core_->broadcast_state(); }
  // Makes the non-trained state agree as `buffers` says (step and allreduce_gradients call it).
  void sync_buffers() { core_->sync_buffers(); }
  // Largest |p - p_root| over all parameters and ranks; 0 when the replicas are in sync.
  double parameter_divergence() { return core_->parameter_divergence(); }

  // The timeout of DataParallelOptions (seconds; 0: none), for the following steps.
  void set_timeout(double seconds) { core_->set_timeout(seconds); }
  double timeout() const { return core_->timeout(); }

  int rank() const { return core_->rank(); }
  int size() const { return core_->size(); }
  int root() const { return core_->root(); }
  int64_t steps() const { return core_->steps(); }
  // In the gradient allreduce, all steps. With "nccl": the time to enqueue it (it completes on the
  // trainer's stream, before the update queued after it).
  double allreduce_seconds() const { return core_->allreduce_seconds(); }
  double last_allreduce_seconds() const { return core_->last_allreduce_seconds(); }
  // In the small (count, loss, error) allreduce, all steps: waiting for the slowest rank.
  double wait_seconds() const { return core_->wait_seconds(); }
  // The transport in use: "mpi" or "nccl" ("auto" resolved at construction).
  std::string transport() const { return core_->transport(); }
  // The algorithm itself (the Python binding drives a step through it in pieces).
  DataParallelCore& core() { return *core_; }

 private:
  std::unique_ptr<Communicator> comm_;  // over the host's MPI_Comm (data_parallel.cpp)
  std::unique_ptr<DataParallelCore> core_;
};

}  // namespace treadle

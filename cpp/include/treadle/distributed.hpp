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
// Semantics match the Python treadle.distributed.DataParallel (see docs/distributed.md).
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
#include <utility>
#include <vector>

#include "treadle/export.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// Non-trained state that training changes (BatchNorm's running statistics: parameters with
// requires_grad=false), which each rank updates from its own shard. After each gradient allreduce:
// root: every rank takes the root's values (torch DDP's choice); average: the mean over the ranks;
// local: left alone (replicas then differ in that state). Batch statistics used inside a step are
// always the local shard's (there is no SyncBatchNorm).
enum class BufferSync { root, average, local };

struct DataParallelOptions {
  int root = 0;
  BufferSync buffers = BufferSync::root;
  // "auto": "nccl" in a build with NCCL when every rank's model is on backend "cuda" and every rank
  // has a GPU of its own, else "mpi". "nccl" where it cannot run: ValueError saying why.
  std::string transport = "auto";
  // Seconds a step waits in its first collective for every rank to arrive (0: as long as MPI waits,
  // which is forever for a rank that left). After a timeout the object is unusable (a collective stays
  // pending on the communicator): every later call throws, and the host should abort the job.
  double timeout = 0.0;
};

// Throws ValueError naming the problem unless the MPI library in this process is the implementation
// treadle::distributed was built for (the MPICH ABI or Open MPI: a handle of one means nothing to the
// other), initialized and not finalized. DataParallel's constructors call it first; a host passing a
// Fortran handle (MPI_Fint) calls it before MPI_Comm_f2c.
TREADLE_API void check_host_mpi();

class TREADLE_API DataParallel {
 public:
  // Collective. Checks that every rank holds the same parameter layout, dtype, loss, optimizer
  // (name and lr) and clipping, else throws the same ValueError on every rank naming the first
  // difference; then broadcasts root's parameters, optimizer state and step count. The trainer and
  // the communicator must outlive this object; the communicator is used, never duplicated or freed.
  DataParallel(Trainer& trainer, MPI_Comm comm, int root = 0, BufferSync buffers = BufferSync::root);
  // The same with the transport chosen (see DataParallelOptions). With "nccl" the constructor also
  // makes the NCCL communicator (collective), which the destructor destroys.
  DataParallel(Trainer& trainer, MPI_Comm comm, const DataParallelOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // zero_grad + compute_gradients on the local shard + allreduce_gradients + update. Shards may
  // differ in size or be empty. If any rank throws (bad input, model error), no rank updates and
  // every rank throws ValueError("DataParallel::step: rank R failed: ...").
  // Throws TimeoutError (on the ranks that arrived) when not every rank arrives within the timeout.
  double step(const Tensor& x, const Tensor& y);
  // Collective with the other ranks' step(): this rank takes part as one that failed with `error` (a
  // check of the host's own, arrays it could not pass), and every rank, this one included, throws the
  // ValueError step() throws for a failing rank. Nothing changes on any rank.
  [[noreturn]] void fail_step(const std::string& error);

  // For a host running the phases itself: after compute_gradients (or forward + backward) on the
  // local shard, sums the gradients into those of the global loss, then the host calls update().
  // `count`: terms the local mean loss averaged over (0 for an empty shard); `loss`: the local loss;
  // `error`: non-empty if this rank failed, making every rank throw. Returns the global loss.
  double allreduce_gradients(int64_t count, double loss, const std::string& error = {});

  // Copies root's parameters, optimizer state buffers and step count to every rank (through the
  // host with either transport; a model on "cuda" uploads them before its next device use).
  void broadcast_state();
  // Makes the non-trained state agree as `buffers` says (step and allreduce_gradients call it).
  void sync_buffers();
  // Largest |p - p_root| over all parameters and ranks; 0 when the replicas are in sync.
  double parameter_divergence();

  // The timeout of DataParallelOptions (seconds; 0: none), for the following steps.
  void set_timeout(double seconds);
  double timeout() const { return timeout_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int root() const { return root_; }
  int64_t steps() const { return steps_; }
  // In the gradient allreduce, all steps. With "nccl": the time to enqueue it (it completes on the
  // trainer's stream, before the update queued after it).
  double allreduce_seconds() const { return allreduce_seconds_; }
  // The transport in use: "mpi" or "nccl" ("auto" resolved at construction).
  const std::string& transport() const { return transport_; }

 private:
  double reduce(int64_t count, double loss, const std::string& error, const char* where);
  void check_same_setup(const std::string& transport);
  // Collective: throws the same ValueError on every rank if any rank passes a non-empty error.
  [[noreturn]] void raise_failure(const std::string& error, const char* where);
  // Collective: the text raise_failure throws ("<where>: rank R failed: <error>").
  std::string failure_message(const std::string& error, const char* where);
  void pack_buffers(Tensor& into) const;    // non-trained slots -> contiguous
  void unpack_buffers(const Tensor& from);  // and back
  // Collective: the transport `requested` resolves to on every rank ("mpi" or "nccl"), the NCCL
  // communicator made for "nccl". Throws the same ValueError on every rank where nccl cannot run.
  void choose_transport(const std::string& requested);
  void allreduce_on_device(double weight);  // the gradient allreduce of transport "nccl"
  void sync_buffers_on_device();

  Trainer& trainer_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, root_ = 0;
  BufferSync buffers_ = BufferSync::root;
  std::vector<std::pair<int64_t, int64_t>> buffer_spans_;  // (offset, elements) in the flat buffer
  Tensor packed_, saved_;                                  // sized once: steps allocate nothing
  int64_t steps_ = 0;
  double allreduce_seconds_ = 0.0;
  double timeout_ = 0.0;
  double head_[3] = {0.0, 0.0, 0.0};  // the step's first allreduce: a member, as it may stay pending
  std::string broken_;                // why this object can no longer be used (a timed-out collective)
  void check_usable(const char* where) const;
  void allreduce_head(const char* where);
  std::string transport_ = "mpi";
  // The NCCL communicator and what goes with it (nccl_transport.cpp); null with transport "mpi".
  struct Nccl;
  struct NcclDeleter {
    void operator()(Nccl* n) const noexcept;
  };
  std::unique_ptr<Nccl, NcclDeleter> nccl_;
};

}  // namespace treadle

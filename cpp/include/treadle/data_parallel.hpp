#pragma once
// Data-parallel training over a Communicator (treadle/communicator.hpp): the algorithm, once, in the
// core library, with no MPI in it. Hosts reach it through
//   * treadle::DataParallel (treadle/distributed.hpp, optional library treadle::distributed): an
//     MPI_Comm from C++, C or Fortran, and the NCCL transport;
//   * treadle.distributed.DataParallel (Python): an mpi4py Comm, through treadle._core (no MPI link),
//     or through treadle._distributed where that was built.
//
// Per step: one small allreduce (count, loss, error flag: 3 float64) that tells every rank the global
// count and whether any rank failed, then one in-place sum of the flat gradient buffer, each rank's
// gradient weighted by count / global count first (docs/distributed.md, "What a step computes").
// Every member except the accessors is collective over the communicator.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "treadle/communicator.hpp"
#include "treadle/export.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// Non-trained state that training changes (BatchNorm's running statistics: parameters with
// requires_grad=false), which each rank updates from its own shard. After each gradient allreduce:
// root: every rank takes the root's values (torch DDP's choice); average: the mean over the ranks;
// local: left alone (replicas then differ in that state). Batch statistics used inside a step are
// always the local shard's (there is no SyncBatchNorm).
enum class BufferSync { root, average, local };
TREADLE_API const char* buffer_sync_name(BufferSync b);  // "root", "average", "local"

// (what, value) settings that must agree on every rank.
using SetupItems = std::vector<std::pair<std::string, std::string>>;

struct DataParallelOptions {
  int root = 0;
  BufferSync buffers = BufferSync::root;
  // "auto": "nccl" in a build with NCCL when every rank's model is on backend "cuda" and every rank
  // has a GPU of its own, else "mpi". "nccl" where it cannot run: ValueError saying why.
  std::string transport = "auto";
  // Seconds a step waits in its first collective for every rank to arrive (0: as long as the
  // communicator waits, which is forever for a rank that left). After a timeout the object is
  // unusable (a collective stays pending on the communicator): every later call throws TimeoutError,
  // and the host should abort the job.
  double timeout = 0.0;
};

// What a host (a language binding) adds to the constructor's checks.
struct DataParallelHost {
  // A problem the host found with this rank's own arguments (a value it could not convert, a choice
  // only it knows): reported like the constructor's own checks, the same ValueError on every rank.
  std::string error;
  // More settings that must agree on every rank, compared after treadle's own; an entry named like
  // one of treadle's ("optimizer") replaces that description with the host's (richer) one.
  SetupItems setup;
};

// A transport that moves the gradient buffer on the device instead of through the Communicator
// (the NCCL one of treadle::distributed). The small exchange, the setup check and the state
// broadcast stay on the Communicator.
class TREADLE_API DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  virtual const char* name() const = 0;
  // What keeps it from running now ("" if nothing): reported to every rank as this rank's failure.
  virtual std::string problem() const = 0;
  // Sums the gradients in place, each rank's multiplied by `weight` first.
  virtual void allreduce_gradients(double weight) = 0;
  // Makes the non-trained slots, (offset, elements) spans of the flat parameters, agree as `mode` says.
  virtual void sync_buffers(const std::vector<std::pair<int64_t, int64_t>>& spans, BufferSync mode, int root) = 0;
};

class TREADLE_API DataParallelCore {
 public:
  // Collective. Each rank checks its arguments (root, timeout, transport, host.error) and the ranks
  // agree; then every rank's setup (parameter layout, dtype, loss, optimizer, clipping, guards, loss
  // scaling, buffers, transport, host.setup) is compared with the root's, else the same ValueError on
  // every rank names the first difference; then root's state is broadcast. The trainer and the
  // communicator must outlive this object.
  DataParallelCore(Trainer& trainer, Communicator& comm, const DataParallelOptions& options,
                   const DataParallelHost& host = {});
  ~DataParallelCore();
  DataParallelCore(const DataParallelCore&) = delete;
  DataParallelCore& operator=(const DataParallelCore&) = delete;

  // zero_grad + compute_gradients on the local shard + the exchange + update. If any rank throws, no
  // rank updates and every rank throws ValueError("DataParallel::step: rank R failed: ...").
  double step(const Tensor& x, const Tensor& y);
  // This rank takes part in the other ranks' step() as one that failed with `error`; every rank throws.
  [[noreturn]] void fail_step(const std::string& error);
  // After compute_gradients on the local shard: the gradient of the global loss on every rank.
  double allreduce_gradients(int64_t count, double loss, const std::string& error = {});

  // step() in pieces, for a host that computes the gradients itself (the Python class); `where`
  // names the host's member in messages. begin_step: zero_grad, and keep the non-trained state;
  // end_step: the exchange, then update (or, if a rank failed, that state put back, and throw).
  void begin_step(const char* where);
  double end_step(int64_t count, double loss, const std::string& error, const char* where);
  double allreduce_gradients(int64_t count, double loss, const std::string& error, const char* where);
  // The terms of a shard's mean loss (y's elements); ValueError for shapes that are not a batch.
  static int64_t shard_count(const Shape& x, const Shape& y);

  void broadcast_state();  // root's parameters, optimizer state, step count and loss scale
  void sync_buffers();     // the non-trained state, as `buffers` says (the exchange calls it)
  // Largest |p - p_root| over all parameters and ranks; 0 when in sync, NaN if any is not finite.
  double parameter_divergence();

  void set_timeout(double seconds);
  double timeout() const { return timeout_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int root() const { return root_; }
  BufferSync buffers() const { return buffers_; }
  int64_t steps() const { return steps_; }
  double allreduce_seconds() const { return allreduce_seconds_; }            // gradient allreduces
  double last_allreduce_seconds() const { return last_allreduce_seconds_; }  // the last one
  double wait_seconds() const { return wait_seconds_; }  // in the small allreduce: waiting for the slowest
  const char* transport() const { return device_ ? device_->name() : "mpi"; }
  Trainer& trainer() { return trainer_; }
  Communicator& communicator() { return comm_; }

  // Moves the gradients with `device` from now on (collective: every rank sets one, or none).
  void set_device_transport(std::unique_ptr<DeviceTransport> device) { device_ = std::move(device); }
  // Collective: the text a failure reports ("<where>: rank R failed[ (and N more ranks)]: <error>"),
  // and the same ValueError thrown on every rank.
  std::string failure_message(const std::string& error, const char* where);
  [[noreturn]] void raise_failure(const std::string& error, const char* where);
  // That text from every rank's error ("" for a rank that did not fail; at least one did).
  static std::string failure_text(const std::vector<std::string>& errors, const char* where);

 private:
  double reduce(int64_t count, double loss, const std::string& error, const char* where);
  void allreduce_head(const char* where);
  void check_usable(const char* where) const;
  void check_same_setup(const SetupItems& host, const std::string& transport);
  std::vector<std::string> allgather_strings(const std::string& mine);
  void pack_buffers(Tensor& into) const;    // non-trained slots -> contiguous
  void unpack_buffers(const Tensor& from);  // and back

  Trainer& trainer_;
  Communicator& comm_;
  int rank_ = 0, size_ = 1, root_ = 0;
  BufferSync buffers_ = BufferSync::root;
  std::vector<std::pair<int64_t, int64_t>> buffer_spans_;  // (offset, elements) in the flat buffer
  Tensor packed_, saved_;                                  // sized once: steps allocate nothing
  int64_t steps_ = 0;
  double allreduce_seconds_ = 0.0, last_allreduce_seconds_ = 0.0, wait_seconds_ = 0.0;
  double timeout_ = 0.0;
  double head_[3] = {0.0, 0.0, 0.0};  // the step's first allreduce: a member, as it may stay pending
  std::string broken_;                // why this object can no longer be used (a timed-out collective)
  std::unique_ptr<DeviceTransport> device_;
};

}  // namespace treadle

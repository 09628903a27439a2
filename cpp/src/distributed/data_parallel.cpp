// treadle::DataParallel: DataParallelCore (the algorithm, in the core library) over a host-lent MPI
// communicator - the MPI checks of the host's library and handle, the MPI calls behind the Communicator
// interface, and the choice of the gradient transport ("mpi" here, "nccl" in nccl_transport.cpp).
#include <algorithm>
#include <cctype>
#include <memory>
#include <string>

#include "nccl_transport.hpp"
#include "treadle/backend.hpp"
#include "treadle/distributed.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

// Communication failures are not the caller's mistake: runtime_error. (With MPI's default error
// handler, MPI_ERRORS_ARE_FATAL, MPI aborts before we see them; a host may have set ERRORS_RETURN.)
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw_runtime_error("DataParallel: ", call, " failed: ", std::string(text, len));
}

int as_count(int64_t n) {  // MPI counts are int; buffers beyond 2^31 elements would need chunking
  if (n > INT32_MAX) throw_value_error("DataParallel: buffer of ", n, " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

// The MPI implementation this library was compiled for: MPICH's ABI (MPICH, Intel MPI, Cray MPICH,
// MVAPICH: MPI_Comm is an int) or Open MPI's (MPI_Comm is a pointer).
#if defined(OMPI_MAJOR_VERSION)
constexpr bool kBuiltForOpenMpi = true;
#else
constexpr bool kBuiltForOpenMpi = false;
#endif

std::string runtime_mpi_library() {  // the first line of MPI_Get_library_version (callable before MPI_Init)
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string version(text, static_cast<std::size_t>(std::max(0, len)));
  version = version.substr(0, version.find_first_of("\n,"));
  std::string words;  // "MPICH Version:      5.0.2" -> "MPICH Version: 5.0.2"
  for (char c : version) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (!space || (!words.empty() && words.back() != ' ')) words += space ? ' ' : c;
  }
  while (!words.empty() && words.back() == ' ') words.pop_back();
  return words.empty() ? "an unnamed MPI library" : words;
}

// Errors about the communicator come back as codes while `comm` is checked, instead of aborting the
// job (MPI's default handler): MPI_COMM_WORLD's handler, which MPI calls for an invalid handle, is set to
// MPI_ERRORS_RETURN for the check and put back after.
int test_intercommunicator(MPI_Comm comm, int* inter) {
  MPI_Errhandler host_handler = MPI_ERRHANDLER_NULL;
  if (MPI_Comm_get_errhandler(MPI_COMM_WORLD, &host_handler) != MPI_SUCCESS) return MPI_Comm_test_inter(comm, inter);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int rc = MPI_Comm_test_inter(comm, inter);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, host_handler);
  MPI_Errhandler_free(&host_handler);
  return rc;
}

// What is wrong with asking for `transport` on this rank ("" if nothing).
std::string transport_problem(const std::string& transport, const Model& model) {
  if (transport != "nccl") return {};  // the core checks the value
#ifndef TREADLE_WITH_NCCL
  return "transport 'nccl' is not in this build: configure with -DTREADLE_WITH_NCCL=ON (which needs "
         "-DTREADLE_WITH_CUDA=ON and -DTREADLE_WITH_MPI=ON, and NCCL: pip install nvidia-nccl-cu13), or use "
         "transport 'mpi'";
#endif
  if (backend_device(model.backend()).kind != DeviceKind::cuda)
    return "transport 'nccl' needs the model on backend 'cuda', but its backend is " + backend_text(model.backend()) +
           ": set the model's backend to 'cuda' first, or use transport 'mpi'";
  return {};
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    default: throw_type_error("DataParallel: MPI buffers must be float32, float64 or int64, got ", dtype_name(t));
  }
}

// The Communicator of DataParallelCore over the host's MPI_Comm: the MPI calls, nothing else.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(void* data, int64_t n, DType dtype, ReduceOp op) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n), mpi_type(dtype), op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                            comm_),
              "MPI_Allreduce");
  }
  void broadcast(void* data, int64_t n, DType dtype, int root) override {
    check_mpi(MPI_Bcast(data, as_count(n), mpi_type(dtype), root, comm_), "MPI_Bcast");
  }
  void allgather(const void* mine, int64_t bytes, void* all) override {
    check_mpi(MPI_Allgather(mine, as_count(bytes), MPI_BYTE, all, as_count(bytes), MPI_BYTE, comm_), "MPI_Allgather");
  }
  void start_allreduce(double* data, int n) override {
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_DOUBLE, MPI_SUM, comm_, &request_), "MPI_Iallreduce");
  }
  bool test_allreduce() override {
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace

#ifndef TREADLE_WITH_NCCL
// Without NCCL every transport is "mpi" (transport_problem refused "nccl" already).
std::unique_ptr<DeviceTransport> choose_nccl_transport(DataParallelCore&, MPI_Comm, const std::string&) {
  return nullptr;
}
#endif

void check_host_mpi() {
  const std::string library = runtime_mpi_library();
  const bool open_mpi = library.find("Open MPI") != std::string::npos;
  if (open_mpi != kBuiltForOpenMpi)
    throw_value_error("DataParallel: the host's MPI is ", library, ", but treadle::distributed was built for ",
                      kBuiltForOpenMpi ? "Open MPI" : "the MPICH ABI (MPICH, Intel MPI, Cray MPICH, MVAPICH)",
                      ": build treadle against the host's MPI (docs/distributed.md)");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw_value_error("DataParallel: MPI is ", finalized ? "finalized" : "not initialized", " in ", library,
                      ", the MPI library treadle::distributed uses: the host initializes MPI (treadle never does) "
                      "before it lends a communicator, and with this MPI: a host on another MPI library needs a "
                      "treadle built against it (docs/distributed.md)");
}

DataParallel::DataParallel(Trainer& trainer, MPI_Comm comm, int root, BufferSync buffers)
    : DataParallel(trainer, comm, DataParallelOptions{root, buffers, "auto", 0.0}) {}

DataParallel::~DataParallel() = default;  // the device transport (NCCL communicator) first, then the core

DataParallel::DataParallel(Trainer& trainer, MPI_Comm comm, const DataParallelOptions& options,
                           const DataParallelHost& host) {
  check_host_mpi();
  if (comm == MPI_COMM_NULL) throw_value_error("DataParallel: comm is MPI_COMM_NULL (this rank is not in the group)");
  int inter = 0;
  if (test_intercommunicator(comm, &inter) != MPI_SUCCESS)
    throw_value_error("DataParallel: comm is not a valid communicator of ", runtime_mpi_library(),
                      " (freed, never created, or a handle of another MPI library)");
  if (inter) throw_value_error("DataParallel: comm must be an intra-communicator");
  comm_ = std::make_unique<MpiCommunicator>(comm);
  // What this build and this rank's model say about the transport, checked with the core's arguments.
  DataParallelHost checked = host;
  if (checked.error.empty()) checked.error = transport_problem(options.transport, trainer.model());
  core_ = std::make_unique<DataParallelCore>(trainer, *comm_, options, checked);
  if (options.transport != "mpi") core_->set_device_transport(choose_nccl_transport(*core_, comm, options.transport));
}

}  // namespace treadle

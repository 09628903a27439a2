// DataParallel over a host-lent MPI communicator: setup check, state broadcast, one small allreduce
// (count, loss, error flag) and one in-place allreduce of the flat gradient buffer per step, through
// the host (transport "mpi", here) or on the device (transport "nccl", nccl_transport.cpp).
//
// A model on backend "cuda" with transport "mpi" needs nothing special: the model's host accessors
// (flat_parameters, flat_gradients) copy device-newer values back and mark the host side current,
// so what is written here (summed gradients, broadcast parameters, running statistics) is uploaded
// before the next device use, and Trainer::optimizer() does the same for the optimizer state.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

MPI_Datatype mpi_type(DType t, const char* what) {
  if (t == DType::f32) return MPI_FLOAT;
  if (t == DType::f64) return MPI_DOUBLE;
  throw_type_error("DataParallel: ", what, " must be float32 or float64, got ", dtype_name(t));
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

// (what, value) lines that must agree on every rank, parameters first.
using Items = std::vector<std::pair<std::string, std::string>>;

const char* buffer_sync_name(BufferSync b) {
  return b == BufferSync::root ? "root" : b == BufferSync::average ? "average" : "local";
}

Items setup_items(Trainer& t, BufferSync buffers, const std::string& transport) {
  Items items;
  const Model& m = t.model();
  std::string names;
  for (const ParamSlot& s : m.layout()) {
    items.emplace_back("parameter '" + s.name + "' shape", shape_str(s.shape));
    names += (names.empty() ? "" : ", ") + s.name;
  }
  items.emplace_back("parameter names", "(" + names + ")");
  items.emplace_back("parameter count", std::to_string(m.flat_parameters().numel()));
  items.emplace_back("dtype", dtype_name(m.dtype()));
  items.emplace_back("loss", t.loss().key());
  std::ostringstream opt, state;
  opt.precision(17);
  opt << t.optimizer().name() << "(lr=" << t.optimizer().lr() << ")";
  items.emplace_back("optimizer", opt.str());
  for (auto& [name, buf] : t.optimizer().state()) state << name << ":" << buf.numel() << " ";
  items.emplace_back("optimizer state", state.str());
  std::ostringstream clip;
  clip.precision(17);
  clip << t.options().clip_grad_norm;
  items.emplace_back("clip_grad_norm", clip.str());
  // guards that decide whether an update happens: a rank that skips while another applies diverges
  items.emplace_back("check_finite", t.options().check_finite ? "True" : "False");
  items.emplace_back("skip_nonfinite", t.options().skip_nonfinite ? "True" : "False");
  items.emplace_back("verify_parameters", t.options().verify_parameters ? "True" : "False");
  const LossScaling& ls = t.options().loss_scaling;
  std::ostringstream scaling;
  scaling.precision(17);
  scaling << static_cast<int>(ls.mode) << " " << ls.init_scale << " " << ls.growth_factor << " " << ls.backoff_factor
          << " " << ls.growth_interval;
  items.emplace_back("loss scaling", scaling.str());
  items.emplace_back("buffers", buffer_sync_name(buffers));
  items.emplace_back("transport", transport);
  return items;
}

std::string backend_text(const std::string& backend) {
  return backend.empty() ? std::string("automatic host dispatch") : "'" + backend + "'";
}

// What is wrong with asking for `transport` on this rank ("" if nothing).
std::string transport_problem(const std::string& transport, const Model& model) {
  if (transport != "auto" && transport != "mpi" && transport != "nccl")
    return "transport must be one of ('auto', 'mpi', 'nccl'), got '" + transport + "'";
  if (transport != "nccl") return {};
#ifndef TREADLE_WITH_NCCL
  return "transport 'nccl' is not in this build: configure with -DTREADLE_WITH_NCCL=ON (which needs "
         "-DTREADLE_WITH_CUDA=ON and -DTREADLE_WITH_MPI=ON, and NCCL: pip install nvidia-nccl-cu13), or use "
         "transport 'mpi'";
#endif
  if (model.backend() != "cuda")
    return "transport 'nccl' needs the model on backend 'cuda', but its backend is " + backend_text(model.backend()) +
           ": set the model's backend to 'cuda' first, or use transport 'mpi'";
  return {};
}

std::string serialize(const Items& items) {
  std::string s;
  for (auto& [what, value] : items) s += what + '\t' + value + '\n';
  return s;
}

Items parse(const std::string& s) {
  Items items;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    auto tab = line.find('\t');
    items.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return items;
}

uint64_t fnv1a(const std::string& s) {  // stable across processes and builds, unlike std::hash
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<std::string> names_of(const Items& items) {
  std::vector<std::string> names;
  for (auto& [what, _] : items)
    if (what.rfind("parameter '", 0) == 0) names.push_back(what.substr(11, what.size() - 11 - 7));
  return names;
}

std::string first_difference(const Items& ref, int ref_rank, const Items& other, int rank) {
  auto r = names_of(ref), o = names_of(other);
  std::ostringstream msg;
  for (std::size_t i = 0; i < std::max(r.size(), o.size()); ++i) {
    std::string theirs = i < r.size() ? r[i] : "", mine = i < o.size() ? o[i] : "";
    if (mine == theirs) continue;
    if (!theirs.empty() && std::find(o.begin(), o.end(), theirs) == o.end())
      msg << "rank " << rank << " lacks parameter '" << theirs << "' of root rank " << ref_rank;
    else if (!mine.empty() && std::find(r.begin(), r.end(), mine) == r.end())
      msg << "rank " << rank << " has parameter '" << mine << "' that root rank " << ref_rank << " lacks";
    else
      msg << "parameter #" << i << " is '" << mine << "' on rank " << rank << " but '" << theirs << "' on root rank "
          << ref_rank;
    return msg.str();
  }
  for (auto& [what, value] : other)
    for (auto& [rwhat, rvalue] : ref)
      if (rwhat == what && rvalue != value)
        return what + " is " + value + " on rank " + std::to_string(rank) + " but " + rvalue + " on root rank " +
               std::to_string(ref_rank);
  return "rank " + std::to_string(rank) + " differs from root rank " + std::to_string(ref_rank);
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine, int size) {
  int len = as_count(static_cast<int64_t>(mine.size()));
  std::vector<int> lens(size), offsets(size);
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < size; ++r) offsets[r] = total, total += lens[r];
  std::string all(static_cast<std::size_t>(total), '\0');
  check_mpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, comm),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(offsets[r], lens[r]));
  return out;
}

template <typename T>
void scale(const Tensor& t, double factor) {
  T* p = t.data_as<T>();
  const T f = static_cast<T>(factor);
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] *= f;
}

}  // namespace

#ifndef TREADLE_WITH_NCCL
// Without NCCL every transport is "mpi" (transport_problem refused "nccl" already).
struct DataParallel::Nccl {};
void DataParallel::NcclDeleter::operator()(Nccl* n) const noexcept { delete n; }
void DataParallel::choose_transport(const std::string&) { transport_ = "mpi"; }
void DataParallel::allreduce_on_device(double) { throw_runtime_error("DataParallel: no NCCL in this build"); }
void DataParallel::sync_buffers_on_device() { throw_runtime_error("DataParallel: no NCCL in this build"); }
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
    : DataParallel(trainer, comm, DataParallelOptions{root, buffers, "auto"}) {}

DataParallel::~DataParallel() = default;

DataParallel::DataParallel(Trainer& trainer, MPI_Comm comm, const DataParallelOptions& options)
    : trainer_(trainer), comm_(comm), buffers_(options.buffers) {
  const int root = options.root;
  check_host_mpi();
  if (comm == MPI_COMM_NULL) throw_value_error("DataParallel: comm is MPI_COMM_NULL (this rank is not in the group)");
  int inter = 0;
  if (test_intercommunicator(comm, &inter) != MPI_SUCCESS)
    throw_value_error("DataParallel: comm is not a valid communicator of ", runtime_mpi_library(),
                      " (freed, never created, or a handle of another MPI library)");
  if (inter) throw_value_error("DataParallel: comm must be an intra-communicator");
  check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  // Each rank checks its own arguments, then all agree, so one bad rank never leaves the others waiting.
  std::string error;
  if (root < 0 || root >= size_)
    error = "root must be a rank in [0, " + std::to_string(size_) + "), got " + std::to_string(root);
  else if (!(options.timeout >= 0.0) || !std::isfinite(options.timeout))
    error = "timeout must be a finite number of seconds >= 0 (0: none), got " + std::to_string(options.timeout);
  else
    error = transport_problem(options.transport, trainer_.model());
  int failed = error.empty() ? 0 : 1;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, comm_), "MPI_Allreduce");
  if (failed) raise_failure(error, "DataParallel");
  root_ = root;
  timeout_ = options.timeout;
  check_same_setup(options.transport);
  broadcast_state();
  choose_transport(options.transport);
  // The non-trained slots, and buffers for them sized once.
  const Model& model = trainer_.model();
  int64_t total = 0;
  for (const NamedParameter& np : model.named_parameters()) {
    if (np.second->requires_grad()) continue;
    for (const ParamSlot& s : model.layout())
      if (s.name == np.first) buffer_spans_.emplace_back(s.offset, s.numel), total += s.numel;
  }
  if (total > 0) packed_ = Tensor({total}, model.dtype()), saved_ = Tensor({total}, model.dtype());
}

void DataParallel::pack_buffers(Tensor& into) const {
  const std::size_t elem = dtype_size(into.dtype());
  const char* src = static_cast<const char*>(trainer_.model().flat_parameters().data());
  char* dst = static_cast<char*>(into.data());
  for (auto [offset, n] : buffer_spans_) std::memcpy(dst, src + offset * elem, n * elem), dst += n * elem;
}

void DataParallel::unpack_buffers(const Tensor& from) {
  const std::size_t elem = dtype_size(from.dtype());
  char* dst = static_cast<char*>(trainer_.model().flat_parameters().data());
  const char* src = static_cast<const char*>(from.data());
  for (auto [offset, n] : buffer_spans_) std::memcpy(dst + offset * elem, src, n * elem), src += n * elem;
}

void DataParallel::sync_buffers() {
  if (!packed_.defined() || buffers_ == BufferSync::local) return;
  if (nccl_) return sync_buffers_on_device();
  pack_buffers(packed_);
  const MPI_Datatype type = mpi_type(packed_.dtype(), "buffers");
  if (buffers_ == BufferSync::root) {
    check_mpi(MPI_Bcast(packed_.data(), as_count(packed_.numel()), type, root_, comm_), "MPI_Bcast");
  } else {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, packed_.data(), as_count(packed_.numel()), type, MPI_SUM, comm_),
              "MPI_Allreduce");
    packed_.dtype() == DType::f32 ? scale<float>(packed_, 1.0 / size_) : scale<double>(packed_, 1.0 / size_);
  }
  unpack_buffers(packed_);
}

void DataParallel::check_same_setup(const std::string& transport) {
  const std::string mine = serialize(setup_items(trainer_, buffers_, transport));
  uint64_t key[2] = {static_cast<uint64_t>(root_), fnv1a(mine)};
  std::vector<uint64_t> all(2 * static_cast<std::size_t>(size_));
  check_mpi(MPI_Allgather(key, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm_), "MPI_Allgather");
  for (int r = 1; r < size_; ++r)
    if (all[2 * r] != all[0])
      throw_value_error("DataParallel: root is ", all[2 * r], " on rank ", r, " but ", all[0], " on rank 0");
  int bad = -1;
  for (int r = 0; r < size_ && bad < 0; ++r)
    if (all[2 * r + 1] != all[2 * root_ + 1]) bad = r;
  if (bad < 0) return;
  // Rare path, taken by every rank (all see the same hashes): exchange the descriptions so that
  // every rank names the same first difference.
  auto everyone = allgather_strings(comm_, mine, size_);
  throw_value_error("DataParallel: ", first_difference(parse(everyone[root_]), root_, parse(everyone[bad]), bad));
}

void DataParallel::broadcast_state() {
  const Tensor& params = trainer_.model().flat_parameters();
  check_mpi(MPI_Bcast(params.data(), as_count(params.numel()), mpi_type(params.dtype(), "parameters"), root_, comm_),
            "MPI_Bcast");
  Optimizer& opt = trainer_.optimizer();
  for (auto& [name, buf] : opt.state())
    check_mpi(MPI_Bcast(buf.data(), as_count(buf.numel()), mpi_type(buf.dtype(), "optimizer state"), root_, comm_),
              "MPI_Bcast");
  int64_t steps = opt.step_count();
  check_mpi(MPI_Bcast(&steps, 1, MPI_INT64_T, root_, comm_), "MPI_Bcast");
  opt.set_step_count(steps);
  // The dynamic loss scale: every rank then takes the same skip decisions on the summed gradients.
  double scale = trainer_.loss_scale();
  int64_t tracker = trainer_.loss_scale_growth_tracker();
  check_mpi(MPI_Bcast(&scale, 1, MPI_DOUBLE, root_, comm_), "MPI_Bcast");
  check_mpi(MPI_Bcast(&tracker, 1, MPI_INT64_T, root_, comm_), "MPI_Bcast");
  trainer_.set_loss_scale_state(scale, tracker);
}

double DataParallel::step(const Tensor& x, const Tensor& y) {
  check_usable("DataParallel::step");
  trainer_.zero_grad();
  // A failed step must change nothing, but the forward pass on the ranks that did not fail updates
  // their running statistics: keep a copy to put back.
  if (saved_.defined()) pack_buffers(saved_);
  int64_t count = 0;
  double loss = 0.0;
  std::string error;
  try {
    if (x.ndim() == 0 || y.ndim() == 0)
      throw_value_error("x and y need a batch dimension, got shapes ", shape_str(x.shape()), " and ",
                        shape_str(y.shape()));
    if (x.dim(0) != y.dim(0)) throw_value_error("x has ", x.dim(0), " samples but y has ", y.dim(0));
    count = y.numel();
    if (count > 0) loss = trainer_.compute_gradients(x, y);
  } catch (const std::exception& e) {  // reported to every rank, then thrown everywhere
    error = *e.what() ? e.what() : "unknown error";
    count = 0;
  }
  double global = 0.0;
  try {
    global = reduce(count, loss, error, "DataParallel::step");
  } catch (const ValueError&) {
    if (saved_.defined()) unpack_buffers(saved_);
    throw;
  }
  trainer_.update();
  return global;
}

void DataParallel::fail_step(const std::string& error) {
  reduce(0, 0.0, error.empty() ? "unknown error" : error, "DataParallel::step");
  throw_runtime_error("DataParallel::fail_step: no rank failed");  // unreachable: reduce raised the failure
}

double DataParallel::allreduce_gradients(int64_t count, double loss, const std::string& error) {
  return reduce(count, loss, error, "DataParallel::allreduce_gradients");
}

void DataParallel::set_timeout(double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds))
    throw_value_error("DataParallel: timeout must be a finite number of seconds >= 0 (0: none), got ", seconds);
  timeout_ = seconds;
}

void DataParallel::check_usable(const char* where) const {
  if (!broken_.empty()) throw TimeoutError(std::string(where) + ": this DataParallel cannot be used again: " + broken_);
}

// The step's first collective: where a rank that left early, or failed outside treadle, is missed.
// With a timeout it is posted non-blocking and tested until every rank has arrived or the time is up;
// the process sleeps between tests (up to 1 ms, so that a long wait leaves the core to others).
void DataParallel::allreduce_head(const char* where) {
  check_usable(where);
  if (timeout_ <= 0.0) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, head_, 3, MPI_DOUBLE, MPI_SUM, comm_), "MPI_Allreduce");
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, head_, 3, MPI_DOUBLE, MPI_SUM, comm_, &request), "MPI_Iallreduce");
  const double deadline = MPI_Wtime() + timeout_;
  double pause = 1e-5;
  for (int done = 0;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (MPI_Wtime() > deadline) break;
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    pause = std::min(2 * pause, 1e-3);
  }
  std::ostringstream message;
  message << where << ": not every rank of the communicator arrived within the timeout of " << timeout_
          << " s (a rank left early, failed outside treadle, or is still busy); the collective stays pending, so "
             "abort the job (MPI_Abort)";
  broken_ = message.str();
  throw TimeoutError(broken_);
}

double DataParallel::reduce(int64_t count, double loss, const std::string& given_error, const char* where) {
  std::string error = given_error;
  if (error.empty() && count < 0) error = "count must be non-negative, got " + std::to_string(count);
  if (error.empty() && nccl_ && trainer_.model().backend() != "cuda")
    error = "transport 'nccl' needs the model on backend 'cuda', but its backend is now " +
            backend_text(trainer_.model().backend());
  const bool mean = trainer_.loss().reduction == "mean";
  // With "mean" the global loss is sum(count_r * loss_r) / sum(count_r); with "sum", sum(loss_r).
  double* head = head_;
  head[0] = head[1] = 0.0;
  head[2] = error.empty() ? 0.0 : 1.0;
  if (error.empty() && count > 0) {
    head[0] = static_cast<double>(count);
    head[1] = mean ? loss * static_cast<double>(count) : loss;
  }
  allreduce_head(where);
  if (head[2] > 0) raise_failure(error, where);
  if (head[0] <= 0) throw_value_error(where, ": the global batch is empty (every rank passed count 0)");
  // Each rank weights its gradient by count / global count before the sum (see docs/distributed.md).
  const double weight = mean && static_cast<double>(count) != head[0] ? static_cast<double>(count) / head[0] : 1.0;
  if (nccl_) {
    const double start = MPI_Wtime();
    allreduce_on_device(weight);
    allreduce_seconds_ += MPI_Wtime() - start;
    sync_buffers();
    ++steps_;
    return mean ? head[1] / head[0] : head[1];
  }
  const Tensor& grads = trainer_.model().flat_gradients();
  if (weight != 1.0) {
    grads.dtype() == DType::f32 ? scale<float>(grads, weight) : scale<double>(grads, weight);
  }
  const double start = MPI_Wtime();
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, grads.data(), as_count(grads.numel()), mpi_type(grads.dtype(), "gradients"),
                          MPI_SUM, comm_),
            "MPI_Allreduce");
  allreduce_seconds_ += MPI_Wtime() - start;
  sync_buffers();
  ++steps_;
  return mean ? head[1] / head[0] : head[1];
}

void DataParallel::raise_failure(const std::string& error, const char* where) {
  throw_value_error(failure_message(error, where));
}

std::string DataParallel::failure_message(const std::string& error, const char* where) {
  auto messages = allgather_strings(comm_, error.empty() ? std::string() : "!" + error, size_);
  int first = -1, failed = 0;
  for (int r = 0; r < size_; ++r)
    if (!messages[r].empty()) failed++, first = first < 0 ? r : first;
  std::string more;
  if (failed > 1) more = " (and " + std::to_string(failed - 1) + " more rank" + (failed > 2 ? "s)" : ")");
  return std::string(where) + ": rank " + std::to_string(first) + " failed" + more + ": " + messages[first].substr(1);
}

double DataParallel::parameter_divergence() {
  const Tensor& params = trainer_.model().flat_parameters();
  Tensor ref = params.clone();
  check_mpi(MPI_Bcast(ref.data(), as_count(ref.numel()), mpi_type(ref.dtype(), "parameters"), root_, comm_),
            "MPI_Bcast");
  // {largest difference, 1 if any value is not finite}: MPI_MAX over a NaN is implementation-defined
  // (and std::max drops it), so a NaN on any rank travels as a flag and comes back as NaN.
  double local[2] = {0.0, 0.0};
  for (int64_t i = 0, n = params.numel(); i < n; ++i) {
    double a = params.dtype() == DType::f32 ? params.data_as<float>()[i] : params.data_as<double>()[i];
    double b = ref.dtype() == DType::f32 ? ref.data_as<float>()[i] : ref.data_as<double>()[i];
    const double d = std::fabs(a - b);
    if (std::isfinite(d))
      local[0] = std::max(local[0], d);
    else
      local[1] = 1.0;
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, local, 2, MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce");
  return local[1] > 0 ? std::numeric_limits<double>::quiet_NaN() : local[0];
}

}  // namespace treadle

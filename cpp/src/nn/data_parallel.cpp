// DataParallelCore: data-parallel training over a Communicator - the setup check, the state
// broadcast, one small allreduce (count, loss, error flag) and one in-place sum of the flat gradient
// buffer per step, the failure agreement and the timeout. Written once, for every host: the MPI
// communicator of treadle::distributed and the mpi4py one of the Python module implement the
// collectives (docs/distributed.md).
//
// A model on backend "cuda" needs nothing special here: the model's host accessors (flat_parameters,
// flat_gradients) copy device-newer values back and mark the host side current, so what is written
// here (summed gradients, broadcast parameters, running statistics) is uploaded before the next device
// use, and Trainer::optimizer() does the same for the optimizer state.
#include "treadle/data_parallel.hpp"

#include <algorithm>
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

#include "treadle/error.hpp"

namespace treadle {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string number(double v) {  // as the items have always printed them: 17 significant digits
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

SetupItems setup_items(Trainer& t, BufferSync buffers, const std::string& transport) {
  SetupItems items;
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
  items.emplace_back("optimizer", t.optimizer().name() + "(lr=" + number(t.optimizer().lr()) + ")");
  std::string state;
  for (auto& [name, buf] : t.optimizer().state()) state += name + ":" + std::to_string(buf.numel()) + " ";
  items.emplace_back("optimizer state", state);
  items.emplace_back("clip_grad_norm", number(t.options().clip_grad_norm));
  // guards that decide whether an update happens: a rank that skips while another applies diverges
  items.emplace_back("check_finite", t.options().check_finite ? "True" : "False");
  items.emplace_back("skip_nonfinite", t.options().skip_nonfinite ? "True" : "False");
  items.emplace_back("verify_parameters", t.options().verify_parameters ? "True" : "False");
  const LossScaling& ls = t.options().loss_scaling;
  items.emplace_back("loss scaling", std::to_string(static_cast<int>(ls.mode)) + " " + number(ls.init_scale) + " " +
                                         number(ls.growth_factor) + " " + number(ls.backoff_factor) + " " +
                                         std::to_string(ls.growth_interval));
  items.emplace_back("buffers", buffer_sync_name(buffers));
  items.emplace_back("transport", transport);
  return items;
}

// The host's settings: an item named like one of treadle's replaces it, the others come last.
void add_host_items(SetupItems& items, const SetupItems& host) {
  for (const auto& item : host) {
    auto same = std::find_if(items.begin(), items.end(), [&](const auto& i) { return i.first == item.first; });
    if (same != items.end()) same->second = item.second;
    else items.push_back(item);
  }
}

std::string serialize(const SetupItems& items) {
  std::string s;
  for (auto& [what, value] : items) s += what + '\t' + value + '\n';
  return s;
}

SetupItems parse(const std::string& s) {
  SetupItems items;
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

std::vector<std::string> names_of(const SetupItems& items) {
  std::vector<std::string> names;
  for (auto& [what, _] : items)
    if (what.rfind("parameter '", 0) == 0) names.push_back(what.substr(11, what.size() - 11 - 7));
  return names;
}

std::string first_difference(const SetupItems& ref, int ref_rank, const SetupItems& other, int rank) {
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

void check_float(DType t, const char* what) {
  if (t != DType::f32 && t != DType::f64)
    throw_type_error("DataParallel: ", what, " must be float32 or float64, got ", dtype_name(t));
}

template <typename T>
void scale(const Tensor& t, double factor) {
  T* p = t.data_as<T>();
  const T f = static_cast<T>(factor);
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] *= f;
}

void scale_tensor(const Tensor& t, double factor) {
  t.dtype() == DType::f32 ? scale<float>(t, factor) : scale<double>(t, factor);
}

double value_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f32 ? t.data_as<float>()[i] : t.data_as<double>()[i];
}

std::string timeout_problem(double seconds) {
  if (seconds >= 0.0 && std::isfinite(seconds)) return {};
  return "timeout must be a finite number of seconds >= 0 (0: none), got " + number(seconds);
}

}  // namespace

const char* buffer_sync_name(BufferSync b) {
  return b == BufferSync::root ? "root" : b == BufferSync::average ? "average" : "local";
}

DataParallelCore::DataParallelCore(Trainer& trainer, Communicator& comm, const DataParallelOptions& options,
                                   const DataParallelHost& host)
    : trainer_(trainer), comm_(comm), rank_(comm.rank()), size_(comm.size()), buffers_(options.buffers) {
  // Each rank checks its own arguments, then all agree, so one bad rank never leaves the others waiting.
  const std::string& transport = options.transport;
  std::string error = timeout_problem(options.timeout);
  if (options.root < 0 || options.root >= size_)
    error = "root must be a rank in [0, " + std::to_string(size_) + "), got " + std::to_string(options.root);
  else if (error.empty() && transport != "auto" && transport != "mpi" && transport != "nccl")
    error = "transport must be one of ('auto', 'mpi', 'nccl'), got '" + transport + "'";
  else if (error.empty())
    error = host.error;
  double failed = error.empty() ? 0.0 : 1.0;
  comm_.allreduce(&failed, 1, DType::f64, ReduceOp::sum);
  if (failed > 0) raise_failure(error, "DataParallel");
  root_ = options.root;
  timeout_ = options.timeout;
  check_same_setup(host.setup, transport);
  broadcast_state();
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

DataParallelCore::~DataParallelCore() = default;

void DataParallelCore::pack_buffers(Tensor& into) const {
  const std::size_t elem = dtype_size(into.dtype());
  const char* src = static_cast<const char*>(trainer_.model().flat_parameters().data());
  char* dst = static_cast<char*>(into.data());
  for (auto [offset, n] : buffer_spans_) std::memcpy(dst, src + offset * elem, n * elem), dst += n * elem;
}

void DataParallelCore::unpack_buffers(const Tensor& from) {
  const std::size_t elem = dtype_size(from.dtype());
  char* dst = static_cast<char*>(trainer_.model().flat_parameters().data());
  const char* src = static_cast<const char*>(from.data());
  for (auto [offset, n] : buffer_spans_) std::memcpy(dst + offset * elem, src, n * elem), src += n * elem;
}

void DataParallelCore::sync_buffers() {
  if (!packed_.defined() || buffers_ == BufferSync::local) return;
  if (device_) return device_->sync_buffers(buffer_spans_, buffers_, root_);
  check_float(packed_.dtype(), "buffers");
  pack_buffers(packed_);
  if (buffers_ == BufferSync::root) {
    comm_.broadcast(packed_.data(), packed_.numel(), packed_.dtype(), root_);
  } else {
    comm_.allreduce(packed_.data(), packed_.numel(), packed_.dtype(), ReduceOp::sum);
    scale_tensor(packed_, 1.0 / size_);
  }
  unpack_buffers(packed_);
}

std::vector<std::string> DataParallelCore::allgather_strings(const std::string& mine) {
  // Fixed-size blocks: the lengths first, then every string padded to the longest.
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<std::size_t>(size_));
  comm_.allgather(&len, sizeof len, lens.data());
  const int64_t block = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::string padded = mine;
  padded.resize(static_cast<std::size_t>(block), '\0');
  std::string all(static_cast<std::size_t>(block * size_), '\0');
  comm_.allgather(padded.data(), block, all.data());
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<std::size_t>(r * block), lens[r]));
  return out;
}

void DataParallelCore::check_same_setup(const SetupItems& host, const std::string& transport) {
  SetupItems items = setup_items(trainer_, buffers_, transport);
  add_host_items(items, host);
  const std::string mine = serialize(items);
  uint64_t key[2] = {static_cast<uint64_t>(root_), fnv1a(mine)};
  std::vector<uint64_t> all(2 * static_cast<std::size_t>(size_));
  comm_.allgather(key, sizeof key, all.data());
  for (int r = 1; r < size_; ++r)
    if (all[2 * r] != all[0])
      throw_value_error("DataParallel: root is ", all[2 * r], " on rank ", r, " but ", all[0], " on rank 0");
  int bad = -1;
  for (int r = 0; r < size_ && bad < 0; ++r)
    if (all[2 * r + 1] != all[2 * root_ + 1]) bad = r;
  if (bad < 0) return;
  // Rare path, taken by every rank (all see the same hashes): exchange the descriptions so that
  // every rank names the same first difference.
  auto everyone = allgather_strings(mine);
  throw_value_error("DataParallel: ", first_difference(parse(everyone[root_]), root_, parse(everyone[bad]), bad));
}

void DataParallelCore::broadcast_state() {
  const Tensor& params = trainer_.model().flat_parameters();
  check_float(params.dtype(), "parameters");
  comm_.broadcast(params.data(), params.numel(), params.dtype(), root_);
  Optimizer& opt = trainer_.optimizer();
  for (auto& [name, buf] : opt.state()) {
    check_float(buf.dtype(), "optimizer state");
    comm_.broadcast(buf.data(), buf.numel(), buf.dtype(), root_);
  }
  int64_t steps = opt.step_count();
  comm_.broadcast(&steps, 1, DType::i64, root_);
  opt.set_step_count(steps);
  // The dynamic loss scale: every rank then takes the same skip decisions on the summed gradients.
  double scale = trainer_.loss_scale();
  int64_t tracker = trainer_.loss_scale_growth_tracker();
  comm_.broadcast(&scale, 1, DType::f64, root_);
  comm_.broadcast(&tracker, 1, DType::i64, root_);
  trainer_.set_loss_scale_state(scale, tracker);
}

int64_t DataParallelCore::shard_count(const Shape& x, const Shape& y) {
  if (x.empty() || y.empty())
    throw_value_error("x and y need a batch dimension, got shapes ", shape_str(x), " and ", shape_str(y));
  if (x[0] != y[0]) throw_value_error("x has ", x[0], " samples but y has ", y[0]);
  int64_t n = 1;
  for (int64_t d : y) n *= d;
  return n;
}

void DataParallelCore::begin_step(const char* where) {
  check_usable(where);
  trainer_.zero_grad();
  // A failed step must change nothing, but the forward pass on the ranks that did not fail updates
  // their running statistics: keep a copy to put back.
  if (saved_.defined()) pack_buffers(saved_);
}

double DataParallelCore::end_step(int64_t count, double loss, const std::string& error, const char* where) {
  double global = 0.0;
  try {
    global = reduce(count, loss, error, where);
  } catch (const ValueError&) {
    if (saved_.defined()) unpack_buffers(saved_);
    throw;
  }
  trainer_.update();
  return global;
}

double DataParallelCore::step(const Tensor& x, const Tensor& y) {
  const char* where = "DataParallel::step";
  begin_step(where);
  int64_t count = 0;
  double loss = 0.0;
  std::string error;
  try {
    count = shard_count(x.shape(), y.shape());
    if (count > 0) loss = trainer_.compute_gradients(x, y);
  } catch (const std::exception& e) {  // reported to every rank, then thrown everywhere
    error = *e.what() ? e.what() : "unknown error";
    count = 0;
  }
  return end_step(count, loss, error, where);
}

void DataParallelCore::fail_step(const std::string& error) {
  reduce(0, 0.0, error.empty() ? "unknown error" : error, "DataParallel::step");
  throw_runtime_error("DataParallel::fail_step: no rank failed");  // unreachable: reduce raised the failure
}

double DataParallelCore::allreduce_gradients(int64_t count, double loss, const std::string& error) {
  return reduce(count, loss, error, "DataParallel::allreduce_gradients");
}

double DataParallelCore::allreduce_gradients(int64_t count, double loss, const std::string& error,
                                             const char* where) {
  return reduce(count, loss, error, where);
}

void DataParallelCore::set_timeout(double seconds) {
  const std::string problem = timeout_problem(seconds);
  if (!problem.empty()) throw_value_error("DataParallel: ", problem);
  timeout_ = seconds;
}

void DataParallelCore::check_usable(const char* where) const {
  if (!broken_.empty()) throw TimeoutError(std::string(where) + ": this DataParallel cannot be used again: " + broken_);
}

// The step's first collective: where a rank that left early, or failed outside treadle, is missed.
// With a timeout it is started non-blocking and tested until every rank has arrived or the time is up;
// the process sleeps between tests (up to 1 ms, so that a long wait leaves the core to others).
void DataParallelCore::allreduce_head(const char* where) {
  check_usable(where);
  if (timeout_ <= 0.0) return comm_.allreduce(head_, 3, DType::f64, ReduceOp::sum);
  const auto start = Clock::now();
  comm_.start_allreduce(head_, 3);
  double pause = 1e-5;
  while (!comm_.test_allreduce()) {
    if (seconds_since(start) > timeout_) {
      std::ostringstream message;
      message << where << ": not every rank of the communicator arrived within the timeout of " << timeout_
              << " s (a rank left early, failed outside treadle, or is still busy); the collective stays pending, "
                 "so abort the job (MPI_Abort, comm.Abort)";
      broken_ = message.str();
      throw TimeoutError(broken_);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    pause = std::min(2 * pause, 1e-3);
  }
}

double DataParallelCore::reduce(int64_t count, double loss, const std::string& given_error, const char* where) {
  std::string error = given_error;
  if (error.empty() && count < 0) error = "count must be a non-negative integer, got " + std::to_string(count);
  if (error.empty() && device_) error = device_->problem();
  const bool mean = trainer_.loss().reduction == "mean";
  // With "mean" the global loss is sum(count_r * loss_r) / sum(count_r); with "sum", sum(loss_r).
  double* head = head_;
  head[0] = head[1] = 0.0;
  head[2] = error.empty() ? 0.0 : 1.0;
  if (error.empty() && count > 0) {
    head[0] = static_cast<double>(count);
    head[1] = mean ? loss * static_cast<double>(count) : loss;
  }
  const auto waiting = Clock::now();
  allreduce_head(where);
  wait_seconds_ += seconds_since(waiting);
  if (head[2] > 0) raise_failure(error, where);
  if (head[0] <= 0) throw_value_error(where, ": the global batch is empty (every rank passed count 0)");
  // Each rank weights its gradient by count / global count before the sum (see docs/distributed.md).
  const double weight = mean && static_cast<double>(count) != head[0] ? static_cast<double>(count) / head[0] : 1.0;
  const auto start = Clock::now();
  if (device_) {
    device_->allreduce_gradients(weight);
  } else {
    const Tensor& grads = trainer_.model().flat_gradients();
    check_float(grads.dtype(), "gradients");
    if (weight != 1.0) scale_tensor(grads, weight);
    comm_.allreduce(grads.data(), grads.numel(), grads.dtype(), ReduceOp::sum);
  }
  last_allreduce_seconds_ = seconds_since(start);
  allreduce_seconds_ += last_allreduce_seconds_;
  sync_buffers();
  ++steps_;
  return mean ? head[1] / head[0] : head[1];
}

void DataParallelCore::raise_failure(const std::string& error, const char* where) {
  throw_value_error(failure_message(error, where));
}

std::string DataParallelCore::failure_message(const std::string& error, const char* where) {
  // "!" marks a rank that failed (its message may be empty).
  auto messages = allgather_strings(error.empty() ? std::string() : "!" + error);
  for (auto& m : messages)
    if (!m.empty()) m = m.substr(1).empty() ? "unknown error" : m.substr(1);
  return failure_text(messages, where);
}

std::string DataParallelCore::failure_text(const std::vector<std::string>& errors, const char* where) {
  int first = -1, failed = 0;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r)
    if (!errors[r].empty()) failed++, first = first < 0 ? r : first;
  if (first < 0) return std::string(where) + ": no rank failed";
  std::string more;
  if (failed > 1) more = " (and " + std::to_string(failed - 1) + " more rank" + (failed > 2 ? "s)" : ")");
  return std::string(where) + ": rank " + std::to_string(first) + " failed" + more + ": " + errors[first];
}

double DataParallelCore::parameter_divergence() {
  const Tensor& params = trainer_.model().flat_parameters();
  check_float(params.dtype(), "parameters");
  Tensor ref = params.clone();
  comm_.broadcast(ref.data(), ref.numel(), ref.dtype(), root_);
  // {largest difference, 1 if any value is not finite}: a MAX over a NaN is implementation-defined
  // (and std::max drops it), so a NaN on any rank travels as a flag and comes back as NaN.
  double local[2] = {0.0, 0.0};
  for (int64_t i = 0, n = params.numel(); i < n; ++i) {
    const double d = std::fabs(value_at(params, i) - value_at(ref, i));
    if (std::isfinite(d))
      local[0] = std::max(local[0], d);
    else
      local[1] = 1.0;
  }
  comm_.allreduce(local, 2, DType::f64, ReduceOp::max);
  return local[1] > 0 ? std::numeric_limits<double>::quiet_NaN() : local[0];
}

}  // namespace treadle

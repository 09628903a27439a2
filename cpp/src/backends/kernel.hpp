#pragma once
// What a kernel receives: resolved tensors (data pointer + static shape), the node (attributes),
// the host's executor and the step's RNG stream. Kernels never allocate; scratch comes in `workspace`.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "treadle/backend.hpp"
#include "treadle/executor.hpp"
#include "treadle/graph.hpp"

namespace treadle {

struct TensorRef {
  void* data = nullptr;
  const Shape* shape = nullptr;
  DType dtype = DType::f32;
  int64_t numel = 0;
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  int ndim() const { return static_cast<int>(shape->size()); }
  int64_t dim(int i) const { return (*shape)[i < 0 ? i + ndim() : i]; }
};

struct KernelArgs {
  const Node& node;
  const TensorRef* in;
  int num_in;
  const TensorRef* out;
  int num_out;
  Executor& exec;
  void* workspace;
  uint64_t rng_seed;     // the context's seed
  uint64_t rng_counter;  // advances every step; with the node index it names a unique stream
  const void* state = nullptr;  // what the backend prepared for this node (Backend::prepare), or null
  // The context's queue (a cudaStream_t for CUDA) for a plan compiled for a device (every pointer
  // above is then a device pointer and the kernel only enqueues on it); null for host plans.
  void* stream = nullptr;
  const Attrs& attrs() const { return node.attrs; }
};

using KernelFn = void (*)(const KernelArgs&);

// What a backend builds once for a node when a plan is finalized (e.g. oneDNN primitives), so that
// steps create nothing. The state is immutable afterwards: plans are shared by threads running
// different contexts. `workspace` is scratch the kernel needs on top of the op's own workspace.
//
// `opaque_outputs` lists outputs (index, bytes) the kernel writes in a layout of its own, as
// oneDNN's recurrent training primitive does with a layer's `saved` buffer (its workspace, larger
// than the reference's saved gates). The plan gives them at least those bytes and makes every
// reader of such a value run on the same backend (ValueInfo::layout_owner), so a backend must take
// a node with an opaque output only when it also takes every node that reads it.
struct PreparedNode {
  std::shared_ptr<const void> state;
  std::size_t workspace = 0;
  std::vector<std::pair<int, std::size_t>> opaque_outputs;
};

// One op a backend takes: how every backend (Eigen, oneDNN, CUDA, a registered one) says what it
// runs. A node of `op` is taken when `choose` gives a kernel (an op with several kernels picks by the
// node), else when `accepts` says so and then runs `kernel`; without either function the node's key
// dtype (its first input's, or its output's for an op without inputs) must be one of `dtypes`.
// `dtypes` are also what supported_ops lists. `prepare` builds the node's state once (null: none);
// `deterministic`: bitwise the same result on every run with the same inputs.
using AcceptFn = std::function<bool(const Graph&, const Node&)>;
using PrepareFn = std::function<PreparedNode(const Graph&, const Node&)>;
using ChooseFn = std::function<KernelFn(const Graph&, const Node&)>;
struct OpEntry {
  OpEntry() = default;
  OpEntry(std::string op, AcceptFn accepts, PrepareFn prepare, KernelFn kernel, bool deterministic = true)
      : op(std::move(op)), accepts(std::move(accepts)), prepare(std::move(prepare)), kernel(kernel),
        deterministic(deterministic) {}
  std::string op;
  AcceptFn accepts;
  PrepareFn prepare;
  KernelFn kernel = nullptr;
  bool deterministic = true;
  std::vector<DType> dtypes = {DType::f32};
  ChooseFn choose;
};

// A backend's entries by op (several per op: one per dtype, or alternatives tried in order). Its
// members are out of line: the Eigen kernel variants, compiled for other instruction sets, fill it.
class TREADLE_API KernelTable {
 public:
  void add(OpEntry entry);
  void add(const std::string& op, DType dtype, KernelFn fn);  // a kernel for one dtype, taken by dtype
  // The entry that takes `node` and its kernel (null, null when none does).
  std::pair<const OpEntry*, KernelFn> find_entry(const Graph& g, const Node& node) const;
  KernelFn find(const Graph& g, const Node& node) const { return find_entry(g, node).second; }
  const OpEntry* only_entry(int op_id) const;  // the op's entry when it has exactly one
  bool all_deterministic(int op_id) const;  // every entry of the op (true for an op without one)
  // Every op with an entry and the dtypes of its kernels (Backend::supported_ops).
  std::vector<OpSupport> list() const;

 private:
  std::unordered_map<int, std::vector<OpEntry>> entries_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The kernel for this node, or nullptr when this backend does not support it.
  virtual KernelFn find(const Graph& g, const Node& node) const = 0;
  // Called once per node this backend's kernel was chosen for; the state reaches the kernel as
  // KernelArgs::state. Backends whose kernels need no state keep the default.
  virtual PreparedNode prepare(const Graph& g, const Node& node) const { return {}; }
  // Whether this backend's kernel for the node gives bitwise the same result on every run with the
  // same inputs (no atomics-order or autotuned-algorithm dependence). Plans compiled with
  // deterministic=true skip kernels that are not. Every CPU kernel of this build is.
  virtual bool deterministic(const Graph& g, const Node& node) const { return true; }
  // The ops this backend may take and the dtypes of its kernels (treadle/backend.hpp).
  virtual std::vector<OpSupport> supported_ops() const = 0;
  // What this backend was built against and runs on here (library version, instruction set in
  // use), as (key, value) pairs for treadle::build_info.
  virtual std::vector<std::pair<std::string, std::string>> build_info() const { return {}; }
};

// A backend that is its table of entries: find, prepare, deterministic and supported_ops answered
// from `table_` (Eigen's, oneDNN's and CUDA's backends; each adds what is its own around them).
class TableBackend : public Backend {
 public:
  KernelFn find(const Graph& g, const Node& node) const override { return table_.find(g, node); }
  PreparedNode prepare(const Graph& g, const Node& node) const override;
  bool deterministic(const Graph& g, const Node& node) const override;
  std::vector<OpSupport> supported_ops() const override { return table_.list(); }

 protected:
  KernelTable table_;
};

// Why a backend declined a node for a reason that the CPU decides, not the node (oneDNN has no
// optimised kernel for it at this instruction set): a backend notes it inside find(), the planner
// takes it after each declining find() and plan descriptions show it ("... # onednn declined on this
// CPU: ref:any"), so that a test can tell a placement the machine decides from one the rules decide.
// Declines by size or shape leave no note. Per thread (plans compile on the calling thread).
void note_cpu_decline(std::string why);
std::string take_cpu_decline();

// Backends decline nodes too small to pay for their fixed costs, or whose kernels measured slower than
// Eigen's on this CPU. Verification checks kernels on small shapes and on any CPU, so while a
// treadle::AllKernelsScope (treadle/testing.hpp; run_op's all_kernels) lives on this thread a backend
// takes every node it can compute. Declines by capability (dtype, layout, instruction set) stand.
// Whether such a decline applies (false inside an AllKernelsScope).
bool size_thresholds_apply();

// Whether `value` is read by nodes of op `op` only, and not by the host: a forward may then write it
// in its backend's own layout for that backward op (PreparedNode::opaque_outputs).
bool read_only_by(const Graph& g, int value, const std::string& op);

// Backends in priority order (fastest first; the Eigen reference last), registered ones included.
std::vector<const Backend*> available_backends();
// Adds a backend the core does not know (a program's own kernels, or a test's stub) after the
// built-in ones and before the reference: pinned by name (Model::set_backend, run_op) or tried in
// priority order. `backend` must outlive every plan that uses it. ValueError for a name that is taken
// or invalid. Only the name and what the Backend interface says are used: no core file changes.
TREADLE_API void register_backend(const Backend& backend);
const Backend* backend_by_name(const std::string& name);  // throws ValueError listing the known names

}  // namespace treadle

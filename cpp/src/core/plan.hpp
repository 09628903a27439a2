#pragma once
// A plan: a graph compiled for one input signature and mode. It holds the forward and backward
// nodes in execution order, the kernel chosen for each, and a static memory plan that places every
// intermediate value in the context's arena. Running a plan allocates nothing (after the context's
// arena has grown once to this plan's size). Plans are immutable after compile and shared by threads.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/kernel.hpp"
#include "treadle/context.hpp"
#include "treadle/graph.hpp"
#include "treadle/profile.hpp"

namespace treadle {

class DeviceRuntime;

// Where a value lives at run time.
enum class Buffer : uint8_t { arena, params, input, target, seed, none };

struct Location {
  Buffer buffer = Buffer::none;
  int slot = 0;          // which input/target/seed
  int64_t offset = 0;    // bytes from the buffer's base
  int output = -1;       // an arena value a run may write straight into this plan output's bound buffer
};

// Bytes a value takes in the arena: its shape's, or more for a backend's own layout (ValueInfo).
int64_t planned_bytes(const ValueInfo& info);

struct PlanStep {
  int node = -1;
  KernelFn kernel = nullptr;  // null for views (aliases need no work)
  const Backend* backend = nullptr;
  std::size_t workspace = 0;
  std::shared_ptr<const void> state;  // the backend's prepared state for this node (Backend::prepare)
  std::string cpu_declines;  // backends that declined it for a reason this CPU decides (note_cpu_decline)
};

// A contiguous run of plan steps that a host scheduler may run as one task: the steps of one
// module (scope prefix) in one pass. `deps` are the earlier tasks it must wait for, derived from
// data flow and from the memory plan (a task must not overwrite arena bytes an earlier task still
// reads, and tasks that use the kernel workspace are ordered). `param_grads` are indices into
// Plan::param_grads whose gradient is final once this task has run.
struct PlanTask {
  std::string name;  // "forward fc1", "loss", "backward fc1"
  int begin = 0, end = 0;
  std::vector<int> deps;
  std::vector<int> param_grads;
};

// Memory handed to a run: parameters and the host's data, by slot.
struct Bindings {
  void* params = nullptr;
  std::span<void* const> inputs;
  std::span<void* const> targets;
  std::span<void* const> seeds;
  // Where the pointers above point. A plan runs only with bindings on its own device: a device
  // plan never reads host memory, a host plan never device memory.
  Device device{};
  // Optional, per plan output: the host buffer the caller will copy that output to (null or absent:
  // none). An output the plan computes into its own arena bytes is then computed there directly
  // (Location::output), and reading it back with the same bindings returns that buffer. The
  // buffers must not overlap each other, the inputs or the parameters.
  std::span<void* const> outputs;
};

// A run of consecutive elementwise Eigen steps over values of one shape, executed block by block
// (plan_elementwise.cpp).
struct ElementwiseRun {
  int begin = 0, end = 0;  // steps
  int64_t numel = 0;
  DType dtype = DType::f32;
  Shape block_shape, tail_shape;  // the 1-D shapes a kernel sees for a whole block and the last one
};

class Plan {
 public:
  explicit Plan(bool training);

  // Places values and picks kernels. `param_offsets[k]` is the byte offset of graph parameter k in
  // the flat parameter buffer. `backend` pins one backend ("" = priority order with fallback,
  // "auto" = the measured dispatch table). `deterministic` skips kernels a backend marks
  // non-deterministic and makes "auto" the fixed priority order.
  void finalize(const std::vector<int64_t>& param_offsets, const std::string& backend, bool deterministic = false);

  // Runs steps [begin, end) on `ctx`. Throws what a kernel throws.
  void run(Context& ctx, const Bindings& b, int begin, int end) const;
  // The same with the dropout RNG counter given: the tasks of one step share one counter, so the
  // step draws the same masks however the host splits it.
  void run_with_counter(Context& ctx, const Bindings& b, int begin, int end, uint64_t counter) const;
  // Splits the steps into tasks, one per module scope (its first `depth` path components) and pass,
  // with the dependencies that make any order respecting them equal to the sequential run.
  std::vector<PlanTask> partition_tasks(int depth) const;
  // A number no other plan in this process shares (profiles key on it).
  uint64_t id() const { return id_; }
  // Address of value `id` for a run on `ctx` with bindings `b`.
  void* address(Context& ctx, const Bindings& b, int id) const;
  // Adds every parameter gradient of the last backward run into `grads` (flat buffer, same layout
  // as the parameters): host memory for a host plan; for a device plan, the model's device copy of
  // the buffer (Model::device_buffers), added on the context's queue.
  void accumulate_param_grads(Context& ctx, const Bindings& b, void* grads) const;
  // The same for entry `g` of param_grads only (a task completes its own gradients).
  void accumulate_param_grad(Context& ctx, const Bindings& b, int g, void* grads) const;
  // A host plan's gradients as the whole content of `grads` (`bytes` long): what zeroing the buffer
  // and then accumulate_param_grads leave, bit for bit (0 + g), in one pass that reads each
  // gradient once and writes each byte once (the gaps between them zeroed). On the wide MLP (3.1M
  // parameters) the zeroing and the read-modify-write were ~7% of a step's perf samples; writing
  // made the step 1.2% faster (in-process A/B), and a step that fails before its backward leaves
  // the gradients as they were.
  void write_param_grads(Context& ctx, const Bindings& b, void* grads, std::size_t bytes) const;

  int num_steps() const { return static_cast<int>(steps.size()); }
  std::size_t arena_bytes() const { return arena_bytes_; }
  // The device of a plan finalized with a device backend ("cuda": cuda:0; its arena is the
  // context's device arena and every node runs that backend's kernel), else the CPU.
  Device device() const { return device_; }
  std::string describe() const;  // one line per step: node, op, backend, shapes

  Graph graph;
  std::vector<int> inputs, outputs, targets, seeds;  // value ids
  int loss = -1;                                     // value id of the loss (loss plans)
  std::vector<std::pair<std::string, int>> observed; // named values the host may read (Graph::observe)
  int forward_end = 0;                               // steps [0, forward_end) are the forward pass
  std::vector<std::pair<int64_t, int>> param_grads;  // (byte offset in flat buffer, gradient value id)
  std::vector<int> input_grads;                      // per input: gradient value id or -1
  std::vector<PlanStep> steps;
  // Run consecutive elementwise steps block by block (the model's `fusion` setting; set before finalize).
  bool fuse_elementwise = false;
  const void* owner = nullptr;  // the model that compiled it, and its layout generation then (API checks)
  uint64_t owner_generation = 0;

 private:
  void plan_memory();
  // Marks the outputs a run may compute straight into the caller's buffers (Bindings::outputs).
  void bind_outputs_in_place(const std::vector<int>& alias);
  // Sets ValueInfo::read from the graph's consumers and the values the host reads after a run.
  void mark_read_values();
  // Anomaly mode: throws ValueError if an output of step `s` holds NaN/Inf.
  void check_numerics(int s, const TensorRef* outs) const;
  void select_kernels(const std::string& backend, bool deterministic);
  // Elementwise runs (plan_elementwise.cpp): found after the memory plan, run by run_with_counter.
  bool blockable_step(int s) const;
  void find_elementwise_runs();
  void run_elementwise(const ElementwiseRun& r, Context& ctx, const Bindings& b, uint64_t counter) const;
  const char* layout_owner_of_inputs(const Node& node) const;
  // Profiling: adds one kernel call of step `s` to `profiler`.
  void record_time(Profiler& profiler, int s, double seconds) const;
  // "forward", "loss" or "backward" for step `s`.
  const char* pass_of(int s) const;
  void order_param_grads();            // fills param_grad_order_ and param_grads_disjoint_
  int64_t grad_bytes(int value) const;  // bytes of gradient value `value`
  std::vector<Location> loc_;
  std::vector<ElementwiseRun> runs_;
  // param_grads' entries in offset order, and whether their byte ranges are disjoint (tied weights
  // give one parameter several entries: then write_param_grads zeroes and accumulates).
  std::vector<int> param_grad_order_;
  bool param_grads_disjoint_ = false;
  std::vector<int> run_of_step_;  // per step: its run in runs_, or -1
  uint64_t id_;
  std::vector<int64_t> param_offsets_;
  std::size_t arena_bytes_ = 0, workspace_offset_ = 0;
  // The arena a run uses: the context's host arena, or its device queue's for a device plan.
  char* arena_base(Context& ctx) const;
  // Throws ValueError when `b` points to another device than the plan's, or when the context asks
  // for what a device plan cannot do yet (anomaly mode reads outputs on the host).
  void check_run(const Context& ctx, const Bindings& b) const;
  Device device_{};
  const DeviceRuntime* runtime_ = nullptr;  // a device plan's backend runtime; null on the host
};

// Appends the backward pass to `g`: gradients of `seeds` (value id -> its gradient value) through
// nodes [0, num_nodes) with respect to the values in `wrt`. Returns the gradient value per entry of
// `wrt` (-1 where no gradient flows).
std::vector<int> build_backward(Graph& g, int num_nodes, const std::vector<std::pair<int, int>>& seeds,
                                const std::vector<int>& wrt);
// The same, with gradients flowing only from the values marked in `sources` (indexed by value id)
// instead of those flagged requires_grad: ops::grad takes derivatives with respect to inputs and
// intermediates this way without touching the graph's flags.
std::vector<int> build_backward_from(Graph& g, int num_nodes, const std::vector<std::pair<int, int>>& seeds,
                                     const std::vector<int>& wrt, std::vector<bool> sources);

}  // namespace treadle

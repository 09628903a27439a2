#include "core/plan.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "backends/device_runtime.hpp"
#include "core/dispatch_table.hpp"
#include "core/op_registry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

constexpr int64_t kAlign = 64;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Interval {
  int value;
  int first, last;  // steps during which the value must stay intact
  int64_t bytes;
};

// Greedy by size: biggest values first, each at the lowest offset that does not overlap a placed
// value alive at the same time. Good packing for the chain-like graphs of typical models.
int64_t place(std::vector<Interval>& items, std::vector<int64_t>& offset_of) {
  std::sort(items.begin(), items.end(), [](const Interval& a, const Interval& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.value < b.value;
  });
  std::vector<const Interval*> placed;
  std::vector<int64_t> placed_off;
  int64_t total = 0;
  for (const Interval& it : items) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (std::size_t k = 0; k < placed.size(); ++k)
      if (placed[k]->first <= it.last && it.first <= placed[k]->last)
        busy.emplace_back(placed_off[k], placed_off[k] + placed[k]->bytes);
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (const auto& [b0, b1] : busy) {
      if (off + it.bytes <= b0) break;
      off = std::max(off, align_up(b1));
    }
    offset_of[it.value] = off;
    placed.push_back(&it);
    placed_off.push_back(off);
    total = std::max(total, off + it.bytes);
  }
  return align_up(total);
}

std::atomic<uint64_t> g_next_plan_id{1};

}  // namespace

Plan::Plan(bool training) : graph(training), id_(g_next_plan_id.fetch_add(1)) {}

void Plan::finalize(const std::vector<int64_t>& param_offsets, const std::string& backend, bool deterministic) {
  param_offsets_ = param_offsets;
  steps.clear();
  steps.resize(graph.nodes().size());
  for (int n = 0; n < static_cast<int>(steps.size()); ++n) steps[n].node = n;
  mark_read_values();
  device_ = plan_device(backend);
  runtime_ = device_runtime(device_.kind);
  if (runtime_) {  // every node on the device: no fallback, since a host kernel cannot read device memory
    runtime_->select_kernels(*this, device_, deterministic);
    plan_memory();
    return;
  }
  select_kernels(backend, deterministic);
  plan_memory();
  find_elementwise_runs();
  order_param_grads();
}

void Plan::order_param_grads() {
  param_grad_order_.resize(param_grads.size());
  for (std::size_t g = 0; g < param_grads.size(); ++g) param_grad_order_[g] = static_cast<int>(g);
  std::sort(param_grad_order_.begin(), param_grad_order_.end(),
            [&](int a, int b) { return param_grads[a].first < param_grads[b].first; });
  param_grads_disjoint_ = true;
  int64_t end = 0;
  for (int g : param_grad_order_) {
    const auto& [offset, value] = param_grads[g];
    if (offset < end) param_grads_disjoint_ = false;
    end = offset + grad_bytes(value);
  }
}

int64_t Plan::grad_bytes(int value) const {
  const ValueInfo& info = graph.values()[value];
  return shape_numel(info.shape) * static_cast<int64_t>(dtype_size(info.dtype));
}

void Plan::mark_read_values() {
  for (ValueInfo& v : graph.values()) {
    v.read = v.host_read = false;
    v.layout_owner = nullptr;
    v.layout_bytes = 0;
  }
  for (const Node& node : graph.nodes())
    for (int in : node.inputs) graph.values()[in].read = true;
  auto host = [&](int v) { graph.values()[v].read = graph.values()[v].host_read = true; };
  for (int v : outputs) host(v);
  if (loss >= 0) host(loss);
  for (const auto& named : observed) host(named.second);
  for (const auto& pg : param_grads) host(pg.second);
  for (int g : input_grads)
    if (g >= 0) host(g);
}

int64_t planned_bytes(const ValueInfo& info) {
  const int64_t bytes = shape_numel(info.shape) * static_cast<int64_t>(dtype_size(info.dtype));
  return std::max<int64_t>({bytes, info.layout_bytes, 1});
}

// The backend whose own layout one of the node's inputs is in (PreparedNode::opaque_outputs), or null.
const char* Plan::layout_owner_of_inputs(const Node& node) const {
  for (int in : node.inputs)
    if (const char* owner = graph.info(in).layout_owner) return owner;
  return nullptr;
}

void Plan::select_kernels(const std::string& backend, bool deterministic) {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<const Backend*> order = available_backends();
  // A pinned backend takes every node it supports; backends are partial, so the rest falls back to
  // the reference (the last in priority order).
  // "auto": per node, as the dispatch table says; deterministic plans keep the fixed priority order
  // (a table is an input from outside the program and may change between runs).
  const bool measured = backend == kAutoBackend && !deterministic;
  if (!backend.empty() && backend != kAutoBackend) {
    const Backend* pinned = backend_by_name(backend);
    const Backend* reference = order.back();  // the last in priority order
    order = {pinned};
    if (pinned != reference) order.push_back(reference);
  }
  for (PlanStep& s : steps) {
    const Node& node = graph.nodes()[s.node];
    const OpDef& def = reg.at(node.op);
    if (def.workspace) {
      std::vector<TensorMeta> metas;
      for (int in : node.inputs) metas.push_back({graph.info(in).shape, graph.info(in).dtype});
      s.workspace = def.workspace(metas, node.attrs);
    }
    // In-place updates (running statistics) belong to training plans only, and only to memory the
    // host binds (parameters, inputs), never to a planned intermediate that another value may share.
    for (int k : def.writes_inputs) {
      if (!graph.training())
        throw_runtime_error("plan: op '", def.name, "' updates its inputs in place; only training plans may hold it");
      ValueKind kind = graph.info(node.inputs.at(k)).kind;
      if (kind != ValueKind::parameter && kind != ValueKind::input)
        throw_runtime_error("plan: op '", def.name, "' writes input ", k, ", which must be a parameter or an input");
    }
    if (def.view_of >= 0) continue;
    const char* owner = layout_owner_of_inputs(node);
    std::vector<const Backend*> candidates = measured ? auto_backend_order(graph, node) : order;
    if (owner) candidates = {backend_by_name(owner)};  // it alone reads its own layout
    std::erase_if(candidates, is_device_backend);  // a host plan's pointers are host memory
    for (const Backend* b : candidates) {
      if (deterministic && !b->deterministic(graph, node)) continue;
      take_cpu_decline();
      KernelFn fn = b->find(graph, node);
      if (std::string why = take_cpu_decline(); !fn && !why.empty())
        s.cpu_declines += std::string(s.cpu_declines.empty() ? "" : "; ") + b->name() + " declined on this CPU: " + why;
      if (fn) {
        s.kernel = fn;
        s.backend = b;
        PreparedNode prepared = b->prepare(graph, node);
        s.state = std::move(prepared.state);
        s.workspace = std::max(s.workspace, prepared.workspace);
        for (const auto& [k, bytes] : prepared.opaque_outputs) {
          ValueInfo& v = graph.values()[node.outputs.at(k)];
          v.layout_owner = b->name();
          v.layout_bytes = static_cast<int64_t>(bytes);
        }
        break;
      }
    }
    if (!s.kernel && owner)
      throw_runtime_error("plan: op '", def.name, "' reads a value that backend '", owner,
                          "' wrote in its own layout, and that backend does not take the op");
    if (!s.kernel) {
      DType dt = node.inputs.empty() ? graph.info(node.outputs[0]).dtype : graph.info(node.inputs[0]).dtype;
      throw_value_error("no ", deterministic ? "deterministic " : "", "backend",
                        backend.empty() ? "" : " '" + backend + "'", " implements op '", def.name, "' for ",
                        dtype_name(dt));
    }
  }
}

void Plan::plan_memory() {
  const OpRegistry& reg = OpRegistry::instance();
  const int nv = static_cast<int>(graph.values().size());
  const int last_step = std::max(0, num_steps() - 1);
  loc_.assign(nv, Location{});
  std::vector<int> alias(nv, -1), first(nv, -1), last(nv, -1);

  for (int v = 0; v < nv; ++v) {
    const ValueInfo& info = graph.values()[v];
    switch (info.kind) {
      case ValueKind::input: loc_[v] = {Buffer::input, info.slot, 0}; break;
      case ValueKind::target: loc_[v] = {Buffer::target, info.slot, 0}; break;
      case ValueKind::seed: loc_[v] = {Buffer::seed, info.slot, 0}; break;
      case ValueKind::parameter: loc_[v] = {Buffer::params, 0, param_offsets_.at(info.slot)}; break;
      case ValueKind::intermediate: break;
    }
  }
  // Lifetimes: from the producing step to the last consuming step; views extend their source.
  auto root = [&](int v) {
    while (alias[v] >= 0) v = alias[v];
    return v;
  };
  for (int s = 0; s < num_steps(); ++s) {
    const Node& node = graph.nodes()[steps[s].node];
    int view_of = reg.at(node.op).view_of;
    for (int out : node.outputs) first[out] = s;
    if (view_of >= 0) alias[node.outputs[0]] = node.inputs[view_of];
    for (int in : node.inputs) last[root(in)] = std::max(last[root(in)], s);
    for (int out : node.outputs) last[root(out)] = std::max(last[root(out)], s);
  }
  // Values the host reads after a run stay alive to the end.
  std::vector<int> pinned = outputs;
  if (loss >= 0) pinned.push_back(loss);
  for (const auto& named : observed) pinned.push_back(named.second);
  for (const auto& pg : param_grads) pinned.push_back(pg.second);
  for (int g : input_grads)
    if (g >= 0) pinned.push_back(g);
  for (int v : pinned) last[root(v)] = last_step;

  std::vector<Interval> items;
  for (int v = 0; v < nv; ++v)
    if (graph.values()[v].kind == ValueKind::intermediate && alias[v] < 0 && first[v] >= 0) {
      items.push_back({v, first[v], std::max(first[v], last[v]), planned_bytes(graph.values()[v])});
    }
  std::vector<int64_t> offset_of(nv, 0);
  int64_t values_bytes = place(items, offset_of);
  for (const Interval& it : items) loc_[it.value] = {Buffer::arena, 0, offset_of[it.value]};
  if (!runtime_) bind_outputs_in_place(alias);
  for (int v = 0; v < nv; ++v)
    if (alias[v] >= 0) loc_[v] = loc_[root(v)];
  std::size_t ws = 0;
  for (const PlanStep& s : steps) ws = std::max(ws, s.workspace);
  workspace_offset_ = static_cast<std::size_t>(values_bytes);
  arena_bytes_ = workspace_offset_ + static_cast<std::size_t>(align_up(static_cast<int64_t>(ws)));
}

// An output whose memory is an arena value of its own (itself, or the value it is a view of, with
// the same bytes) may live in the caller's buffer instead: predict then skips the copy out. Not
// when two outputs share that memory, nor for a backend's own layout (the host reads it plain).
void Plan::bind_outputs_in_place(const std::vector<int>& alias) {
  auto root = [&](int v) {
    while (alias[v] >= 0) v = alias[v];
    return v;
  };
  std::vector<int> roots;
  for (int v : outputs) roots.push_back(root(v));
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const int r = roots[k];
    const ValueInfo &out = graph.info(outputs[k]), &mem = graph.info(r);
    if (loc_[r].buffer != Buffer::arena || mem.layout_owner || out.layout_owner ||
        planned_bytes(mem) != static_cast<int64_t>(shape_numel(out.shape) * dtype_size(out.dtype)) ||
        std::count(roots.begin(), roots.end(), r) != 1)
      continue;
    loc_[r].output = static_cast<int>(k);
  }
}

void* Plan::address(Context& ctx, const Bindings& b, int id) const {
  const Location& l = loc_[id];
  if (l.output >= 0 && static_cast<std::size_t>(l.output) < b.outputs.size() && b.outputs[l.output])
    return b.outputs[l.output];
  char* base = nullptr;
  switch (l.buffer) {
    case Buffer::arena: base = arena_base(ctx); break;
    case Buffer::params: base = static_cast<char*>(b.params); break;
    case Buffer::input: base = static_cast<char*>(b.inputs[l.slot]); break;
    case Buffer::target: base = static_cast<char*>(b.targets[l.slot]); break;
    case Buffer::seed: base = static_cast<char*>(b.seeds[l.slot]); break;
    case Buffer::none: throw_runtime_error("plan: value ", id, " has no memory (never produced)");
  }
  return base + l.offset;
}

namespace {

// A device plan's device is the thread's current one while the plan runs, and the host's choice after.
class CurrentDevice {
 public:
  explicit CurrentDevice(DeviceQueue* queue) : queue_(queue), previous_(queue ? queue->make_current() : -1) {}
  ~CurrentDevice() {
    if (queue_) queue_->restore(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  DeviceQueue* queue_;
  int previous_;
};

}  // namespace

void Plan::run(Context& ctx, const Bindings& b, int begin, int end) const {
  run_with_counter(ctx, b, begin, end, ctx.next_rng_counter());
}

void Plan::run_with_counter(Context& ctx, const Bindings& b, int begin, int end, uint64_t counter) const {
  constexpr int kMaxOperands = 24;
  ExecutorRun run(ctx.executor());  // the host's workers are called in once for all the steps below
  check_run(ctx, b);
  char* arena = arena_base(ctx);
  DeviceQueue* queue = runtime_ ? &ctx.device_queue(device_) : nullptr;
  const CurrentDevice current(queue);  // the kernels enqueue on the plan's device
  void* stream = queue ? queue->stream() : nullptr;
  Profiler* profiler = ctx.profiler() ? ctx.profiler() : global_profiler();
  // A device kernel call only enqueues work: device plans are timed by the device.
  std::unique_ptr<DeviceStepTimer> device_timer;
  if (profiler && runtime_) device_timer = runtime_->step_timer(stream);
  std::array<TensorRef, kMaxOperands> refs;
  for (int s = begin; s < end; ++s) {
    const PlanStep& step = steps[s];
    if (!step.kernel) continue;
    // An elementwise run starting here and ending in range runs block by block (anomaly mode checks
    // each step's output before the next runs: unfused). A profile shares the run's time equally.
    const int r = run_of_step_.empty() ? -1 : run_of_step_[s];
    if (r >= 0 && runs_[r].begin == s && runs_[r].end <= end && !ctx.check_numerics()) {
      const ElementwiseRun& run = runs_[r];
      const auto t0 = profiler ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      run_elementwise(run, ctx, b, counter);
      if (profiler) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (int k = run.begin; k < run.end; ++k) record_time(*profiler, k, seconds / (run.end - run.begin));
      }
      s = run.end - 1;
      continue;
    }
    const Node& node = graph.nodes()[step.node];
    const int nin = static_cast<int>(node.inputs.size()), nout = static_cast<int>(node.outputs.size());
    if (nin + nout > kMaxOperands) throw_runtime_error("plan: node with more than ", kMaxOperands, " operands");
    for (int k = 0; k < nin + nout; ++k) {
      int v = k < nin ? node.inputs[k] : node.outputs[k - nin];
      const ValueInfo& info = graph.values()[v];
      refs[k] = TensorRef{address(ctx, b, v), &info.shape, info.dtype, shape_numel(info.shape)};
    }
    KernelArgs args{node, refs.data(), nin, refs.data() + nin, nout, ctx.executor(), arena + workspace_offset_,
                    ctx.seed(), counter};
    args.state = step.state.get();
    args.stream = stream;
    if (device_timer) {
      step.kernel(args);
      device_timer->mark(s);
      continue;  // no check_numerics: check_run refuses it for device plans (the trainer checks on the device)
    }
    if (profiler) {
      const auto t0 = std::chrono::steady_clock::now();
      step.kernel(args);
      record_time(*profiler, s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } else {
      step.kernel(args);
    }
    if (ctx.check_numerics()) check_numerics(s, refs.data() + nin);
  }
  if (device_timer) device_timer->finish([&](int s, double seconds) { record_time(*profiler, s, seconds); });
}

char* Plan::arena_base(Context& ctx) const {
  if (runtime_) return static_cast<char*>(ctx.device_queue(device_).arena(arena_bytes_, ctx.memory_budget()));
  return static_cast<char*>(ctx.arena(arena_bytes_));
}

void Plan::check_run(const Context& ctx, const Bindings& b) const {
  if (!(b.device == device_))
    throw_value_error("plan: compiled for ", device_name(device_), " but run with bindings on ", device_name(b.device),
                      runtime_ ? " (a device plan runs only with device memory bound; the Trainer and Model::predict "
                                 "upload host data themselves)"
                               : "");
  if (runtime_ && ctx.check_numerics())
    throw_value_error("plan: check_numerics reads outputs on the host and is not available for ",
                      device_name(device_), " plans run directly (the Trainer and Model::predict check them on ",
                      "the device)");
}

namespace {
// Index of the first non-finite element and how many there are (-1, 0 when all are finite).
template <typename T>
std::pair<int64_t, int64_t> find_nonfinite(const void* data, int64_t n) {
  const T* p = static_cast<const T*>(data);
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) {
      if (first < 0) first = i;
      ++count;
    }
  return {first, count};
}
}  // namespace

const char* Plan::pass_of(int s) const {
  // Loss nodes follow the forward pass and end at the loss value's producer.
  if (s < forward_end) return "forward";
  return loss >= 0 && steps[s].node <= graph.info(loss).producer ? "loss" : "backward";
}

void Plan::record_time(Profiler& profiler, int s, double seconds) const {
  profiler.record(id_, s, seconds, [&] {
    const Node& node = graph.nodes()[steps[s].node];
    NodeProfile p;
    p.plan = id_;
    p.node = steps[s].node;
    p.op = OpRegistry::instance().at(node.op).name;
    p.scope = node.scope;
    p.backend = steps[s].backend ? steps[s].backend->name() : "view";
    p.pass = pass_of(s);
    if (!node.outputs.empty()) p.output_shape = graph.info(node.outputs[0]).shape;
    return p;
  });
}

void Plan::check_numerics(int s, const TensorRef* outs) const {
  const Node& node = graph.nodes()[steps[s].node];
  for (std::size_t k = 0; k < node.outputs.size(); ++k) {
    const ValueInfo& info = graph.info(node.outputs[k]);
    if (!info.read || info.layout_owner) continue;  // possibly never written, or not numbers of ours
    const TensorRef& r = outs[k];
    std::pair<int64_t, int64_t> bad{-1, 0};
    if (r.dtype == DType::f32) bad = find_nonfinite<float>(r.data, r.numel);
    else if (r.dtype == DType::f64) bad = find_nonfinite<double>(r.data, r.numel);
    if (bad.first < 0) continue;
    double v = r.dtype == DType::f32 ? static_cast<const float*>(r.data)[bad.first]
                                     : static_cast<const double*>(r.data)[bad.first];
    const char* pass = pass_of(s);
    throw_value_error("check_numerics: node ", steps[s].node, " '", OpRegistry::instance().at(node.op).name,
                      "' in module '", node.scope.empty() ? "<root>" : node.scope, "' (", pass,
                      " pass) produced ", std::isnan(v) ? "NaN" : "Inf", " in output ", k, " of shape ",
                      shape_str(*r.shape), " (", bad.second, " non-finite value(s), first at flat index ",
                      bad.first, ")");
  }
}

namespace {
template <typename T>
void add_into(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

// dst = 0 + src: the bits of zeroing dst and adding src into it (-0 becomes +0).
template <typename T>
void zero_plus(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = T(0) + s[i];
}
}  // namespace

void Plan::write_param_grads(Context& ctx, const Bindings& b, void* grads, std::size_t bytes) const {
  char* base = static_cast<char*>(grads);
  if (runtime_ || !param_grads_disjoint_) {
    std::memset(base, 0, bytes);
    accumulate_param_grads(ctx, b, grads);
    return;
  }
  int64_t cursor = 0;  // bytes written so far
  for (int g : param_grad_order_) {
    const auto& [offset, value] = param_grads[g];
    if (offset > cursor) std::memset(base + cursor, 0, static_cast<std::size_t>(offset - cursor));
    const ValueInfo& info = graph.values()[value];
    const void* src = address(ctx, b, value);
    if (info.dtype == DType::f32)
      zero_plus<float>(base + offset, src, shape_numel(info.shape));
    else
      zero_plus<double>(base + offset, src, shape_numel(info.shape));
    cursor = offset + grad_bytes(value);
  }
  if (static_cast<int64_t>(bytes) > cursor)
    std::memset(base + cursor, 0, bytes - static_cast<std::size_t>(cursor));
}

void Plan::accumulate_param_grads(Context& ctx, const Bindings& b, void* grads) const {
  for (int g = 0; g < static_cast<int>(param_grads.size()); ++g) accumulate_param_grad(ctx, b, g, grads);
}

void Plan::accumulate_param_grad(Context& ctx, const Bindings& b, int g, void* grads) const {
  const auto& [offset, value] = param_grads[g];
  const ValueInfo& info = graph.values()[value];
  void* dst = static_cast<char*>(grads) + offset;  // a device plan's `grads` are the device copies
  const void* src = address(ctx, b, value);
  if (runtime_)
    ctx.device_queue(device_).add_into(dst, src, shape_numel(info.shape), info.dtype);
  else if (info.dtype == DType::f32)
    add_into<float>(dst, src, shape_numel(info.shape));
  else
    add_into<double>(dst, src, shape_numel(info.shape));
}

std::string Plan::describe() const {
  const OpRegistry& reg = OpRegistry::instance();
  std::ostringstream os;
  for (const PlanStep& s : steps) {
    const Node& n = graph.nodes()[s.node];
    const int run = run_of_step_.empty() ? -1 : run_of_step_[&s - steps.data()];
    os << s.node << " " << reg.at(n.op).name << " [" << (s.backend ? s.backend->name() : "view") << "]";
    if (const char* rounding = rounding_label(rounding_of(n.attrs))) os << " " << rounding;
    if (!fused_activation(n.attrs).empty()) os << " +" << fused_activation(n.attrs);
    if (!n.scope.empty()) os << " scope=" << n.scope;
    for (int out : n.outputs) os << " -> " << shape_str(graph.info(out).shape);
    if (run >= 0) os << " run=" << run;  // an elementwise run, block by block (plan_elementwise.cpp)
    if (!s.cpu_declines.empty()) os << "  # " << s.cpu_declines;
    os << "\n";
  }
  return os.str();
}

}  // namespace treadle

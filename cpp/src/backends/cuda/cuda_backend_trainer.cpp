// Trainer's device half on CUDA (DeviceTrainer): a training step of a plan compiled for "cuda" with the
// model's device copies bound. Per step: the inputs and the target are copied into one pinned
// staging buffer and uploaded with one copy on the context's stream, the plan runs, every parameter
// gradient is added into the device gradient buffer (Plan::accumulate_param_grads, the queue's
// add_into), the optimizer updates the device buffers (fused Adam / AdamW / AMSGrad, SGD), and the
// loss is the one value read back (the step's one stream synchronisation; the update is enqueued
// after it and finishes before anything else on the stream). All device memory comes from caching
// allocators, so steps after the first make no cudaMalloc call. With cuda_graph a step is one graph
// launch: what changes per step (the update's coefficients, the RNG counter) is uploaded, loss
// scaling's state stays on the device, and the loss and the non-finite flag come back together.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_backend_train.hpp"
#include "backends/cuda/cuda_graph.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "backends/cuda/device_rng.hpp"
#include "backends/cuda/loss_scale.hpp"
#include "backends/device_runtime.hpp"
#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/trainer_internals.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

using Inputs = Trainer::Inputs;
constexpr std::size_t kMaxInputs = Trainer::kMaxInputs;

// The coefficient slot of a captured step's upload: the update's coefficients, then the RNG state
// its dropout kernels read (device_rng.hpp).
struct GraphConstants {
  static constexpr std::size_t kUpdateBytes = 128;
  alignas(16) unsigned char update[kUpdateBytes];
  cuda::DeviceRngState rng;
};
static_assert(sizeof(cuda::AdamCoefficients) <= GraphConstants::kUpdateBytes);
static_assert(sizeof(cuda::SgdCoefficients) <= GraphConstants::kUpdateBytes);

// Destroyed in reverse order: graphs, buffers and pinned memory first, the allocator (cudaFree) last.
struct DeviceStep {
  enum class Side : uint8_t { both, host, device };
  explicit DeviceStep(Device d) : device(d), alloc(d.index), readback(64) {}
  Device device;  // the plans' device (the trainer's model's backend)

  // Where upload() put the step's data on the device.
  struct Slots {
    void* coefficients = nullptr;
    std::array<void*, kMaxInputs> inputs{};
    void* target = nullptr;
  };
  // Copies the update's coefficients (for a graph replay; may be null), the inputs and the target
  // into the pinned staging buffer and uploads it with one copy on `s`. The coefficients' slot is
  // there either way, so the first (launched) step and the captured ones use the same buffer.
  static constexpr std::size_t kCoefficientSlot = 256;
  Slots upload(Inputs xs, const Tensor& y, const void* coefficients, std::size_t coefficient_bytes, cudaStream_t s);
  // The optimizer's state on the device: allocated once, uploaded when the host's is newer (zeros
  // after bind, a restored checkpoint) or the optimizer was re-bound (new host tensors).
  void ready_state(Optimizer& o, cudaStream_t s);
  float* state_ptr(std::size_t i) const { return i < state.size() ? state[i].ptr<float>() : nullptr; }
  // Enqueues clip_grad_norm over the first n gradients; ready_clip makes its scratch (before a capture).
  void ready_clip(int64_t n, cudaStream_t s);
  void clip(float* grads, int64_t n, double max_norm, cudaStream_t s);

  // Loss scaling's device state. A launched step unscales by inv_scale (the host scaler's, uploaded
  // per step) and reads the flag back before its update; a captured step seeds its backward with
  // `scale`, unscales by it, skips its update on the flag and applies the rule to scale and
  // growth_tracker on the device, and the host mirrors the rule from the flag read back.
  struct Scaling {
    float scale;
    int32_t growth_tracker;
    int32_t found_nonfinite;
    float inv_scale;
  };
  Scaling* scaling_state(cudaStream_t s);
  // Uploads the host scaler's scale and tracker when the device may hold others (first use, a
  // restored checkpoint, set_loss_scale_state): a separate 8-byte copy, rare.
  void sync_scaling(const LossScaler& host, cudaStream_t s);
  // After a captured step: the host rule applied to the flag read back (`back`: the device's
  // Scaling after the step), checked against the device's result. Returns whether the update ran.
  bool settle_scaling(LossScaler& host, const Scaling& back);
  // The captured step's loss-scaling nodes: unscale the accumulated gradients by the device scale
  // into a fresh flag, and (dynamic) the rule on the device. Returns the flag for the update.
  const int32_t* enqueue_unscale(float* grads, int64_t n, const LossScaler& host, cudaStream_t s);

  // The optimizer's update rule, asked again only when its options changed (set_group_option
  // between updates, as OneCycleLR's momentum / beta1 cycling does on the host): a step allocates
  // nothing on the host. check_support made sure there is one.
  Optimizer::UpdateRule rule;
  uint64_t rule_version = ~uint64_t{0};
  const Optimizer::UpdateRule& refresh_rule(const Optimizer& o) {
    if (rule_version != o.options_version()) {
      rule = *o.update_rule();
      rule_version = o.options_version();
    }
    return rule;
  }
  cuda::CachingDeviceAllocator alloc;
  cuda::DeviceBuffer io;  // coefficients, inputs, target: each slot 256-byte aligned
  std::size_t io_bytes = 0;
  cuda::PinnedHostBuffer staging;   // the host side of `io`
  cuda::PinnedHostBuffer readback;  // the loss and a non-finite count
  cuda::DeviceBuffer stats;         // cuda::NonfiniteStats
  cuda::DeviceBuffer scaling;       // loss scaling: one Scaling
  bool scaling_known = false;       // whether the device's scale and tracker are known to be:
  float known_scale = 0;
  int64_t known_tracker = 0;
  cuda::DeviceBuffer clip_scratch;  // clip_grad_norm: partial sums, then the coefficient and the norm
  std::vector<cuda::DeviceBuffer> state;  // in Optimizer::state() order
  std::vector<const void*> state_host;    // the host tensors they mirror
  Side state_at = Side::host;
  // One captured step per plan (input signature), with the addresses it was captured with: any
  // change (a grown arena, re-made model copies) captures again.
  struct Graph {
    std::shared_ptr<const Plan> plan;
    std::array<const void*, 8> pointers{};
    double clip_grad_norm = 0;  // captured into the graph's kernel arguments
    unsigned kernel_flags = 0;  // the update kernel's variant (UpdateCoefficients::kernel_flags)
    cuda::GraphExec exec;
  };
  std::vector<Graph> graphs;
  // (Re-)captures `g`: the step's body after the upload, which device_graph_step then launches.
  // `enqueue_update(skip)` enqueues the update reading its coefficients from the upload.
  template <typename EnqueueUpdate>
  void capture(Graph& g, const Plan& p, Context& ctx, const Bindings& b, const Model::DeviceBuffers& mb,
               const void* rng_slot, uint64_t counter, const LossScaler* scaler, const TrainerOptions& options,
               int64_t n, cudaStream_t s, EnqueueUpdate&& enqueue_update);
};

DeviceStep::Slots DeviceStep::upload(Inputs xs, const Tensor& y, const void* coefficients,
                                     std::size_t coefficient_bytes, cudaStream_t s) {
  static_assert(sizeof(cuda::AdamCoefficients) <= kCoefficientSlot);
  static_assert(sizeof(cuda::SgdCoefficients) <= kCoefficientSlot);
  static_assert(sizeof(GraphConstants) <= kCoefficientSlot);
  if (coefficient_bytes > kCoefficientSlot) throw_runtime_error("Trainer: ", coefficient_bytes, " coefficient bytes");
  std::array<std::size_t, kMaxInputs + 1> offset{};
  std::size_t total = kCoefficientSlot;
  for (std::size_t i = 0; i <= xs.size(); ++i) {
    offset[i] = total;
    total += cuda::align256(i < xs.size() ? xs[i].nbytes() : y.nbytes());
  }
  if (total > io_bytes) {  // the last step synchronised: neither buffer is in use
    io = alloc.buffer(total, s);
    staging = cuda::PinnedHostBuffer(total);
    io_bytes = total;
  }
  auto* staged = staging.ptr<char>();
  if (coefficients) std::memcpy(staged, coefficients, coefficient_bytes);
  bool on_device[kMaxInputs + 1] = {};
  for (std::size_t i = 0; i <= xs.size(); ++i) {
    const Tensor& t = i < xs.size() ? xs[i] : y;
    if ((on_device[i] = !t.is_cpu())) continue;  // copied on the device below
    const Tensor c = t.is_contiguous() ? t : t.clone();
    std::memcpy(staged + offset[i], c.data(), c.nbytes());
  }
  cuda::copy_to_device_async(io.data(), staged, total, s);
  auto* base = static_cast<char*>(io.data());
  // Device arrays (the host's CuPy/torch data) go into their slots after the upload, on the same
  // stream: the step's pointers stay the trainer's own, so a captured graph replays with them too.
  for (std::size_t i = 0; i <= xs.size(); ++i)
    if (on_device[i]) cuda::copy_tensor_async(base + offset[i], i < xs.size() ? xs[i] : y, device, s);
  Slots slots;
  slots.coefficients = base;
  for (std::size_t i = 0; i < xs.size(); ++i) slots.inputs[i] = base + offset[i];
  slots.target = base + offset[xs.size()];
  return slots;
}

void DeviceStep::ready_clip(int64_t n, cudaStream_t s) {
  const std::size_t need = cuda::align256(cuda::clip_workspace_bytes(n)) + 256;
  if (clip_scratch.bytes() < need) clip_scratch = alloc.buffer(need, s);
}

void DeviceStep::clip(float* grads, int64_t n, double max_norm, cudaStream_t s) {
  ready_clip(n, s);
  const std::size_t partial = cuda::align256(cuda::clip_workspace_bytes(n));
  char* base = clip_scratch.ptr<char>();
  cuda::clip_grad_norm(grads, n, max_norm, base, reinterpret_cast<float*>(base + partial),
                       reinterpret_cast<double*>(base + partial + 128), s);
}

void DeviceStep::ready_state(Optimizer& o, cudaStream_t s) {
  std::vector<std::pair<std::string, Tensor>>& host = o.state();
  bool rebound = state.size() != host.size();
  for (std::size_t i = 0; !rebound && i < host.size(); ++i) rebound = state_host[i] != host[i].second.data();
  if (rebound) {
    state.clear();
    state_host.clear();
    for (auto& [name, t] : host) {
      state.push_back(alloc.buffer(std::max<std::size_t>(t.nbytes(), 1), s));
      state_host.push_back(t.data());
    }
    state_at = Side::host;
  }
  if (state_at == Side::host) {
    for (std::size_t i = 0; i < host.size(); ++i)
      cuda::copy_to_device_async(state[i].data(), host[i].second.data(), host[i].second.nbytes(), s);
    state_at = Side::both;
  }
}

DeviceStep::Scaling* DeviceStep::scaling_state(cudaStream_t s) {
  if (!scaling.data()) scaling = alloc.buffer(sizeof(Scaling), s);
  return scaling.ptr<Scaling>();
}

void DeviceStep::sync_scaling(const LossScaler& host, cudaStream_t s) {
  if (scaling_known && known_scale == host.scale() && known_tracker == host.growth_tracker()) return;
  // The device rule counts in int32; a tracker at or beyond the interval (a checkpoint's) grows on
  // the next finite step either way, so interval - 1 stands for it.
  const int64_t cap = std::max<int64_t>(host.options().growth_interval - 1, 0);
  const int32_t tracker = static_cast<int32_t>(std::min(host.growth_tracker(), cap));
  auto* staged = reinterpret_cast<char*>(readback.data()) + 48;  // the last step synchronised: free
  const float scale = host.scale();
  std::memcpy(staged, &scale, sizeof scale);
  std::memcpy(staged + sizeof scale, &tracker, sizeof tracker);
  static_assert(offsetof(Scaling, growth_tracker) == sizeof(float));
  cuda::copy_to_device_async(scaling_state(s), staged, sizeof scale + sizeof tracker, s);
  scaling_known = true;
  known_scale = host.scale();
  known_tracker = host.growth_tracker();
}

const int32_t* DeviceStep::enqueue_unscale(float* grads, int64_t n, const LossScaler& host, cudaStream_t s) {
  Scaling* st = scaling_state(s);
  cuda::clear_nonfinite_flag(&st->found_nonfinite, s);
  // 1 / scale in float32 on the device equals the host's float(1 / double(scale)): both are the
  // correctly rounded quotient.
  cuda::scale_gradients(grads, grads, n, &st->scale, cuda::ScaleDirection::divide, &st->found_nonfinite, s);
  if (host.dynamic()) {
    const LossScaling& o = host.options();
    const cuda::LossScaleRule rule{o.growth_factor, o.backoff_factor, static_cast<int32_t>(o.growth_interval)};
    cuda::loss_scale_update(&st->scale, &st->growth_tracker, &st->found_nonfinite, rule, s);
  }
  return &st->found_nonfinite;
}

bool DeviceStep::settle_scaling(LossScaler& host, const Scaling& back) {
  const bool applied = host.update(back.found_nonfinite != 0);
  if (host.dynamic() && (back.scale != host.scale() || back.growth_tracker != host.growth_tracker())) {
    scaling_known = false;  // the next step uploads the host's state
    throw_runtime_error("Trainer.step: the device's loss scale ", back.scale, " (growth tracker ",
                        back.growth_tracker, ") differs from the host rule's ", host.scale(), " (",
                        host.growth_tracker(), ") after a captured step");
  }
  known_scale = host.scale();
  known_tracker = host.growth_tracker();
  return applied;
}

using Hyperparameters = std::vector<std::pair<std::string, double>>;

double hyperparameter(const Hyperparameters& hp, const char* name) {
  for (const auto& [key, value] : hp)
    if (key == name) return value;
  throw_runtime_error("Trainer: the optimizer reports no hyper-parameter '", name, "'");
}

// The coefficients of update `t` (the count including it) at learning rate `lr`: SGD's or Adam's.
struct UpdateCoefficients {
  bool sgd = false;
  cuda::SgdCoefficients sgd_k;
  cuda::AdamCoefficients adam_k;
  const void* data() const { return sgd ? static_cast<const void*>(&sgd_k) : &adam_k; }
  std::size_t bytes() const { return sgd ? sizeof(sgd_k) : sizeof(adam_k); }
  // The flags that choose the update kernel, fixed in a captured graph (the values are read from the
  // upload): set_group_option can change weight_decay from or to 0, or nesterov, between steps.
  unsigned kernel_flags() const {
    if (sgd) return 1u | (sgd_k.decay ? 2u : 0u) | (sgd_k.use_momentum ? 4u : 0u) | (sgd_k.nesterov ? 8u : 0u);
    return (adam_k.coupled ? 2u : 0u) | (adam_k.amsgrad ? 4u : 0u);
  }
};

UpdateCoefficients update_coefficients(const Optimizer::UpdateRule& rule, double lr, int64_t t) {
  const Hyperparameters& hp = rule.options;
  UpdateCoefficients k;
  k.sgd = rule.family == Optimizer::UpdateRule::Family::sgd;
  if (k.sgd)
    k.sgd_k = cuda::sgd_coefficients(lr, hyperparameter(hp, "momentum"), hyperparameter(hp, "dampening"),
                                     hyperparameter(hp, "weight_decay"), hyperparameter(hp, "nesterov") != 0, t);
  else
    k.adam_k = cuda::adam_coefficients(lr, hyperparameter(hp, "beta1"), hyperparameter(hp, "beta2"),
                                       hyperparameter(hp, "eps"), hyperparameter(hp, "weight_decay"), t,
                                       rule.decoupled_weight_decay, hyperparameter(hp, "amsgrad") != 0);
  return k;
}

// Enqueues the update: with the coefficients as arguments, or read from `k_device` (a graph), then
// skipped on the device when `skip` (loss scaling's flag in a graph, or null) is set.
void enqueue_update(const UpdateCoefficients& k, const void* k_device, float* p, const float* g,
                    const std::array<float*, 3>& state, int64_t n, cudaStream_t s, const int32_t* skip = nullptr) {
  if (k.sgd && k_device)
    cuda::sgd_update_indirect(p, g, state[0], n, k.sgd_k, static_cast<const cuda::SgdCoefficients*>(k_device), s,
                              skip);
  else if (k.sgd)
    cuda::sgd_update(p, g, state[0], n, k.sgd_k, s);
  else if (k_device)
    cuda::adam_update_indirect(p, g, state[0], state[1], k.adam_k.amsgrad ? state[2] : nullptr, n, k.adam_k,
                               static_cast<const cuda::AdamCoefficients*>(k_device), s, skip);
  else
    cuda::adam_update(p, g, state[0], state[1], k.adam_k.amsgrad ? state[2] : nullptr, n, k.adam_k, s);
}

// `seed`: the loss gradient's seed (loss scaling: the scale, on the device), or null for 1.
// What a captured step cannot do: anomaly mode, and device labels (whose range the host cannot check).
void refuse_in_graph(const Context& ctx, const Tensor& y, const std::string& loss_kind) {
  if (ctx.check_numerics())
    throw_value_error("Trainer.step: anomaly mode (check_numerics) reads every output back, which a CUDA graph ",
                      "cannot; turn cuda_graph off to use it");
  if (!y.is_cpu() && loss_kind == "cross_entropy")
    throw_value_error("Trainer.step: cuda_graph with class labels on ", device_name(y.device()), ": a captured ",
                      "step applies its update before the loss is read, so a label out of range (checked on the ",
                      "host for host labels) would reach the parameters as NaN; pass the labels as a host array ",
                      "or turn cuda_graph off");
}

Bindings device_bindings(Device device, void* params, std::span<void* const> inputs, void* const* target,
                         void* const* seed = nullptr) {
  Bindings b{params, inputs, std::span<void* const>(target, 1), std::span<void* const>(seed, seed ? 1 : 0)};
  b.device = device;
  return b;
}

// The trainer's members are reached as references of the same names, so the step reads as the
// trainer's own code; the device side of the step is `step_`, made on the first device step.
class CudaTrainer final : public DeviceTrainer, private UpdateSteps {
 public:
  CudaTrainer(Device device, Trainer& trainer)
      : t_(trainer), device_(device), model_(TrainerInternals::model(trainer)),
        optimizer_(TrainerInternals::optimizer(trainer)), options_(TrainerInternals::options(trainer)),
        ctx_(TrainerInternals::context(trainer)), loss_(TrainerInternals::loss(trainer)),
        scaler_(TrainerInternals::scaler(trainer)), skipped_(TrainerInternals::skipped(trainer)),
        pending_(TrainerInternals::pending(trainer)) {}

  void check_support(const char* who) const override;
  double run_loss_plan(const Plan& p, Inputs xs, const Tensor& y, PlanMode mode) override;
  double graph_step(Inputs xs, const Tensor& y) override;
  UpdateSteps& update_steps() override { return *this; }
  void optimizer_to_host(bool will_write) override;
  void wait() noexcept override;
  uint64_t allocations() const override { return step_ ? step_->alloc.stats().misses : 0; }

 private:
  DeviceStep& step();
  // Trainer::update's pieces on the model's device copies (the trainer sequences them).
  bool unscale(float inv_scale) override;
  bool gradients_finite() override;
  void clip(double max_norm) override;
  void optimizer_step() override;
  cudaStream_t stream() { return static_cast<cudaStream_t>(ctx_.device_queue(device_).stream()); }
  void end_tasked_step() { TrainerInternals::end_tasked_step(t_); }
  std::shared_ptr<const Plan> plan_for(PlanMode mode, Inputs xs, const Tensor* y, bool input_grad) {
    return TrainerInternals::plan_for(t_, mode, xs, y, input_grad);
  }
  void check_input(const Tensor& x, const char* what) const { TrainerInternals::check_input(t_, x, what); }
  double finish_with_update(double loss, const char* who) {
    return TrainerInternals::finish_with_update(t_, loss, who);
  }
  void zero_grad() { t_.zero_grad(); }
  double current_lr() const { return t_.current_lr(); }
  float loss_scale() const { return t_.loss_scale(); }

  Trainer& t_;
  Device device_;
  std::shared_ptr<Model>& model_;
  std::shared_ptr<Optimizer>& optimizer_;
  const TrainerOptions& options_;
  Context& ctx_;
  const Loss& loss_;
  std::unique_ptr<LossScaler>& scaler_;
  int64_t& skipped_;
  std::shared_ptr<const Plan>& pending_;
  std::unique_ptr<DeviceStep> step_;
};

void CudaTrainer::check_support(const char* who) const {
  const std::string name = optimizer_->name();
  // The optimizer says whether it has an update rule the device runs (SGD, Adam, AdamW); Adadelta,
  // Adamax, NAdam, RAdam, RMSprop, Adagrad, ... have none.
  if (!optimizer_->update_rule())
    throw_value_error(who, ": optimizer ", name, " has no update on the device (backend 'cuda', ",
                      device_name(device_), "); the device trainer runs SGD, Adam and AdamW (amsgrad ",
                      "included): use one of those, or a CPU backend");
  // The device update applies one set of options at one lr to the whole flat buffer: parameter
  // groups (per-group options, parameters left out) are refused, checked every step since groups
  // can be set on a live trainer's optimizer. One group of every parameter (torch's
  // Adam(model.parameters())) is one set of options.
  if (!optimizer_->uniform_options())
    throw_value_error(who, ": optimizer ", name, " has ", optimizer_->param_groups().size(), " parameter group",
                      optimizer_->param_groups().size() == 1 ? "" : "s", " (set_param_groups, torch's param_groups); ",
                      "the device update (backend 'cuda', ", device_name(device_), ") runs one set of ",
                      "options over every parameter: create the optimizer without groups (its options as keywords), ",
                      "or use a CPU backend");
  if (model_->dtype() != DType::f32)
    throw_type_error(who, ": backend 'cuda' trains float32 models on ", device_name(device_), ", got ",
                     dtype_name(model_->dtype()));
  if (options_.verify_parameters)
    throw_value_error(who, ": verify_parameters is not implemented for backend 'cuda' on ",
                      device_name(device_), " (the checksums are taken on the host)");
  if (options_.cuda_graph && (options_.skip_nonfinite || options_.check_finite))
    throw_value_error(who, ": cuda_graph replays the optimizer in the same graph as the backward pass, so the ",
                      "update cannot wait for the loss or gradients read back (skip_nonfinite ",
                      options_.skip_nonfinite ? "on" : "off", ", check_finite ", options_.check_finite ? "on" : "off",
                      "); turn those off, or cuda_graph off");
}

void CudaTrainer::wait() noexcept {
  if (!step_) return;  // nothing was queued
  try {
    cudaStreamSynchronize(stream());
  } catch (...) {  // a context that cannot make its stream has nothing queued
  }
}

DeviceStep& CudaTrainer::step() {
  if (!step_) {
    require_cuda_device(device_);  // a ValueError naming the device, before any CUDA call
    step_ = std::make_unique<DeviceStep>(device_);
  }
  return *step_;
}

double CudaTrainer::run_loss_plan(const Plan& p, Inputs xs, const Tensor& y, PlanMode mode) {
  check_support("Trainer");
  DeviceStep& d = step();
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  const Model::DeviceBuffers mb = model_->device_buffers(s);
  if (!d.stats.data()) d.stats = d.alloc.buffer(sizeof(cuda::NonfiniteStats), s);
  // Loss scaling seeds the backward with the scale: it travels in the (otherwise unused) coefficient
  // slot of the step's one upload.
  const float seed = loss_scale();
  const bool seeded = !p.seeds.empty();
  const DeviceStep::Slots slots = d.upload(xs, y, seeded ? &seed : nullptr, seeded ? sizeof seed : 0, s);
  const Bindings b = device_bindings(device_, mb.params, {slots.inputs.data(), xs.size()}, &slots.target,
                                     seeded ? &slots.coefficients : nullptr);

  pending_.reset();  // this run reuses the context's activation memory: a pending backward is void
  end_tasked_step();
  cuda::run_device_steps(p, ctx_, b, 0, p.num_steps(), d.stats.ptr<cuda::NonfiniteStats>());
  if (mode == PlanMode::train_loss) {
    p.accumulate_param_grads(ctx_, b, mb.grads);  // on the context's queue: `s`
    model_->device_written(s, true, true);  // the parameters too: running statistics are updated in place
  }
  float* loss = d.readback.ptr<float>();
  cuda::copy_to_host_async(loss, p.address(ctx_, b, p.loss), sizeof(float), s);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!y.is_cpu() && loss_.kind == "cross_entropy" && std::isnan(*loss))  // the labels' only check
    throw_value_error("cross_entropy: the loss is NaN: a label on ", device_name(y.device()), " outside [0, ",
                      p.graph.info(p.outputs.at(0)).shape.back(), ") (the device kernel gives NaN for it), or NaN ",
                      "in the model's output; the update is not applied");
  return *loss;
}

// Loss scaling's unscale on the device: the gradients multiplied by the host scaler's 1/scale in
// place and the non-finite flag read back (the update waits for it anyway); the trainer applies the
// host rule to it. A skipped step leaves the unscaled gradients, as on the host.
bool CudaTrainer::unscale(float inv_scale) {
  DeviceStep& d = step();
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  auto* grads = static_cast<float*>(model_->device_buffers(s).grads);
  DeviceStep::Scaling* st = d.scaling_state(s);
  auto* staged = reinterpret_cast<char*>(d.readback.data()) + 32;  // after the loss and the count
  std::memcpy(staged, &inv_scale, sizeof inv_scale);
  cuda::copy_to_device_async(&st->inv_scale, staged, sizeof inv_scale, s);
  cuda::clear_nonfinite_flag(&st->found_nonfinite, s);
  cuda::scale_gradients(grads, grads, model_->num_trainable(), &st->inv_scale, cuda::ScaleDirection::multiply,
                        &st->found_nonfinite, s);
  auto* found = reinterpret_cast<int32_t*>(staged + 8);
  cuda::copy_to_host_async(found, &st->found_nonfinite, sizeof *found, s);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
  model_->device_written(s, false, true);
  return *found != 0;
}

// All gradients finite <=> the host's finite global norm, for float32.
bool CudaTrainer::gradients_finite() {
  DeviceStep& d = step();
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  if (!d.stats.data()) d.stats = d.alloc.buffer(sizeof(cuda::NonfiniteStats), s);
  cuda::nonfinite_stats(static_cast<const float*>(model_->device_buffers(s).grads), model_->num_trainable(),
                        d.stats.ptr<cuda::NonfiniteStats>(), s);
  auto* count = d.readback.ptr<unsigned long long>() + 1;
  cuda::copy_to_host_async(count, d.stats.data(), sizeof(*count), s);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
  return *count == 0;
}

void CudaTrainer::clip(double max_norm) {
  DeviceStep& d = step();
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  d.clip(static_cast<float*>(model_->device_buffers(s).grads), model_->num_trainable(), max_norm, s);
  model_->device_written(s, false, true);
}

void CudaTrainer::optimizer_step() {
  DeviceStep& d = step();
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  const Model::DeviceBuffers mb = model_->device_buffers(s);
  d.ready_state(*optimizer_, s);
  const int64_t t = optimizer_->step_count() + 1;
  // The schedule's rate before this update, as the host's optimizer_->step(params, grads,
  // schedule_.get(), exec) gives its one group: schedule_->lr_at(step_count(), lr()) = current_lr().
  const UpdateCoefficients k = update_coefficients(d.refresh_rule(*optimizer_), current_lr(), t);
  enqueue_update(k, nullptr, static_cast<float*>(mb.params), static_cast<const float*>(mb.grads),
                 {d.state_ptr(0), d.state_ptr(1), d.state_ptr(2)}, model_->num_trainable(), s);
  optimizer_->set_step_count(t);
  d.state_at = DeviceStep::Side::device;
  model_->device_written(s, true, false);
}

// The plan's dropout kernels read the RNG state from the upload (`rng_slot`): `counter` now, each
// replay's own counter later. Loss scaling's unscaling and rule precede clipping, and the update
// skips on its flag.
template <typename EnqueueUpdate>
void DeviceStep::capture(Graph& g, const Plan& p, Context& ctx, const Bindings& b, const Model::DeviceBuffers& mb,
                         const void* rng_slot, uint64_t counter, const LossScaler* scaler,
                         const TrainerOptions& options, int64_t n, cudaStream_t s, EnqueueUpdate&& enqueue_update) {
  g.exec = cuda::GraphExec();
  if (options.clip_grad_norm > 0) ready_clip(n, s);  // no allocation in a capture
  cuda::StreamCapture capture(s);
  {
    const cuda::DeviceRngScope rng(s, static_cast<const cuda::DeviceRngState*>(rng_slot));
    p.run_with_counter(ctx, b, 0, p.num_steps(), counter);
  }
  p.accumulate_param_grads(ctx, b, mb.grads);  // on the context's queue, `s`, captured
  auto* grads = static_cast<float*>(mb.grads);
  const int32_t* skip = scaler ? enqueue_unscale(grads, n, *scaler, s) : nullptr;
  if (options.clip_grad_norm > 0) clip(grads, n, options.clip_grad_norm, s);
  enqueue_update(skip);
  g.exec = cuda::GraphExec(capture.finish("Trainer.step"), "Trainer.step");
  g.clip_grad_norm = options.clip_grad_norm;
}

// step() as one graph launch. The first step of a signature runs as launched kernels: it creates
// what a capture must not (library handles, the grown arena, the optimizer's device state).
double CudaTrainer::graph_step(Inputs xs, const Tensor& y) {
  check_support("Trainer.step");
  for (const Tensor& x : xs) check_input(x, "input");
  check_input(y, "target");
  refuse_in_graph(ctx_, y, loss_.kind);
  zero_grad();
  std::shared_ptr<const Plan> p = plan_for(PlanMode::train_loss, xs, &y, false);
  const ValueInfo& out = p->graph.info(p->outputs.at(0));
  loss_.check_target(out.shape, out.dtype, y);  // class indices in range: the device kernel cannot raise
  DeviceStep& d = step();
  auto it = std::find_if(d.graphs.begin(), d.graphs.end(), [&](const DeviceStep::Graph& g) { return g.plan == p; });
  if (it == d.graphs.end()) {
    d.graphs.push_back(DeviceStep::Graph{p, {}, 0, 0, {}});
    return finish_with_update(run_loss_plan(*p, xs, y, PlanMode::train_loss), "Trainer.step");
  }
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t s = stream();
  const Model::DeviceBuffers mb = model_->device_buffers(s);  // enqueues the gradients' zeroing
  d.ready_state(*optimizer_, s);
  if (scaler_) d.sync_scaling(*scaler_, s);
  const int64_t t = optimizer_->step_count() + 1;
  const UpdateCoefficients k =
      update_coefficients(d.refresh_rule(*optimizer_), current_lr(), t);
  // The counter this step stands for, whether it captures or replays: one per step, as launched.
  GraphConstants constants{};
  std::memcpy(constants.update, k.data(), k.bytes());
  constants.rng = {ctx_.seed(), ctx_.next_rng_counter()};
  const DeviceStep::Slots slots = d.upload(xs, y, &constants, sizeof constants, s);
  void* const seed = scaler_ ? &d.scaling_state(s)->scale : nullptr;  // the backward reads the device scale
  const Bindings b = device_bindings(device_, mb.params, {slots.inputs.data(), xs.size()}, &slots.target,
                                     scaler_ ? &seed : nullptr);
  pending_.reset();
  end_tasked_step();
  const std::array<const void*, 8> pointers = {ctx_.device_arena(p->arena_bytes()), mb.params, mb.grads, d.io.data(),
                                             d.state_ptr(0), d.state_ptr(1), d.state_ptr(2), d.scaling.data()};
  DeviceStep::Graph& graph = *it;
  if (!graph.exec.valid() || graph.pointers != pointers || graph.clip_grad_norm != options_.clip_grad_norm ||
      graph.kernel_flags != k.kernel_flags()) {
    d.capture(graph, *p, ctx_, b, mb, static_cast<char*>(slots.coefficients) + offsetof(GraphConstants, rng),
              constants.rng.counter, scaler_.get(), options_, model_->num_trainable(), s, [&](const int32_t* skip) {
                enqueue_update(k, slots.coefficients, static_cast<float*>(mb.params),
                               static_cast<const float*>(mb.grads), {d.state_ptr(0), d.state_ptr(1), d.state_ptr(2)},
                               model_->num_trainable(), s, skip);
              });
    graph.pointers = pointers;
    graph.kernel_flags = k.kernel_flags();
  }
  graph.exec.launch(s);
  d.state_at = DeviceStep::Side::device;
  model_->device_written(s, true, true);
  // The step's one read-back: the loss, and with loss scaling the flag with the device's new state.
  float* loss = d.readback.ptr<float>();
  auto* back = reinterpret_cast<DeviceStep::Scaling*>(d.readback.ptr<char>() + 16);
  cuda::copy_to_host_async(loss, p->address(ctx_, b, p->loss), sizeof(float), s);
  if (scaler_) cuda::copy_to_host_async(back, d.scaling.data(), sizeof *back, s);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (scaler_ && !d.settle_scaling(*scaler_, *back)) {
    ++skipped_;  // the update kernels wrote nothing: the step count stays
    return *loss;
  }
  optimizer_->set_step_count(t);
  return *loss;
}

void CudaTrainer::optimizer_to_host(bool will_write) {
  if (!step_) return;  // no device update yet: the host's state is current
  DeviceStep& d = *step_;
  std::vector<std::pair<std::string, Tensor>>& state = optimizer_->state();
  if (d.state_at == DeviceStep::Side::device && d.state.size() == state.size()) {
    cuda::DeviceGuard guard(device_.index);
    const cudaStream_t s = stream();  // after the update's kernels
    for (std::size_t i = 0; i < state.size(); ++i)
      cuda::copy_to_host(state[i].second.data(), d.state[i].data(), state[i].second.nbytes(), s);
    d.state_at = DeviceStep::Side::both;
  }
  if (will_write && d.state_at == DeviceStep::Side::both) d.state_at = DeviceStep::Side::host;
}

}  // namespace

namespace cuda {
std::unique_ptr<DeviceTrainer> make_trainer(Device d, Trainer& trainer) {
  return std::make_unique<CudaTrainer>(d, trainer);
}
}  // namespace cuda

}  // namespace treadle

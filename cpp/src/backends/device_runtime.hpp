#pragma once
// What a device backend provides besides its kernels (docs/architecture.md, "Adding a backend"):
// the queue and arena of a context, the model's parameters mirrored on the device, the trainer's
// device step, copies between the host and the device, and kernel selection for plans compiled for
// it. The core reaches a device only through this interface, found by the device's kind among the
// runtimes this build registered (generated list, cpp/CMakeLists.txt); it never names one.
//
// A host (CPU) plan has no runtime: its arena is Context::arena and its kernels take host pointers.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "treadle/dtype.hpp"
#include "treadle/model.hpp"
#include "treadle/tensor.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

class Backend;
class Context;
class Plan;
struct Bindings;

// A context's side of one device: the queue its kernels are enqueued on and the arena device plans
// run in. Made on the context's first use of the device; owned by the context.
class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;
  virtual Device device() const = 0;
  // The host's queue handle (a cudaStream_t for CUDA), set between steps (work queued on the previous
  // one is waited for first), or null for the queue's own, made on first use.
  virtual void set_stream(void* stream) = 0;
  virtual void* stream() = 0;
  // dst[i] += src[i] for i < n, enqueued on stream(): a plan's parameter gradients accumulated into
  // the model's device gradient buffer (Plan::accumulate_param_grads). TypeError for a dtype the
  // device does not train in.
  virtual void add_into(void* dst, const void* src, int64_t n, DType dtype) = 0;
  // Makes this queue's device the calling thread's current one for a plan run, returning what to
  // give restore() after it (the host's selection is never left changed).
  virtual int make_current() = 0;
  virtual void restore(int previous) noexcept = 0;
  // Device memory of at least `bytes`, grown (never shrunk) and zeroed when it grows; more than
  // `budget` bytes (0: no budget) is refused with ValueError.
  virtual void* arena(std::size_t bytes, std::size_t budget) = 0;
  virtual std::size_t arena_bytes() const = 0;
  virtual uint64_t allocations() const = 0;  // device allocations made so far: constant once steady
};

// A model's flat parameter and gradient buffers mirrored on a device and kept coherent with the
// host's (Model::device_buffers says the contract). The host tensors outlive the mirror: the model
// drops it before it repacks them.
class ParameterMirror {
 public:
  virtual ~ParameterMirror() = default;
  virtual Device device() const = 0;
  virtual Model::DeviceBuffers buffers(void* stream) = 0;
  virtual void written(void* stream, bool params, bool grads) = 0;
  virtual void zero_grad() = 0;  // the host zeroed its gradients: the device copy is zeroed on next use
  // Copies device-newer values back into the host buffers; `will_write`: the host may change them,
  // so the next device use uploads them again.
  virtual void to_host(bool will_write) = 0;
  virtual uint64_t allocations() const = 0;
  // Model::predict of a plan on this device: host or device inputs in, the caller's tensors out.
  virtual void predict(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                       Context& ctx) = 0;
};

// The pieces of Trainer::update on the memory the gradients live in: the host's buffers, or a device
// backend's copies of them. Trainer::update sequences them, once for every backend: loss scaling's
// unscale (and the scaler's rule on its answer), the non-finite skip, clipping, the optimizer step.
class UpdateSteps {
 public:
  virtual ~UpdateSteps() = default;
  // Multiplies every trainable gradient by `inv_scale` in place; true when one is not finite.
  virtual bool unscale(float inv_scale) = 0;
  // Whether every trainable gradient, and so their global norm, is finite.
  virtual bool gradients_finite() = 0;
  // Scales the gradients so that their global norm is at most max_norm (torch's clip_grad_norm_).
  virtual void clip(double max_norm) = 0;
  // The optimizer's update of the trainable parameters at the scheduled lr; its step count advances.
  virtual void optimizer_step() = 0;
};

// A trainer's steps on a device (Trainer's device half): made on the trainer's first device use
// without touching the device (check_support is a host-only check); the device resources come with
// the first step. It reaches the trainer's members through TrainerInternals.
class DeviceTrainer {
 public:
  using Inputs = Trainer::Inputs;
  virtual ~DeviceTrainer() = default;
  // ValueError for what the device step does not do (an optimizer without a device update, a
  // trainer option that reads values on the host); `who` names the caller.
  virtual void check_support(const char* who) const = 0;
  // A loss plan on the device with the model's device copies: the loss read back (train_loss also
  // accumulates the parameter gradients on the device).
  virtual double run_loss_plan(const Plan& p, Inputs xs, const Tensor& y, PlanMode mode) = 0;
  // Trainer::step with TrainerOptions::cuda_graph: the whole step captured once and replayed.
  virtual double graph_step(Inputs xs, const Tensor& y) = 0;
  virtual UpdateSteps& update_steps() = 0;  // Trainer::update's pieces on the device copies
  // Copies the optimizer's device-newer state back; `will_write`: upload it before the next update.
  virtual void optimizer_to_host(bool will_write) = 0;
  virtual void wait() noexcept = 0;  // for the work queued so far (errors are dropped)
  virtual uint64_t allocations() const = 0;
};

// Per-node device time of one profiled plan run: kernel calls only enqueue, so the device reports
// when each node's work ended (mark after each node; finish waits and reports node by node).
class DeviceStepTimer {
 public:
  virtual ~DeviceStepTimer() = default;
  virtual void mark(int step) = 0;
  virtual void finish(const std::function<void(int, double)>& record) = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceKind kind() const = 0;
  // The kernels of device plans; its name is the backend a model pins to run there ("cuda").
  virtual const Backend& backend() const = 0;
  // ValueError naming `d` when it cannot be used (no driver, no such device), before any other call.
  virtual void require(Device d) const = 0;
  // Picks and prepares every node's kernel of `plan` on `d`: there is no fallback (a host kernel
  // would read device pointers), so a node without a kernel is a ValueError naming the op.
  virtual void select_kernels(Plan& plan, Device d, bool deterministic) const = 0;
  virtual std::unique_ptr<DeviceStepTimer> step_timer(void* stream) const = 0;
  // run_op's device half: host `inputs` and gradient `seeds` uploaded, the plan run on the context's
  // queue, the plan values `values` returned as host tensors (undefined where an id is negative).
  virtual std::vector<Tensor> run_on_host_data(const Plan& plan, Context& ctx, const std::vector<Tensor>& inputs,
                                               const std::vector<Tensor>& seeds,
                                               const std::vector<int>& values) const = 0;
  // Tensor::to: `t` (on the host or this kind of device) copied into fresh memory on `to`, waited for.
  virtual Tensor copy(const Tensor& t, Device to, void* stream) const = 0;
  virtual std::unique_ptr<DeviceQueue> make_queue(Device d) const = 0;
  virtual std::unique_ptr<ParameterMirror> make_mirror(Device d, Tensor& params, Tensor& grads) const = 0;
  virtual std::unique_ptr<DeviceTrainer> make_trainer(Device d, Trainer& trainer) const = 0;
};

// The runtime this build has for `kind`, or null.
const DeviceRuntime* device_runtime(DeviceKind kind);
// The runtime of `d`, or ValueError naming `who`, the device and the configure flag that adds it.
const DeviceRuntime& require_device_runtime(Device d, const char* who);
// The device of a plan pinned to `backend`: a device runtime's backend runs on the device its name
// gives ("cuda:1"; "cuda" is device 0), every other backend on the CPU.
Device plan_device(const std::string& backend);
// Whether a backend's kernels take device pointers (such a backend never serves a host plan).
bool is_device_backend(const Backend* b);

}  // namespace treadle

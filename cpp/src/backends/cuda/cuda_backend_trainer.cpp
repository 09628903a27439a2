// Trainer's device half (CUDA builds): a training step of a plan compiled for "cuda" with the
// model's device copies bound. Per step: the inputs and the target are copied into one pinned
// staging buffer and uploaded with one copy on the context's stream, the plan runs, every parameter
// gradient is added into the device gradient buffer (Plan::accumulate_param_grads' loop as a
// kernel), the optimizer updates the device buffers (fused Adam / AdamW / AMSGrad, SGD), and the
// loss is the one value read back (the step's one stream synchronisation; the update is enqueued
// after it and finishes before anything else on the stream). All device memory comes from caching
// allocators, so steps after the first make no cudaMalloc call.
#include <cuda_runtime_api.h>

#include <cstring>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_backend_train.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/trainer.hpp"

namespace treadle {

// Destroyed in reverse order: buffers and pinned memory first, the allocator (cudaFree) last.
struct Trainer::DeviceStep {
  enum class Side : uint8_t { both, host, device };
  static constexpr int kDevice = 0;
  DeviceStep() : alloc(kDevice) {}

  cuda::CachingDeviceAllocator alloc;
  cuda::DeviceBuffer io;  // the inputs then the target, each slot 256-byte aligned
  std::size_t io_bytes = 0;
  cuda::PinnedHostBuffer staging;   // the host side of `io`
  cuda::PinnedHostBuffer readback;  // the loss and a non-finite count
  cuda::DeviceBuffer stats;         // cuda::NonfiniteStats
  // The optimizer's state buffers on the device, in Optimizer::state() order, and the host tensors
  // they mirror (a re-bound optimizer has new ones: uploaded again).
  std::vector<cuda::DeviceBuffer> state;
  std::vector<const void*> state_host;
  Side state_at = Side::host;
};

void Trainer::DeviceStepDeleter::operator()(DeviceStep* d) const noexcept { delete d; }

namespace {

double hyperparameter(const Optimizer& o, const std::string& name) {
  for (const auto& [key, value] : o.hyperparameters())
    if (key == name) return value;
  throw_runtime_error("Trainer: optimizer ", o.name(), " reports no hyper-parameter '", name, "'");
}

}  // namespace

bool Trainer::on_device() const { return model_->backend() == "cuda"; }

void Trainer::check_device_support(const char* who) const {
  const std::string name = optimizer_->name();
  if ((name != "SGD" && name != "Adam" && name != "AdamW") || optimizer_->hyperparameters().empty())
    throw_value_error(who, ": optimizer ", name, " has no update on the device (backend 'cuda', ",
                      device_name(cuda::kTrainDevice), "); the device trainer runs SGD, Adam and AdamW (amsgrad ",
                      "included): use one of those, or a CPU backend");
  if (model_->dtype() != DType::f32)
    throw_type_error(who, ": backend 'cuda' trains float32 models on ", device_name(cuda::kTrainDevice), ", got ",
                     dtype_name(model_->dtype()));
  if (options_.clip_grad_norm > 0)
    throw_value_error(who, ": clip_grad_norm (", options_.clip_grad_norm, ") is not implemented for backend 'cuda' ",
                      "on ", device_name(cuda::kTrainDevice), "; set it to 0 or train on a CPU backend");
  if (options_.verify_parameters)
    throw_value_error(who, ": verify_parameters is not implemented for backend 'cuda' on ",
                      device_name(cuda::kTrainDevice), " (the checksums are taken on the host)");
}

uint64_t Trainer::device_allocations() const {
  return ctx_.device_allocations() + (device_ ? device_->alloc.stats().misses : 0) + model_->device_allocations();
}

double Trainer::run_device_loss_plan(const Plan& p, Inputs xs, const Tensor& y, PlanMode mode) {
  check_device_support("Trainer");
  if (!device_) {
    auto d = std::unique_ptr<DeviceStep, DeviceStepDeleter>(new DeviceStep());
    d->readback = cuda::PinnedHostBuffer(64);
    device_ = std::move(d);
  }
  DeviceStep& d = *device_;
  cuda::DeviceGuard guard(DeviceStep::kDevice);
  const cudaStream_t s = static_cast<cudaStream_t>(ctx_.cuda_stream());
  const Model::DeviceBuffers mb = model_->device_buffers(s);
  if (!d.stats.data()) d.stats = d.alloc.buffer(sizeof(cuda::NonfiniteStats), s);

  // One staging buffer and one upload for everything the host gives per step.
  std::array<std::size_t, kMaxInputs + 1> offset{};
  std::size_t total = 0;
  for (std::size_t i = 0; i <= xs.size(); ++i) {
    offset[i] = total;
    total += cuda::align256(i < xs.size() ? xs[i].nbytes() : y.nbytes());
  }
  if (total > d.io_bytes) {  // the last step synchronised: neither buffer is still in use
    d.io = d.alloc.buffer(total, s);
    d.staging = cuda::PinnedHostBuffer(total);
    d.io_bytes = total;
  }
  auto* staged = d.staging.ptr<char>();
  for (std::size_t i = 0; i <= xs.size(); ++i) {
    const Tensor& t = i < xs.size() ? xs[i] : y;
    const Tensor c = t.is_contiguous() ? t : t.clone();
    std::memcpy(staged + offset[i], c.data(), c.nbytes());
  }
  cuda::copy_to_device_async(d.io.data(), staged, total, s);
  auto* io = static_cast<char*>(d.io.data());
  std::array<void*, kMaxInputs> in_ptr{};
  for (std::size_t i = 0; i < xs.size(); ++i) in_ptr[i] = io + offset[i];
  void* tgt_ptr[1] = {io + offset[xs.size()]};
  Bindings b{mb.params, std::span<void* const>(in_ptr.data(), xs.size()), tgt_ptr, {}};
  b.device = cuda::kTrainDevice;

  pending_.reset();  // this run reuses the context's activation memory: a pending backward is void
  end_tasked_step();
  cuda::run_device_steps(p, ctx_, b, 0, p.num_steps(), d.stats.ptr<cuda::NonfiniteStats>());
  if (mode == PlanMode::train_loss) {
    auto* grads = static_cast<char*>(mb.grads);
    for (const auto& [off, value] : p.param_grads)
      cuda::add_into(reinterpret_cast<float*>(grads + off), static_cast<const float*>(p.address(ctx_, b, value)),
                     shape_numel(p.graph.info(value).shape), s);
    model_->device_written(s, true, true);  // the parameters too: running statistics are updated in place
  }
  float* loss = d.readback.ptr<float>();
  cuda::copy_to_host_async(loss, p.address(ctx_, b, p.loss), sizeof(float), s);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
  return *loss;
}

void Trainer::device_update() {
  check_device_support("Trainer.update");
  if (!device_) {  // an update before any device step: gradients from the host
    auto d = std::unique_ptr<DeviceStep, DeviceStepDeleter>(new DeviceStep());
    d->readback = cuda::PinnedHostBuffer(64);
    device_ = std::move(d);
  }
  DeviceStep& d = *device_;
  cuda::DeviceGuard guard(DeviceStep::kDevice);
  const cudaStream_t s = static_cast<cudaStream_t>(ctx_.cuda_stream());
  const Model::DeviceBuffers mb = model_->device_buffers(s);
  if (!d.stats.data()) d.stats = d.alloc.buffer(sizeof(cuda::NonfiniteStats), s);
  auto* p = static_cast<float*>(mb.params);
  const auto* g = static_cast<const float*>(mb.grads);
  const int64_t n = model_->num_trainable();
  if (options_.skip_nonfinite) {  // all gradients finite <=> the host's finite global norm, for float32
    cuda::nonfinite_stats(g, n, d.stats.ptr<cuda::NonfiniteStats>(), s);
    auto* count = d.readback.ptr<unsigned long long>() + 1;
    cuda::copy_to_host_async(count, d.stats.data(), sizeof(*count), s);
    TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
    if (*count != 0) {
      ++skipped_;
      return;
    }
  }
  // The optimizer's state: allocated once, uploaded when the host's is newer (zeros after bind, or
  // a restored checkpoint).
  std::vector<std::pair<std::string, Tensor>>& state = optimizer_->state();
  bool rebound = d.state.size() != state.size();
  for (std::size_t i = 0; !rebound && i < state.size(); ++i) rebound = d.state_host[i] != state[i].second.data();
  if (rebound) {
    d.state.clear();
    d.state_host.clear();
    for (auto& [name, t] : state) {
      d.state.push_back(d.alloc.buffer(std::max<std::size_t>(t.nbytes(), 1), s));
      d.state_host.push_back(t.data());
    }
    d.state_at = DeviceStep::Side::host;
  }
  if (d.state_at == DeviceStep::Side::host)
    for (std::size_t i = 0; i < state.size(); ++i)
      cuda::copy_to_device_async(d.state[i].data(), state[i].second.data(), state[i].second.nbytes(), s);
  auto buf = [&](std::size_t i) { return i < d.state.size() ? d.state[i].ptr<float>() : nullptr; };

  const double lr = current_lr();  // the schedule's value before this update, as on the host
  const int64_t t = optimizer_->step_count() + 1;
  const Optimizer& o = *optimizer_;
  if (o.name() == "SGD") {
    const cuda::SgdCoefficients k =
        cuda::sgd_coefficients(lr, hyperparameter(o, "momentum"), hyperparameter(o, "dampening"),
                               hyperparameter(o, "weight_decay"), hyperparameter(o, "nesterov") != 0, t);
    cuda::sgd_update(p, g, buf(0), n, k, s);
  } else {
    const bool amsgrad = hyperparameter(o, "amsgrad") != 0;
    const cuda::AdamCoefficients k = cuda::adam_coefficients(
        lr, hyperparameter(o, "beta1"), hyperparameter(o, "beta2"), hyperparameter(o, "eps"),
        hyperparameter(o, "weight_decay"), t, o.name() == "AdamW", amsgrad);
    cuda::adam_update(p, g, buf(0), buf(1), amsgrad ? buf(2) : nullptr, n, k, s);
  }
  optimizer_->set_step_count(t);
  d.state_at = DeviceStep::Side::device;
  model_->device_written(s, true, false);
}

void Trainer::device_optimizer_to_host(bool will_write) {
  DeviceStep& d = *device_;
  std::vector<std::pair<std::string, Tensor>>& state = optimizer_->state();
  if (d.state_at == DeviceStep::Side::device && d.state.size() == state.size()) {
    cuda::DeviceGuard guard(DeviceStep::kDevice);
    const cudaStream_t s = static_cast<cudaStream_t>(ctx_.cuda_stream());  // after the update's kernels
    for (std::size_t i = 0; i < state.size(); ++i)
      cuda::copy_to_host(state[i].second.data(), d.state[i].data(), state[i].second.nbytes(), s);
    d.state_at = DeviceStep::Side::both;
  }
  if (will_write && d.state_at == DeviceStep::Side::both) d.state_at = DeviceStep::Side::host;
}

}  // namespace treadle

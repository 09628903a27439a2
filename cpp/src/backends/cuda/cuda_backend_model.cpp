// A model's parameters on a CUDA device (ParameterMirror): the copies of the flat parameter and
// gradient buffers that device plans bind, kept coherent with the host buffers, and Model::predict
// on the device (inputs uploaded, outputs copied back into the caller's host tensors).
//
// Coherence, per buffer: the current values are on both sides, only on the host (written there, or
// never uploaded) or only on the device (a step wrote them). Host accessors copy device-only values
// back and, since what they hand out may be written, mark the host side as the current one; the
// next device use uploads it. zero_grad() zeroes the host and leaves a fill for the device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_backend_train.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "backends/device_runtime.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

void copy_tensor_async(void* dst, const Tensor& t, Device device, cudaStream_t s) {
  if (t.is_cpu()) {
    const Tensor c = t.is_contiguous() ? t : t.clone();
    copy_to_device_async(dst, c.data(), c.nbytes(), s);
  } else if (t.device() == device) {
    copy_device_to_device_async(dst, t.data(), t.nbytes(), s);
  } else {
    throw_value_error("backend 'cuda': a tensor on ", device_name(t.device()), " was given, but plans run on ",
                      device_name(device));
  }
}

namespace {

using DeviceBuffers = Model::DeviceBuffers;

// Destroyed in reverse order: buffers back to the allocator, the allocator frees the device memory
// (cudaFree waits for the device), then the event and the copy stream go.
//
// Streams are ordered through `used_`, an event recorded after the work of every use: the next use,
// on whatever stream, waits for it first. No stream handle is kept, so a stream (a context) that is
// gone leaves nothing dangling here.
class CudaParameterMirror final : public ParameterMirror {
 public:
  enum class Side : uint8_t { both, host, device };

  CudaParameterMirror(Device d, Tensor& params, Tensor& grads)
      : device_(d), host_params_(params), host_grads_(grads), copy_stream_(d.index), used_(false), alloc_(d.index),
        bytes_(params.nbytes()) {}

  Device device() const override { return device_; }

  DeviceBuffers buffers(void* stream_ptr) override {
    const cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
    std::lock_guard<std::mutex> lock(mu_);
    DeviceGuard guard(device_.index);
    if (!params_.data()) {  // made on the first use's stream; both sides are "host": uploaded below
      params_ = alloc_.buffer(std::max<std::size_t>(bytes_, 1), s);
      grads_ = alloc_.buffer(std::max<std::size_t>(bytes_, 1), s);
    }
    wait_on(s);
    if (params_at_ == Side::host) {
      copy_to_device_async(params_.data(), host_params_.data(), bytes_, s);
      params_at_ = Side::both;
    }
    if (zero_grads_) {
      fill_zero_async(grads_.data(), bytes_, s);
      zero_grads_ = false;
      grads_at_ = Side::both;
    } else if (grads_at_ == Side::host) {
      copy_to_device_async(grads_.data(), host_grads_.data(), bytes_, s);
      grads_at_ = Side::both;
    }
    return {params_.data(), grads_.data()};
  }

  void written(void* stream, bool params, bool grads) override {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceGuard guard(device_.index);
    used_.record(static_cast<cudaStream_t>(stream));
    recorded_ = true;
    if (params) params_at_ = Side::device;
    if (grads) grads_at_ = Side::device;
  }

  uint64_t allocations() const override { return alloc_.stats().misses; }

  void zero_grad() override {
    std::lock_guard<std::mutex> lock(mu_);
    zero_grads_ = true;
    grads_at_ = Side::host;
  }

  void to_host(bool will_write) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (params_at_ == Side::device || grads_at_ == Side::device) {
      DeviceGuard guard(device_.index);
      const cudaStream_t s = copy_stream_.get();
      wait_on(s);  // after the work that wrote them
      if (params_at_ == Side::device) copy_to_host(host_params_.data(), params_.data(), bytes_, s);
      if (grads_at_ == Side::device) copy_to_host(host_grads_.data(), grads_.data(), bytes_, s);
      if (params_at_ == Side::device) params_at_ = Side::both;
      if (grads_at_ == Side::device) grads_at_ = Side::both;
    }
    if (will_write) {
      params_at_ = Side::host;
      if (!zero_grads_) grads_at_ = Side::host;
    }
  }

  void predict(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
               Context& ctx) override;

 private:
  void wait_on(cudaStream_t s) {
    if (recorded_) TREADLE_CUDA_CHECK(cudaStreamWaitEvent(s, used_.get(), 0));
  }

  Device device_;
  Tensor& host_params_;
  Tensor& host_grads_;
  CudaStream copy_stream_;  // for the copies back to the host
  CudaEvent used_;
  bool recorded_ = false;
  CachingDeviceAllocator alloc_;
  DeviceBuffer params_, grads_;
  std::size_t bytes_;
  Side params_at_ = Side::host, grads_at_ = Side::host;
  bool zero_grads_ = false;  // the host zeroed its gradients; the device copy still has to be
  std::mutex mu_;
};

void CudaParameterMirror::predict(const Plan& plan, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& outputs, Context& ctx) {
  const cudaStream_t s = static_cast<cudaStream_t>(ctx.device_queue(device_).stream());
  const DeviceBuffers d = buffers(s);
  DeviceGuard guard(device_.index);
  // One block for the inputs and the anomaly counter, from the model's allocator: a cached block
  // after the first prediction on this stream. predict_into allows at most 8 inputs.
  constexpr std::size_t kMaxInputs = 8;
  if (inputs.size() > kMaxInputs) throw_value_error("predict: at most ", kMaxInputs, " inputs");
  std::array<std::size_t, kMaxInputs> offsets{}, bytes{};
  std::size_t total = align256(sizeof(NonfiniteStats));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& info = plan.graph.info(plan.inputs[i]);
    offsets[i] = total;
    bytes[i] = static_cast<std::size_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
    total += align256(bytes[i]);
  }
  DeviceBuffer block = alloc_.buffer(total, s);
  auto* base = static_cast<char*>(block.data());
  std::array<void*, kMaxInputs> dev_in{};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    dev_in[i] = base + offsets[i];
    copy_tensor_async(dev_in[i], inputs[i], device_, s);
  }
  Bindings b{d.params, std::span<void* const>(dev_in.data(), inputs.size()), {}, {}};
  b.device = device_;
  try {
    run_device_steps(plan, ctx, b, 0, plan.forward_end, reinterpret_cast<NonfiniteStats*>(base));
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const void* src = plan.address(ctx, b, plan.outputs[k]);
      if (outputs[k].is_cpu())
        copy_to_host_async(outputs[k].data(), src, outputs[k].nbytes(), s);
      else
        copy_device_to_device_async(outputs[k].data(), src, outputs[k].nbytes(), s);
    }
  } catch (...) {
    written(s, false, false);  // a later writer waits for what this prediction queued
    throw;
  }
  written(s, false, false);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

std::unique_ptr<ParameterMirror> make_mirror(Device d, Tensor& params, Tensor& grads) {
  require_cuda_device(d);
  if (params.dtype() != DType::f32)
    throw_type_error("Model: backend 'cuda' runs float32 models on ", device_name(d), ", got ",
                     dtype_name(params.dtype()), " parameters");
  DeviceGuard guard(d.index);
  return std::make_unique<CudaParameterMirror>(d, params, grads);
}

}  // namespace treadle::cuda

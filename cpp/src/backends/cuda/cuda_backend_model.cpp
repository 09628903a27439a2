// Model's device half (CUDA builds): the copies of the flat parameter and gradient buffers on
// cuda:0 that device plans bind, kept coherent with the host buffers, and Model::predict on the
// device (inputs uploaded, outputs copied back into the caller's host tensors).
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
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/model.hpp"

namespace treadle {

void cuda::copy_tensor_async(void* dst, const Tensor& t, cudaStream_t s) {
  if (t.is_cpu()) {
    const Tensor c = t.is_contiguous() ? t : t.clone();
    copy_to_device_async(dst, c.data(), c.nbytes(), s);
  } else if (t.device() == kTrainDevice) {
    copy_device_to_device_async(dst, t.data(), t.nbytes(), s);
  } else {
    throw_value_error("backend 'cuda': a tensor on ", device_name(t.device()), " was given, but plans run on ",
                      device_name(kTrainDevice));
  }
}

// Destroyed in reverse order: buffers back to the allocator, the allocator frees the device memory
// (cudaFree waits for the device), then the event and the copy stream go.
//
// Streams are ordered through `used`, an event recorded after the work of every use: the next use,
// on whatever stream, waits for it first. No stream handle is kept, so a stream (a context) that is
// gone leaves nothing dangling here.
struct Model::DeviceMirror {
  enum class Side : uint8_t { both, host, device };
  static constexpr int kDevice = 0;
  explicit DeviceMirror(std::size_t bytes) : copy_stream(kDevice), used(false), alloc(kDevice), bytes(bytes) {}

  cuda::CudaStream copy_stream;  // for the copies back to the host
  cuda::CudaEvent used;
  bool recorded = false;
  cuda::CachingDeviceAllocator alloc;
  cuda::DeviceBuffer params, grads;
  std::size_t bytes;
  Side params_at = Side::host, grads_at = Side::host;
  bool zero_grads = false;  // the host zeroed its gradients; the device copy still has to be
  std::mutex mu;

  void wait_on(cudaStream_t s) {
    if (recorded) TREADLE_CUDA_CHECK(cudaStreamWaitEvent(s, used.get(), 0));
  }
};

void Model::DeviceMirrorDeleter::operator()(DeviceMirror* d) const noexcept { delete d; }

void Model::make_device_copies(void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);  // concurrent first predictions make them once
  if (device_) return;
  require_cuda_device(cuda::kTrainDevice);
  if (dtype_ != DType::f32)
    throw_type_error("Model: backend 'cuda' runs float32 models on ", device_name(cuda::kTrainDevice), ", got ",
                     dtype_name(dtype_), " parameters");
  cuda::DeviceGuard guard(DeviceMirror::kDevice);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto m = std::unique_ptr<DeviceMirror, DeviceMirrorDeleter>(new DeviceMirror(flat_params_.nbytes()));
  m->params = m->alloc.buffer(std::max<std::size_t>(m->bytes, 1), s);
  m->grads = m->alloc.buffer(std::max<std::size_t>(m->bytes, 1), s);
  device_ = std::move(m);  // both sides marked "host": the next step uploads
}

Model::DeviceBuffers Model::device_buffers(void* stream_ptr) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  if (!device_) make_device_copies(s);
  DeviceMirror& m = *device_;
  std::lock_guard<std::mutex> lock(m.mu);
  cuda::DeviceGuard guard(DeviceMirror::kDevice);
  m.wait_on(s);
  if (m.params_at == DeviceMirror::Side::host) {
    cuda::copy_to_device_async(m.params.data(), flat_params_.data(), m.bytes, s);
    m.params_at = DeviceMirror::Side::both;
  }
  if (m.zero_grads) {
    cuda::fill_zero_async(m.grads.data(), m.bytes, s);
    m.zero_grads = false;
    m.grads_at = DeviceMirror::Side::both;
  } else if (m.grads_at == DeviceMirror::Side::host) {
    cuda::copy_to_device_async(m.grads.data(), flat_grads_.data(), m.bytes, s);
    m.grads_at = DeviceMirror::Side::both;
  }
  return {m.params.data(), m.grads.data()};
}

void Model::device_written(void* stream, bool params, bool grads) {
  if (!device_) throw_runtime_error("Model: device copies written before they were made");
  std::lock_guard<std::mutex> lock(device_->mu);
  cuda::DeviceGuard guard(DeviceMirror::kDevice);
  device_->used.record(static_cast<cudaStream_t>(stream));
  device_->recorded = true;
  if (params) device_->params_at = DeviceMirror::Side::device;
  if (grads) device_->grads_at = DeviceMirror::Side::device;
}

uint64_t Model::device_allocations() const { return device_ ? device_->alloc.stats().misses : 0; }

void Model::device_zero_grad() {
  std::lock_guard<std::mutex> lock(device_->mu);
  device_->zero_grads = true;
  device_->grads_at = DeviceMirror::Side::host;
}

void Model::device_to_host(bool will_write) const {
  DeviceMirror& m = *device_;
  std::lock_guard<std::mutex> lock(m.mu);
  using Side = DeviceMirror::Side;
  if (m.params_at == Side::device || m.grads_at == Side::device) {
    cuda::DeviceGuard guard(DeviceMirror::kDevice);
    const cudaStream_t s = m.copy_stream.get();
    m.wait_on(s);  // after the work that wrote them
    if (m.params_at == Side::device) cuda::copy_to_host(flat_params_.data(), m.params.data(), m.bytes, s);
    if (m.grads_at == Side::device) cuda::copy_to_host(flat_grads_.data(), m.grads.data(), m.bytes, s);
    if (m.params_at == Side::device) m.params_at = Side::both;
    if (m.grads_at == Side::device) m.grads_at = Side::both;
  }
  if (will_write) {
    m.params_at = Side::host;
    if (!m.zero_grads) m.grads_at = Side::host;
  }
}

void Model::predict_on_device(const Plan& plan, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                              Context& ctx) {
  const cudaStream_t s = static_cast<cudaStream_t>(ctx.cuda_stream());
  const DeviceBuffers d = device_buffers(s);
  cuda::DeviceGuard guard(DeviceMirror::kDevice);
  // One block for the inputs and the anomaly counter, from the model's allocator: a cached block
  // after the first prediction on this stream. predict_into allows at most 8 inputs.
  constexpr std::size_t kMaxInputs = 8;
  if (inputs.size() > kMaxInputs) throw_value_error("predict: at most ", kMaxInputs, " inputs");
  std::array<std::size_t, kMaxInputs> offsets{}, bytes{};
  std::size_t total = cuda::align256(sizeof(cuda::NonfiniteStats));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& info = plan.graph.info(plan.inputs[i]);
    offsets[i] = total;
    bytes[i] = static_cast<std::size_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
    total += cuda::align256(bytes[i]);
  }
  cuda::DeviceBuffer block = device_->alloc.buffer(total, s);
  auto* base = static_cast<char*>(block.data());
  std::array<void*, kMaxInputs> dev_in{};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    dev_in[i] = base + offsets[i];
    cuda::copy_tensor_async(dev_in[i], inputs[i], s);
  }
  Bindings b{d.params, std::span<void* const>(dev_in.data(), inputs.size()), {}, {}};
  b.device = cuda::kTrainDevice;
  try {
    cuda::run_device_steps(plan, ctx, b, 0, plan.forward_end, reinterpret_cast<cuda::NonfiniteStats*>(base));
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const void* src = plan.address(ctx, b, plan.outputs[k]);
      if (outputs[k].is_cpu())
        cuda::copy_to_host_async(outputs[k].data(), src, outputs[k].nbytes(), s);
      else
        cuda::copy_device_to_device_async(outputs[k].data(), src, outputs[k].nbytes(), s);
    }
  } catch (...) {
    device_written(s, false, false);  // a later writer waits for what this prediction queued
    throw;
  }
  device_written(s, false, false);
  TREADLE_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace treadle

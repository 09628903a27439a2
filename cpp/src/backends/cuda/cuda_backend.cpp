// CudaBackend: the table of op adapters (cuda_backend_ops.cpp) behind the core's Backend interface,
// and CudaRuntime: the device side the core reaches through DeviceRuntime (each piece in its own
// cuda_backend_*.cpp file).
#include "backends/cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>


#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/device_runtime.hpp"
#include "treadle/error.hpp"

namespace treadle {
namespace {

class CudaBackend final : public TableBackend {
 public:
  CudaBackend() {
    for (std::vector<OpEntry> family : {cuda::op_entries(), cuda::cnn_op_entries(), cuda::rnn_op_entries(),
                                        cuda::norm_op_entries(), cuda::shape_op_entries(),
                                        cuda::elementwise_op_entries()})
      for (OpEntry& e : family) table_.add(std::move(e));
  }

  // Its prepare builds the cuBLASLt products (algorithm choice included) once per node, on the
  // current device: select_kernels makes the plan's device current first.
  const char* name() const override { return "cuda"; }
};

}  // namespace

const Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

namespace {

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceKind kind() const override { return DeviceKind::cuda; }
  const Backend& backend() const override { return cuda_backend(); }
  void require(Device d) const override { require_cuda_device(d); }
  void select_kernels(Plan& plan, Device d, bool deterministic) const override {
    cuda::select_kernels(plan, d, deterministic);
  }
  std::unique_ptr<DeviceStepTimer> step_timer(void* stream) const override { return cuda::make_step_timer(stream); }
  std::vector<Tensor> run_on_host_data(const Plan& plan, Context& ctx, const std::vector<Tensor>& inputs,
                                       const std::vector<Tensor>& seeds,
                                       const std::vector<int>& values) const override {
    return cuda::run_on_device(plan, ctx, inputs, seeds, values);
  }
  Tensor copy(const Tensor& t, Device to, void* stream) const override {
    return cuda::copy_tensor_between_devices(t, to, stream);
  }
  std::unique_ptr<DeviceQueue> make_queue(Device d) const override { return cuda::make_queue(d); }
  std::unique_ptr<ParameterMirror> make_mirror(Device d, Tensor& params, Tensor& grads) const override {
    return cuda::make_mirror(d, params, grads);
  }
  std::unique_ptr<DeviceTrainer> make_trainer(Device d, Trainer& trainer) const override {
    return cuda::make_trainer(d, trainer);
  }
};

}  // namespace

const DeviceRuntime& cuda_runtime() {
  static const CudaRuntime runtime;
  return runtime;
}

void require_cuda_device(Device d) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    cudaGetLastError();  // not sticky: a later call may succeed once a driver is there
    throw_value_error("plan: backend 'cuda' needs a CUDA device for ", device_name(d), ", but cudaGetDeviceCount ",
                      "failed: ", cudaGetErrorName(st), " (", cudaGetErrorString(st), ")");
  }
  if (d.index >= count)
    throw_value_error("plan: backend 'cuda' needs a CUDA device for ", device_name(d), ", but this machine has ",
                      count, " CUDA device(s)");
}

}  // namespace treadle

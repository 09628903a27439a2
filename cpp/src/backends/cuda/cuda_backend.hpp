#pragma once
// The CUDA backend (TREADLE_WITH_CUDA builds): the core's plans on an NVIDIA device. A plan
// finalized with backend "cuda" runs on cuda:0 ("cuda:N": device N): its arena is the context's
// device arena, its kernels enqueue on the context's stream, and every node must have a CUDA kernel here (there is no copy
// to the host in a plan, so a node without one fails at finalize, naming the op and the device).
// Host plans never take this backend. Float32 only; the ops covered are listed in
// cuda_backend.cpp and docs/cuda.md.
//
// No CUDA header here. The core reaches this backend only through its DeviceRuntime (cuda_runtime(),
// cuda_backend.cpp); these declarations are for the backend's own files and the device tests.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/kernel.hpp"
#include "treadle/context.hpp"
#include "treadle/export.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

class Plan;
struct Bindings;
class DeviceQueue;
class DeviceRuntime;
class DeviceStepTimer;
class DeviceTrainer;
class Trainer;
class ParameterMirror;

const Backend& cuda_backend();
const DeviceRuntime& cuda_runtime();

// Throws ValueError naming the plan's device when no CUDA device is usable (no driver, no device).
void require_cuda_device(Device d);

namespace cuda {

// The pieces of the runtime (DeviceRuntime, backends/device_runtime.hpp), one file each.
void select_kernels(Plan& plan, Device device, bool deterministic);     // cuda_backend_plan.cpp
std::unique_ptr<DeviceQueue> make_queue(Device d);                      // cuda_backend_context.cpp
std::unique_ptr<ParameterMirror> make_mirror(Device d, Tensor& params, Tensor& grads);  // cuda_backend_model.cpp
std::unique_ptr<DeviceStepTimer> make_step_timer(void* stream);         // cuda_backend_profile.cpp
std::unique_ptr<DeviceTrainer> make_trainer(Device d, Trainer& trainer);  // cuda_backend_trainer.cpp

// Driving a compiled plan by hand, for programs that place their data on the device themselves
// (the device tests). Exported because Plan's own members are internal to the library.
TREADLE_API void run_plan(const Plan& plan, Context& ctx, const Bindings& b);
// Where value `value` of the plan lives for a run on `ctx` with bindings `b` (a device pointer for
// a device plan).
TREADLE_API void* plan_value_address(const Plan& plan, Context& ctx, const Bindings& b, int value);
TREADLE_API Device plan_device_of(const Plan& plan);
// The plan's steps, one line each, with the backend of every node (Plan::describe).
TREADLE_API std::string describe_plan(const Plan& plan);

// Tensor::to(Device) in a CUDA build: `t` (contiguous or not, on the host or a CUDA device) copied into
// fresh memory on `device` (cudaMalloc, freed with the storage) on `stream` (null: a non-blocking
// stream of the call's own), waited for. ValueError for a device that is not there.
Tensor copy_tensor_between_devices(const Tensor& t, Device device, void* stream);

// run_op's device half: uploads `inputs` and the gradient `seeds` (host tensors, contiguous), runs
// the device plan on the context's stream and returns the plan values `values` as host tensors (an
// undefined tensor where an id is negative). Synchronises the stream once.
std::vector<Tensor> run_on_device(const Plan& plan, Context& ctx, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& seeds, const std::vector<int>& values);

}  // namespace cuda
}  // namespace treadle

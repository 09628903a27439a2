#pragma once
// The CUDA backend (TREADLE_WITH_CUDA builds): the core's plans on an NVIDIA device. A plan
// finalized with backend "cuda" runs on cuda:0: its arena is the context's device arena, its kernels
// enqueue on the context's stream, and every node must have a CUDA kernel here (there is no copy
// to the host in a plan, so a node without one fails at finalize, naming the op and the device).
// Host plans never take this backend. Float32 only; the ops covered are listed in
// cuda_backend.cpp and docs/cuda.md.
//
// No CUDA header here: the core's plan.cpp and registry.cpp include it.
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

const Backend& cuda_backend();

// The device of a plan pinned to `backend`: cuda:0 for "cuda", else the CPU.
Device plan_device(const std::string& backend);
// Whether a backend's kernels take device pointers (such a backend never serves a host plan).
bool is_device_backend(const Backend* b);
// Throws ValueError naming the plan's device when no CUDA device is usable (no driver, no device).
void require_cuda_device(Device d);

namespace cuda {

// Driving a compiled plan by hand, for programs that place their data on the device themselves
// (the device tests). Exported because Plan's own members are internal to the library.
TREADLE_API void run_plan(const Plan& plan, Context& ctx, const Bindings& b);
// Where value `value` of the plan lives for a run on `ctx` with bindings `b` (a device pointer for
// a device plan).
TREADLE_API void* plan_value_address(const Plan& plan, Context& ctx, const Bindings& b, int value);
TREADLE_API Device plan_device_of(const Plan& plan);
// The plan's steps, one line each, with the backend of every node (Plan::describe).
TREADLE_API std::string describe_plan(const Plan& plan);

// Device time of each node of a profiled device plan run (cuda_backend_profile.cpp): events on
// `stream` before the first node and after each node; finish() waits for the stream to reach the
// last one and calls record(step, seconds) per node, in order. A node's time is what the device
// spent between the end of the previous node and its own end: its kernels, plus any gap while the
// host was still launching them (a launch-bound plan shows its launch cost there).
class DeviceStepTimer {
 public:
  explicit DeviceStepTimer(void* stream);
  ~DeviceStepTimer();
  DeviceStepTimer(const DeviceStepTimer&) = delete;
  DeviceStepTimer& operator=(const DeviceStepTimer&) = delete;
  void mark(int step);
  void finish(const std::function<void(int, double)>& record);

 private:
  struct Events;
  void* stream_;
  std::unique_ptr<Events> events_;
};

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

// run_op's device half (CUDA builds): one op's plan compiled for "cuda" run on host data. The
// inputs and gradient seeds are uploaded into one device block, the plan runs on the context's
// stream, and the requested values come back as host tensors. This is what lets the parameterised op
// suite run unchanged against the CUDA backend (tests/opcheck.py): host arrays in, host arrays out.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/device_runtime.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_allocator.hpp"
#include "backends/cuda/device_copy.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr std::size_t kSlotAlign = 256;  // the allocator's alignment, kept for every slot

std::size_t slot_bytes(const Tensor& t) { return (t.nbytes() + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

// One device block for all host tensors, each in its own aligned slot; returns the slot pointers.
std::vector<void*> upload_all(const std::vector<const Tensor*>& tensors, DeviceBuffer& block,
                              CachingDeviceAllocator& alloc, cudaStream_t stream) {
  std::size_t total = 0;
  for (const Tensor* t : tensors) total += slot_bytes(*t);
  block = alloc.buffer(total > 0 ? total : kSlotAlign, stream);
  std::vector<void*> slots;
  char* at = block.ptr<char>();
  for (const Tensor* t : tensors) {
    if (t->nbytes() > 0) copy_to_device_async(at, t->data(), t->nbytes(), stream);
    slots.push_back(at);
    at += slot_bytes(*t);
  }
  return slots;
}

}  // namespace

std::vector<Tensor> run_on_device(const Plan& plan, Context& ctx, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& seeds, const std::vector<int>& values) {
  if (plan.device().kind != DeviceKind::cuda)
    throw_value_error("run_on_device: the plan runs on ", device_name(plan.device()), ", not on a CUDA device");
  const DeviceGuard on_device(plan.device().index);  // the uploads and the plan's kernels
  auto stream = static_cast<cudaStream_t>(ctx.device_queue(plan.device()).stream());
  CachingDeviceAllocator alloc(plan.device().index);
  std::vector<const Tensor*> staged;
  for (const Tensor& t : inputs) staged.push_back(&t);
  for (const Tensor& t : seeds) staged.push_back(&t);
  DeviceBuffer block;
  const std::vector<void*> slots = upload_all(staged, block, alloc, stream);
  const std::vector<void*> in_ptrs(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(inputs.size()));
  const std::vector<void*> seed_ptrs(slots.begin() + static_cast<std::ptrdiff_t>(inputs.size()), slots.end());
  Bindings b{nullptr, in_ptrs, {}, seed_ptrs};
  b.device = plan.device();
  run_plan(plan, ctx, b);

  std::vector<Tensor> out;
  for (int id : values) {
    if (id < 0) {
      out.emplace_back();
      continue;
    }
    Tensor t(plan.graph.info(id).shape, plan.graph.info(id).dtype);
    if (t.nbytes() > 0) copy_to_host_async(t.data(), plan_value_address(plan, ctx, b, id), t.nbytes(), stream);
    out.push_back(std::move(t));
  }
  // The copies target pageable memory; waiting on the stream also keeps `block` alive until the
  // plan's kernels that read it have finished.
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(run_op stream)");
  return out;
}

}  // namespace treadle::cuda

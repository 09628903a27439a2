#pragma once
// What the model and the trainer share around a device plan (CUDA builds): running a plan's steps
// with anomaly mode on the device. Included by the device halves of Model and Trainer
// (cuda_backend_model.cpp, cuda_backend_trainer.cpp) only: model.cpp and trainer.cpp see no CUDA header.
#include "backends/cuda/train_kernels.hpp"
#include "core/plan.hpp"
#include "treadle/context.hpp"

namespace treadle::cuda {

// Rounds a byte count up to the allocator's 256-byte alignment (slots inside one upload buffer).
inline std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Runs steps [begin, end) of a device plan on ctx's stream. In anomaly mode (ctx.check_numerics())
// the steps run one by one under one RNG counter (the same dropout masks as one run) and every
// floating output the plan reads is counted on the device (`stats`: device scratch), 8 bytes read
// back per output; the first non-finite one raises the host's check_numerics ValueError, naming
// the node, op, module, pass, count and first index, plus the device.
void run_device_steps(const Plan& plan, Context& ctx, const Bindings& b, int begin, int end, NonfiniteStats* stats);

// Copies tensor `t` to device memory `dst` on `s`: a host tensor is uploaded (a non-contiguous one
// through a contiguous copy; pageable memory, so the call returns once the host side was read), a
// tensor on `device` (the plan's) is copied on the device. ValueError for a tensor on another device.
void copy_tensor_async(void* dst, const Tensor& t, Device device, cudaStream_t s);

}  // namespace treadle::cuda

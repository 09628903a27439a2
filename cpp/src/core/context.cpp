#include "treadle/context.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/device_runtime.hpp"
#include "treadle/error.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

Executor& serial_executor() {
  static SerialExecutor serial;
  return serial;
}

Context::Context(Executor* executor, uint64_t seed) : executor_(executor), seed_(seed) {}

Context::~Context() { std::free(arena_); }

Context::Use::Use(Context& ctx, const char* who) : ctx_(ctx) {
  const std::thread::id me = std::this_thread::get_id();
  if (ctx.user_.load(std::memory_order_acquire) == me) return;  // nested on this thread
  std::thread::id none{};
  if (!ctx.user_.compare_exchange_strong(none, me, std::memory_order_acq_rel))
    throw_runtime_error(who, ": this Context is in use by another thread; a context serves one thread at a time ",
                        "(give each thread its own, or none: predictions then take one from the model's pool)");
  outer_ = true;
}

Context::Use::~Use() {
  if (outer_) ctx_.user_.store(std::thread::id{}, std::memory_order_release);
}

void* Context::arena(std::size_t bytes) {
  if (bytes > arena_bytes_) {
    if (bytes > static_cast<std::size_t>(max_tensor_bytes()))
      throw_value_error("Context: a plan needs ", bytes, " bytes of activations and workspace, more than this ",
                        "machine's ", max_tensor_bytes(), " bytes of memory");
    if (memory_budget_ && bytes > memory_budget_)
      throw_value_error("Context: a plan needs ", bytes, " bytes of activations and workspace, over this context's ",
                        "memory_budget of ", memory_budget_, " bytes");
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    std::free(arena_);
    arena_ = p;
    arena_bytes_ = rounded;
  }
  return arena_;
}

// The device side. The public calls named after CUDA address the device plans for "cuda" run on.
namespace {
constexpr Device kCudaPlans{DeviceKind::cuda, 0};
}

Device Context::cuda_device(int index) const {
  if (index < -1) throw_value_error("Context: device index ", index, " (0 and up, or -1 for the served one)");
  if (index >= 0) return Device{DeviceKind::cuda, index};
  return device_ && device_->device().kind == DeviceKind::cuda ? device_->device() : kCudaPlans;
}

void Context::DeviceQueueDeleter::operator()(DeviceQueue* q) const noexcept { delete q; }

DeviceQueue& Context::device_queue(Device d) {
  if (!device_) {
    device_.reset(require_device_runtime(d, "Context").make_queue(d).release());
  } else if (!(device_->device() == d)) {
    throw_value_error("Context: this context serves ", device_name(device_->device()), ", not ", device_name(d),
                      "; use one context per device");
  }
  return *device_;
}

void Context::set_cuda_stream(void* stream, int device) { device_queue(cuda_device(device)).set_stream(stream); }

void* Context::cuda_stream(int device) { return device_queue(cuda_device(device)).stream(); }

void* Context::device_arena(std::size_t bytes) {
  return device_queue(device_ ? device_->device() : kCudaPlans).arena(bytes, memory_budget_);
}

std::size_t Context::device_arena_bytes() const { return device_ ? device_->arena_bytes() : 0; }

uint64_t Context::device_allocations() const { return device_ ? device_->allocations() : 0; }

}  // namespace treadle

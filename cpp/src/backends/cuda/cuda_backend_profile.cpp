// Profiling device plans (CUDA builds): each node's time is measured on the device with CUDA events,
// since a kernel call on the host only enqueues work. DeviceStepTimer records one event before the
// first node and one after each node, on the plan's stream; finish() waits for the last one and hands
// each node the time between its event and the previous one.
#include <memory>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_stream.hpp"

namespace treadle::cuda {

struct DeviceStepTimer::Events {
  CudaEvent start;
  std::vector<std::pair<int, std::unique_ptr<CudaEvent>>> marks;  // (step, its end)
};

DeviceStepTimer::DeviceStepTimer(void* stream) : stream_(stream), events_(std::make_unique<Events>()) {
  events_->start.record(static_cast<cudaStream_t>(stream_));
}

DeviceStepTimer::~DeviceStepTimer() = default;

void DeviceStepTimer::mark(int step) {
  auto end = std::make_unique<CudaEvent>();
  end->record(static_cast<cudaStream_t>(stream_));
  events_->marks.emplace_back(step, std::move(end));
}

void DeviceStepTimer::finish(const std::function<void(int, double)>& record) {
  if (events_->marks.empty()) return;
  events_->marks.back().second->synchronize();
  const CudaEvent* previous = &events_->start;
  for (const auto& [step, end] : events_->marks) {
    record(step, 1e-3 * static_cast<double>(CudaEvent::elapsed_ms(*previous, *end)));
    previous = end.get();
  }
}

}  // namespace treadle::cuda

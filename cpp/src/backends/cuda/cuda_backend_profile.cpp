// Profiling device plans (CUDA builds): each node's time is measured on the device with CUDA events,
// since a kernel call on the host only enqueues work. The timer records one event before the
// first node and one after each node, on the plan's stream; finish() waits for the last one and hands
// each node the time between its event and the previous one. A run on a capturing stream (the
// trainer's cuda_graph step) executes nothing and may not wait for a captured event
// (cudaErrorCapturedEvent), so it is not timed.
#include <memory>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/device_runtime.hpp"

namespace treadle::cuda {
namespace {

class CudaStepTimer final : public DeviceStepTimer {
 public:
  explicit CudaStepTimer(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TREADLE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;  // start_ stays null: nothing is timed
    start_ = std::make_unique<CudaEvent>();
    start_->record(stream_);
  }

  void mark(int step) override {
    if (!start_) return;
    auto end = std::make_unique<CudaEvent>();
    end->record(stream_);
    marks_.emplace_back(step, std::move(end));
  }

  void finish(const std::function<void(int, double)>& record) override {
    if (marks_.empty()) return;
    marks_.back().second->synchronize();
    const CudaEvent* previous = start_.get();
    for (const auto& [step, end] : marks_) {
      record(step, 1e-3 * static_cast<double>(CudaEvent::elapsed_ms(*previous, *end)));
      previous = end.get();
    }
  }

 private:
  cudaStream_t stream_;
  std::unique_ptr<CudaEvent> start_;
  std::vector<std::pair<int, std::unique_ptr<CudaEvent>>> marks_;  // (step, its end)
};

}  // namespace

std::unique_ptr<DeviceStepTimer> make_step_timer(void* stream) { return std::make_unique<CudaStepTimer>(stream); }

}  // namespace treadle::cuda

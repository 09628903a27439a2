#pragma once
// CUDA graphs for replaying a whole training step: a stream capture (RAII, so an exception thrown
// while work is being captured leaves the stream usable) and the executable graph made from it.
#include <cuda_runtime_api.h>

namespace treadle::cuda {

// Begins capturing `stream` (thread-local mode: a call that is not allowed during capture, such as
// cudaMalloc, fails on this thread instead of corrupting the capture). finish() ends it and returns
// the graph; a capture still open at destruction is ended and discarded.
class StreamCapture {
 public:
  explicit StreamCapture(cudaStream_t stream);
  ~StreamCapture();
  StreamCapture(const StreamCapture&) = delete;
  StreamCapture& operator=(const StreamCapture&) = delete;
  // Throws RuntimeError naming `who` when the capture was invalidated (an unsupported call inside).
  cudaGraph_t finish(const char* who);

 private:
  cudaStream_t stream_;
  bool open_ = true;
};

// An instantiated graph (move-only); takes ownership of the graph it is made from.
class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(cudaGraph_t graph, const char* who);
  ~GraphExec();
  GraphExec(GraphExec&& o) noexcept;
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  bool valid() const { return exec_ != nullptr; }
  void launch(cudaStream_t stream) const;

 private:
  void reset() noexcept;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace treadle::cuda

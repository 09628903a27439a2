// Stream capture and graph execution wrappers (cuda_graph.hpp).
#include "backends/cuda/cuda_graph.hpp"

#include <utility>

#include "backends/cuda/cuda_status.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {

StreamCapture::StreamCapture(cudaStream_t stream) : stream_(stream) {
  if (stream == nullptr) throw_value_error("StreamCapture: the legacy default stream cannot be captured");
  TREADLE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

StreamCapture::~StreamCapture() {
  if (!open_) return;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // an invalidated capture leaves its error behind: not the next call's
}

cudaGraph_t StreamCapture::finish(const char* who) {
  open_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t st = cudaStreamEndCapture(stream_, &graph);
  if (st != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw_runtime_error(who, ": capturing the step as a CUDA graph failed: ", cudaGetErrorName(st), " (",
                        cudaGetErrorString(st), "); a call inside the step is not allowed in a graph; train ",
                        "with cuda_graph off");
  }
  return graph;
}

GraphExec::GraphExec(cudaGraph_t graph, const char* who) : graph_(graph) {
  const cudaError_t st = cudaGraphInstantiate(&exec_, graph_, 0);
  if (st != cudaSuccess) {
    exec_ = nullptr;
    reset();
    cudaGetLastError();
    throw_runtime_error(who, ": instantiating the captured CUDA graph failed: ", cudaGetErrorName(st), " (",
                        cudaGetErrorString(st), ")");
  }
}

GraphExec::~GraphExec() { reset(); }

GraphExec::GraphExec(GraphExec&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}

GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void GraphExec::reset() noexcept {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

void GraphExec::launch(cudaStream_t stream) const {
  if (!exec_) throw_value_error("GraphExec::launch: no graph");
  TREADLE_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

}  // namespace treadle::cuda

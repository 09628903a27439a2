#pragma once
// Verification entry point: run one op on one backend, forward and backward, outside any model.
// The op test suite drives every op on every backend through this and compares with the float64
// reference, finite differences and PyTorch.
#include <string>
#include <vector>

#include "treadle/executor.hpp"
#include "treadle/graph.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

// Splits every parallel_for into `workers` ranges and runs them last to first on the calling
// thread: a test aid that shows whether results depend on chunking (they must not).
class ChunkingExecutor final : public Executor {
 public:
  explicit ChunkingExecutor(int workers) : workers_(workers) {}
  int num_workers() const override { return workers_; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) override {
    for (int64_t w = workers_ - 1; w >= 0; --w) {
      const int64_t b = n * w / workers_, e = n * (w + 1) / workers_;
      if (b < e) body(b, e);
    }
  }

 private:
  int workers_;
};


// While one lives on this thread, the plans compiled on it let every backend take every node it can
// compute, also those it declines for speed (below its size thresholds, or on a CPU where its
// kernels are slower than Eigen's): run_op's all_kernels for whole models, so that a test reaches a
// backend's kernels on any CPU. Declines by capability (dtype, layout, instruction set) stand.
class TREADLE_API AllKernelsScope {
 public:
  AllKernelsScope();
  ~AllKernelsScope();
  AllKernelsScope(const AllKernelsScope&) = delete;
  AllKernelsScope& operator=(const AllKernelsScope&) = delete;

 private:
  bool outer_;
};

struct OpRunResult {
  std::vector<Tensor> outputs;
  std::vector<Tensor> input_grads;  // undefined for inputs with no gradient (e.g. class indices)
  std::string plan;                 // the plan that ran, one line per step with its backend
};

// Applies `op` to `inputs` with `attrs` on `backend` ("" = automatic). When grad_outputs is
// non-empty (one per output; an undefined tensor means no gradient), also runs the backward pass
// and returns the gradient of sum(grad_output * output) with respect to each floating input.
// workers > 1 runs on a host executor that splits every parallel_for into that many ranges (run
// serially, last first): results must be bitwise those of the serial executor. all_kernels: a
// backend takes every node it can compute, also those below its profitability thresholds (small
// shapes, where the planner would prefer Eigen), so that its kernels are checked on small inputs.
TREADLE_API OpRunResult run_op(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                               const std::vector<Tensor>& grad_outputs = {}, const std::string& backend = "",
                               bool training = true, uint64_t seed = 0, int workers = 1, bool all_kernels = false);

}  // namespace treadle

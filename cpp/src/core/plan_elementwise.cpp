// Elementwise runs: consecutive plan steps that are elementwise Eigen kernels over values of one
// shape run block by block (every step on block 0, then every step on block 1, ...), so the values
// one step writes are still in cache when the next reads them. A double-backward graph (a PINN's
// residual) is mostly such chains: about a hundred adds, muls and tanh derivatives over
// (batch, width) matrices, each of which would otherwise stream its operands through memory.
//
// Each step still writes its whole output (the memory plan is unchanged) and each element is
// computed by the same kernel code as unfused: blocks are multiples of 128 elements from the
// value's start, as the kernels' own chunks and vector blocks are, so results are bitwise those of
// the unfused run (tests/test_elementwise_runs.py checks it).
#include <algorithm>
#include <array>

#include "core/op_registry.hpp"
#include "core/plan.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"

namespace treadle {
namespace {

// Elements per block: 8 KB of float32 per value, 64 vector blocks of 128 (transcendental.hpp).
constexpr int64_t kRunBlock = 2048;
// Below two blocks a run gains nothing; above kMaxRunSteps steps a run is split (operand pointers
// live on the stack).
constexpr int kMaxRunSteps = 32;
constexpr int kMaxRunOperands = 4;  // mul3's three inputs and its output

struct ByteRange {
  int64_t begin, end;
  bool overlaps(const ByteRange& o) const { return begin < o.end && o.begin < end; }
  bool operator==(const ByteRange& o) const { return begin == o.begin && end == o.end; }
};

}  // namespace

bool Plan::blockable_step(int s) const {
  const PlanStep& step = steps[s];
  if (!step.kernel || step.state || step.workspace || !step.backend || std::string(step.backend->name()) != "eigen")
    return false;
  const Node& node = graph.nodes()[step.node];
  if (node.outputs.size() != 1 || node.inputs.empty() || static_cast<int>(node.inputs.size()) + 1 > kMaxRunOperands)
    return false;
  if (!OpRegistry::instance().at(node.op).pointwise) return false;
  const ValueInfo& out = graph.info(node.outputs[0]);
  if (out.dtype != DType::f32 && out.dtype != DType::f64) return false;
  if (loc_[node.outputs[0]].buffer != Buffer::arena) return false;
  for (int in : node.inputs) {
    const ValueInfo& info = graph.info(in);
    if (info.dtype != out.dtype || info.shape != out.shape) return false;
  }
  return true;
}

// Groups steps into runs. A step joins the run before it when it is blockable over the same
// number of elements and its values' arena bytes either miss every other value of the run or
// coincide with one exactly (a value written over one that died: the same block positions). Any
// other overlap would let a later step's block overwrite bytes an earlier step has yet to read.
void Plan::find_elementwise_runs() {
  runs_.clear();
  run_of_step_.assign(steps.size(), -1);
  if (!fuse_elementwise) return;
  std::vector<ByteRange> ranges;  // the run's arena values so far
  ElementwiseRun run;
  auto close = [&]() {
    if (run.end - run.begin >= 2 && run.numel >= 2 * kRunBlock) {
      run.block_shape = Shape{kRunBlock};
      run.tail_shape = Shape{run.numel % kRunBlock ? run.numel % kRunBlock : kRunBlock};
      for (int s = run.begin; s < run.end; ++s) run_of_step_[s] = static_cast<int>(runs_.size());
      runs_.push_back(run);
    }
    run = ElementwiseRun{};
    ranges.clear();
  };
  auto range_of = [&](int v) {
    const int64_t begin = loc_[v].offset;
    return ByteRange{begin, begin + planned_bytes(graph.info(v))};
  };
  for (int s = 0; s < static_cast<int>(steps.size()); ++s) {
    if (!blockable_step(s)) {
      close();
      continue;
    }
    const Node& node = graph.nodes()[steps[s].node];
    const int64_t numel = shape_numel(graph.info(node.outputs[0]).shape);
    bool fits = run.end > run.begin && numel == run.numel && s == run.end && run.end - run.begin < kMaxRunSteps;
    std::vector<ByteRange> mine;
    for (int v : node.inputs)
      if (loc_[v].buffer == Buffer::arena) mine.push_back(range_of(v));
    mine.push_back(range_of(node.outputs[0]));
    for (const ByteRange& m : mine)
      for (const ByteRange& r : ranges)
        if (m.overlaps(r) && !(m == r)) fits = false;
    if (!fits) {
      close();
      run.begin = s;
      run.numel = numel;
      run.dtype = graph.info(node.outputs[0]).dtype;
    }
    run.end = s + 1;
    ranges.insert(ranges.end(), mine.begin(), mine.end());
  }
  close();
}

// Runs steps [r.begin, r.end) block by block: the blocks split over the host's workers, each
// kernel called on one block with the serial executor.
void Plan::run_elementwise(const ElementwiseRun& r, Context& ctx, const Bindings& b, uint64_t counter) const {
  std::array<std::array<char*, kMaxRunOperands>, kMaxRunSteps> base{};
  for (int s = r.begin; s < r.end; ++s) {
    const Node& node = graph.nodes()[steps[s].node];
    int k = 0;
    for (int v : node.inputs) base[s - r.begin][k++] = static_cast<char*>(address(ctx, b, v));
    base[s - r.begin][k] = static_cast<char*>(address(ctx, b, node.outputs[0]));
  }
  const int64_t blocks = (r.numel + kRunBlock - 1) / kRunBlock;
  const int64_t elem = static_cast<int64_t>(dtype_size(r.dtype));
  auto body = [&](int64_t b0, int64_t b1) {
    std::array<TensorRef, kMaxRunOperands> refs;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const bool tail = blk == blocks - 1;
      const Shape* shape = tail ? &r.tail_shape : &r.block_shape;
      const int64_t n = (*shape)[0], offset = blk * kRunBlock * elem;
      for (int s = r.begin; s < r.end; ++s) {
        const Node& node = graph.nodes()[steps[s].node];
        const int nin = static_cast<int>(node.inputs.size());
        for (int k = 0; k <= nin; ++k) refs[k] = TensorRef{base[s - r.begin][k] + offset, shape, r.dtype, n};
        KernelArgs args{node, refs.data(), nin, refs.data() + nin, 1, serial_executor(), nullptr, ctx.seed(), counter};
        steps[s].kernel(args);
      }
    }
  };
  Executor& exec = ctx.executor();
  if (blocks < 2 || exec.num_workers() <= 1) {
    body(0, blocks);
    return;
  }
  const auto* job = &body;  // one captured pointer: the std::function needs no allocation
  exec.parallel_for(blocks, [job](int64_t b0, int64_t b1) { (*job)(b0, b1); });
}

}  // namespace treadle

#pragma once
// Shared by the oneDNN recurrent kernels (rnn_kernels.cpp: LSTM inference; rnn_train_kernels.cpp:
// LSTM and GRU training): a layer's dimensions and memory descriptors, pieces of the batch, and
// primitives executed with pooled memory objects.
#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "backends/onednn/onednn_common.hpp"
#include "ops/recurrent.hpp"

namespace treadle::onednn::rnn_common {

// Samples per piece. A piece is one oneDNN execution; pieces of 16 to 64 samples run as fast per
// sample as the whole batch in one execution (one core: T 16, N 256, I = H = 256 in 4 pieces of 64,
// 19.3 ms against 19.5 ms; T 32, H 64: 4 x 16 samples 0.72 ms against 0.74 ms for 64), so fixed
// pieces cost nothing on one worker and let several workers share a large batch.
constexpr int64_t kPieceSamples = 32;
constexpr std::size_t kAlign = 64;

inline std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One primitive with the descriptor of each argument (the scratchpad last, when it has one) and a
// pool of memory objects, so that an execution creates none once the pool is warm.
struct PooledPrimitive {
  dnnl::primitive prim;
  std::vector<int> args;
  std::vector<MemDesc> mds;
  std::size_t scratch_bytes = 0;
  std::unique_ptr<MemoryPool> pool = std::make_unique<MemoryPool>();
};

PooledPrimitive make_pooled(const dnnl::primitive_desc_base& pd, std::vector<int> args);

// Executes `p` on `ptrs` (one per argument, the scratchpad last). With every pooled slot busy
// (more concurrent executions than slots) it makes temporary memory objects.
void run_pooled(const PooledPrimitive& p, void* const* ptrs);

// A reorder from a plain weight matrix (G*H, rows) row-major (oneDNN's ldgoi) to `to`, or back.
PooledPrimitive weight_reorder(const MemDesc& to, int64_t rows, int gates);
PooledPrimitive weight_reorder_back(const MemDesc& from, int64_t rows, int gates);

// A layer's dimensions and options.
struct Layer {
  rnn::Cell cell = rnn::Cell::lstm;
  int64_t T = 0, N = 0, I = 0, H = 0, G = 4;
  bool batch_first = false, reverse = false;

  // Sequence tensor of width `c` for a piece of `n` samples (x, y and their gradients, in place).
  MemDesc seq_desc(int64_t n, int64_t c) const {
    return batch_first ? f32_desc({T, n, c}, {c, T * c, 1}) : f32_desc({T, n, c}, {N * c, c, 1});
  }
  // Bytes from one sample to the next in a sequence tensor of width `c`.
  int64_t sample_step(int64_t c) const { return (batch_first ? T * c : c) * static_cast<int64_t>(sizeof(float)); }
  int64_t pieces() const { return (N + kPieceSamples - 1) / kPieceSamples; }
  // Samples in piece p, and which of the (at most two) piece sizes it has: 0 full, 1 the remainder.
  int64_t piece_samples(int64_t p) const { return std::min(kPieceSamples, N - p * kPieceSamples); }
  int piece_kind(int64_t p) const { return N > kPieceSamples && piece_samples(p) < kPieceSamples ? 1 : 0; }
  // The piece sizes: {full, remainder (0: none)}.
  std::array<int64_t, 2> piece_sizes() const {
    return {std::min(N, kPieceSamples), N > kPieceSamples ? N % kPieceSamples : 0};
  }
  dnnl::rnn_direction direction() const {
    return reverse ? dnnl::rnn_direction::unidirectional_right2left : dnnl::rnn_direction::unidirectional_left2right;
  }
};

// The cell of an lstm_layer / gru_layer node or of its backward op.
rnn::Cell cell_of(const Node& node);
// The layer of a forward node or (backward = true) of a backward node: float32, no `lengths` input;
// std::nullopt otherwise. Where oneDNN pays off is each kernel's own decision.
std::optional<Layer> layer_of_node(const Graph& g, const Node& node, bool backward);

// LSTM and GRU layers in training plans (rnn_train_kernels.cpp): the forward, taken when its
// `saved` feeds only the layer's backward op, and the backward, taken exactly when its forward was.
KernelFn find_train_forward(const Graph& g, const Node& node);
PreparedNode prepare_train_forward(const Graph& g, const Node& node);
KernelFn find_train_backward(const Graph& g, const Node& node);
PreparedNode prepare_train_backward(const Graph& g, const Node& node);

}  // namespace treadle::onednn::rnn_common

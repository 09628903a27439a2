// LSTM layers in inference plans on oneDNN's vanilla_lstm primitive (forward_inference).
//
// lstm_layer defines four outputs (y, h_n, c_n, saved). oneDNN's forward_inference computes the
// first three; `saved` (the gates and cell of every step, read by lstm_layer_backward) has no
// counterpart: forward_training keeps them in an opaque workspace. So a node is taken only when
// nothing reads `saved` (ValueInfo::read: no node consumes it and the host does not read it), which
// is the case in every inference plan; training plans keep the Eigen kernel (recomputing `saved`
// on top of oneDNN's output costs more than Eigen's whole forward: measured, docs/onednn_ops.md).
//
// Per call: the weights (they change between training steps) are reordered from treadle's layout
// (W_ih is (4H, I) row-major: oneDNN's ldgoi, gate order i, f, g, o as oneDNN's) into the
// primitive's layout in the workspace, the two biases are summed (oneDNN adds one bias per gate),
// then the batch runs in fixed pieces of samples, one single-threaded execution each, on the host's
// executor. Pieces depend on the problem only, so results do not depend on the workers.
//
// Not taken: variable lengths (a run-time input; oneDNN has no per-sample lengths), float64, and
// GRU: oneDNN 3.2 runs lbr_gru (PyTorch's GRU) only on its "ref" implementation (see docs/onednn_ops.md).
#include <algorithm>
#include <array>

#include "backends/onednn/rnn_common.hpp"
#include "treadle/error.hpp"

namespace treadle::onednn {
namespace {

using dnnl::memory;
using namespace rnn_common;

// The forward input slots of an lstm_layer node.
rnn::ForwardSlots lstm_slots(const Node& node) {
  return rnn::forward_slots(rnn::cell_info(rnn::Cell::lstm), static_cast<int>(node.inputs.size()));
}

// Where Eigen is faster (bench/onednn_rnn.py, one core, CPU time of predict, T = 16, I = H; docs/onednn_ops.md).
// With oneDNN's AVX-512 kernels (Intel Xeon with AMX) against Eigen with its packed step products
// (backends/eigen/small_gemm.hpp): one sample (Eigen's matrix-vector steps: 0.48-0.97x) and two
// (0.69-1.03x: 0.81x at H 32, 0.54x at H 256), and small layers, where oneDNN's fixed cost per call
// is not yet paid back (below 2^18 multiply-adds); at H 256 oneDNN also loses at 4 samples (0.70x)
// and ties at 8 (0.97x) with these kernels. From 8 samples it is 1.1-1.7x faster at every H from 8 to 256 (bench W5
// inference: 1.47x). With oneDNN's AVX2 kernels (AMD EPYC Zen 3) against the packed products, oneDNN
// wins from H 128 and 4 samples only (1.02-1.29x; N 2 ties at H 256) and loses below (0.67-0.97x at
// H 16-64, but for 1.05x at N 4, H 64; bench W5: Eigen 1.27x faster).
constexpr int64_t kMinSamples = 4;
constexpr int64_t kMinMacs = int64_t{1} << 18;
constexpr int64_t kWideHidden = 256, kMinSamplesWide = 8;
std::optional<Layer> layer_of(const Graph& g, const Node& node) {
  if (g.info(node.outputs.back()).read) return std::nullopt;  // `saved` is needed: training
  const std::optional<Layer> l = layer_of_node(g, node, false);
  if (!l) return std::nullopt;
  if (size_thresholds_apply() && (l->N < kMinSamples || l->T * l->N * 4 * l->H * (l->I + l->H) < kMinMacs ||
                                  (l->H >= kWideHidden && l->N < kMinSamplesWide && wide_vectors())))
    return std::nullopt;
  if ((l->H < 128 || l->N < 4) && avx2_kernels_lose("LSTM below hidden size 128 or 4 samples")) return std::nullopt;
  return l;
}

const std::vector<int> kLstmArgs = {DNNL_ARG_SRC_LAYER,  DNNL_ARG_SRC_ITER, DNNL_ARG_SRC_ITER_C,
                                    DNNL_ARG_WEIGHTS_LAYER, DNNL_ARG_WEIGHTS_ITER, DNNL_ARG_BIAS,
                                    DNNL_ARG_DST_LAYER, DNNL_ARG_DST_ITER, DNNL_ARG_DST_ITER_C};

std::optional<dnnl::lstm_forward::primitive_desc> piece_pd(const Layer& l, int64_t n) {
  try {
    const MemDesc state = f32_dense({1, 1, n, l.H});
    const MemDesc any_wl(Dims{1, 1, l.I, 4, l.H}, memory::data_type::f32, memory::format_tag::any);
    const MemDesc any_wi(Dims{1, 1, l.H, 4, l.H}, memory::data_type::f32, memory::format_tag::any);
    dnnl::lstm_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference, l.direction(),
                                          l.seq_desc(n, l.I),
                                          state, state, any_wl, any_wi, f32_dense({1, 1, 4, l.H}), l.seq_desc(n, l.H),
                                          state, state, default_attr());
    if (!is_optimised(pd)) return std::nullopt;
    return pd;
  } catch (const dnnl::error& e) {
    note_unimplemented(e);
    return std::nullopt;
  }
}

// The prepared node: weight reorders, one primitive per piece size and the workspace layout
// (reordered W_ih, reordered W_hh, the summed bias, reorder scratch, then one scratch per piece).
struct LstmState {
  Layer layer;
  PooledPrimitive reorder_ih, reorder_hh;
  PooledPrimitive piece[2];  // a full piece, and the remainder when N is not a multiple
  std::size_t wl_offset = 0, wi_offset = 0, bias_offset = 0, reorder_scratch = 0, piece_scratch = 0, piece_stride = 0;
};

bool accepts(const Graph& g, const Node& node) {
  const std::optional<Layer> l = layer_of(g, node);
  if (!l) return false;
  const int64_t rest = l->N % kPieceSamples;
  return piece_pd(*l, std::min(l->N, kPieceSamples)) && (rest == 0 || l->N < kPieceSamples || piece_pd(*l, rest));
}

PreparedNode prepare(const Graph& g, const Node& node) {
  const std::optional<Layer> l = layer_of(g, node);
  if (!l) throw_runtime_error("onednn: lstm_layer is no longer supported at prepare time");
  auto s = std::make_shared<LstmState>();
  s->layer = *l;
  const int64_t sizes[2] = {std::min(l->N, kPieceSamples), l->N > kPieceSamples ? l->N % kPieceSamples : 0};
  std::size_t piece_scratch = 0;
  for (int k = 0; k < 2; ++k) {
    if (sizes[k] == 0) continue;
    const std::optional<dnnl::lstm_forward::primitive_desc> pd = piece_pd(*l, sizes[k]);
    if (!pd) throw_runtime_error("onednn: lstm_layer has no primitive for ", sizes[k], " samples at prepare time");
    s->piece[k] = make_pooled(*pd, kLstmArgs);
    piece_scratch = std::max(piece_scratch, s->piece[k].scratch_bytes);
    if (k == 0) {
      s->reorder_ih = weight_reorder(pd->weights_layer_desc(), l->I, 4);
      s->reorder_hh = weight_reorder(pd->weights_iter_desc(), l->H, 4);
      s->wi_offset = align_up(pd->weights_layer_desc().get_size());
      s->bias_offset = s->wi_offset + align_up(pd->weights_iter_desc().get_size());
    }
  }
  s->reorder_scratch = s->bias_offset + align_up(4 * l->H * sizeof(float));
  s->piece_scratch = s->reorder_scratch + align_up(std::max(s->reorder_ih.scratch_bytes, s->reorder_hh.scratch_bytes));
  s->piece_stride = align_up(piece_scratch);
  const std::size_t workspace = s->piece_scratch + s->piece_stride * static_cast<std::size_t>(l->pieces());
  return {std::move(s), workspace};
}

// Runs the samples of piece `p` through the layer.
void run_piece(const KernelArgs& a, const LstmState& s, int64_t p) {
  const Layer& l = s.layer;
  const rnn::ForwardSlots sl = lstm_slots(a.node);
  const int64_t n0 = p * kPieceSamples, state_step = l.H * static_cast<int64_t>(sizeof(float));
  const bool rest = l.N - n0 < kPieceSamples;
  const PooledPrimitive& prim = s.piece[rest && l.N > kPieceSamples ? 1 : 0];
  char* ws = static_cast<char*>(a.workspace);
  auto at = [&](const TensorRef& t, int64_t step) {
    return static_cast<void*>(static_cast<char*>(t.data) + n0 * step);
  };
  std::array<void*, kMaxArgs> ptrs = {at(a.in[sl.x], l.sample_step(l.I)),
                                      at(a.in[sl.h0], state_step),
                                      at(a.in[sl.c0], state_step),
                                      ws + s.wl_offset,
                                      ws + s.wi_offset,
                                      ws + s.bias_offset,
                                      at(a.out[0], l.sample_step(l.H)),
                                      at(a.out[1], state_step),
                                      at(a.out[2], state_step),
                                      ws + s.piece_scratch + p * static_cast<int64_t>(s.piece_stride)};
  run_pooled(prim, ptrs.data());
}

void lstm_inference(const KernelArgs& a) {
  const auto& s = *static_cast<const LstmState*>(a.state);
  const Layer& l = s.layer;
  char* ws = static_cast<char*>(a.workspace);
  const rnn::ForwardSlots sl = lstm_slots(a.node);
  void* reorder_ih[3] = {a.in[sl.w_ih].data, ws + s.wl_offset, ws + s.reorder_scratch};
  void* reorder_hh[3] = {a.in[sl.w_hh].data, ws + s.wi_offset, ws + s.reorder_scratch};
  run_pooled(s.reorder_ih, reorder_ih);
  run_pooled(s.reorder_hh, reorder_hh);
  // oneDNN adds one bias per gate: b_ih + b_hh, as treadle's and PyTorch's LSTM use them.
  auto* bias = reinterpret_cast<float*>(ws + s.bias_offset);
  if (sl.b_ih >= 0) {
    const float* b_ih = a.in[sl.b_ih].ptr<float>();
    const float* b_hh = a.in[sl.b_hh].ptr<float>();
    for (int64_t k = 0; k < 4 * l.H; ++k) bias[k] = b_ih[k] + b_hh[k];
  } else {
    std::fill_n(bias, 4 * l.H, 0.0f);
  }
  const int64_t pieces = l.pieces();
  if (pieces <= 1 || a.exec.num_workers() <= 1) {
    for (int64_t p = 0; p < pieces; ++p) run_piece(a, s, p);
    return;
  }
  // One captured pointer keeps the std::function inside its small buffer: no allocation per call.
  struct Job {
    const KernelArgs& a;
    const LstmState& s;
  } job{a, s};
  const Job* j = &job;
  a.exec.parallel_for(pieces, [j](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) run_piece(j->a, j->s, p);
  });
}

// lstm_layer: inference (above) when nothing reads `saved`, else the training pair.
KernelFn find_lstm(const Graph& g, const Node& node) {
  return accepts(g, node) ? &lstm_inference : find_train_forward(g, node);
}

PreparedNode prepare_lstm(const Graph& g, const Node& node) {
  return layer_of(g, node) ? prepare(g, node) : prepare_train_forward(g, node);
}

}  // namespace

std::vector<OpEntry> rnn_entries() {
  std::vector<OpEntry> entries(4);
  entries[0].op = "lstm_layer";
  entries[0].choose = &find_lstm;
  entries[0].prepare = &prepare_lstm;
  entries[1].op = "gru_layer";
  entries[1].choose = &find_train_forward;
  entries[1].prepare = &prepare_train_forward;
  for (int k : {2, 3}) {
    entries[k].op = k == 2 ? "lstm_layer_backward" : "gru_layer_backward";
    entries[k].choose = &find_train_backward;
    entries[k].prepare = &prepare_train_backward;
  }
  return entries;
}

}  // namespace treadle::onednn

// LSTM and GRU layers in training plans on oneDNN's recurrent primitives: vanilla_lstm and lbr_gru
// (PyTorch's GRU: the hidden side of the n gate is multiplied by r after its bias is added),
// forward_training and backward; and GRU layers in inference plans (lbr_gru forward_inference).
//
// oneDNN's forward_training keeps what its backward needs in a workspace of its own layout, larger
// than the reference's `saved` gates. So the forward and backward ops of a layer run on oneDNN as a
// pair: the forward writes that workspace into the layer's `saved` value, declared an opaque output
// of the node (PreparedNode::opaque_outputs: the plan gives it the bytes oneDNN needs and routes
// every reader of it to this backend), and the forward is taken only when `saved` is read by the
// layer's backward op alone. The backward op is the layer's whole gradient (ops/recurrent.hpp), which
// is what oneDNN's backward computes: dx, dh0, dc0, the weight and the bias gradients.
//
// Per call the weights are reordered into the primitive's layout (they change every step), GRU's
// gates permuted from PyTorch's (r, z, n) to oneDNN's (u = z, r, n); biases combined as the
// primitive adds them. The batch runs in pieces of samples, each one single-threaded execution on
// the host's executor with its own part of the workspace and, in backward, its own weight-gradient
// buffers, summed in piece order afterwards: results do not depend on the workers.
//
// Not taken: variable lengths (a run-time input; oneDNN has no per-sample lengths), float64, the
// plain RNN, layers where Eigen is as fast (pays_off), and layers whose `saved` the host reads.
#include <cstring>

#include "backends/onednn/rnn_common.hpp"
#include "core/op_registry.hpp"
#include "treadle/error.hpp"

namespace treadle::onednn::rnn_common {
namespace {

using dnnl::memory;
using rnn::Cell;

// Where oneDNN beats Eigen (bench/onednn_rnn.py, T 16, I = H, one core, CPU time; docs/onednn_ops.md).
// The training pair (forward + backward) with oneDNN's AVX-512 kernels (Intel Xeon with AMX), against
// Eigen with its packed step products (backends/eigen/small_gemm.hpp), one layer: oneDNN loses below
// 32 samples at every H (LSTM 0.39-0.80x, GRU 0.29-0.72x at N 2-8, H 16-128) and is within
// 0.78-1.01x from 32 samples; but the W5 step (batch-first LSTM seq 32, I 16, H 64 -> last step ->
// Linear, Adam) is 1.05x faster with the pair at batch 32 and 1.17x at batch 128. A batch of one
// piece (kPieceSamples), though, runs on one worker while Eigen's steps split over every worker lent:
// W5 at batch 32 took 1,550 us on 1 worker and 1,644 us on 2 with the pair (bench workers). The
// choice may not depend on the workers (results are the same for any number), so the pair is taken
// from two pieces, where it was measured to win: LSTM from H 32, GRU from H 128.
// GRU inference (predict, same machine and Eigen): oneDNN 1.15-1.26x faster from 32 samples at every
// H from 16 to 128, and from 8 samples at H 64-128 (1.06-1.10x); it loses below (0.78-0.96x at N
// 2-4, H 64-128; 0.55-0.85x at H 16-32 below 32 samples). One sample is never taken: Eigen's
// matrix-vector steps win there.
// With its AVX2 kernels (AMD EPYC Zen 3), against Eigen with the packed step products, the training
// pair never wins (Eigen 1.0-1.37x faster at H 128-256, N 2-128: the pair ties only at N 32, H 256)
// and GRU inference wins from H 256 (1.10-1.12x at N 4-32; 0.83-1.03x at H 128, 0.74-0.89x at H 64).
bool pays_off_with_avx512(const Layer& l, bool inference) {
  if (inference) return l.N >= 32 || (l.N >= 8 && l.H >= 64);  // GRU: pays_off keeps LSTM inference out
  return l.N >= 2 * kPieceSamples && l.H >= (l.cell == Cell::gru ? 128 : 32);
}

// LSTM inference is never taken here (rnn_kernels.cpp has its own kernel); inside an AllKernelsScope
// every other layer is, so tests and the crossover study (bench/onednn_rnn.py) reach the kernels.
bool pays_off(const Layer& l, bool inference) {
  if (inference && l.cell != Cell::gru) return false;
  if (!size_thresholds_apply()) return true;
  if (!pays_off_with_avx512(l, inference)) return false;
  if (wide_vectors()) return true;
  if (inference) return l.H >= 256 || !avx2_kernels_lose("GRU inference below hidden size 256");
  return !avx2_kernels_lose("LSTM and GRU training pair");
}

// oneDNN's GRU gate g is PyTorch's gate kGruGate[g] (u = z, r, n); the permutation is its own inverse.
constexpr int kGruGate[3] = {1, 0, 2};

// The forward_training and backward descriptors for a piece of `n` samples.
struct PiecePds {
  dnnl::primitive_desc fwd, bwd;
  std::size_t workspace_bytes = 0;
};

// With `inference`, fwd is a forward_inference descriptor (no workspace) and bwd stays empty.
std::optional<PiecePds> piece_pds(const Layer& l, int64_t n, bool inference = false) {
  try {
    const MemDesc st = f32_dense({1, 1, n, l.H});
    const MemDesc wl(Dims{1, 1, l.I, l.G, l.H}, memory::data_type::f32, memory::format_tag::any);
    const MemDesc wi(Dims{1, 1, l.H, l.G, l.H}, memory::data_type::f32, memory::format_tag::any);
    const MemDesc src = l.seq_desc(n, l.I), dst = l.seq_desc(n, l.H);
    const dnnl::engine& eng = cpu_engine();
    const auto fwd = inference ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training;
    const auto bwd = dnnl::prop_kind::backward;
    PiecePds p;
    if (l.cell == Cell::lstm) {
      const MemDesc b = f32_dense({1, 1, 4, l.H});
      dnnl::lstm_forward::primitive_desc f(eng, fwd, l.direction(), src, st, st, wl, wi, b, dst, st, st,
                                           default_attr());
      p.fwd = f;
      if (inference) return p;
      p.bwd = dnnl::lstm_backward::primitive_desc(eng, bwd, l.direction(), src, st, st, wl, wi, b, dst, st, st, src,
                                                  st, st, wl, wi, b, dst, st, st, f, default_attr());
      p.workspace_bytes = f.workspace_desc().get_size();
    } else {
      const MemDesc b = f32_dense({1, 1, 4, l.H});  // lbr_gru: u, r, n and the hidden side of n
      dnnl::lbr_gru_forward::primitive_desc f(eng, fwd, l.direction(), src, st, wl, wi, b, dst, st, default_attr());
      p.fwd = f;
      if (inference) return p;
      p.bwd = dnnl::lbr_gru_backward::primitive_desc(eng, bwd, l.direction(), src, st, wl, wi, b, dst, st, src, st,
                                                     wl, wi, b, dst, st, f, default_attr());
      p.workspace_bytes = f.workspace_desc().get_size();
    }
    return p;
  } catch (const dnnl::error& e) {
    note_unimplemented(e);
    return std::nullopt;
  }
}

std::vector<int> forward_args(Cell c, bool inference = false) {
  std::vector<int> args;
  if (c == Cell::lstm)
    args = {DNNL_ARG_SRC_LAYER,    DNNL_ARG_SRC_ITER, DNNL_ARG_SRC_ITER_C, DNNL_ARG_WEIGHTS_LAYER,
            DNNL_ARG_WEIGHTS_ITER, DNNL_ARG_BIAS,     DNNL_ARG_DST_LAYER,  DNNL_ARG_DST_ITER,
            DNNL_ARG_DST_ITER_C};
  else
    args = {DNNL_ARG_SRC_LAYER, DNNL_ARG_SRC_ITER,  DNNL_ARG_WEIGHTS_LAYER, DNNL_ARG_WEIGHTS_ITER,
            DNNL_ARG_BIAS,      DNNL_ARG_DST_LAYER, DNNL_ARG_DST_ITER};
  if (!inference) args.push_back(DNNL_ARG_WORKSPACE);
  return args;
}

std::vector<int> backward_args(Cell c) {
  std::vector<int> args = forward_args(c);
  const std::vector<int> diff =
      c == Cell::lstm
          ? std::vector<int>{DNNL_ARG_DIFF_SRC_LAYER,    DNNL_ARG_DIFF_SRC_ITER,    DNNL_ARG_DIFF_SRC_ITER_C,
                             DNNL_ARG_DIFF_WEIGHTS_LAYER, DNNL_ARG_DIFF_WEIGHTS_ITER, DNNL_ARG_DIFF_BIAS,
                             DNNL_ARG_DIFF_DST_LAYER,    DNNL_ARG_DIFF_DST_ITER,    DNNL_ARG_DIFF_DST_ITER_C}
          : std::vector<int>{DNNL_ARG_DIFF_SRC_LAYER,    DNNL_ARG_DIFF_SRC_ITER,  DNNL_ARG_DIFF_WEIGHTS_LAYER,
                             DNNL_ARG_DIFF_WEIGHTS_ITER, DNNL_ARG_DIFF_BIAS,      DNNL_ARG_DIFF_DST_LAYER,
                             DNNL_ARG_DIFF_DST_ITER};
  args.insert(args.end(), diff.begin(), diff.end());
  return args;
}

// A prepared forward or backward node. Workspace: the weights in the primitive's layout, the
// combined bias, a plain copy for GRU's gate permutation, reorder scratch, then one region per
// piece (the primitive's scratchpad and, in backward, the piece's weight and bias gradients).
struct TrainState {
  Layer layer;
  bool backward = false;
  bool inference = false;  // a forward whose `saved` nobody reads: forward_inference, no workspace
  PooledPrimitive reorder_ih, reorder_hh, diff_ih, diff_hh;
  PooledPrimitive piece[2];
  std::size_t wl = 0, wi = 0, bias = 0, plain = 0, reorder_scratch = 0, pieces_base = 0, piece_stride = 0;
  std::size_t dwl = 0, dwi = 0, dbias = 0;  // within a piece region (backward)
  std::size_t dwl_bytes = 0, dwi_bytes = 0;
  std::size_t saved_stride = 0;  // bytes of oneDNN workspace per piece in `saved`
};

std::size_t max_scratch(std::initializer_list<const PooledPrimitive*> ps) {
  std::size_t m = 0;
  for (const PooledPrimitive* p : ps) m = std::max(m, p->scratch_bytes);
  return m;
}

PreparedNode prepare_train(const Graph& g, const Node& node, bool backward) {
  const std::optional<Layer> l = layer_of_node(g, node, backward);
  if (!l) throw_runtime_error("onednn: ", op_name(node), " is no longer supported at prepare time");
  auto s = std::make_shared<TrainState>();
  s->layer = *l;
  s->backward = backward;
  s->inference = !backward && !g.info(node.outputs.back()).read;
  const std::array<int64_t, 2> sizes = l->piece_sizes();
  std::size_t piece_scratch = 0;
  for (int k = 0; k < 2; ++k) {
    if (sizes[k] == 0) continue;
    const std::optional<PiecePds> pds = piece_pds(*l, sizes[k], s->inference);
    if (!pds) throw_runtime_error("onednn: ", op_name(node), " has no primitive for ", sizes[k], " samples");
    s->saved_stride = std::max(s->saved_stride, align_up(pds->workspace_bytes));
    const dnnl::primitive_desc& pd = backward ? pds->bwd : pds->fwd;
    s->piece[k] = make_pooled(pd, backward ? backward_args(l->cell) : forward_args(l->cell, s->inference));
    piece_scratch = std::max(piece_scratch, s->piece[k].scratch_bytes);
    if (k != 0) continue;
    const MemDesc wl_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_LAYER);
    const MemDesc wi_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_ITER);
    s->reorder_ih = weight_reorder(wl_md, l->I, l->G);
    s->reorder_hh = weight_reorder(wi_md, l->H, l->G);
    s->wi = align_up(wl_md.get_size());
    s->bias = s->wi + align_up(wi_md.get_size());
    s->plain = s->bias + align_up(4 * l->H * sizeof(float));
    std::size_t after_plain = s->plain + align_up(l->G * l->H * std::max(l->I, l->H) * sizeof(float));
    if (backward) {
      const MemDesc dwl_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_DIFF_WEIGHTS_LAYER);
      const MemDesc dwi_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_DIFF_WEIGHTS_ITER);
      s->diff_ih = weight_reorder_back(dwl_md, l->I, l->G);
      s->diff_hh = weight_reorder_back(dwi_md, l->H, l->G);
      s->dwl_bytes = dwl_md.get_size();
      s->dwi_bytes = dwi_md.get_size();
    }
    s->reorder_scratch = after_plain;
  }
  s->pieces_base = s->reorder_scratch + align_up(max_scratch({&s->reorder_ih, &s->reorder_hh, &s->diff_ih, &s->diff_hh}));
  s->dwl = align_up(piece_scratch);
  s->dwi = s->dwl + align_up(s->dwl_bytes);
  s->dbias = s->dwi + align_up(s->dwi_bytes);
  s->piece_stride = backward ? s->dbias + align_up(4 * l->H * sizeof(float)) : s->dwl;
  const std::size_t workspace = s->pieces_base + s->piece_stride * static_cast<std::size_t>(l->pieces());
  PreparedNode out{nullptr, workspace, {}};
  if (!backward && !s->inference)
    out.opaque_outputs.push_back({static_cast<int>(node.outputs.size()) - 1,
                                  s->saved_stride * static_cast<std::size_t>(l->pieces())});
  out.state = std::move(s);
  return out;
}

// Weight `w` (G*H, cols) in oneDNN's gate order: itself for LSTM (i, f, g, o as oneDNN's), a
// gate-permuted copy in `plain` for GRU.
const float* in_onednn_gate_order(const Layer& l, const float* w, int64_t cols, float* plain) {
  if (l.cell != Cell::gru) return w;
  const int64_t block = l.H * cols;
  for (int g = 0; g < 3; ++g) std::memcpy(plain + g * block, w + kGruGate[g] * block, block * sizeof(float));
  return plain;
}

// The weights into the primitive's layout and the bias as the primitive adds it.
void stage_weights(const KernelArgs& a, const TrainState& s, int w_ih, int w_hh, int b_ih, int b_hh) {
  const Layer& l = s.layer;
  char* ws = static_cast<char*>(a.workspace);
  auto* plain = reinterpret_cast<float*>(ws + s.plain);
  const float* src_ih = in_onednn_gate_order(l, a.in[w_ih].ptr<float>(), l.I, plain);
  void* reorder_ih[3] = {const_cast<float*>(src_ih), ws + s.wl, ws + s.reorder_scratch};
  run_pooled(s.reorder_ih, reorder_ih);
  const float* src_hh = in_onednn_gate_order(l, a.in[w_hh].ptr<float>(), l.H, plain);
  void* reorder_hh[3] = {const_cast<float*>(src_hh), ws + s.wi, ws + s.reorder_scratch};
  run_pooled(s.reorder_hh, reorder_hh);
  auto* bias = reinterpret_cast<float*>(ws + s.bias);
  const int64_t H = l.H;
  if (b_ih < 0) {
    std::fill_n(bias, 4 * H, 0.0f);
    return;
  }
  const float* bi = a.in[b_ih].ptr<float>();
  const float* bh = a.in[b_hh].ptr<float>();
  if (l.cell == Cell::lstm) {
    for (int64_t k = 0; k < 4 * H; ++k) bias[k] = bi[k] + bh[k];
    return;
  }
  for (int g = 0; g < 2; ++g)  // u and r: both sides added
    for (int64_t k = 0; k < H; ++k) bias[g * H + k] = bi[kGruGate[g] * H + k] + bh[kGruGate[g] * H + k];
  std::copy_n(bi + 2 * H, H, bias + 2 * H);  // n, input side
  std::copy_n(bh + 2 * H, H, bias + 3 * H);  // n, hidden side (multiplied by r)
}

// Pointers of one piece's execution, by oneDNN argument.
struct PiecePointers {
  const TrainState& s;
  const KernelArgs& a;
  int64_t p;
  char* ws;

  void* seq(int operand, bool output, int64_t width) const {
    const TensorRef& t = output ? a.out[operand] : a.in[operand];
    return static_cast<char*>(t.data) + p * kPieceSamples * s.layer.sample_step(width);
  }
  void* state(int operand, bool output) const {
    const TensorRef& t = output ? a.out[operand] : a.in[operand];
    return static_cast<char*>(t.data) + p * kPieceSamples * s.layer.H * static_cast<int64_t>(sizeof(float));
  }
  char* region() const { return ws + s.pieces_base + p * static_cast<int64_t>(s.piece_stride); }
  void* saved(int operand, bool output) const {
    const TensorRef& t = output ? a.out[operand] : a.in[operand];
    return static_cast<char*>(t.data) + p * static_cast<int64_t>(s.saved_stride);
  }
};

void* forward_pointer(const PiecePointers& pp, const rnn::ForwardSlots& f, int arg) {
  const Layer& l = pp.s.layer;
  const int c_n = 2;  // lstm outputs: y, h_n, c_n, saved
  switch (arg) {
    case DNNL_ARG_SRC_LAYER: return pp.seq(f.x, false, l.I);
    case DNNL_ARG_SRC_ITER: return pp.state(f.h0, false);
    case DNNL_ARG_SRC_ITER_C: return pp.state(f.c0, false);
    case DNNL_ARG_WEIGHTS_LAYER: return pp.ws + pp.s.wl;
    case DNNL_ARG_WEIGHTS_ITER: return pp.ws + pp.s.wi;
    case DNNL_ARG_BIAS: return pp.ws + pp.s.bias;
    case DNNL_ARG_DST_LAYER: return pp.seq(0, true, l.H);
    case DNNL_ARG_DST_ITER: return pp.state(1, true);
    case DNNL_ARG_DST_ITER_C: return pp.state(c_n, true);
    case DNNL_ARG_WORKSPACE: return pp.saved(pp.a.num_out - 1, true);
    case DNNL_ARG_SCRATCHPAD: return pp.region();
  }
  throw_runtime_error("onednn: recurrent forward has no argument ", arg);
}

void* backward_pointer(const PiecePointers& pp, const rnn::BackwardSlots& b, int arg) {
  const Layer& l = pp.s.layer;
  switch (arg) {
    case DNNL_ARG_SRC_LAYER: return pp.seq(b.x, false, l.I);
    case DNNL_ARG_SRC_ITER: return pp.state(b.h0, false);
    case DNNL_ARG_SRC_ITER_C: return pp.state(b.c0, false);
    case DNNL_ARG_WEIGHTS_LAYER: return pp.ws + pp.s.wl;
    case DNNL_ARG_WEIGHTS_ITER: return pp.ws + pp.s.wi;
    case DNNL_ARG_BIAS: return pp.ws + pp.s.bias;
    case DNNL_ARG_DST_LAYER: return pp.seq(b.y, false, l.H);
    case DNNL_ARG_DST_ITER: return pp.state(b.h_n, false);
    case DNNL_ARG_DST_ITER_C: return pp.state(b.c_n, false);
    case DNNL_ARG_WORKSPACE: return pp.saved(b.saved, false);
    case DNNL_ARG_DIFF_SRC_LAYER: return pp.seq(b.dx, true, l.I);
    case DNNL_ARG_DIFF_SRC_ITER: return pp.state(b.dh0, true);
    case DNNL_ARG_DIFF_SRC_ITER_C: return pp.state(b.dc0, true);
    case DNNL_ARG_DIFF_WEIGHTS_LAYER: return pp.region() + pp.s.dwl;
    case DNNL_ARG_DIFF_WEIGHTS_ITER: return pp.region() + pp.s.dwi;
    case DNNL_ARG_DIFF_BIAS: return pp.region() + pp.s.dbias;
    case DNNL_ARG_DIFF_DST_LAYER: return pp.seq(b.dy, false, l.H);
    case DNNL_ARG_DIFF_DST_ITER: return pp.state(b.dh_n, false);
    case DNNL_ARG_DIFF_DST_ITER_C: return pp.state(b.dc_n, false);
    case DNNL_ARG_SCRATCHPAD: return pp.region();
  }
  throw_runtime_error("onednn: recurrent backward has no argument ", arg);
}

void run_piece(const KernelArgs& a, const TrainState& s, int64_t p) {
  const Layer& l = s.layer;
  const PooledPrimitive& prim = s.piece[l.piece_kind(p)];
  const PiecePointers pp{s, a, p, static_cast<char*>(a.workspace)};
  std::array<void*, kMaxArgs> ptrs{};
  const rnn::CellInfo ci = rnn::cell_info(l.cell);
  if (s.backward) {
    const rnn::BackwardSlots b = rnn::backward_slots(ci, a.num_in);
    char* region = pp.region();  // oneDNN adds into the weight gradients: start from zeros
    std::memset(region + s.dwl, 0, s.dwl_bytes);
    std::memset(region + s.dwi, 0, s.dwi_bytes);
    std::memset(region + s.dbias, 0, 4 * l.H * sizeof(float));
    for (std::size_t k = 0; k < prim.args.size(); ++k) ptrs[k] = backward_pointer(pp, b, prim.args[k]);
  } else {
    const rnn::ForwardSlots f = rnn::forward_slots(ci, a.num_in);
    for (std::size_t k = 0; k < prim.args.size(); ++k) ptrs[k] = forward_pointer(pp, f, prim.args[k]);
  }
  run_pooled(prim, ptrs.data());
}

void run_pieces(const KernelArgs& a, const TrainState& s) {
  const int64_t pieces = s.layer.pieces();
  if (pieces <= 1 || a.exec.num_workers() <= 1) {
    for (int64_t p = 0; p < pieces; ++p) run_piece(a, s, p);
    return;
  }
  struct Job {  // one captured pointer keeps the std::function in its small buffer: no allocation
    const KernelArgs& a;
    const TrainState& s;
  } job{a, s};
  const Job* j = &job;
  a.exec.parallel_for(pieces, [j](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) run_piece(j->a, j->s, p);
  });
}

void train_forward(const KernelArgs& a) {
  const auto& s = *static_cast<const TrainState*>(a.state);
  const rnn::ForwardSlots f = rnn::forward_slots(rnn::cell_info(s.layer.cell), a.num_in);
  stage_weights(a, s, f.w_ih, f.w_hh, f.b_ih, f.b_hh);
  run_pieces(a, s);
}

// Piece gradients summed into piece 0's buffers in piece order, then into treadle's layouts.
void finish_weight_grads(const KernelArgs& a, const TrainState& s, const rnn::BackwardSlots& b) {
  const Layer& l = s.layer;
  char* ws = static_cast<char*>(a.workspace);
  char* first = ws + s.pieces_base;
  for (int64_t p = 1; p < l.pieces(); ++p) {
    const char* other = first + p * static_cast<int64_t>(s.piece_stride);
    auto add = [&](std::size_t off, std::size_t bytes) {
      float* dst = reinterpret_cast<float*>(first + off);
      const float* src = reinterpret_cast<const float*>(other + off);
      for (std::size_t k = 0; k < bytes / sizeof(float); ++k) dst[k] += src[k];
    };
    add(s.dwl, s.dwl_bytes);
    add(s.dwi, s.dwi_bytes);
    add(s.dbias, 4 * l.H * sizeof(float));
  }
  auto* plain = reinterpret_cast<float*>(ws + s.plain);
  auto to_treadle = [&](const PooledPrimitive& reorder, std::size_t off, int out, int64_t cols) {
    float* dst = a.out[out].ptr<float>();
    void* ptrs[3] = {first + off, l.cell == Cell::gru ? plain : dst, ws + s.reorder_scratch};
    run_pooled(reorder, ptrs);
    if (l.cell != Cell::gru) return;
    const int64_t block = l.H * cols;
    for (int g = 0; g < 3; ++g) std::memcpy(dst + kGruGate[g] * block, plain + g * block, block * sizeof(float));
  };
  to_treadle(s.diff_ih, s.dwl, b.dw_ih, l.I);
  to_treadle(s.diff_hh, s.dwi, b.dw_hh, l.H);
  if (b.db_ih < 0) return;
  const auto* db = reinterpret_cast<const float*>(first + s.dbias);
  float* db_ih = a.out[b.db_ih].ptr<float>();
  float* db_hh = a.out[b.db_hh].ptr<float>();
  const int64_t H = l.H;
  if (l.cell == Cell::lstm) {
    std::copy_n(db, 4 * H, db_ih);
    std::copy_n(db, 4 * H, db_hh);
    return;
  }
  for (int g = 0; g < 2; ++g) {
    std::copy_n(db + g * H, H, db_ih + kGruGate[g] * H);
    std::copy_n(db + g * H, H, db_hh + kGruGate[g] * H);
  }
  std::copy_n(db + 2 * H, H, db_ih + 2 * H);
  std::copy_n(db + 3 * H, H, db_hh + 2 * H);
}

void train_backward(const KernelArgs& a) {
  const auto& s = *static_cast<const TrainState*>(a.state);
  const rnn::BackwardSlots b = rnn::backward_slots(rnn::cell_info(s.layer.cell), a.num_in);
  stage_weights(a, s, b.w_ih, b.w_hh, b.b_ih, b.b_hh);
  run_pieces(a, s);
  finish_weight_grads(a, s, b);
}

// A forward node is taken when its `saved` is read by the layer's backward op only (not by the
// host), and oneDNN has both primitives for every piece size; a GRU forward whose `saved` nobody
// reads (inference) when oneDNN has its forward_inference primitive. (LSTM inference has its own
// kernel, rnn_kernels.cpp, on oneDNN's optimised inference implementation.)
bool takes_forward(const Graph& g, const Node& node) {
  const std::optional<Layer> l = layer_of_node(g, node, false);
  if (!l) return false;
  const int saved = node.outputs.back();
  const ValueInfo& info = g.info(saved);
  if (!pays_off(*l, !info.read)) return false;
  if (!info.read) {
    for (int64_t n : l->piece_sizes())
      if (n > 0 && !piece_pds(*l, n, true)) return false;
    return true;
  }
  if (!read_only_by(g, saved, op_name(node) + "_backward")) return false;
  for (int64_t n : l->piece_sizes())
    if (n > 0 && !piece_pds(*l, n)) return false;
  return true;
}

// A backward node is taken exactly when its forward was: `saved` then holds oneDNN's workspace.
bool takes_backward(const Graph& g, const Node& node) {
  const rnn::BackwardSlots b = rnn::backward_slots(rnn::cell_info(cell_of(node)), static_cast<int>(node.inputs.size()));
  if (!b.valid || b.saved < 0) return false;
  const char* owner = g.info(node.inputs[b.saved]).layout_owner;
  return owner && std::strcmp(owner, "onednn") == 0;
}

}  // namespace

KernelFn find_train_forward(const Graph& g, const Node& node) {
  return takes_forward(g, node) ? &train_forward : nullptr;
}

PreparedNode prepare_train_forward(const Graph& g, const Node& node) { return prepare_train(g, node, false); }

KernelFn find_train_backward(const Graph& g, const Node& node) {
  return takes_backward(g, node) ? &train_backward : nullptr;
}

PreparedNode prepare_train_backward(const Graph& g, const Node& node) { return prepare_train(g, node, true); }

}  // namespace treadle::onednn::rnn_common

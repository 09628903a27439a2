// Convolutions (1-d, 2-d, 3-d; stride, padding, dilation, groups) on oneDNN's direct convolution
// kernels, which need oneDNN's blocked layouts (nChw16c activations, OIhw16i16o-like weights):
//   conv (bias fused)       convolution forward
//   conv_backward_data      convolution backward data (also a transposed convolution's forward;
//                           its bias is added to the plain result)
//   conv_backward_weight    convolution backward weights
// In treadle's plain layouts oneDNN picks im2col + GEMM, no faster than Eigen (docs/onednn_ops.md), so
// the primitives are created with format_tag::any and every piece chains reorders around them:
//   before the pieces   weights plain -> blocked into the workspace (once per node execution)
//   each piece          its images plain -> blocked, the convolution, the result blocked -> plain
// Pieces are a fixed number of images (set by the problem, never by the workers), dealt round-robin
// to at most 16 slots that run in parallel; each slot has its own region of the workspace (blocked
// copies, scratchpad), so slots and concurrent contexts never share memory, and the workspace stays
// bounded for large batches. The weight gradient sums over images: each piece writes a partial gradient
// (blocked) into its region; the partials are added in piece order and the sum reordered to plain,
// so the result does not depend on the executor. conv_backward_bias stays on Eigen (a reduction at
// memory speed). Nodes go to oneDNN only where its direct kernels were measured faster than Eigen,
// reorders included (thresholds below); the rest, and windows oneDNN cannot express (negative end
// padding, from a transposed convolution with output_padding >= stride), stay on Eigen.
//
// A fused activation (ops/fusion.hpp) is an eltwise post-op of the forward convolution, applied to
// the blocked output. bf16 compute (ops/precision.hpp) changes only data types: the reorders into
// the blocked layouts convert the float32 operands to bf16 (round to nearest even), the bf16
// kernels accumulate in float32 and write float32 results, so the chain stays the same.
#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <string>

#include "backends/onednn/conv_layouts.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"
#include "treadle/error.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kF32 = sizeof(float);
// Multiply-adds per piece: enough to amortise the calls and reorders of a piece (a few us), few
// enough to give the host's workers several pieces on a mid-size batch.
constexpr int64_t kPieceMacs = int64_t{1} << 22;
// At most this many pieces for the weight gradient: each adds a partial gradient to the sum.
constexpr int64_t kMaxWeightPieces = 8;
// Slots (parallel workers' regions of the workspace) per node; every piece of a weight gradient has
// its own slot, since its partial gradient stays there until the sum.
constexpr int64_t kMaxSlots = 16;
static_assert(kMaxWeightPieces <= kMaxSlots);
constexpr int64_t kSumGrain = int64_t{1} << 14;  // elements per chunk of the partial-gradient sum

using Tag = dnnl::memory::format_tag;

Dims spatial(const Dims3& d, int nd, int64_t minus = 0) {
  Dims out;
  for (int i = 3 - nd; i < 3; ++i) out.push_back(d[i] - minus);
  return out;
}

Dims with_spatial(Dims lead, const Dims3& d, int nd) {
  for (int64_t v : spatial(d, nd)) lead.push_back(v);
  return lead;
}

Dims src_dims(const ConvGeometry& g, int64_t n) { return with_spatial({n, g.channels}, g.in, g.nd); }
Dims dst_dims(const ConvGeometry& g, int64_t n) { return with_spatial({n, g.out_channels}, g.out, g.nd); }
Dims weight_dims(const ConvGeometry& g) {
  if (g.groups == 1) return with_spatial({g.out_channels, g.channels}, g.kernel, g.nd);
  return with_spatial({g.groups, g.out_group(), g.in_group()}, g.kernel, g.nd);
}

int64_t image_macs(const ConvGeometry& g) { return g.out_channels * g.out_volume() * g.in_group() * g.kernel_volume(); }
int64_t x_image_bytes(const ConvGeometry& g) { return g.channels * g.in_volume() * kF32; }
int64_t y_image_bytes(const ConvGeometry& g) { return g.out_channels * g.out_volume() * kF32; }

// The window in oneDNN's terms (dilation counts the gaps: torch's dilation - 1).
struct Window {
  Dims strides, dilates, pad_l, pad_r;
};
Window window_of(const ConvGeometry& g) {
  return {spatial(g.stride, g.nd), spatial(g.dilation, g.nd, 1), spatial(g.pad_begin, g.nd), spatial(g.pad_end, g.nd)};
}

constexpr auto kDirect = dnnl::algorithm::convolution_direct;
using DataType = dnnl::memory::data_type;

// What a node asks of its primitive besides the geometry: the data type of the two operands
// (bf16 compute, ops/precision.hpp: oneDNN's reorders round the float32 tensors to bf16 on their
// way into the blocked layout; results and bias stay float32), a fused bias (forward) and a fused
// activation (forward, ops/fusion.hpp: an eltwise post-op on the blocked output).
struct ConvKind {
  ConvPass pass = ConvPass::forward;
  DataType operands = DataType::f32;
  bool bias = false;
  std::string activation;
};

dnnl::primitive_attr conv_attr(const ConvKind& kind) {
  dnnl::primitive_attr attr = default_attr();
  if (kind.activation.empty()) return attr;
  const dnnl::algorithm alg = kind.activation == "relu"   ? dnnl::algorithm::eltwise_relu
                              : kind.activation == "tanh" ? dnnl::algorithm::eltwise_tanh
                                                          : dnnl::algorithm::eltwise_logistic;
  dnnl::post_ops ops;
  ops.append_eltwise(alg, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  return attr;
}

MemDesc any_desc(const Dims& dims, DataType type) { return MemDesc(dims, type, Tag::any); }

// The layout-free weights descriptor of a pass: operand type, float32 for a weight gradient.
MemDesc any_weights(const ConvGeometry& g, const ConvKind& kind) {
  return any_desc(weight_dims(g), kind.pass == ConvPass::backward_weight ? DataType::f32 : kind.operands);
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvGeometry& g, int64_t n, const MemDesc& w,
                                                     const ConvKind& kind) {
  const Window k = window_of(g);
  const auto prop = dnnl::prop_kind::forward_training;
  const MemDesc src = any_desc(src_dims(g, n), kind.operands), dst = any_desc(dst_dims(g, n), DataType::f32);
  const dnnl::primitive_attr attr = conv_attr(kind);
  if (kind.bias)
    return {cpu_engine(), prop, kDirect, src, w, f32_dense({g.out_channels}), dst, k.strides, k.dilates, k.pad_l,
            k.pad_r, attr};
  return {cpu_engine(), prop, kDirect, src, w, dst, k.strides, k.dilates, k.pad_l, k.pad_r, attr};
}

// The primitive descriptor of a piece of `n` images with weights descriptor `w`.
dnnl::primitive_desc pass_pd(const ConvGeometry& g, const ConvKind& kind, int64_t n, const MemDesc& w) {
  if (kind.pass == ConvPass::forward) return forward_pd(g, n, w, kind);
  const Window k = window_of(g);
  const ConvKind plain{ConvPass::forward, kind.operands, false, ""};
  const auto hint = forward_pd(g, n, any_desc(weight_dims(g), kind.operands), plain);
  // The operands (dy and w, or x and dy) carry the compute type; the result is float32.
  const bool data = kind.pass == ConvPass::backward_data;
  const MemDesc src = any_desc(src_dims(g, n), data ? DataType::f32 : kind.operands);
  const MemDesc dst = any_desc(dst_dims(g, n), kind.operands);
  if (data)
    return dnnl::convolution_backward_data::primitive_desc(cpu_engine(), kDirect, src, w, dst, k.strides, k.dilates,
                                                           k.pad_l, k.pad_r, hint, default_attr());
  return dnnl::convolution_backward_weights::primitive_desc(cpu_engine(), kDirect, src, w, dst, k.strides, k.dilates,
                                                            k.pad_l, k.pad_r, hint, default_attr());
}

// The weights layout a pass's primitive chose.
MemDesc weights_md(const dnnl::primitive_desc& pd, ConvPass pass) {
  return pd.query_md(dnnl::query::exec_arg_md, pass == ConvPass::backward_weight ? DNNL_ARG_DIFF_WEIGHTS
                                                                                 : DNNL_ARG_WEIGHTS);
}

// oneDNN's direct kernels ("jit:avx512_core", "brgconv:...", "jit_dw:..."); its im2col + GEMM
// ("gemm:jit") is what plain layouts get and is no faster than Eigen, reference kernels are slower.
bool direct_impl(const dnnl::primitive_desc& pd) {
  const char* impl = pd.impl_info_str();
  const bool direct = impl && (std::strncmp(impl, "jit", 3) == 0 || std::strncmp(impl, "brg", 3) == 0);
  if (!direct) note_cpu_decline(std::string("no direct oneDNN kernel (") + (impl ? impl : "?") + ")");
  return direct;
}

// Where oneDNN's blocked kernels beat Eigen, reorders included: measured with bench/onednn_conv.py
// (one core, CPU time; docs/onednn_ops.md, "Convolutions"), Eigen time / oneDNN time in brackets.
// Below ~2^16 multiply-adds a call's fixed costs decide (37-41K: 0.91-1.15; 98K: 1.16-1.18;
// 295K: 1.8-2.3).
constexpr int64_t kMinMacs = int64_t{1} << 16;

bool worth_it(const ConvGeometry& g, ConvPass pass) {
  if (!size_thresholds_apply()) return true;
  if (g.batch * image_macs(g) < kMinMacs) return false;
  switch (pass) {
    case ConvPass::forward:
      // One input channel: oneDNN reads it in place, a tie (0.99, 1 -> 32 channels at 28x28). A
      // pointwise convolution is one plain GEMM for Eigen, without im2col (0.91-1.24 across runs).
      return g.channels > 1 && !g.pointwise();
    case ConvPass::backward_data:
      // A data gradient with few channels is blocked in 16s: mostly padding, and its reorder back
      // dominates (0.21 at 1 channel, 0.40 at 2, 0.43 at 3, 0.68 at 4; 1.10-1.43 at 8).
      return g.channels >= 8;
    case ConvPass::backward_weight:
      // With 4 to 7 input channels per group oneDNN falls back to its AVX2 kernel in 8-channel
      // blocks (0.78 at 4 -> 16 channels); with 1 to 3 it reads the input in place (1.20 at 1,
      // 2.2-2.4 at 2 and 3); depthwise ones are fast (3.3). Those are its AVX-512 kernels; with
      // its AVX2 ones (Zen 3) 1 and 2 channels lose (0.35 at 1 -> 32, 28x28; 0.58 at 2 -> 16),
      // 3 still wins (1.84 at 3 -> 16, 32x32).
      if (g.in_group() <= 2 && avx2_kernels_lose("weight gradient over 1 or 2 input channels")) return false;
      return g.in_group() < 4 || g.in_group() >= 8;
  }
  return false;
}

// The pieces and the primitive descriptor of each piece size (full pieces, then the remainder).
struct ConvPlan {
  ConvGeometry geo;
  ConvKind kind;
  bool bias = false;  // the node has a bias (fused into the forward; added afterwards for backward data)
  int64_t grain = 1;
  int64_t images[2] = {0, 0};
  dnnl::primitive_desc pds[2];
  int64_t pieces() const { return (geo.batch + grain - 1) / grain; }
  int64_t slots() const { return std::min(pieces(), kMaxSlots); }
};

ConvGeometry geometry_of(const Graph& g, const Node& node, ConvPass pass) {
  const Shape &a = in_shape(g, node, 0), &b = in_shape(g, node, 1);
  if (pass == ConvPass::forward) return conv_geometry_forward(a, b, node.attrs);
  if (pass == ConvPass::backward_data) return conv_geometry_backward_data(a, b, node.attrs);
  return conv_geometry_backward_weight(a, b, node.attrs);
}

ConvKind kind_of(const Node& node, ConvPass pass) {
  ConvKind kind;
  kind.pass = pass;
  if (is_bf16_compute(node.attrs)) kind.operands = DataType::bf16;
  kind.bias = pass == ConvPass::forward && node.inputs.size() == 3;
  kind.activation = fused_activation(node.attrs);
  return kind;
}

std::optional<ConvPlan> plan_conv(const Graph& g, const Node& node, ConvPass pass) {
  if (!all_f32(g, node)) return std::nullopt;
  ConvPlan p;
  p.geo = geometry_of(g, node, pass);
  p.kind = kind_of(node, pass);
  p.bias = pass != ConvPass::backward_weight && node.inputs.size() == 3;
  const ConvGeometry& geo = p.geo;
  if (pass != ConvPass::forward && !p.kind.activation.empty()) return std::nullopt;  // only forwards fuse
  for (int i = 0; i < 3; ++i)
    if (geo.pad_begin[i] < 0 || geo.pad_end[i] < 0) return std::nullopt;
  if (geo.batch < 1 || !worth_it(geo, pass)) return std::nullopt;
  p.grain = std::clamp<int64_t>((kPieceMacs + image_macs(geo) - 1) / std::max<int64_t>(1, image_macs(geo)), 1,
                                geo.batch);
  if (pass == ConvPass::backward_weight)
    p.grain = std::max(p.grain, (geo.batch + kMaxWeightPieces - 1) / kMaxWeightPieces);
  p.images[0] = p.grain;
  p.images[1] = geo.batch % p.grain;
  // Every piece size shares one weights layout (one reorder per run; partial gradients add up).
  std::optional<dnnl::primitive_desc> full =
      try_pd([&] { return pass_pd(geo, p.kind, p.images[0], any_weights(geo, p.kind)); });
  if (!full || !direct_impl(*full)) return std::nullopt;
  p.pds[0] = *full;
  if (p.images[1] > 0) {
    const MemDesc w = weights_md(*full, pass);
    std::optional<dnnl::primitive_desc> rest = try_pd([&] { return pass_pd(geo, p.kind, p.images[1], w); });
    if (!rest || !direct_impl(*rest)) return std::nullopt;
    p.pds[1] = *rest;
  }
  return p;
}

// ---- prepared state -----------------------------------------------------------------------------

// One piece size: its staged operands and the convolution. in_a / out are the activations read and
// written per image (forward: x, y; backward data: dy, dx); backward weights reads x (in_a) and dy
// (in_b) and writes a partial gradient.
struct PieceKind {
  Staged in_a, in_b, out;
  Step conv;
};

struct ConvState {
  ConvPlan plan;
  PieceKind kinds[2];
  Staged weights;  // forward / backward data: plain -> blocked; backward weights: blocked sum -> plain
  std::size_t weights_bytes = 0;   // blocked weights at the start of the workspace (0: read in place)
  std::size_t partial_bytes = 0;   // backward weights: one partial gradient per piece
  std::size_t piece_offset = 0, piece_stride = 0;  // where the slots' regions start, and their size
  std::size_t off_b = 0, off_out = 0, off_scratch = 0;  // within a piece's region (in_a at 0)
};

PieceKind make_kind(const ConvPlan& p, const dnnl::primitive_desc& pd, int64_t n) {
  const ConvGeometry& g = p.geo;
  const MemDesc x = f32_dense(src_dims(g, n)), y = f32_dense(dst_dims(g, n));
  PieceKind k;
  auto md = [&](int arg) { return pd.query_md(dnnl::query::exec_arg_md, arg); };
  switch (p.kind.pass) {
    case ConvPass::forward:
      k.in_a = make_staged(x, md(DNNL_ARG_SRC), true);
      k.out = make_staged(y, md(DNNL_ARG_DST), false);
      k.conv = p.bias ? make_step(pd, {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST})
                      : make_step(pd, {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST});
      break;
    case ConvPass::backward_data:
      k.in_a = make_staged(y, md(DNNL_ARG_DIFF_DST), true);
      k.out = make_staged(x, md(DNNL_ARG_DIFF_SRC), false);
      k.conv = make_step(pd, {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC});
      break;
    case ConvPass::backward_weight:
      k.in_a = make_staged(x, md(DNNL_ARG_SRC), true);
      k.in_b = make_staged(y, md(DNNL_ARG_DIFF_DST), true);
      k.conv = make_step(pd, {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS});
      break;
  }
  return k;
}

PreparedNode prepare_conv(const Graph& g, const Node& node, ConvPass pass) {
  std::optional<ConvPlan> plan = plan_conv(g, node, pass);
  if (!plan) throw_runtime_error("onednn: node ", op_name(node), " is no longer supported at prepare time");
  auto s = std::make_shared<ConvState>();
  s->plan = *plan;
  const bool bwd_w = pass == ConvPass::backward_weight;
  const MemDesc w_blocked = weights_md(plan->pds[0], pass);
  s->weights = make_staged(f32_dense(weight_dims(plan->geo)), w_blocked, !bwd_w);
  std::size_t scratch = s->weights.reorder.defined() ? s->weights.reorder.scratch_bytes : 0;
  std::size_t a_bytes = 0, b_bytes = 0, out_bytes = 0;
  for (int i = 0; i < 2; ++i) {
    if (!plan->pds[i]) continue;
    PieceKind& k = s->kinds[i] = make_kind(*plan, plan->pds[i], plan->images[i]);
    a_bytes = std::max(a_bytes, k.in_a.bytes);
    b_bytes = std::max(b_bytes, k.in_b.bytes);
    out_bytes = std::max(out_bytes, k.out.bytes);
    scratch = std::max(scratch, max_scratch({&k.in_a.reorder, &k.in_b.reorder, &k.conv, &k.out.reorder}));
  }
  if (bwd_w) s->partial_bytes = out_bytes = w_blocked.get_size();
  else s->weights_bytes = aligned_bytes(s->weights.bytes);
  s->off_b = aligned_bytes(a_bytes);
  s->off_out = s->off_b + aligned_bytes(b_bytes);
  s->off_scratch = s->off_out + aligned_bytes(out_bytes);
  s->piece_offset = s->weights_bytes;
  s->piece_stride = s->off_scratch + aligned_bytes(scratch);
  const std::size_t workspace = s->piece_offset + s->piece_stride * static_cast<std::size_t>(plan->slots());
  return {std::move(s), workspace};
}

// ---- execution ----------------------------------------------------------------------------------

char* region_of(const KernelArgs& a, const ConvState& s, int64_t slot) {
  return static_cast<char*>(a.workspace) + s.piece_offset + slot * s.piece_stride;
}

// Adds the bias of a transposed convolution to `n` plain images.
void add_bias(float* y, const float* b, int64_t n, int64_t channels, int64_t volume) {
  for (int64_t i = 0; i < n * channels; ++i)
    Eigen::Map<Eigen::ArrayXf>(y + i * volume, volume) += b[i % channels];
}

void run_piece(const KernelArgs& a, const ConvState& s, int64_t piece, int64_t slot) {
  const ConvPlan& p = s.plan;
  const int64_t n0 = piece * p.grain;
  const bool rest = p.geo.batch - n0 < p.grain;
  const PieceKind& k = s.kinds[rest];
  const int64_t n = p.images[rest];
  char* r = region_of(a, s, slot);
  void* scratch = r + s.off_scratch;
  auto batched = [&](const TensorRef& t, int64_t image_bytes) { return static_cast<char*>(t.data) + n0 * image_bytes; };
  auto blocked = [&](const Staged& t, void* plain, std::size_t off) -> void* { return t.in_place() ? plain : r + off; };
  const int64_t xb = x_image_bytes(p.geo), yb = y_image_bytes(p.geo);
  if (p.kind.pass == ConvPass::backward_weight) {
    void *x = batched(a.in[0], xb), *dy = batched(a.in[1], yb);
    void *src = blocked(k.in_a, x, 0), *diff_dst = blocked(k.in_b, dy, s.off_b);
    run_staged(k.in_a, x, src, scratch);
    run_staged(k.in_b, dy, diff_dst, scratch);
    run_step(k.conv, {src, diff_dst, r + s.off_out}, scratch);
    return;
  }
  const bool fwd = p.kind.pass == ConvPass::forward;
  void* in = batched(a.in[0], fwd ? xb : yb);
  void* out = batched(a.out[0], fwd ? yb : xb);
  void *src = blocked(k.in_a, in, 0), *dst = blocked(k.out, out, s.off_out);
  void* w = s.weights.in_place() ? a.in[1].data : a.workspace;
  run_staged(k.in_a, in, src, scratch);
  if (fwd && p.bias) run_step(k.conv, {src, w, a.in[2].data, dst}, scratch);
  else run_step(k.conv, {src, w, dst}, scratch);
  run_staged(k.out, dst, out, scratch);
  if (!fwd && p.bias) add_bias(static_cast<float*>(out), a.in[2].ptr<float>(), n, p.geo.channels, p.geo.in_volume());
}

// Adds the partial weight gradients of pieces 1.. into piece 0's, in piece order for every element
// (piece i ran in slot i).
void sum_partials(const KernelArgs& a, const ConvState& s) {
  const int64_t pieces = s.plan.pieces(), numel = static_cast<int64_t>(s.partial_bytes / sizeof(float));
  auto body = [&](int64_t c0, int64_t c1) {
    const int64_t i0 = c0 * kSumGrain, i1 = std::min(numel, c1 * kSumGrain);
    float* acc = reinterpret_cast<float*>(region_of(a, s, 0) + s.off_out);
    for (int64_t piece = 1; piece < pieces; ++piece) {
      const float* part = reinterpret_cast<const float*>(region_of(a, s, piece) + s.off_out);
      for (int64_t i = i0; i < i1; ++i) acc[i] += part[i];
    }
  };
  const int64_t chunks = (numel + kSumGrain - 1) / kSumGrain;
  if (pieces <= 1) return;
  if (chunks <= 1 || a.exec.num_workers() <= 1) return body(0, chunks);
  const auto* b = &body;
  a.exec.parallel_for(chunks, [b](int64_t c0, int64_t c1) { (*b)(c0, c1); });
}

// Slot k runs pieces k, k + slots, ... in order.
void run_slot(const KernelArgs& a, const ConvState& s, int64_t slot) {
  for (int64_t piece = slot; piece < s.plan.pieces(); piece += s.plan.slots()) run_piece(a, s, piece, slot);
}

void run_pieces(const KernelArgs& a, const ConvState& s) {
  const int64_t slots = s.plan.slots();
  if (slots <= 1 || a.exec.num_workers() <= 1) {
    for (int64_t k = 0; k < slots; ++k) run_slot(a, s, k);
    return;
  }
  // One captured pointer keeps the std::function inside its small buffer: no allocation per call.
  struct Job {
    const KernelArgs& a;
    const ConvState& s;
  } job{a, s};
  const Job* j = &job;
  a.exec.parallel_for(slots, [j](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) run_slot(j->a, j->s, k);
  });
}

void conv_kernel(const KernelArgs& a) {
  const auto& s = *static_cast<const ConvState*>(a.state);
  void* scratch0 = region_of(a, s, 0) + s.off_scratch;  // free while no piece runs
  if (s.plan.kind.pass != ConvPass::backward_weight) {
    run_staged(s.weights, a.in[1].data, a.workspace, scratch0);
    run_pieces(a, s);
    return;
  }
  run_pieces(a, s);
  sum_partials(a, s);
  void* sum = region_of(a, s, 0) + s.off_out;
  if (s.weights.in_place()) std::memcpy(a.out[0].data, sum, s.partial_bytes);
  else run_staged(s.weights, sum, a.out[0].data, scratch0);
}

template <ConvPass pass>
bool accepts(const Graph& g, const Node& node) {
  return plan_conv(g, node, pass).has_value();
}

template <ConvPass pass>
PreparedNode prepare(const Graph& g, const Node& node) {
  return prepare_conv(g, node, pass);
}

template <ConvPass pass>
OpEntry entry(const char* op) {
  OpEntry e;
  e.op = op;
  e.accepts = &accepts<pass>;
  e.prepare = &prepare<pass>;
  e.kernel = &conv_kernel;
  return e;
}

}  // namespace

std::vector<OpEntry> conv_entries() {
  return {entry<ConvPass::forward>("conv"), entry<ConvPass::backward_data>("conv_backward_data"),
          entry<ConvPass::backward_weight>("conv_backward_weight")};
}

}  // namespace treadle::onednn

// Pooling on oneDNN's pooling primitives (jit:avx512_core here; plain NCHW/NCDHW is handled by
// oneDNN itself, which transposes internally), float32, 1 to 3 spatial dims. Planes are independent
// and a block of consecutive planes of one sample is itself a plain (1, block, *spatial) tensor, so
// the input is viewed as (N * C / block, block, *spatial) and pieces are fixed runs of those items,
// about 2^16 input elements each, also when one sample is larger than that (64 x 56 x 56: 200k).
// oneDNN's plain-layout kernels transpose each piece through their scratchpad (300 KB for such a
// piece); for_each_tile lets the pieces of one worker reuse one scratchpad.
//   max_pool          forward_training: oneDNN's workspace holds, per output, the position of the
//                     window's maximum as a u8 offset in (kd, kh, kw) scan order; each piece turns
//                     it into the op's int64 index (plane offset of that input element) through
//                     tables built at prepare time. Ties go to the first maximum in scan order, as in
//                     Eigen and PyTorch (checked). oneDNN never lets a NaN win its window (the op does)
//                     and gives a window of -inf values -FLT_MAX (measured), so a piece whose input
//                     holds a NaN or -inf runs the op's own rule (a scalar loop, as in the reference).
//   avg_pool and      count_include_pad = False (divisor: the window's elements inside the input) and
//   avg_pool_backward count_include_pad = True where no window reaches past the input's right
//                     padding (ceil mode can make it do so: there PyTorch's divisor is clipped,
//                     oneDNN's is not); no divisor_override.
//   adaptive_avg_pool where every input size is a multiple of the output size (then it is an
//   and its backward  avg_pool with kernel = stride = input / output), windows of up to 256 taps.
// What stays on Eigen (docs/onednn_ops.md, "Pooling and normalisation"): max_pool_backward (it takes
// the int64 indices, not oneDNN's workspace, and Eigen's scatter is already at memory speed), other
// adaptive pools, float64, and small inputs (thresholds below, measured).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/onednn/onednn_common.hpp"
#include "ops/conv_geometry.hpp"

namespace treadle::onednn {
namespace {

using dnnl::algorithm;

constexpr int64_t kElementGrain = int64_t{1} << 16;  // input elements per piece
// Input elements from which oneDNN wins (bench/onednn_norm_pool.py and a predict sweep, one core, CPU
// time): max_pool 2x2 0.86x of Eigen's speed at 512 elements, 1.5x at 1024 (3x3 windows, which Eigen
// runs ~10x slower than 2x2, win from 256: 3.9x); avg_pool 1.2x at 256, 1.6x at 512 (backward 2.1x).
constexpr int64_t kMinMaxElements = 1024;
// Windows of up to 4 taps (1x2, 2x2, ...), which Eigen runs on specialised paths, only up to this
// size: on 8 x 64 x 56 x 56 (1.6M elements) a 2x2 max pool ran at 0.86-0.97x of Eigen's speed and
// the training step of a 1x1 convolution + that pool took 5.88 ms against Eigen's 5.83 (oneDNN's
// transposes through memory; 3x3 windows there: 5.3x, and 5.73 ms against 10.15).
constexpr int64_t kMaxSmallWindowElements = int64_t{1} << 20;
constexpr int64_t kMinAvgElements = 512;
// adaptive_avg_pool as an avg_pool: global pooling of 8 x 64 x S x S ran at 2.8x Eigen's speed for
// S = 7, 1.8x for 14, 1.16x for 16, 0.94x for 28 and 0.73x for 56 (Eigen sums long rows vectorised).
constexpr int64_t kMaxAdaptiveTaps = 256;
constexpr std::size_t kMaxPoolArgs = 3;              // arguments of a pooling primitive (max: src, dst, workspace)

// Those crossovers are oneDNN's AVX-512 kernels (Xeon). With its AVX2 ones (avx2_kernels_lose;
// AMD EPYC Zen 3, bench/onednn_norm_pool.py, one core) pooling on plain layouts loses to Eigen:
// max_pool at 0.12-0.34x of Eigen's speed from 8 x 8 x 16 x 16 up (a tie at 8 x 64 x 56 x 56, 2x2),
// avg_pool forward 0.70-0.96x (1.06x excluding padding), adaptive_avg_pool forward 0.31-0.88x and
// its global backward 0.46-0.73x. avg_pool_backward wins (1.07-1.45x; 0.90-0.97x at batch 64) and
// stays, as does the adaptive backward over windows of up to 4 taps (14 -> 7: 1.42x).
constexpr int64_t kNarrowAdaptiveBackwardTaps = 4;

// oneDNN's view of a pooling: items of `c` planes (src/dst dims (items, c, spatial)) and the window.
struct PoolDims {
  PoolGeometry g;
  int64_t n = 0, c = 0;  // items, planes per item
  Dims strides, kernel, dilation, pad_l, pad_r;
  bool reaches_right_pad = false;  // some window extends past the input's right padding

  Dims src(int64_t batch) const { return with_spatial(batch, g.in); }
  Dims dst(int64_t batch) const { return with_spatial(batch, g.out); }
  int64_t grain() const { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, c * g.in_volume())); }

 private:
  Dims with_spatial(int64_t batch, const Dims3& s) const {
    Dims d{batch, c};
    d.insert(d.end(), s.begin() + (3 - g.nd), s.end());
    return d;
  }
};

// `x` is the pooled input's shape. oneDNN's right padding makes its output size PyTorch's (ceil mode
// included); its dilation counts the gaps (PyTorch's minus one).
PoolDims pool_dims(const char* kind, const Shape& x, const Attrs& attrs, bool dilation) {
  PoolDims p;
  p.g = pool_geometry(kind, x, attrs, dilation);
  // The largest block of channels (a divisor of C) within the piece size; all of C when it fits.
  p.c = 1;
  for (int64_t b = x[1]; b >= 1; --b)
    if (x[1] % b == 0 && (b * p.g.in_volume() <= kElementGrain || b == 1)) {
      p.c = b;
      break;
    }
  p.n = p.g.planes / p.c;
  for (int i = 3 - p.g.nd; i < 3; ++i) {
    const PoolGeometry& g = p.g;
    const int64_t span = (g.kernel[i] - 1) * g.dilation[i] + 1;
    const int64_t needed = (g.out[i] - 1) * g.stride[i] + span - g.in[i] - g.pad[i];
    p.strides.push_back(g.stride[i]);
    p.kernel.push_back(g.kernel[i]);
    p.dilation.push_back(g.dilation[i] - 1);
    p.pad_l.push_back(g.pad[i]);
    p.pad_r.push_back(std::max(g.pad[i], needed));
    p.reaches_right_pad = p.reaches_right_pad || needed > g.pad[i];
  }
  return p;
}

dnnl::pooling_forward::primitive_desc forward_pd(const PoolDims& p, int64_t batch, algorithm alg,
                                                 dnnl::prop_kind prop) {
  return dnnl::pooling_forward::primitive_desc(cpu_engine(), prop, alg, f32_dense(p.src(batch)),
                                               f32_dense(p.dst(batch)), p.strides, p.kernel, p.dilation, p.pad_l,
                                               p.pad_r, default_attr());
}

bool f32_data(const Graph& g, const Node& node) {
  return g.info(node.inputs.at(0)).dtype == DType::f32 && g.info(node.outputs.at(0)).dtype == DType::f32;
}

// ---- avg_pool, avg_pool_backward, adaptive_avg_pool, adaptive_avg_pool_backward
std::optional<algorithm> avg_algorithm(const Node& node, const PoolDims& p) {
  if (node.attrs.i_or("divisor_override", 0) != 0) return std::nullopt;
  if (node.attrs.i_or("count_include_pad", 1) == 0) return algorithm::pooling_avg_exclude_padding;
  if (p.reaches_right_pad) return std::nullopt;
  return algorithm::pooling_avg_include_padding;
}

// The chunk plan of an average pooling, forward (x -> y) or backward (dy -> dx).
std::optional<ChunkPlan> plan_avg(const PoolDims& p, algorithm alg, bool backward) {
  const int64_t f = sizeof(float), in_step = p.c * p.g.in_volume() * f, out_step = p.c * p.g.out_volume() * f;
  std::vector<ArgSpec> args;
  if (backward)
    args = {{DNNL_ARG_DIFF_DST, false, 0, out_step}, {DNNL_ARG_DIFF_SRC, true, 0, in_step}};
  else
    args = {{DNNL_ARG_SRC, false, 0, in_step}, {DNNL_ARG_DST, true, 0, out_step}};
  return plan_chunks(args, p.n, p.grain(), [&](int64_t batch) {
    return try_pd([&]() -> dnnl::primitive_desc {
      if (!backward) return forward_pd(p, batch, alg, dnnl::prop_kind::forward_inference);
      return dnnl::pooling_backward::primitive_desc(
          cpu_engine(), alg, f32_dense(p.src(batch)), f32_dense(p.dst(batch)), p.strides, p.kernel, p.dilation,
          p.pad_l, p.pad_r, forward_pd(p, batch, alg, dnnl::prop_kind::forward_training), default_attr());
    });
  });
}

// avg_pool (x -> y) and avg_pool_backward (dy -> dx: the pooled input's shape is the output's).
std::optional<ChunkPlan> plan_avg_node(const Graph& g, const Node& node) {
  const bool backward = op_name(node) == "avg_pool_backward";
  const Shape& x = backward ? out_shape(g, node, 0) : in_shape(g, node, 0);
  if (!f32_data(g, node) || (shape_numel(x) < kMinAvgElements && size_thresholds_apply())) return std::nullopt;
  const PoolDims p = pool_dims("avg", x, node.attrs, false);
  const std::optional<algorithm> alg = avg_algorithm(node, p);
  if (!alg || (!backward && avx2_kernels_lose("average pooling"))) return std::nullopt;
  return plan_avg(p, *alg, backward);
}

// adaptive_avg_pool and its backward op where every input size is a multiple of the output size:
// PyTorch's windows [floor(o I/O), ceil((o+1) I/O)) are then those of an average pool with kernel =
// stride = I/O and no padding. Large windows stay on Eigen (kMaxAdaptiveTaps).
std::optional<ChunkPlan> plan_adaptive_node(const Graph& g, const Node& node) {
  const bool backward = op_name(node) == "adaptive_avg_pool_backward";
  const Shape& x = backward ? out_shape(g, node, 0) : in_shape(g, node, 0);
  const Shape& y = backward ? in_shape(g, node, 0) : out_shape(g, node, 0);
  if (!f32_data(g, node) || (shape_numel(x) < kMinAvgElements && size_thresholds_apply())) return std::nullopt;
  Shape window;
  int64_t taps = 1;
  for (std::size_t d = 2; d < x.size(); ++d) {
    if (x[d] % y[d] != 0) return std::nullopt;
    window.push_back(x[d] / y[d]);
    taps *= window.back();
  }
  if (taps > kMaxAdaptiveTaps) return std::nullopt;
  if ((!backward || taps > kNarrowAdaptiveBackwardTaps) && avx2_kernels_lose("adaptive average pooling"))
    return std::nullopt;
  const Attrs attrs{{"kernel_size", window}, {"stride", window}};
  return plan_avg(pool_dims("avg", x, attrs, false), algorithm::pooling_avg_exclude_padding, backward);
}

// ---- max_pool: x -> (y, int64 indices)
// Prepared state: the primitives, and the tables that turn oneDNN's window offsets into indices:
// index = window_start[o] + tap_offset[offset] (window_start may be negative: padding).
struct MaxPoolState {
  PreparedNode chunks;
  PoolGeometry g;
  std::vector<int64_t> window_start, tap_offset;
};

std::optional<ChunkPlan> plan_max(const Graph& g, const Node& node) {
  if (!f32_data(g, node) || (shape_numel(in_shape(g, node, 0)) < kMinMaxElements && size_thresholds_apply()))
    return std::nullopt;
  const PoolDims p = pool_dims("max", in_shape(g, node, 0), node.attrs, true);
  const int64_t taps = p.g.kernel[0] * p.g.kernel[1] * p.g.kernel[2];
  if (taps > 256) return std::nullopt;  // the offsets must fit oneDNN's u8 workspace
  if (taps <= 4 && shape_numel(in_shape(g, node, 0)) > kMaxSmallWindowElements) return std::nullopt;
  if (avx2_kernels_lose("max pooling")) return std::nullopt;
  const int64_t f = sizeof(float), ov = p.c * p.g.out_volume();
  // The workspace (u8 offsets, laid out like y) lives at the start of the node's workspace.
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, p.c * p.g.in_volume() * f},
                               {DNNL_ARG_DST, true, 0, ov * f},
                               {DNNL_ARG_WORKSPACE, false, 0, ov, 0, 0}};
  std::optional<ChunkPlan> plan = plan_chunks(args, p.n, p.grain(), [&](int64_t batch) {
    return try_pd([&]() -> std::optional<dnnl::primitive_desc> {
      auto pd = forward_pd(p, batch, algorithm::pooling_max, dnnl::prop_kind::forward_training);
      const Dims dst = p.dst(batch);
      Dims strides(dst.size(), 1);
      for (int d = static_cast<int>(dst.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * dst[d + 1];
      if (pd.workspace_desc() != plain_desc(dst, strides, dnnl::memory::data_type::u8)) return std::nullopt;
      return pd;
    });
  });
  if (plan) plan->staging_bytes = static_cast<std::size_t>(round_up(p.n * ov, 64));
  return plan;
}

bool accepts_max(const Graph& g, const Node& node) { return plan_max(g, node).has_value(); }

PreparedNode prepare_max(const Graph& g, const Node& node) {
  auto s = std::make_shared<MaxPoolState>();
  s->chunks = make_prepared(*plan_max(g, node));
  s->g = pool_geometry("max", in_shape(g, node, 0), node.attrs, true);
  const PoolGeometry& pg = s->g;
  for (int64_t od = 0; od < pg.out[0]; ++od)
    for (int64_t oh = 0; oh < pg.out[1]; ++oh)
      for (int64_t ow = 0; ow < pg.out[2]; ++ow)
        s->window_start.push_back(((od * pg.stride[0] - pg.pad[0]) * pg.in[1] + oh * pg.stride[1] - pg.pad[1]) *
                                      pg.in[2] +
                                  ow * pg.stride[2] - pg.pad[2]);
  for (int64_t kd = 0; kd < pg.kernel[0]; ++kd)
    for (int64_t kh = 0; kh < pg.kernel[1]; ++kh)
      for (int64_t kw = 0; kw < pg.kernel[2]; ++kw)
        s->tap_offset.push_back((kd * pg.dilation[0] * pg.in[1] + kh * pg.dilation[1]) * pg.in[2] +
                                kw * pg.dilation[2]);
  const std::size_t workspace = s->chunks.workspace;
  return {std::move(s), workspace};
}

// True when x[0, n) holds a NaN or -inf (the values oneDNN's max pooling does not treat as the op).
// On the bits, in blocks: integer compares vectorise (a float compare here compiled to scalar code
// that cost more than the pooling itself).
bool has_nan_or_neg_inf(const float* x, int64_t n) {
  constexpr uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u, kNegInf = 0xff800000u;
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    uint32_t found = 0;
    for (int64_t i = b, e = std::min(n, b + kBlock); i < e; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(x[i]);
      found |= static_cast<uint32_t>((u & kAbs) > kInf) | static_cast<uint32_t>(u == kNegInf);
    }
    if (found) return true;
  }
  return false;
}

// The op's rule for one plane: the first maximum in scan order, a NaN wins (the last one seen).
void max_pool_plane(const PoolGeometry& g, const float* x, float* y, int64_t* idx) {
  int64_t o = 0;
  for (int64_t od = 0; od < g.out[0]; ++od)
    for (int64_t oh = 0; oh < g.out[1]; ++oh)
      for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
        const int64_t start[3] = {od * g.stride[0] - g.pad[0], oh * g.stride[1] - g.pad[1],
                                  ow * g.stride[2] - g.pad[2]};
        float best = -std::numeric_limits<float>::infinity();
        int64_t arg = -1;
        for (int64_t kd = 0; kd < g.kernel[0]; ++kd)
          for (int64_t kh = 0; kh < g.kernel[1]; ++kh)
            for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
              const int64_t i[3] = {start[0] + kd * g.dilation[0], start[1] + kh * g.dilation[1],
                                    start[2] + kw * g.dilation[2]};
              if (i[0] < 0 || i[0] >= g.in[0] || i[1] < 0 || i[1] >= g.in[1] || i[2] < 0 || i[2] >= g.in[2]) continue;
              const int64_t at = (i[0] * g.in[1] + i[1]) * g.in[2] + i[2];
              const float v = x[at];
              if (arg < 0 || v > best || std::isnan(v)) best = v, arg = at;
            }
        y[o] = best;
        idx[o] = arg;
      }
}

// Runs tile t with the scratchpad of `region` (see for_each_tile).
void run_tile_in(const KernelArgs& a, const ChunkedPrimitive& s, int64_t t, int64_t region) {
  std::array<void*, kMaxPoolArgs + 1> overrides{};
  overrides[s.args.size()] = tile_scratch(a, s, region);
  run_tile(a, s, t, overrides.data());
}

void max_kernel(const KernelArgs& a) {
  const auto& st = *static_cast<const MaxPoolState*>(a.state);
  const auto& s = *static_cast<const ChunkedPrimitive*>(st.chunks.state.get());
  const PoolGeometry& g = st.g;
  const int64_t iv = g.in_volume(), ov = g.out_volume(), c = g.planes / std::max<int64_t>(1, s.split.rows);
  const float* x = a.in[0].ptr<float>();
  float* y = a.out[0].ptr<float>();
  int64_t* idx = a.out[1].ptr<int64_t>();
  const auto* offsets = static_cast<const uint8_t*>(a.workspace);
  const int64_t* start = st.window_start.data();
  const int64_t* tap = st.tap_offset.data();
  for_each_tile(a, s, [&](int64_t t, int64_t region) {
    const int64_t p0 = t * s.split.row_grain * c, p1 = std::min(s.split.rows, (t + 1) * s.split.row_grain) * c;
    if (has_nan_or_neg_inf(x + p0 * iv, (p1 - p0) * iv)) {
      for (int64_t p = p0; p < p1; ++p) max_pool_plane(g, x + p * iv, y + p * ov, idx + p * ov);
      return;
    }
    run_tile_in(a, s, t, region);
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* op = offsets + p * ov;
      int64_t* ip = idx + p * ov;
      for (int64_t o = 0; o < ov; ++o) ip[o] = start[o] + tap[op[o]];
    }
  });
}

// avg_pool and avg_pool_backward: the tiles, with shared scratchpads.
void avg_kernel(const KernelArgs& a) {
  const auto& s = *static_cast<const ChunkedPrimitive*>(a.state);
  for_each_tile(a, s, [&](int64_t t, int64_t region) { run_tile_in(a, s, t, region); });
}

bool accepts_avg(const Graph& g, const Node& node) { return plan_avg_node(g, node).has_value(); }
PreparedNode prepare_avg(const Graph& g, const Node& node) { return make_prepared(*plan_avg_node(g, node)); }
bool accepts_adaptive(const Graph& g, const Node& node) { return plan_adaptive_node(g, node).has_value(); }
PreparedNode prepare_adaptive(const Graph& g, const Node& node) {
  return make_prepared(*plan_adaptive_node(g, node));
}

}  // namespace

std::vector<OpEntry> pool_entries() {
  return {{"avg_pool", &accepts_avg, &prepare_avg, &avg_kernel},
          {"avg_pool_backward", &accepts_avg, &prepare_avg, &avg_kernel},
          {"adaptive_avg_pool", &accepts_adaptive, &prepare_adaptive, &avg_kernel},
          {"adaptive_avg_pool_backward", &accepts_adaptive, &prepare_adaptive, &avg_kernel},
          {"max_pool", &accepts_max, &prepare_max, &max_kernel}};
}

}  // namespace treadle::onednn

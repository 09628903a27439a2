// layer_norm, group_norm and their backward ops on oneDNN's layer_normalization primitives
// (jit:uni here), float32. The tensor is viewed as (rows, width) with width = the normalized
// trailing dims (group_norm: rows = (sample, group), width = C / G channels x spatial); fixed blocks
// of rows are the pieces. The forward's statistics are computed here, per row in double (two
// passes, as the Eigen reference), and oneDNN normalizes with them (use_global_stats): its own
// float32 statistics differ from the reference's by 1-2 ulp of the mean and 1.2e-7 of rstd, which
// the weight gradient of inputs with a large mean (N(100, 1)) amplifies past the 1e-5 contract
// (group_norm: 1 in 600 random inputs). The ops' statistics are (mean, rstd = 1/sqrt(var + eps))
// while oneDNN's are (mean, var), so the forward writes var into the rstd output and converts it after
// each piece, and the backward gives oneDNN var = 1/rstd^2 with eps = 0 (the backward op carries no eps;
// oneDNN then recomputes rstd from it), converted into the workspace before each piece. The
// backward's weight and bias gradients are per-piece partial sums (in the workspace), added in piece
// order in double afterwards: results never depend on the executor.
//
// What stays on Eigen (docs/onednn_ops.md, "Pooling and normalisation", has the numbers):
//   - batch_norm (training statistics): oneDNN sums the mean in float32 (plain layout: ncsp_bnorm;
//     blocked/nhwc: bnorm_jit), which on inputs with a large mean (N(100, 1)) misses the float64 mean
//     by 3e-4 to 4e-2, so y misses by as much: far outside the 1e-5 contract. Eigen sums in double.
//   - batch_norm_eval: Eigen's loop runs at 0.12 ns per element; oneDNN's plain-layout kernel at 0.9
//     (its fast kernels want nhwc or blocked layouts, and the reorders alone cost more than Eigen).
//   - rms_norm: oneDNN 3.2 has no primitive for it.
//   - small tensors (kMinElements) and float64.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kElementGrain = int64_t{1} << 16;  // elements per piece
// From here oneDNN wins (one core, CPU time): forward 0.87x of Eigen's speed at 512 elements (8 x 64),
// 1.4x at 1024 (16 x 64), 3.2x at 4096; a LayerNorm training step (forward and backward) 3.87 us on
// Eigen, 3.40 on oneDNN at 16 x 64, 12.5 / 6.4 at 64 x 64 (docs/onednn_ops.md has the table).
constexpr int64_t kMinElements = 1024;
constexpr std::size_t kAlign = 64;
constexpr std::size_t kMaxLayerNormArgs = 9;  // layer_norm_backward with a weight
constexpr int kLanes = 8;                     // partial sums of group_norm_backward's weight terms

using dnnl::normalization_flags;

// The (rows, width) view of input `x` of a layer_norm node (normalized_ndim trailing dims).
struct Rows {
  int64_t rows = 0, width = 1;
  int64_t grain() const { return std::max<int64_t>(1, kElementGrain / width); }
  int64_t step() const { return width * static_cast<int64_t>(sizeof(float)); }
};

std::optional<Rows> rows_if_supported(const Graph& g, const Node& node, int x) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& s = in_shape(g, node, x);
  const int64_t k = node.attrs.i("normalized_ndim"), numel = shape_numel(s);
  Rows r;
  for (std::size_t d = s.size() - static_cast<std::size_t>(k); d < s.size(); ++d) r.width *= s[d];
  if (r.width == 0 || (numel < kMinElements && size_thresholds_apply())) return std::nullopt;
  r.rows = numel / r.width;
  return r;
}

// group_norm's rows: (sample, group) blocks of C / G channels, contiguous in (N, C, *).
std::optional<Rows> group_rows_if_supported(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& s = in_shape(g, node, 0);
  const int64_t numel = shape_numel(s), rows = s[0] * node.attrs.i("num_groups");
  if (rows == 0 || (numel < kMinElements && size_thresholds_apply())) return std::nullopt;
  return Rows{rows, numel / rows};
}

normalization_flags flags_of(bool scale, bool shift, bool global_stats = false) {
  normalization_flags f = global_stats ? normalization_flags::use_global_stats : normalization_flags::none;
  if (scale) f = f | normalization_flags::use_scale;
  if (shift) f = f | normalization_flags::use_shift;
  return f;
}

float eps_of(const Node& node) { return static_cast<float>(node.attrs.f("eps")); }

dnnl::layer_normalization_forward::primitive_desc forward_pd(int64_t rows, int64_t width, float eps,
                                                             normalization_flags f) {
  const MemDesc md = f32_dense({rows, width});
  return dnnl::layer_normalization_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_training, md, md,
                                                           eps, f, default_attr());
}

const ChunkedPrimitive& prepared(const KernelArgs& a) { return *static_cast<const ChunkedPrimitive*>(a.state); }

// ---- layer_norm: (x, [weight, [bias]]) -> (y, mean, rstd), and group_norm (x, [weight, bias]) ->
// (y, mean, rstd): a layer norm of its (sample, group) rows without oneDNN's scale and shift (they
// are per channel, not per row element); each piece applies them after its execution.
std::optional<ChunkPlan> plan_forward(const Graph& g, const Node& node) {
  const bool group = op_name(node) == "group_norm";
  const std::optional<Rows> r = group ? group_rows_if_supported(g, node) : rows_if_supported(g, node, 0);
  if (!r) return std::nullopt;
  const bool scale = !group && node.inputs.size() > 1, shift = !group && node.inputs.size() > 2;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, r->step()},
                               {DNNL_ARG_DST, true, 0, r->step()},
                               {DNNL_ARG_MEAN, true, 1, sizeof(float)},        // ours, read by oneDNN
                               {DNNL_ARG_VARIANCE, true, 2, sizeof(float)}};  // var, turned into rstd
  if (scale) args.push_back({DNNL_ARG_SCALE, false, 1, 0});
  if (shift) args.push_back({DNNL_ARG_SHIFT, false, 2, 0});
  const float eps = eps_of(node);
  return plan_chunks(args, r->rows, r->grain(), [&](int64_t rows) {
    return try_pd(
        [&]() -> dnnl::primitive_desc { return forward_pd(rows, r->width, eps, flags_of(scale, shift, true)); });
  });
}

bool accepts_forward(const Graph& g, const Node& node) { return plan_forward(g, node).has_value(); }

PreparedNode prepare_forward(const Graph& g, const Node& node) { return make_prepared(*plan_forward(g, node)); }

// group_norm's per-channel affine on rows [r0, r1) of y (rows of `cg` channels of `spatial` values).
void group_affine(const KernelArgs& a, int64_t r0, int64_t r1, int64_t cg, int64_t spatial) {
  const int64_t groups = a.attrs().i("num_groups");
  const float *w = a.in[1].ptr<float>(), *b = a.in[2].ptr<float>();
  float* y = a.out[0].ptr<float>();
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t cc = 0; cc < cg; ++cc) {
      const int64_t c = (r % groups) * cg + cc;
      const float wc = w[c], bc = b[c];
      float* ys = y + (r * cg + cc) * spatial;
      for (int64_t i = 0; i < spatial; ++i) ys[i] = ys[i] * wc + bc;
    }
}

// Mean and variance of rows [r0, r1) of x (rows of `width`), in double with two passes of kLanes
// independent sums each (vectorisable, a fixed order), as the reference computes them.
void row_statistics(const float* x, int64_t width, int64_t r0, int64_t r1, float* mean, float* var) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * width;
    std::array<double, kLanes> acc{};
    int64_t i = 0;
    for (; i + kLanes <= width; i += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += row[i + k];
    for (int k = 0; i < width; ++i, ++k) acc[k] += row[i];
    const double m = std::accumulate(acc.begin(), acc.end(), 0.0) / static_cast<double>(width);
    acc.fill(0.0);
    for (i = 0; i + kLanes <= width; i += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += (row[i + k] - m) * (row[i + k] - m);
    for (int k = 0; i < width; ++i, ++k) acc[k] += (row[i] - m) * (row[i] - m);
    mean[r] = static_cast<float>(m);
    var[r] = static_cast<float>(std::accumulate(acc.begin(), acc.end(), 0.0) / static_cast<double>(width));
  }
}

void forward_kernel(const KernelArgs& a) {
  const ChunkedPrimitive& s = prepared(a);
  const double eps = a.attrs().f("eps");
  const float* x = a.in[0].ptr<float>();
  float* mean = a.out[1].ptr<float>();
  float* rstd = a.out[2].ptr<float>();
  const int64_t width = a.in[0].numel / s.split.rows;
  // group_norm with weight and bias: channels per row and values per channel
  const bool affine = a.attrs().has("num_groups") && a.num_in == 3;
  const int64_t cg = affine ? a.in[0].dim(1) / a.attrs().i("num_groups") : 1;
  const int64_t spatial = affine ? a.in[0].numel / (s.split.rows * cg) : 1;
  for_each_tile(a, s, [&](int64_t t, int64_t region) {
    const int64_t r0 = t * s.split.row_grain, r1 = std::min(s.split.rows, r0 + s.split.row_grain);
    row_statistics(x, width, r0, r1, mean, rstd);  // var in rstd's place until the tile has run
    std::array<void*, kMaxLayerNormArgs + 1> overrides{};
    overrides[s.args.size()] = tile_scratch(a, s, region);
    run_tile(a, s, t, overrides.data());
    for (int64_t r = r0; r < r1; ++r) rstd[r] = static_cast<float>(1.0 / std::sqrt(double{rstd[r]} + eps));
    if (affine) group_affine(a, r0, r1, cg, spatial);
  });
}

// ---- layer_norm_backward: (dy, x, mean, rstd, [weight]) -> (dx, [dweight, dbias])
// Workspace: var (rows floats), then per tile the partial dweight and dbias (2 x width floats each),
// then the tiles' scratchpads.
struct BackwardLayout {
  std::size_t var_bytes = 0, partial_bytes = 0;  // partial_bytes: per tile
  std::size_t total(int64_t tiles) const { return var_bytes + partial_bytes * static_cast<std::size_t>(tiles); }
};

BackwardLayout backward_layout(const Rows& r, bool weight) {
  BackwardLayout l;
  l.var_bytes = static_cast<std::size_t>(round_up(r.rows * static_cast<int64_t>(sizeof(float)), kAlign));
  if (weight) l.partial_bytes = static_cast<std::size_t>(round_up(2 * r.step(), kAlign));
  return l;
}

// Argument order: the weight-gradient arguments last (kDiffScale, kDiffShift), so that the kernel
// can point them at each tile's partial sums.
constexpr int kDiffScale = 7, kDiffShift = 8;

std::optional<ChunkPlan> plan_backward(const Graph& g, const Node& node) {
  const std::optional<Rows> r = rows_if_supported(g, node, 1);
  if (!r) return std::nullopt;
  const bool weight = node.inputs.size() > 4;
  // The partial weight and bias gradients take 2 x width floats per piece: with very wide rows (a
  // piece of one or a few rows) that would be up to twice the input, so such nodes stay on Eigen.
  const int64_t tiles = (r->rows + r->grain() - 1) / r->grain();
  if (weight && 2 * r->width * tiles > std::max(r->rows * r->width / 4, 16 * r->width)) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_DIFF_DST, false, 0, r->step()},
                               {DNNL_ARG_SRC, false, 1, r->step()},
                               {DNNL_ARG_MEAN, false, 2, sizeof(float)},
                               {DNNL_ARG_VARIANCE, false, 0, sizeof(float), 0, 0},  // staged at byte 0
                               {DNNL_ARG_DIFF_SRC, true, 0, r->step()}};
  if (weight) {
    // oneDNN's backward with use_shift asks for the shift although dx does not depend on it: the
    // weight stands in (read-only, same shape).
    args.push_back({DNNL_ARG_SCALE, false, 4, 0});
    args.push_back({DNNL_ARG_SHIFT, false, 4, 0});
    args.push_back({DNNL_ARG_DIFF_SCALE, true, 1, 0});  // replaced by the tile's partial sums
    args.push_back({DNNL_ARG_DIFF_SHIFT, true, 2, 0});
  }
  const float eps = 0.f;  // var = 1/rstd^2 already holds the forward's eps
  const normalization_flags f = flags_of(weight, weight);
  const dnnl::prop_kind prop = weight ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data;
  std::optional<ChunkPlan> plan = plan_chunks(args, r->rows, r->grain(), [&](int64_t rows) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc md = f32_dense({rows, r->width});
      return dnnl::layer_normalization_backward::primitive_desc(cpu_engine(), prop, md, md, md, eps, f,
                                                                forward_pd(rows, r->width, eps, f), default_attr());
    });
  });
  if (plan) plan->staging_bytes = backward_layout(*r, weight).total(plan->split.row_tiles());
  return plan;
}

bool accepts_backward(const Graph& g, const Node& node) { return plan_backward(g, node).has_value(); }

PreparedNode prepare_backward(const Graph& g, const Node& node) { return make_prepared(*plan_backward(g, node)); }

// dweight and dbias: the tiles' partial sums added in tile order, in double.
void sum_partials(const KernelArgs& a, const ChunkedPrimitive& s, const BackwardLayout& l, int64_t width) {
  const char* base = static_cast<const char*>(a.workspace) + l.var_bytes;
  float *dw = a.out[1].ptr<float>(), *db = a.out[2].ptr<float>();
  for (int64_t j = 0; j < width; ++j) {
    double sw = 0, sb = 0;
    for (int64_t t = 0; t < s.split.tiles(); ++t) {
      const auto* p = reinterpret_cast<const float*>(base + static_cast<std::size_t>(t) * l.partial_bytes);
      sw += p[j];
      sb += p[width + j];
    }
    dw[j] = static_cast<float>(sw);
    db[j] = static_cast<float>(sb);
  }
}

void backward_kernel(const KernelArgs& a) {
  const ChunkedPrimitive& s = prepared(a);
  const bool weight = a.num_in > 4;
  const int64_t width = a.in[1].numel / std::max<int64_t>(1, s.split.rows);
  const BackwardLayout l = backward_layout(Rows{s.split.rows, width}, weight);
  const float* rstd = a.in[3].ptr<float>();
  auto* var = static_cast<float*>(a.workspace);
  for_each_tile(a, s, [&](int64_t t, int64_t region) {
    const int64_t r0 = t * s.split.row_grain, r1 = std::min(s.split.rows, r0 + s.split.row_grain);
    for (int64_t r = r0; r < r1; ++r) {
      const double rs = rstd[r];
      var[r] = static_cast<float>(1.0 / (rs * rs));
    }
    std::array<void*, kMaxLayerNormArgs + 1> overrides{};
    overrides[s.args.size()] = tile_scratch(a, s, region);
    if (weight) {
      auto* partial = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + l.var_bytes +
                                               static_cast<std::size_t>(t) * l.partial_bytes);
      overrides[kDiffScale] = partial;
      overrides[kDiffShift] = partial + width;
    }
    run_tile(a, s, t, overrides.data());
  });
  if (weight) sum_partials(a, s, l, width);
}

// ---- group_norm_backward: (dy, x, mean, rstd, [weight]) -> (dx, [dweight, dbias])
// dx is the layer-norm backward (no scale) of g = dy * weight[c] over the (sample, group) rows: the
// same formula as the reference's. With a weight, each piece first writes its g into the workspace
// and its per-(sample, channel) sums of dy * xhat and dy (double); dweight and dbias add them over
// the samples in order afterwards. Workspace: var (rows floats), g (the input's size), the sums
// (N x C x 2 doubles), then the tiles' scratchpads.
struct GroupLayout {
  std::size_t var_bytes = 0, g_bytes = 0, sums_bytes = 0;
  std::size_t g_offset() const { return var_bytes; }
  std::size_t sums_offset() const { return var_bytes + g_bytes; }
};

GroupLayout group_layout(const Rows& r, int64_t n, int64_t c, bool weight) {
  GroupLayout l;
  l.var_bytes = static_cast<std::size_t>(round_up(r.rows * static_cast<int64_t>(sizeof(float)), kAlign));
  if (!weight) return l;
  l.g_bytes = static_cast<std::size_t>(round_up(r.rows * r.step(), kAlign));
  l.sums_bytes = static_cast<std::size_t>(n * c * 2) * sizeof(double);
  return l;
}

std::optional<ChunkPlan> plan_group_backward(const Graph& g, const Node& node) {
  const std::optional<Rows> r = group_rows_if_supported(g, node);
  if (!r) return std::nullopt;
  const bool weight = node.inputs.size() > 4;
  const Shape& x = in_shape(g, node, 1);
  const GroupLayout l = group_layout(*r, x[0], x[1], weight);
  const int64_t staged_g = weight ? static_cast<int64_t>(l.g_offset()) : -1;
  std::vector<ArgSpec> args = {{DNNL_ARG_DIFF_DST, false, 0, r->step(), 0, staged_g},
                               {DNNL_ARG_SRC, false, 1, r->step()},
                               {DNNL_ARG_MEAN, false, 2, sizeof(float)},
                               {DNNL_ARG_VARIANCE, false, 0, sizeof(float), 0, 0},  // staged at byte 0
                               {DNNL_ARG_DIFF_SRC, true, 0, r->step()}};
  std::optional<ChunkPlan> plan = plan_chunks(args, r->rows, r->grain(), [&](int64_t rows) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc md = f32_dense({rows, r->width});
      return dnnl::layer_normalization_backward::primitive_desc(
          cpu_engine(), dnnl::prop_kind::backward_data, md, md, md, 0.f, normalization_flags::none,
          forward_pd(rows, r->width, 0.f, normalization_flags::none), default_attr());
    });
  });
  if (plan) plan->staging_bytes = l.var_bytes + l.g_bytes + l.sums_bytes;
  return plan;
}

bool accepts_group_backward(const Graph& g, const Node& node) { return plan_group_backward(g, node).has_value(); }

PreparedNode prepare_group_backward(const Graph& g, const Node& node) {
  return make_prepared(*plan_group_backward(g, node));
}

// Rows [r0, r1): g = dy * weight[c] into the workspace, and the per-(sample, channel) sums.
void group_weight_terms(const KernelArgs& a, const GroupLayout& l, int64_t r0, int64_t r1, int64_t cg,
                        int64_t spatial) {
  const int64_t groups = a.attrs().i("num_groups"), channels = a.in[1].dim(1);
  const float *dy = a.in[0].ptr<float>(), *x = a.in[1].ptr<float>(), *mean = a.in[2].ptr<float>();
  const float *rstd = a.in[3].ptr<float>(), *w = a.in[4].ptr<float>();
  auto* gbuf = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + l.g_offset());
  auto* sums = reinterpret_cast<double*>(static_cast<char*>(a.workspace) + l.sums_offset());
  for (int64_t r = r0; r < r1; ++r) {
    const double m = mean[r], rs = rstd[r];
    for (int64_t cc = 0; cc < cg; ++cc) {
      const int64_t c = (r % groups) * cg + cc, o = (r * cg + cc) * spatial;
      const float wc = w[c];
      for (int64_t i = 0; i < spatial; ++i) gbuf[o + i] = dy[o + i] * wc;
      // kLanes independent double sums (vectorisable, a fixed order), added up at the end
      std::array<double, kLanes> sw{}, sb{};
      int64_t i = 0;
      for (; i + kLanes <= spatial; i += kLanes)
        for (int k = 0; k < kLanes; ++k) {
          const double d = dy[o + i + k];
          sw[k] += d * ((x[o + i + k] - m) * rs);
          sb[k] += d;
        }
      for (int k = 0; i < spatial; ++i, ++k) {
        sw[k] += dy[o + i] * ((x[o + i] - m) * rs);
        sb[k] += dy[o + i];
      }
      const int64_t n = r / groups;
      sums[2 * (n * channels + c)] = std::accumulate(sw.begin(), sw.end(), 0.0);
      sums[2 * (n * channels + c) + 1] = std::accumulate(sb.begin(), sb.end(), 0.0);
    }
  }
}

void group_backward_kernel(const KernelArgs& a) {
  const ChunkedPrimitive& s = prepared(a);
  const bool weight = a.num_in > 4;
  const int64_t n = a.in[1].dim(0), channels = a.in[1].dim(1), groups = a.attrs().i("num_groups");
  const int64_t cg = channels / groups, spatial = a.in[1].numel / std::max<int64_t>(1, n * channels);
  const GroupLayout l = group_layout(Rows{s.split.rows, cg * spatial}, n, channels, weight);
  const float* rstd = a.in[3].ptr<float>();
  auto* var = static_cast<float*>(a.workspace);
  for_each_tile(a, s, [&](int64_t t, int64_t region) {
    const int64_t r0 = t * s.split.row_grain, r1 = std::min(s.split.rows, r0 + s.split.row_grain);
    for (int64_t r = r0; r < r1; ++r) var[r] = static_cast<float>(1.0 / (double{rstd[r]} * rstd[r]));
    if (weight) group_weight_terms(a, l, r0, r1, cg, spatial);
    std::array<void*, kMaxLayerNormArgs + 1> overrides{};
    overrides[s.args.size()] = tile_scratch(a, s, region);
    run_tile(a, s, t, overrides.data());
  });
  if (!weight) return;
  const auto* sums = reinterpret_cast<const double*>(static_cast<const char*>(a.workspace) + l.sums_offset());
  float *dw = a.out[1].ptr<float>(), *db = a.out[2].ptr<float>();
  for (int64_t c = 0; c < channels; ++c) {
    double sw = 0, sb = 0;
    for (int64_t i = 0; i < n; ++i) {
      sw += sums[2 * (i * channels + c)];
      sb += sums[2 * (i * channels + c) + 1];
    }
    dw[c] = static_cast<float>(sw);
    db[c] = static_cast<float>(sb);
  }
}

}  // namespace

std::vector<OpEntry> norm_entries() {
  return {{"layer_norm", &accepts_forward, &prepare_forward, &forward_kernel},
          {"group_norm", &accepts_forward, &prepare_forward, &forward_kernel},
          {"layer_norm_backward", &accepts_backward, &prepare_backward, &backward_kernel},
          {"group_norm_backward", &accepts_group_backward, &prepare_group_backward, &group_backward_kernel}};
}

}  // namespace treadle::onednn

// Convolutions (1-d, 2-d, 3-d; stride, padding, dilation, groups) on oneDNN's convolution
// primitives, in treadle's plain layouts (N, C, *spatial) and weights (O, I/groups, *kernel), so no
// reorder is needed:
//   conv (with or without bias)   convolution forward, bias fused
//   conv_backward_data (no bias)  convolution backward data (also a transposed convolution's forward)
//   conv_backward_weight          convolution backward weights
// Samples are the pieces run on the host's executor. The weight gradient sums over samples: each
// piece after the first writes a partial gradient into the workspace, and the partials are added
// in piece order afterwards, so the result does not depend on the executor either.
// conv_backward_bias stays on Eigen (a plain reduction). Windows oneDNN cannot express (negative
// end padding, which a transposed convolution with output_padding >= stride produces) stay on
// Eigen too, as do problems where oneDNN offers only a reference implementation.
#include <algorithm>

#include "backends/onednn/onednn_common.hpp"
#include "ops/conv_geometry.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kF32 = sizeof(float);
// Multiply-adds per piece: enough to amortise a call, few enough pieces to feed the workers.
constexpr int64_t kChunkMacs = int64_t{1} << 22;
// At most this many pieces for the weight gradient (each adds a partial gradient to sum).
constexpr int64_t kMaxWeightPieces = 8;
constexpr int64_t kMinMacs = int64_t{1} << 17;

// The last `nd` entries of a 3-d geometry vector, as oneDNN dims (minus `bias`, for dilations).
Dims spatial(const Dims3& d, int nd, int64_t bias = 0) {
  Dims out;
  for (int i = 3 - nd; i < 3; ++i) out.push_back(d[i] - bias);
  return out;
}

Dims with_spatial(Dims lead, const Dims3& d, int nd) {
  for (int64_t v : spatial(d, nd)) lead.push_back(v);
  return lead;
}

struct ConvDescs {
  MemDesc src, weights, bias, dst;
  Dims strides, dilates, pad_l, pad_r;
};

// Descriptors for a piece of `n` samples of the convolution x -> y described by `g`.
ConvDescs conv_descs(const ConvGeometry& g, int64_t n) {
  ConvDescs d;
  d.src = f32_dense(with_spatial({n, g.channels}, g.in, g.nd));
  d.dst = f32_dense(with_spatial({n, g.out_channels}, g.out, g.nd));
  d.weights = g.groups == 1 ? f32_dense(with_spatial({g.out_channels, g.channels}, g.kernel, g.nd))
                            : f32_dense(with_spatial({g.groups, g.out_group(), g.in_group()}, g.kernel, g.nd));
  d.bias = f32_dense({g.out_channels});
  d.strides = spatial(g.stride, g.nd);
  d.dilates = spatial(g.dilation, g.nd, 1);  // oneDNN counts the gaps: torch's dilation - 1
  d.pad_l = spatial(g.pad_begin, g.nd);
  d.pad_r = spatial(g.pad_end, g.nd);
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvDescs& d, bool bias) {
  using dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
  if (bias)
    return convolution_forward::primitive_desc(cpu_engine(), prop, alg, d.src, d.weights, d.bias, d.dst, d.strides,
                                               d.dilates, d.pad_l, d.pad_r, default_attr());
  return convolution_forward::primitive_desc(cpu_engine(), prop, alg, d.src, d.weights, d.dst, d.strides, d.dilates,
                                             d.pad_l, d.pad_r, default_attr());
}

// Multiply-adds of the whole convolution, and whether oneDNN can take it at all.
int64_t conv_macs(const ConvGeometry& g) {
  return g.batch * g.out_channels * g.out_volume() * g.in_group() * g.kernel_volume();
}

bool expressible(const Graph& g, const Node& node, const ConvGeometry& geo) {
  if (!all_f32(g, node) || geo.batch < 1 || conv_macs(geo) < kMinMacs) return false;
  for (int i = 0; i < 3; ++i)
    if (geo.pad_begin[i] < 0 || geo.pad_end[i] < 0) return false;
  return true;
}

int64_t sample_grain(const ConvGeometry& g) {
  const int64_t per_sample = std::max<int64_t>(1, conv_macs(g) / g.batch);
  return std::max<int64_t>(1, (kChunkMacs + per_sample - 1) / per_sample);
}

int64_t x_step(const ConvGeometry& g) { return g.channels * g.in_volume() * kF32; }
int64_t y_step(const ConvGeometry& g) { return g.out_channels * g.out_volume() * kF32; }

std::optional<ChunkPlan> plan_conv(const Graph& g, const Node& node) {
  const ConvGeometry geo = conv_geometry_forward(in_shape(g, node, 0), in_shape(g, node, 1), node.attrs);
  if (!expressible(g, node, geo)) return std::nullopt;
  const bool bias = node.inputs.size() == 3;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, x_step(geo), 0},
                               {DNNL_ARG_WEIGHTS, false, 1, 0, 0},
                               {DNNL_ARG_DST, true, 0, y_step(geo), 0}};
  if (bias) args.push_back({DNNL_ARG_BIAS, false, 2, 0, 0});
  return plan_chunks(args, geo.batch, sample_grain(geo), [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc { return forward_pd(conv_descs(geo, n), bias); });
  });
}

// (dy, w) -> dx
std::optional<ChunkPlan> plan_backward_data(const Graph& g, const Node& node) {
  if (node.inputs.size() != 2) return std::nullopt;  // a transposed convolution's bias: Eigen
  const ConvGeometry geo = conv_geometry_backward_data(in_shape(g, node, 0), in_shape(g, node, 1), node.attrs);
  if (!expressible(g, node, geo)) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_DIFF_DST, false, 0, y_step(geo), 0},
                               {DNNL_ARG_WEIGHTS, false, 1, 0, 0},
                               {DNNL_ARG_DIFF_SRC, true, 0, x_step(geo), 0}};
  return plan_chunks(args, geo.batch, sample_grain(geo), [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const ConvDescs d = conv_descs(geo, n);
      return dnnl::convolution_backward_data::primitive_desc(
          cpu_engine(), dnnl::algorithm::convolution_direct, d.src, d.weights, d.dst, d.strides, d.dilates, d.pad_l,
          d.pad_r, forward_pd(d, false), default_attr());
    });
  });
}

// (x, dy) -> dw, summed over samples (the output is the reduced argument).
std::optional<ChunkPlan> plan_backward_weight(const Graph& g, const Node& node) {
  const ConvGeometry geo = conv_geometry_backward_weight(in_shape(g, node, 0), in_shape(g, node, 1), node.attrs);
  if (!expressible(g, node, geo)) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, x_step(geo), 0},
                               {DNNL_ARG_DIFF_DST, false, 1, y_step(geo), 0},
                               {DNNL_ARG_DIFF_WEIGHTS, true, 0, 0, 0}};
  const int64_t grain = std::max(sample_grain(geo), (geo.batch + kMaxWeightPieces - 1) / kMaxWeightPieces);
  std::optional<ChunkPlan> plan = plan_chunks(args, geo.batch, grain, [&](int64_t n) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const ConvDescs d = conv_descs(geo, n);
      return dnnl::convolution_backward_weights::primitive_desc(
          cpu_engine(), dnnl::algorithm::convolution_direct, d.src, d.weights, d.dst, d.strides, d.dilates, d.pad_l,
          d.pad_r, forward_pd(d, false), default_attr());
    });
  });
  if (plan) plan->reduced_arg = 2;
  return plan;
}

}  // namespace

std::vector<OpEntry> conv_entries() {
  return {{"conv", &plan_conv}, {"conv_backward_data", &plan_backward_data},
          {"conv_backward_weight", &plan_backward_weight}};
}

}  // namespace treadle::onednn

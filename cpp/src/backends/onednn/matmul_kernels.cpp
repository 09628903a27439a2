// Matrix products on oneDNN's matmul primitive: linear (x @ W^T + b, bias fused), 2-D matmul with
// transpose flags (which also carries the linear gradients) and batched matmul. Transposes and
// tiles are expressed as strides, so no operand is copied by us. Output tiles (batch entries for
// bmm) are the fixed chunks run on the host's executor.
#include <algorithm>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kF32 = sizeof(float);
// 2-D products are tiled over output rows and columns, in large tiles: each oneDNN execution packs
// its block of B again, so short row tiles cost (one core, 1024^3: 64-row tiles ~210 GFLOP/s,
// 256 x 1024 tiles ~235). Column tiles give the host's workers more pieces without packing B twice
// (256 x 512 tiles: within a few % of 256 x 1024, and the wide MLP's forward splits in two).
constexpr int64_t kTileRows = 256;
constexpr int64_t kTileCols = 512;
// Batched products are split over the batch with at least this many multiply-adds per chunk.
constexpr int64_t kChunkMacs = int64_t{1} << 19;
// Below these, Eigen is faster (measured, docs/onednn.md): oneDNN's ~0.5 us per call outweighs its
// faster kernel for products under ~2^17 multiply-adds, and Eigen's GEMV beats oneDNN on one row.
constexpr int64_t kMinMacs = int64_t{1} << 17;
constexpr int64_t kMinOutputRows = 2;

bool worth_it(int64_t batch, int64_t m, int64_t k, int64_t n) {
  return m >= kMinOutputRows && n > 0 && k > 0 && batch * m * k * n >= kMinMacs;
}

Split tiles_of(int64_t m, int64_t n) { return Split{m, n, kTileRows, kTileCols}; }

std::optional<ChunkPlan> plan_linear(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& w = in_shape(g, node, 1);
  const int64_t out = w[0], in = w[1], rows = in > 0 ? shape_numel(in_shape(g, node, 0)) / in : 0;
  if (!worth_it(1, rows, in, out)) return std::nullopt;
  const bool bias = node.inputs.size() == 3;
  // A tile of columns of y = x W^T + b reads rows of W and entries of b.
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, in * kF32, 0},
                               {DNNL_ARG_WEIGHTS, false, 1, 0, in * kF32},
                               {DNNL_ARG_DST, true, 0, out * kF32, kF32}};
  if (bias) args.push_back({DNNL_ARG_BIAS, false, 2, 0, kF32});
  return plan_chunks(args, tiles_of(rows, out), [&](int64_t r, int64_t c) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = f32_desc({r, in}, {in, 1}), wt = f32_desc({in, c}, {1, in});
      const MemDesc dst = f32_desc({r, c}, {out, 1});
      if (bias)
        return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_desc({1, c}, {out, 1}), dst, default_attr());
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, dst, default_attr());
    });
  });
}

std::optional<ChunkPlan> plan_matmul(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const bool ta = node.attrs.i_or("trans_a", 0), tb = node.attrs.i_or("trans_b", 0);
  const Shape& c = out_shape(g, node, 0);
  const int64_t m = c[0], n = c[1], k = ta ? in_shape(g, node, 0)[0] : in_shape(g, node, 0)[1];
  if (!worth_it(1, m, k, n)) return std::nullopt;
  // A tile reads rows of A (columns when A is stored transposed) and columns of B (rows when B is
  // stored transposed).
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, (ta ? 1 : k) * kF32, 0},
                               {DNNL_ARG_WEIGHTS, false, 1, 0, (tb ? k : 1) * kF32},
                               {DNNL_ARG_DST, true, 0, n * kF32, kF32}};
  return plan_chunks(args, tiles_of(m, n), [&](int64_t r, int64_t cols) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ta ? f32_desc({r, k}, {1, m}) : f32_desc({r, k}, {k, 1});
      const MemDesc wt = tb ? f32_desc({k, cols}, {1, k}) : f32_desc({k, cols}, {n, 1});
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_desc({r, cols}, {n, 1}), default_attr());
    });
  });
}

std::optional<ChunkPlan> plan_bmm(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const bool ta = node.attrs.i_or("trans_a", 0), tb = node.attrs.i_or("trans_b", 0);
  const Shape& c = out_shape(g, node, 0);
  const int64_t bs = c[0], m = c[1], n = c[2], k = ta ? in_shape(g, node, 0)[1] : in_shape(g, node, 0)[2];
  if (!worth_it(bs, m, k, n)) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, m * k * kF32, 0},
                               {DNNL_ARG_WEIGHTS, false, 1, k * n * kF32, 0},
                               {DNNL_ARG_DST, true, 0, m * n * kF32, 0}};
  const int64_t grain = std::max<int64_t>(1, (kChunkMacs + m * n * k - 1) / (m * n * k));
  return plan_chunks(args, bs, grain, [&](int64_t b) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ta ? f32_desc({b, m, k}, {m * k, 1, m}) : f32_desc({b, m, k}, {m * k, k, 1});
      const MemDesc wt = tb ? f32_desc({b, k, n}, {k * n, 1, k}) : f32_desc({b, k, n}, {k * n, n, 1});
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_dense({b, m, n}), default_attr());
    });
  });
}

}  // namespace

std::vector<OpEntry> matmul_entries() {
  return {{"linear", &plan_linear}, {"matmul", &plan_matmul}, {"bmm", &plan_bmm}};
}

}  // namespace treadle::onednn

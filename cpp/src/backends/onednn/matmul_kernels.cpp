// Matrix products on oneDNN's matmul primitive: linear (x @ W^T + b, bias fused), 2-D matmul with
// transpose flags (which also carries the linear gradients) and batched matmul. Transposes and
// tiles are expressed as strides, so a float32 operand is read in place, except where oneDNN's AVX2
// kernels would read it along a 4 KiB stride (below: a row-padded copy). Output tiles (batch
// entries for bmm) are the fixed chunks run on the host's executor.
//
// bf16 compute (ops/precision.hpp): both matrix operands are converted to bf16 into the workspace
// (same layout, round to nearest even, like the reference), then oneDNN multiplies bf16 x bf16 with
// float32 accumulation into the float32 output (avx512_core_bf16 / AMX kernels where the CPU has
// them). oneDNN's fpmath_mode(bf16) would avoid the copies, but oneDNN 3.2 ignores it for matmul on
// CPUs without AMX (it keeps the float32 kernel), so the conversion is ours.
#include <algorithm>

#include "backends/onednn/onednn_common.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"

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
  if (!size_thresholds_apply()) return m > 0 && n > 0 && k > 0;
  return m >= kMinOutputRows && n > 0 && k > 0 && batch * m * k * n >= kMinMacs;
}

// A^T B with at most 4 output columns and a longer sum: the weight gradient of a layer with 1-4
// inputs (a PINN's (x, t) layer). Eigen's thin path (linear_kernels.cpp) streams A once; oneDNN packs
// it: (1024 x 64)^T (1024 x 2) took 28-49 us on oneDNN against 13-15 on Eigen (Xeon, AVX-512, in
// the PINN step, W8-b1024), so such products stay on Eigen.
bool thin_weight_gradient(bool ta, int64_t n, int64_t k) { return ta && n <= 4 && k > 4; }

// bf16 kernels run twice as fast, so packing B costs relatively more: large bf16 products use
// 512 x 1024 tiles (standalone ~440-455 GFLOP/s against ~417 in 256 x 512), where that still leaves
// at least two tiles for the host's workers.
constexpr int64_t kBigTileRows = 512;
constexpr int64_t kBigTileCols = 1024;

// A product with a single tile but enough work for two (a weight gradient: a small output, a long
// sum) gets narrower tiles, halving the wider side, while each keeps at least kMinTileMacs
// multiply-adds (~20 us: an extra call and a second packing of the other operand cost ~1 us) and
// kMinTileSide rows and columns: then two lent workers share it. Narrower still (four 64-wide tiles)
// made the transformer's weight gradients ~10% slower on one worker, so two it is. Decided from the
// shape alone, so the tiles (and the rounding) are the same for any number of workers; one worker
// runs the same tiles in turn.
constexpr int64_t kWantTiles = 2;
constexpr int64_t kMinTileMacs = int64_t{1} << 21;
constexpr int64_t kMinTileSide = 128;

Split tiles_of(int64_t m, int64_t n, int64_t k, bool bf16) {
  Split s = bf16 && m * n >= 2 * kBigTileRows * kBigTileCols ? Split{m, n, kBigTileRows, kBigTileCols}
                                                             : Split{m, n, kTileRows, kTileCols};
  while (s.tiles() < kWantTiles) {
    const int64_t tile_rows = std::min(s.row_grain, m), tile_cols = std::min(s.col_grain, n);
    Split narrower = s;
    if (tile_cols >= tile_rows && tile_cols >= 2 * kMinTileSide)
      narrower.col_grain = (tile_cols + 1) / 2;
    else if (tile_rows >= 2 * kMinTileSide)
      narrower.row_grain = (tile_rows + 1) / 2;
    else
      break;
    if (m * n * k < kMinTileMacs * narrower.tiles()) break;
    s = narrower;
  }
  return s;
}

// oneDNN 3.2's float32 GEMM with its AVX2 kernels (CPUs where wide_vectors() is false) has two
// drivers. One packs both operands into blocks (~85-95 GFLOP/s on one Zen 3 core); the other reads
// them in place, and oneDNN takes it whenever 1/rows + 1/cols of the product it is given is at
// least 0.0038 (a side under ~264, or both under ~527). In place, an operand read along a stride
// that is a multiple of 1024 floats (4 KiB: its rows share one L1 set) runs at ~35-45 GFLOP/s:
// B not transposed with 1024k columns (the data gradient of a 1024-wide linear at batch 256) and A
// transposed with 1024k rows (its weight gradient in 256 x 512 tiles). Eigen's GEMM makes ~55-65
// there. Measured on Zen 3 over m 64-2048, n 128-2048, k 128-1024 and each transposition
// (bench/onednn_gemm.py). Such a product gets tiles oneDNN packs where it has them; otherwise the
// operand is copied into the workspace with its rows 64 bytes further apart, and oneDNN reads the
// copy in place at ~85 GFLOP/s, copy included (256 x 1024 x 1024: 6.1 ms against 12.1).
constexpr double kInPlaceReciprocal = 0.0038;
constexpr int64_t kAliasingStride = 1024;
constexpr int64_t kRowPadding = 16;  // floats

bool packs_operands(int64_t tile_rows, int64_t tile_cols) {
  return 1.0 / double(tile_rows) + 1.0 / double(tile_cols) < kInPlaceReciprocal;
}

// Whether oneDNN reads operand A (0) or B (1) of tiles `s` in place along an aliasing stride.
bool reads_aliased(const Split& s, bool ta, bool tb, int operand) {
  if (wide_vectors() || packs_operands(std::min(s.row_grain, s.rows), std::min(s.col_grain, s.cols))) return false;
  return operand == 0 ? ta && s.rows % kAliasingStride == 0 : !tb && s.cols % kAliasingStride == 0;
}

// The whole product as one tile, halved along its wider side while the halves are still packed,
// until there are kWantTiles of them for the host's workers.
Split packed_tiles(int64_t m, int64_t n, int64_t k) {
  Split s{m, n, m, n};
  while (s.tiles() < kWantTiles) {
    Split narrower = s;
    if (s.col_grain >= s.row_grain)
      narrower.col_grain = (s.col_grain + 1) / 2;
    else
      narrower.row_grain = (s.row_grain + 1) / 2;
    if (!packs_operands(narrower.row_grain, narrower.col_grain) || m * n * k < kMinTileMacs * narrower.tiles()) break;
    s = narrower;
  }
  return s;
}

// The matrix operands of a product: float32 read in place, or bf16 copies staged in the workspace.
struct Operands {
  dnnl::memory::data_type dt = dnnl::memory::data_type::f32;
  int64_t size = kF32;  // bytes per element
  std::vector<Staging> staging;
  std::size_t staging_bytes = 0;
  int64_t staged_at[2] = {-1, -1};  // workspace byte of each input's copy, -1: read in place
  int64_t padded_ld[2] = {0, 0};    // leading dimension of a padded float32 copy, 0: as stored

  MemDesc desc(const Dims& dims, const Dims& strides) const { return plain_desc(dims, strides, dt); }
  // The leading dimension input `i` is read with, `stored` elements where it is not padded.
  int64_t ld(int i, int64_t stored) const { return padded_ld[i] ? padded_ld[i] : stored; }
  // The argument reading input `i`, advanced by `rows` / `cols` elements per row / column item.
  ArgSpec arg(int dnnl_arg, int i, int64_t rows, int64_t cols) const {
    return {dnnl_arg, false, i, rows * size, cols * size, staged_at[i]};
  }
  // Reads float32 input `i`, a row-major rows x cols matrix, from a copy with padded rows.
  void pad(int i, int64_t rows, int64_t cols) {
    padded_ld[i] = cols + kRowPadding;
    staged_at[i] = static_cast<int64_t>(staging_bytes);
    staging.push_back({i, rows * cols, staged_at[i], rows, cols, padded_ld[i]});
    staging_bytes += padded_bytes(rows * padded_ld[i], kF32);
  }
  std::optional<ChunkPlan> attach(std::optional<ChunkPlan> p) const {
    if (p) {
      p->staging = staging;
      p->staging_bytes = staging_bytes;
    }
    return p;
  }
};

Operands operands_of(const Graph& g, const Node& node) {
  Operands o;
  if (!is_bf16_compute(node.attrs)) return o;
  o.dt = dnnl::memory::data_type::bf16;
  o.size = 2;
  for (int i = 0; i < 2; ++i) {
    const int64_t n = shape_numel(in_shape(g, node, i));
    o.staged_at[i] = static_cast<int64_t>(o.staging_bytes);
    o.staging.push_back({i, n, o.staged_at[i]});
    o.staging_bytes += padded_bytes(n, 2);
  }
  return o;
}

// The primitive attributes of a linear: a fused relu (ops/fusion.hpp) becomes an eltwise post-op
// applied to each output tile before it is stored; tanh and sigmoid are treadle's TileActivation.
dnnl::primitive_attr linear_attr(const Node& node) {
  dnnl::primitive_attr attr = default_attr();
  if (fused_activation(node.attrs) != "relu") return attr;
  dnnl::post_ops ops;
  ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  return attr;
}

// The tile activation of a linear whose output is argument `arg`.
TileActivation linear_tile_activation(const Node& node, int arg) {
  const std::string& act = fused_activation(node.attrs);
  if (act == "tanh") return {TileActivation::Kind::tanh, arg};
  if (act == "sigmoid") return {TileActivation::Kind::sigmoid, arg};
  return {};
}

std::optional<ChunkPlan> plan_linear(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& w = in_shape(g, node, 1);
  const int64_t out = w[0], in = w[1], rows = in > 0 ? shape_numel(in_shape(g, node, 0)) / in : 0;
  if (!worth_it(1, rows, in, out)) return std::nullopt;
  const bool bias = node.inputs.size() == 3;
  const Operands ops = operands_of(g, node);
  // A tile of columns of y = x W^T + b reads rows of W and entries of b.
  std::vector<ArgSpec> args = {ops.arg(DNNL_ARG_SRC, 0, in, 0), ops.arg(DNNL_ARG_WEIGHTS, 1, 0, in),
                               {DNNL_ARG_DST, true, 0, out * kF32, kF32}};
  if (bias) args.push_back({DNNL_ARG_BIAS, false, 2, 0, kF32});
  const Split split = tiles_of(rows, out, in, is_bf16_compute(node.attrs));
  std::optional<ChunkPlan> p = ops.attach(plan_chunks(args, split, [&](int64_t r, int64_t c) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ops.desc({r, in}, {in, 1}), wt = ops.desc({in, c}, {1, in});
      const MemDesc dst = f32_desc({r, c}, {out, 1});
      const dnnl::primitive_attr attr = linear_attr(node);
      if (bias) return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_desc({1, c}, {out, 1}), dst, attr);
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, dst, attr);
    });
  }));
  if (p) p->activation = linear_tile_activation(node, 2);
  return p;
}

std::optional<ChunkPlan> plan_matmul(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const bool ta = node.attrs.i_or("trans_a", 0), tb = node.attrs.i_or("trans_b", 0);
  const Shape& c = out_shape(g, node, 0);
  const int64_t m = c[0], n = c[1], k = ta ? in_shape(g, node, 0)[0] : in_shape(g, node, 0)[1];
  if (!worth_it(1, m, k, n)) return std::nullopt;
  const bool bf16 = is_bf16_compute(node.attrs);
  if (thin_weight_gradient(ta, n, k) && !bf16 && size_thresholds_apply()) return std::nullopt;
  Operands ops = operands_of(g, node);
  Split tiles = tiles_of(m, n, k, bf16);
  if (!bf16 && (reads_aliased(tiles, ta, tb, 0) || reads_aliased(tiles, ta, tb, 1))) {
    if (packs_operands(m, n)) tiles = packed_tiles(m, n, k);
    if (reads_aliased(tiles, ta, tb, 0)) ops.pad(0, k, m);
    if (reads_aliased(tiles, ta, tb, 1)) ops.pad(1, k, n);
  }
  // A tile reads rows of A (columns when A is stored transposed) and columns of B (rows when B is
  // stored transposed).
  const int64_t lda = ops.ld(0, ta ? m : k), ldb = ops.ld(1, tb ? k : n);
  std::vector<ArgSpec> args = {ops.arg(DNNL_ARG_SRC, 0, ta ? 1 : lda, 0),
                               ops.arg(DNNL_ARG_WEIGHTS, 1, 0, tb ? ldb : 1), {DNNL_ARG_DST, true, 0, n * kF32, kF32}};
  return ops.attach(plan_chunks(args, tiles, [&](int64_t r, int64_t cols) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ta ? ops.desc({r, k}, {1, lda}) : ops.desc({r, k}, {lda, 1});
      const MemDesc wt = tb ? ops.desc({k, cols}, {1, ldb}) : ops.desc({k, cols}, {ldb, 1});
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_desc({r, cols}, {n, 1}), default_attr());
    });
  }));
}

std::optional<ChunkPlan> plan_bmm(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const bool ta = node.attrs.i_or("trans_a", 0), tb = node.attrs.i_or("trans_b", 0);
  const Shape& c = out_shape(g, node, 0);
  const int64_t bs = c[0], m = c[1], n = c[2], k = ta ? in_shape(g, node, 0)[1] : in_shape(g, node, 0)[2];
  if (!worth_it(bs, m, k, n)) return std::nullopt;
  const Operands ops = operands_of(g, node);
  std::vector<ArgSpec> args = {ops.arg(DNNL_ARG_SRC, 0, m * k, 0), ops.arg(DNNL_ARG_WEIGHTS, 1, k * n, 0),
                               {DNNL_ARG_DST, true, 0, m * n * kF32, 0}};
  const int64_t grain = std::max<int64_t>(1, (kChunkMacs + m * n * k - 1) / (m * n * k));
  return ops.attach(plan_chunks(args, bs, grain, [&](int64_t b) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ta ? ops.desc({b, m, k}, {m * k, 1, m}) : ops.desc({b, m, k}, {m * k, k, 1});
      const MemDesc wt = tb ? ops.desc({b, k, n}, {k * n, 1, k}) : ops.desc({b, k, n}, {k * n, n, 1});
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_dense({b, m, n}), default_attr());
    });
  }));
}

}  // namespace

std::vector<OpEntry> matmul_entries() {
  return {chunked("linear", &plan_linear), chunked("matmul", &plan_matmul), chunked("bmm", &plan_bmm)};
}

}  // namespace treadle::onednn

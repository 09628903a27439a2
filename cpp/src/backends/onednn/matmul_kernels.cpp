// Matrix products on oneDNN's matmul primitive: linear (x @ W^T + b, bias fused), 2-D matmul with
// transpose flags (which also carries the linear gradients) and batched matmul. Transposes are
// expressed as strides, so no operand is copied by us. Rows of the output (batch entries for bmm)
// are split into fixed chunks over the host's executor.
#include <algorithm>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kF32 = sizeof(float);
// A chunk holds at least this many multiply-adds (amortises the ~1 us cost of an execution) and at
// least kMinRows rows (keeps each product an efficient GEMM).
constexpr int64_t kChunkMacs = int64_t{1} << 19;
constexpr int64_t kMinRows = 64;
// Below these, Eigen is faster (measured, docs/onednn.md): oneDNN's ~0.5 us per call outweighs its
// faster kernel for products under ~2^17 multiply-adds, and Eigen's GEMV beats oneDNN on one row.
constexpr int64_t kMinMacs = int64_t{1} << 17;
constexpr int64_t kMinOutputRows = 2;

int64_t row_grain(int64_t k, int64_t n) {
  return round_up(std::max(kMinRows, (kChunkMacs + k * n - 1) / (k * n)), 16);
}

bool worth_it(int64_t batch, int64_t m, int64_t k, int64_t n) {
  return m >= kMinOutputRows && n > 0 && k > 0 && batch * m * k * n >= kMinMacs;
}

std::optional<ChunkPlan> plan_linear(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& w = in_shape(g, node, 1);
  const int64_t out = w[0], in = w[1], rows = in > 0 ? shape_numel(in_shape(g, node, 0)) / in : 0;
  if (!worth_it(1, rows, in, out)) return std::nullopt;
  const bool bias = node.inputs.size() == 3;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, in * kF32}, {DNNL_ARG_WEIGHTS, false, 1, 0},
                               {DNNL_ARG_DST, true, 0, out * kF32}};
  if (bias) args.push_back({DNNL_ARG_BIAS, false, 2, 0});
  return plan_chunks(args, rows, row_grain(in, out), [&](int64_t r) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = f32_dense({r, in}), wt = f32_desc({in, out}, {1, in}), dst = f32_dense({r, out});
      if (bias) return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_dense({1, out}), dst, default_attr());
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
  // A chunk of output rows reads rows of A, or columns of A when it is stored transposed.
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, (ta ? 1 : k) * kF32},
                               {DNNL_ARG_WEIGHTS, false, 1, 0},
                               {DNNL_ARG_DST, true, 0, n * kF32}};
  const MemDesc wt = tb ? f32_desc({k, n}, {1, k}) : f32_desc({k, n}, {n, 1});
  return plan_chunks(args, m, row_grain(k, n), [&](int64_t r) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc src = ta ? f32_desc({r, k}, {1, m}) : f32_desc({r, k}, {k, 1});
      return dnnl::matmul::primitive_desc(cpu_engine(), src, wt, f32_dense({r, n}), default_attr());
    });
  });
}

std::optional<ChunkPlan> plan_bmm(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const bool ta = node.attrs.i_or("trans_a", 0), tb = node.attrs.i_or("trans_b", 0);
  const Shape& c = out_shape(g, node, 0);
  const int64_t bs = c[0], m = c[1], n = c[2], k = ta ? in_shape(g, node, 0)[1] : in_shape(g, node, 0)[2];
  if (!worth_it(bs, m, k, n)) return std::nullopt;
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, m * k * kF32},
                               {DNNL_ARG_WEIGHTS, false, 1, k * n * kF32},
                               {DNNL_ARG_DST, true, 0, m * n * kF32}};
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

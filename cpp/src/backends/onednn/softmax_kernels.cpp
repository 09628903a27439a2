// softmax and its backward op on oneDNN's softmax primitives. The tensor is viewed as
// (outer, n, inner) around the axis; blocks of outer rows are the chunks. The backward op takes the
// forward output, as oneDNN's softmax backward does. Only axes where oneDNN has an optimised kernel
// (in practice the innermost) are taken. log_softmax stays on Eigen: oneDNN's log-sum-exp is ~4x
// less accurate than the reference in float32 (errors up to 4e-6 on O(1) outputs, measured), which
// breaks the 1e-5 relative contract on entries near 0.
#include <algorithm>

#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {
namespace {

constexpr int64_t kElementGrain = int64_t{1} << 16;
constexpr int64_t kMinElements = 256;  // below, oneDNN's call overhead outweighs its faster exp

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
  // The chunk's memory descriptor: (rows, n) when the axis is last, else (rows, n, inner).
  MemDesc desc(int64_t rows) const { return inner == 1 ? f32_dense({rows, n}) : f32_dense({rows, n, inner}); }
};

Lines lines_of(const Shape& s, int axis) {
  Lines l;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) l.outer *= s[d];
    if (d > axis) l.inner *= s[d];
  }
  l.n = s[axis];
  return l;
}

constexpr dnnl::algorithm kSoftmax = dnnl::algorithm::softmax_accurate;  // subtracts the line's max

dnnl::softmax_forward::primitive_desc forward_pd(const Lines& l, int64_t rows) {
  const MemDesc md = l.desc(rows);
  return dnnl::softmax_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_training, kSoftmax, md, md, 1,
                                               default_attr());
}

std::optional<Lines> lines_if_supported(const Graph& g, const Node& node) {
  if (!all_f32(g, node)) return std::nullopt;
  const Shape& s = in_shape(g, node, 0);
  if (s.empty() || (shape_numel(s) < kMinElements && size_thresholds_apply())) return std::nullopt;
  return lines_of(s, static_cast<int>(node.attrs.i("axis")));
}

int64_t line_grain(const Lines& l) { return std::max<int64_t>(1, kElementGrain / (l.n * l.inner)); }

std::optional<ChunkPlan> plan_forward(const Graph& g, const Node& node) {
  const std::optional<Lines> l = lines_if_supported(g, node);
  if (!l) return std::nullopt;
  const int64_t step = l->n * l->inner * static_cast<int64_t>(sizeof(float));
  std::vector<ArgSpec> args = {{DNNL_ARG_SRC, false, 0, step}, {DNNL_ARG_DST, true, 0, step}};
  return plan_chunks(args, l->outer, line_grain(*l), [&](int64_t rows) {
    return try_pd([&]() -> dnnl::primitive_desc { return forward_pd(*l, rows); });
  });
}

// (y, dy) -> dx
std::optional<ChunkPlan> plan_backward(const Graph& g, const Node& node) {
  const std::optional<Lines> l = lines_if_supported(g, node);
  if (!l) return std::nullopt;
  const int64_t step = l->n * l->inner * static_cast<int64_t>(sizeof(float));
  std::vector<ArgSpec> args = {
      {DNNL_ARG_DST, false, 0, step}, {DNNL_ARG_DIFF_DST, false, 1, step}, {DNNL_ARG_DIFF_SRC, true, 0, step}};
  return plan_chunks(args, l->outer, line_grain(*l), [&](int64_t rows) {
    return try_pd([&]() -> dnnl::primitive_desc {
      const MemDesc md = l->desc(rows);
      return dnnl::softmax_backward::primitive_desc(cpu_engine(), kSoftmax, md, md, md, 1, forward_pd(*l, rows),
                                                    default_attr());
    });
  });
}

}  // namespace

std::vector<OpEntry> softmax_entries() {
  return {chunked("softmax", &plan_forward), chunked("softmax_backward", &plan_backward)};
}

}  // namespace treadle::onednn

// Op adapters of the CUDA backend for normalisation and log_softmax (float32; norm_kernels.hpp):
//   layer_norm, layer_norm_backward       -> layer_norm_forward, row_norm_backward
//   rms_norm, rms_norm_backward           -> rms_norm_forward, row_norm_backward (RMS form)
//   group_norm, group_norm_backward       -> group_norm_forward, group_norm_backward
//   batch_norm_eval_backward              -> batch_norm_eval_backward (cuDNN has no counterpart)
//   log_softmax, log_softmax_backward     -> log_softmax_forward, log_softmax_backward
// The weight gradients of layer_norm / rms_norm reduce over rows through the plan's workspace
// (PreparedNode::workspace); everything else needs none.
#include <memory>
#include <string>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/norm_kernels.hpp"
#include "core/op_registry.hpp"

namespace treadle::cuda {
namespace {

const float* opt_in(const KernelArgs& a, int k) { return a.num_in > k ? in_f(a, k) : nullptr; }
float* opt_out(const KernelArgs& a, int k) { return a.num_out > k ? out_f(a, k) : nullptr; }

// ---- layer_norm / rms_norm: rows of the trailing `normalized_ndim` dimensions of x, which is
// input 0 of the forward ops and input 1 (after dy) of the backward ops.
struct RowNorm {
  int64_t rows = 0, len = 1;
  double eps = 0;
};

const Shape& norm_x(const Graph& g, const Node& node) {
  return shape_of(g, node.inputs[op_name(node).ends_with("_backward") ? 1 : 0]);
}

RowNorm row_norm_of(const Graph& g, const Node& node) {
  const Shape& x = norm_x(g, node);
  const auto k = static_cast<std::size_t>(node.attrs.i("normalized_ndim"));
  RowNorm r;
  for (std::size_t d = x.size() - k; d < x.size(); ++d) r.len *= x[d];
  r.rows = shape_numel(x) / r.len;
  r.eps = node.attrs.has("eps") ? node.attrs.f("eps") : 0.0;
  return r;
}

bool accepts_row_norm(const Graph& g, const Node& node) {
  return float32_node(g, node) && row_norm_of(g, node).len > 0;
}

PreparedNode prepare_row_norm(const Graph& g, const Node& node) {
  auto r = std::make_shared<RowNorm>(row_norm_of(g, node));
  const std::string& op = op_name(node);
  const bool weight_grad = op.ends_with("_backward") && node.outputs.size() > 1;
  const std::size_t ws = weight_grad ? row_norm_workspace_bytes(r->rows, r->len) : 0;
  return with_state(std::move(r), ws);
}

// (x[, weight[, bias]]) -> (y, mean, rstd)
void layer_norm_kernel(const KernelArgs& a) {
  const RowNorm& r = state_of<RowNorm>(a);
  layer_norm_forward(in_f(a, 0), opt_in(a, 1), opt_in(a, 2), out_f(a, 0), out_f(a, 1), out_f(a, 2), r.rows, r.len,
                     r.eps, stream_of(a));
}

// (dy, x, mean, rstd[, weight]) -> (dx[, dweight, dbias])
void layer_norm_backward_kernel(const KernelArgs& a) {
  const RowNorm& r = state_of<RowNorm>(a);
  row_norm_backward(in_f(a, 0), in_f(a, 1), in_f(a, 2), in_f(a, 3), opt_in(a, 4), out_f(a, 0), opt_out(a, 1),
                    opt_out(a, 2), r.rows, r.len, a.workspace, stream_of(a));
}

// (x[, weight]) -> (y, rstd)
void rms_norm_kernel(const KernelArgs& a) {
  const RowNorm& r = state_of<RowNorm>(a);
  rms_norm_forward(in_f(a, 0), opt_in(a, 1), out_f(a, 0), out_f(a, 1), r.rows, r.len, r.eps, stream_of(a));
}

// (dy, x, rstd[, weight]) -> (dx[, dweight])
void rms_norm_backward_kernel(const KernelArgs& a) {
  const RowNorm& r = state_of<RowNorm>(a);
  row_norm_backward(in_f(a, 0), in_f(a, 1), nullptr, in_f(a, 2), opt_in(a, 3), out_f(a, 0), opt_out(a, 1), nullptr,
                    r.rows, r.len, a.workspace, stream_of(a));
}

// ---- group_norm and batch_norm_eval_backward: x (N, C, *spatial) as (N, C, S).
struct ChannelNorm {
  GroupNormShape shape;
  double eps = 0;
};

ChannelNorm channel_norm_of(const Graph& g, const Node& node) {
  const Shape& x = norm_x(g, node);
  ChannelNorm c;
  c.shape.n = x.at(0);
  c.shape.channels = x.at(1);
  c.shape.spatial = shape_numel(x) / (c.shape.n * c.shape.channels);
  c.shape.groups = node.attrs.i_or("num_groups", 1);
  c.eps = node.attrs.has("eps") ? node.attrs.f("eps") : 0.0;
  return c;
}

bool accepts_channel_norm(const Graph& g, const Node& node) {
  return float32_node(g, node) && norm_x(g, node).size() >= 2;  // non-empty output: N, C, S >= 1
}

PreparedNode prepare_channel_norm(const Graph& g, const Node& node) {
  return with_state(std::make_shared<ChannelNorm>(channel_norm_of(g, node)));
}

// (x[, weight, bias]) -> (y, mean, rstd)
void group_norm_kernel(const KernelArgs& a) {
  const ChannelNorm& c = state_of<ChannelNorm>(a);
  group_norm_forward(in_f(a, 0), opt_in(a, 1), opt_in(a, 2), out_f(a, 0), out_f(a, 1), out_f(a, 2), c.shape, c.eps,
                     stream_of(a));
}

// (dy, x, mean, rstd[, weight]) -> (dx[, dweight, dbias])
void group_norm_backward_kernel(const KernelArgs& a) {
  const ChannelNorm& c = state_of<ChannelNorm>(a);
  group_norm_backward(in_f(a, 0), in_f(a, 1), in_f(a, 2), in_f(a, 3), opt_in(a, 4), out_f(a, 0), opt_out(a, 1),
                      opt_out(a, 2), c.shape, stream_of(a));
}

// (dy, x, running_mean, running_var[, weight]) -> (dx[, dweight, dbias])
void batch_norm_eval_backward_kernel(const KernelArgs& a) {
  const ChannelNorm& c = state_of<ChannelNorm>(a);
  batch_norm_eval_backward(in_f(a, 0), in_f(a, 1), in_f(a, 2), in_f(a, 3), opt_in(a, 4), out_f(a, 0), opt_out(a, 1),
                           opt_out(a, 2), c.shape.n, c.shape.channels, c.shape.spatial, c.eps, stream_of(a));
}

// ---- log_softmax over attribute "axis", as softmax (prepare_axis_split)

void log_softmax_kernel(const KernelArgs& a) {
  const AxisSplit& x = state_of<AxisSplit>(a);
  log_softmax_forward(in_f(a, 0), out_f(a), x.outer, x.axis, x.inner, stream_of(a));
}

// (y, dy) -> dx
void log_softmax_backward_kernel(const KernelArgs& a) {
  const AxisSplit& x = state_of<AxisSplit>(a);
  log_softmax_backward(in_f(a, 0), in_f(a, 1), out_f(a), x.outer, x.axis, x.inner, stream_of(a));
}

}  // namespace

std::vector<OpEntry> norm_op_entries() {
  return {
      {"layer_norm", accepts_row_norm, prepare_row_norm, layer_norm_kernel},
      {"layer_norm_backward", accepts_row_norm, prepare_row_norm, layer_norm_backward_kernel},
      {"rms_norm", accepts_row_norm, prepare_row_norm, rms_norm_kernel},
      {"rms_norm_backward", accepts_row_norm, prepare_row_norm, rms_norm_backward_kernel},
      {"group_norm", accepts_channel_norm, prepare_channel_norm, group_norm_kernel},
      {"group_norm_backward", accepts_channel_norm, prepare_channel_norm, group_norm_backward_kernel},
      {"batch_norm_eval_backward", accepts_channel_norm, prepare_channel_norm, batch_norm_eval_backward_kernel},
      {"log_softmax", float32_node, prepare_axis_split, log_softmax_kernel},
      {"log_softmax_backward", float32_node, prepare_axis_split, log_softmax_backward_kernel},
  };
}

}  // namespace treadle::cuda

// Op adapters of the CUDA backend for convolutional networks, float32, convolution and pooling 1-d,
// 2-d and 3-d (a 1-d problem is a 2-d one of height 1, as the core's geometry already stores it; a
// 3-d convolution runs on cuDNN's Nd descriptors):
//   conv (optional bias, fused relu/tanh/sigmoid applied after), conv_backward_data (with a bias:
//   the core's conv_transpose, the bias added per channel afterwards),
//   conv_backward_weight, conv_backward_bias     -> CudnnConv2d, one per node, deterministic
//                                                   algorithms with FMA-only float32 math;
//                                                   asymmetric padding (padding_end != padding)
//                                                   through an explicitly padded copy of the input
//                                                   (conv_pad_kernels.hpp) and unpadded cuDNN calls
//   max_pool, max_pool_backward                  -> the index kernels (the core's int64 argmax; 3-d too)
//   avg_pool, avg_pool_backward                  -> CudnnPool2d where cuDNN can say the pool, else
//                                                   the own kernels (divisor_override, ceil_mode
//                                                   that changes the size, 3-d windows)
//   batch_norm, batch_norm_eval, batch_norm_backward -> CudnnBatchNorm (spatial mode)
//   batch_norm_update_stats                      -> an own kernel (the count lives on the device)
// Precision "bf16" / "fp16" (ops/precision.hpp): the two operands are rounded into float32 copies
// in the workspace (round_operand) and the float32 FMA convolution reads them; products of rounded
// values are exact in float32, so this is the core's definition, not an approximation of it (no
// tensor cores: cuDNN's half convolutions round the output to half as well).
// Not taken (so a cuda plan holding them fails at finalize): batch_norm_eval_backward.
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "backends/cuda/avg_pool_kernels.hpp"
#include "backends/cuda/conv_pad_kernels.hpp"
#include "backends/cuda/cuda_backend_kernels.hpp"
#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cudnn_norm.hpp"
#include "backends/cuda/cudnn_pool.hpp"
#include "backends/cuda/max_pool_kernels.hpp"
#include "core/op_registry.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"

namespace treadle::cuda {
namespace {

// ---- convolution
// The forward convolution's geometry, whichever of the four ops the node is. conv_backward_bias
// carries no window: it is described as the 1x1 convolution of dy onto itself, whose bias gradient
// is the one wanted (cuDNN's bias gradient needs only the two tensors' shapes).
ConvGeometry conv_geometry_of(const Graph& g, const Node& node) {
  const std::string& op = op_name(node);
  const Shape& a = shape_of(g, node.inputs[0]);
  if (op == "conv") return conv_geometry_forward(a, shape_of(g, node.inputs[1]), node.attrs);
  if (op == "conv_backward_data") return conv_geometry_backward_data(a, shape_of(g, node.inputs[1]), node.attrs);
  if (op == "conv_backward_weight") return conv_geometry_backward_weight(a, shape_of(g, node.inputs[1]), node.attrs);
  Shape w{a.at(1), a.at(1)};
  for (std::size_t d = 2; d < a.size(); ++d) w.push_back(1);
  return conv_geometry_forward(a, w, Attrs{});
}

// Asymmetric padding: cuDNN then sees the explicitly padded input (padding 0).
bool explicit_padding(const ConvGeometry& g) { return g.pad_begin != g.pad_end; }

Conv2dConfig conv_config(const ConvGeometry& g) {
  const bool pad = explicit_padding(g);
  auto size = [&](int d) { return pad ? g.in[d] + g.pad_begin[d] + g.pad_end[d] : g.in[d]; };
  auto padding = [&](int d) { return pad ? int64_t{0} : g.pad_begin[d]; };
  Conv2dConfig c;
  c.batch = g.batch;
  c.in_channels = g.channels;
  c.height = size(1);
  c.width = size(2);
  c.out_channels = g.out_channels;
  c.kernel = {g.kernel[1], g.kernel[2]};
  c.stride = {g.stride[1], g.stride[2]};
  c.padding = {padding(1), padding(2)};
  c.dilation = {g.dilation[1], g.dilation[2]};
  c.groups = g.groups;
  if (g.nd == 3) {
    c.depth = size(0);
    c.kernel_d = g.kernel[0];
    c.stride_d = g.stride[0];
    c.padding_d = padding(0);
    c.dilation_d = g.dilation[0];
  }
  return c;
}

// The padded volume of the convolution's input x (conv, conv_backward_weight) or of dx
// (conv_backward_data): the same shapes, so one geometry.
PadGeometry pad_geometry(const ConvGeometry& g) {
  PadGeometry p;
  p.planes = g.batch * g.channels;
  for (int d = 0; d < 3; ++d) {
    p.in[d] = g.in[d];
    p.pad_begin[d] = g.pad_begin[d];
    p.pad_end[d] = g.pad_end[d];
  }
  return p;
}

bool accepts_conv(const Graph& g, const Node& node) {
  if (!float32_node(g, node)) return false;
  try {
    // conv_backward_bias accepts any (N, C, ...) gradient; the geometry needs 1 to 3 spatial dims.
    const ConvGeometry geo = conv_geometry_of(g, node);
    if (explicit_padding(geo) && pad_geometry(geo).padded_elements() < 1) return false;
    validate_conv2d(conv_config(geo));  // host-only: the limits of cuDNN's descriptors
  } catch (const ValueError&) {
    return false;
  }
  return true;
}

struct ConvState {
  ConvState(cudnnHandle_t handle, const Conv2dConfig& config) : conv(handle, config) {}
  CudnnConv2d conv;
  bool post = false;  // a fused activation, reading the convolution from the workspace
  Activation act = Activation::relu;
  std::size_t product_offset = 0;
  // Mixed precision: the rounded copies of inputs 0 and 1 in the workspace.
  OperandRounding rounding = OperandRounding::none;
  std::size_t rounded_offset[2] = {0, 0};
  // Asymmetric padding: the padded x (or dx) in the workspace.
  bool padded = false;
  PadGeometry pad;
  std::size_t pad_offset = 0;
};

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

// The two operands the convolution reads: inputs 0 and 1, or their rounded copies (written here).
std::pair<const float*, const float*> conv_operands(const KernelArgs& a, const ConvState& s) {
  if (s.rounding == OperandRounding::none) return {in_f(a, 0), in_f(a, 1)};
  float* copies[2];
  for (int k = 0; k < 2; ++k) {
    copies[k] = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + s.rounded_offset[k]);
    round_operand(s.rounding, in_f(a, k), copies[k], a.in[k].numel, stream_of(a));
  }
  return {copies[0], copies[1]};
}

PreparedNode prepare_conv(const Graph& g, const Node& node) {
  const ConvGeometry geo = conv_geometry_of(g, node);
  auto s = std::make_shared<ConvState>(cudnn_handle(nullptr), conv_config(geo));
  if (s->conv.out_height() != geo.out[1] || s->conv.out_width() != geo.out[2])
    throw_runtime_error(op_name(node), ": cuDNN's output size (", s->conv.out_height(), ", ", s->conv.out_width(),
                        ") differs from the core's (", geo.out[1], ", ", geo.out[2], ")");
  if (geo.nd == 3 && s->conv.out_depth() != geo.out[0])
    throw_runtime_error(op_name(node), ": cuDNN's output depth ", s->conv.out_depth(), " differs from the core's ",
                        geo.out[0]);
  const std::string& act = fused_activation(node.attrs);
  PreparedNode p;
  p.workspace = s->conv.workspace_bytes();
  if (!act.empty()) {  // the activation kernel's operands are __restrict__: never in place
    s->post = true;
    s->act = act == "relu" ? Activation::relu : act == "tanh" ? Activation::tanh : Activation::sigmoid;
    s->product_offset = post_product_offset(p.workspace);
    const auto out_elements = static_cast<std::size_t>(shape_numel(shape_of(g, node.outputs[0])));
    p.workspace = s->product_offset + out_elements * sizeof(float);
  }
  if (op_name(node) != "conv_backward_bias") s->rounding = operand_rounding(node.attrs);
  if (s->rounding != OperandRounding::none) {
    for (int k = 0; k < 2; ++k) {
      s->rounded_offset[k] = align256(p.workspace);
      p.workspace = s->rounded_offset[k] + static_cast<std::size_t>(shape_numel(shape_of(g, node.inputs[k]))) * sizeof(float);
    }
  }
  if (explicit_padding(geo)) {
    s->padded = true;
    s->pad = pad_geometry(geo);
    s->pad_offset = align256(p.workspace);
    p.workspace = s->pad_offset + static_cast<std::size_t>(s->pad.padded_elements()) * sizeof(float);
  }
  p.state = std::move(s);
  return p;
}

const ConvState& conv_state(const KernelArgs& a) { return *static_cast<const ConvState*>(a.state); }

float* padded_buffer(const KernelArgs& a, const ConvState& s) {
  return reinterpret_cast<float*>(static_cast<char*>(a.workspace) + s.pad_offset);
}

// The convolution's input as cuDNN sees it: x itself, or its explicitly padded copy.
const float* conv_input(const KernelArgs& a, const ConvState& s, const float* x) {
  if (!s.padded) return x;
  float* xp = padded_buffer(a, s);
  pad_volume(x, xp, s.pad, stream_of(a));
  return xp;
}

void conv_kernel(const KernelArgs& a) {
  const ConvState& s = conv_state(a);
  float* y = s.post ? reinterpret_cast<float*>(static_cast<char*>(a.workspace) + s.product_offset) : out_f(a);
  const auto [x_in, w] = conv_operands(a, s);
  const float* x = conv_input(a, s, x_in);
  s.conv.forward(cudnn_handle(stream_of(a)), x, w, a.num_in == 3 ? in_f(a, 2) : nullptr, y, a.workspace);
  if (s.post) activation_forward(s.act, y, out_f(a), a.out[0].numel, stream_of(a));
}

// (dy, w[, bias]) -> dx; with the bias, the core's conv_transpose: dx + bias per channel (not
// rounded under a precision attribute: the core adds it in float32 too).
void conv_backward_data_kernel(const KernelArgs& a) {
  const ConvState& s = conv_state(a);
  const auto [dy, w] = conv_operands(a, s);
  const float* bias = a.num_in == 3 ? in_f(a, 2) : nullptr;
  cudnnHandle_t h = cudnn_handle(stream_of(a));
  if (s.padded) {  // the padded gradient, cropped (and the bias added) into dx
    float* dxp = padded_buffer(a, s);
    s.conv.backward_data(h, dy, w, dxp, false, a.workspace);
    crop_volume(dxp, out_f(a), s.pad, bias, s.conv.config().in_channels, stream_of(a));
    return;
  }
  s.conv.backward_data(h, dy, w, out_f(a), false, a.workspace);
  if (bias != nullptr) s.conv.add_input_bias(h, bias, out_f(a));
}

// (x, dy) -> dw
void conv_backward_weight_kernel(const KernelArgs& a) {
  const ConvState& s = conv_state(a);
  const auto [x_in, dy] = conv_operands(a, s);
  const float* x = conv_input(a, s, x_in);
  s.conv.backward_filter(cudnn_handle(stream_of(a)), x, dy, out_f(a), false, a.workspace);
}

// (dy) -> db
void conv_backward_bias_kernel(const KernelArgs& a) {
  conv_state(a).conv.backward_bias(cudnn_handle(stream_of(a)), in_f(a, 0), out_f(a), false);
}

// ---- pooling. The pooled input's shape is the forward's input, or the backward's output.
PoolGeometry pool_geometry_of(const Graph& g, const Node& node, const char* kind) {
  const bool backward = op_name(node).ends_with("_backward");
  const Shape& x = backward ? shape_of(g, node.outputs[0]) : shape_of(g, node.inputs[0]);
  return pool_geometry(kind, x, node.attrs, std::string(kind) == "max");
}

MaxPoolGeometry max_geometry(const PoolGeometry& p) {
  MaxPoolGeometry m;
  m.planes = p.planes;
  m.in_h = p.in[1];
  m.in_w = p.in[2];
  m.out_h = p.out[1];
  m.out_w = p.out[2];
  m.kernel_h = p.kernel[1];
  m.kernel_w = p.kernel[2];
  m.stride_h = p.stride[1];
  m.stride_w = p.stride[2];
  m.pad_h = p.pad[1];
  m.pad_w = p.pad[2];
  m.dilation_h = p.dilation[1];
  m.dilation_w = p.dilation[2];
  m.in_d = p.in[0];
  m.out_d = p.out[0];
  m.kernel_d = p.kernel[0];
  m.stride_d = p.stride[0];
  m.pad_d = p.pad[0];
  m.dilation_d = p.dilation[0];
  return m;
}

bool accepts_max_pool(const Graph& g, const Node& node) { return float32_node(g, node); }

PreparedNode prepare_max_pool(const Graph& g, const Node& node) {
  PreparedNode p;
  p.state = std::make_shared<MaxPoolGeometry>(max_geometry(pool_geometry_of(g, node, "max")));
  return p;
}

void max_pool_kernel(const KernelArgs& a) {
  max_pool2d_with_indices(in_f(a, 0), out_f(a, 0), static_cast<int64_t*>(a.out[1].data),
                          *static_cast<const MaxPoolGeometry*>(a.state), stream_of(a));
}

// (dy, indices) -> dx
void max_pool_backward_kernel(const KernelArgs& a) {
  max_pool2d_backward_indices(in_f(a, 0), static_cast<const int64_t*>(a.in[1].data), out_f(a),
                              *static_cast<const MaxPoolGeometry*>(a.state), stream_of(a));
}

// Average pooling over (N*C, 1, H, W): cuDNN's planes are independent, so one channel per plane.
Pool2dConfig avg_config(const PoolGeometry& p, const Attrs& attrs) {
  Pool2dConfig c;
  c.batch = p.planes;
  c.channels = 1;
  c.height = p.in[1];
  c.width = p.in[2];
  c.mode = attrs.i_or("count_include_pad", 1) ? PoolMode::avg_include_pad : PoolMode::avg_exclude_pad;
  c.kernel = {p.kernel[1], p.kernel[2]};
  c.stride = Hw{p.stride[1], p.stride[2]};
  c.padding = {p.pad[1], p.pad[2]};
  c.ceil_mode = p.ceil_mode;
  c.divisor_override = attrs.i_or("divisor_override", 0);
  return c;
}

// cuDNN where it can say the pool (1-d and 2-d, no divisor_override, ceil_mode not changing the
// size); else the own kernels (avg_pool_kernels.hpp), which follow the reference in everything.
struct AvgPoolState {
  std::unique_ptr<CudnnPool2d> cudnn;
  AvgPoolGeometry own;
};

bool cudnn_can_pool(const PoolGeometry& p, const Attrs& attrs) {
  if (p.nd > 2) return false;
  try {
    validate_pool2d(avg_config(p, attrs));  // refuses divisor_override and size-changing ceil_mode
  } catch (const ValueError&) {
    return false;
  }
  return true;
}

AvgPoolGeometry own_avg_geometry(const PoolGeometry& p, const Attrs& attrs) {
  AvgPoolGeometry g;
  g.planes = p.planes;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = p.in[d];
    g.out[d] = p.out[d];
    g.kernel[d] = p.kernel[d];
    g.stride[d] = p.stride[d];
    g.pad[d] = p.pad[d];
  }
  g.include_pad = attrs.i_or("count_include_pad", 1) != 0;
  g.divisor_override = attrs.i_or("divisor_override", 0);
  return g;
}

bool accepts_avg_pool(const Graph& g, const Node& node) { return float32_node(g, node); }

PreparedNode prepare_avg_pool(const Graph& g, const Node& node) {
  const PoolGeometry geo = pool_geometry_of(g, node, "avg");
  auto s = std::make_shared<AvgPoolState>();
  if (cudnn_can_pool(geo, node.attrs)) s->cudnn = std::make_unique<CudnnPool2d>(avg_config(geo, node.attrs));
  else s->own = own_avg_geometry(geo, node.attrs);
  PreparedNode p;
  p.state = std::move(s);
  return p;
}

const AvgPoolState& avg_state(const KernelArgs& a) { return *static_cast<const AvgPoolState*>(a.state); }

void avg_pool_kernel(const KernelArgs& a) {
  const AvgPoolState& s = avg_state(a);
  if (s.cudnn) s.cudnn->forward(cudnn_handle(stream_of(a)), in_f(a, 0), out_f(a));
  else avg_pool_forward(in_f(a, 0), out_f(a), s.own, stream_of(a));
}

// (dy) -> dx; the average modes read neither x nor y.
void avg_pool_backward_kernel(const KernelArgs& a) {
  const AvgPoolState& s = avg_state(a);
  if (s.cudnn) s.cudnn->backward(cudnn_handle(stream_of(a)), nullptr, nullptr, in_f(a, 0), out_f(a));
  else avg_pool_backward(in_f(a, 0), out_f(a), s.own, stream_of(a));
}

// ---- batch norm (spatial): x (N, C, *) seen as (N, C, S, 1). The node's x is input 0, or input 1
// of batch_norm_backward (dy, x, mean, rstd[, weight]); affine nodes carry weight (and bias).
const Shape& bn_x(const Graph& g, const Node& node) {
  return shape_of(g, node.inputs[op_name(node) == "batch_norm_backward" ? 1 : 0]);
}

BatchNormConfig bn_config(const Graph& g, const Node& node) {
  const std::string& op = op_name(node);
  const Shape& x = bn_x(g, node);
  BatchNormConfig c;
  c.batch = x.at(0);
  c.channels = x.at(1);
  c.spatial = shape_numel(x) / (c.batch * c.channels);
  // batch_norm_backward carries no eps: with the saved mean and rstd given, cuDNN does not use it.
  c.eps = node.attrs.has("eps") ? node.attrs.f("eps") : 1e-5;
  c.affine = node.inputs.size() == (op == "batch_norm" ? 3u : 5u);
  return c;
}

bool accepts_batch_norm(const Graph& g, const Node& node) {
  if (!float32_node(g, node) || bn_x(g, node).size() < 2) return false;
  try {
    validate_batch_norm(bn_config(g, node));
  } catch (const ValueError&) {
    return false;
  }
  return true;
}

PreparedNode prepare_batch_norm(const Graph& g, const Node& node) {
  auto bn = std::make_shared<CudnnBatchNorm>(bn_config(g, node));
  PreparedNode p;
  p.workspace = bn->workspace_bytes();
  p.state = std::move(bn);
  return p;
}

const CudnnBatchNorm& bn_state(const KernelArgs& a) { return *static_cast<const CudnnBatchNorm*>(a.state); }

// (x[, weight, bias]) -> (y, mean, rstd); the running statistics are batch_norm_update_stats' work.
void batch_norm_kernel(const KernelArgs& a) {
  const bool affine = a.num_in == 3;
  bn_state(a).forward_training(cudnn_handle(stream_of(a)), in_f(a, 0), affine ? in_f(a, 1) : nullptr,
                               affine ? in_f(a, 2) : nullptr, out_f(a, 0), out_f(a, 1), out_f(a, 2), nullptr, nullptr,
                               0.0, a.workspace);
}

// (x, running_mean, running_var[, weight, bias]) -> y
void batch_norm_eval_kernel(const KernelArgs& a) {
  const bool affine = a.num_in == 5;
  bn_state(a).forward_inference(cudnn_handle(stream_of(a)), in_f(a, 0), affine ? in_f(a, 3) : nullptr,
                                affine ? in_f(a, 4) : nullptr, in_f(a, 1), in_f(a, 2), out_f(a), a.workspace);
}

// (dy, x, mean, rstd[, weight]) -> (dx[, dweight, dbias])
void batch_norm_backward_kernel(const KernelArgs& a) {
  const bool affine = a.num_in == 5;
  bn_state(a).backward(cudnn_handle(stream_of(a)), in_f(a, 1), in_f(a, 0), affine ? in_f(a, 4) : nullptr, in_f(a, 2),
                       in_f(a, 3), out_f(a, 0), affine ? out_f(a, 1) : nullptr, affine ? out_f(a, 2) : nullptr, false,
                       a.workspace);
}

// (mean, rstd, running_mean, running_var, num_batches_tracked): updates the last three in place.
struct UpdateStats {
  double eps = 0, momentum = 0;
  int64_t count = 0;
};

bool accepts_update_stats(const Graph& g, const Node& node) {
  for (int v : node.inputs)
    if (g.info(v).dtype != DType::f32) return false;
  return shape_numel(shape_of(g, node.inputs[0])) > 0;
}

PreparedNode prepare_update_stats(const Graph&, const Node& node) {
  auto u = std::make_shared<UpdateStats>();
  u->eps = node.attrs.f("eps");
  u->momentum = node.attrs.f("momentum");
  u->count = node.attrs.i("count");
  PreparedNode p;
  p.state = std::move(u);
  return p;
}

void update_stats_kernel(const KernelArgs& a) {
  const UpdateStats& u = *static_cast<const UpdateStats*>(a.state);
  auto io = [&](int k) { return static_cast<float*>(a.in[k].data); };
  batch_norm_update_stats(in_f(a, 0), in_f(a, 1), io(2), io(3), io(4), a.in[0].numel, u.eps, u.momentum, u.count,
                          stream_of(a));
}

}  // namespace

std::vector<OpEntry> cnn_op_entries() {
  return {
      {"conv", accepts_conv, prepare_conv, conv_kernel},
      {"conv_backward_data", accepts_conv, prepare_conv, conv_backward_data_kernel},
      {"conv_backward_weight", accepts_conv, prepare_conv, conv_backward_weight_kernel},
      {"conv_backward_bias", accepts_conv, prepare_conv, conv_backward_bias_kernel},
      {"max_pool", accepts_max_pool, prepare_max_pool, max_pool_kernel},
      {"max_pool_backward", accepts_max_pool, prepare_max_pool, max_pool_backward_kernel},
      {"avg_pool", accepts_avg_pool, prepare_avg_pool, avg_pool_kernel},
      {"avg_pool_backward", accepts_avg_pool, prepare_avg_pool, avg_pool_backward_kernel},
      {"batch_norm", accepts_batch_norm, prepare_batch_norm, batch_norm_kernel},
      {"batch_norm_eval", accepts_batch_norm, prepare_batch_norm, batch_norm_eval_kernel},
      {"batch_norm_backward", accepts_batch_norm, prepare_batch_norm, batch_norm_backward_kernel},
      {"batch_norm_update_stats", accepts_update_stats, prepare_update_stats, update_stats_kernel},
  };
}

cudnnHandle_t cudnn_handle(cudaStream_t stream) {
  // A cuDNN handle belongs to the device current when it is made, is bound to a stream and must not
  // be used by two threads at once: one per host thread and device (contexts on different threads
  // never share one), rebound when the stream changes. Kernels run with their plan's device current.
  struct Bound {
    std::unique_ptr<CudnnHandle> handle;
    cudaStream_t stream = nullptr;
  };
  thread_local std::map<int, Bound> handles;
  Bound& mine = handles[current_device()];
  if (!mine.handle) {
    mine.handle = std::make_unique<CudnnHandle>(stream);
    mine.stream = stream;
  } else if (mine.stream != stream) {
    mine.handle->set_stream(stream);
    mine.stream = stream;
  }
  return mine.handle->get();
}

}  // namespace treadle::cuda

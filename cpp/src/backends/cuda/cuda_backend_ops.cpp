// Op adapters of the CUDA backend. Each kernel reads device pointers from KernelArgs, shapes from
// its TensorRefs or from what prepare computed, and enqueues one call of the kernel layer on
// KernelArgs::stream; scratch is the plan's workspace (PreparedNode::workspace), so nothing
// allocates during a step. Covered (float32 only): linear (with a fused relu/tanh/sigmoid, precision
// "bf16" as exact bf16 operands), matmul, sum_to (every reduction the core allows), relu/tanh/sigmoid/
// gelu/silu and their backward ops, softmax and softmax_backward, cross_entropy and its backward, constant.
#include "backends/cuda/cuda_backend_ops.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "backends/cuda/linear_lt.hpp"
#include "backends/cuda/lt_gemm.hpp"
#include "core/op_registry.hpp"
#include "ops/fusion.hpp"
#include "ops/precision.hpp"

namespace treadle::cuda {
namespace {

int64_t numel_of(const Graph& g, int value) { return shape_numel(g.info(value).shape); }

MathMode math_of(const Attrs& attrs) {
  switch (operand_rounding(attrs)) {
    case OperandRounding::bf16: return MathMode::bf16_operands;
    case OperandRounding::fp16: return MathMode::fp16_operands;
    case OperandRounding::none: break;
  }
  return MathMode::f32;
}


// ---- linear: one LtLinear per node; a fused relu with a bias is cuBLASLt's RELU_BIAS epilogue, any
// other fused activation reads the product from the workspace (after the product's own scratch) and
// writes the output: the activation kernel's operands are __restrict__, so it never runs in place.
struct LinearState {
  LinearState(cublasLtHandle_t handle, const LinearConfig& config) : lt(handle, config) {}
  LtLinear lt;
  bool post = false;
  Activation act = Activation::relu;
  std::size_t product_offset = 0;  // where the pre-activation product sits in the workspace
};

Activation activation_named(const std::string& name, const Attrs& attrs) {
  if (name == "relu") return Activation::relu;
  if (name == "tanh") return Activation::tanh;
  if (name == "sigmoid") return Activation::sigmoid;
  if (name == "silu") return Activation::silu;
  if (name == "gelu") return attrs.has("approximate") && attrs.s("approximate") == "tanh" ? Activation::gelu_tanh
                                                                                           : Activation::gelu;
  throw_runtime_error("cuda: no activation kernel named '", name, "'");
}

bool accepts_linear(const Graph& g, const Node& node) {
  return float32_node(g, node) && numel_of(g, node.inputs[0]) > 0;
}

PreparedNode prepare_linear(const Graph& g, const Node& node) {
  const Shape& w = shape_of(g, node.inputs[1]);
  const bool bias = node.inputs.size() == 3;
  const std::string& act = fused_activation(node.attrs);
  const bool relu_epilogue = bias && act == "relu";
  LinearConfig c;
  c.batch = numel_of(g, node.inputs[0]) / w[1];
  c.in_features = w[1];
  c.out_features = w[0];
  c.epilogue = !bias ? LinearEpilogue::none : relu_epilogue ? LinearEpilogue::bias_relu : LinearEpilogue::bias;
  c.math = math_of(node.attrs);
  auto s = std::make_shared<LinearState>(lt_handle(), c);
  s->post = !act.empty() && !relu_epilogue;
  std::size_t ws = s->lt.workspace_bytes();
  if (s->post) {
    s->act = activation_named(act, node.attrs);
    s->product_offset = post_product_offset(ws);
    ws = s->product_offset + static_cast<std::size_t>(numel_of(g, node.outputs[0])) * sizeof(float);
  }
  return with_state(std::move(s), ws);
}

void linear_kernel(const KernelArgs& a) {
  const LinearState& s = state_of<LinearState>(a);
  const float* bias = a.num_in == 3 ? in_f(a, 2) : nullptr;
  if (!s.post) {
    s.lt.forward(in_f(a, 0), in_f(a, 1), bias, out_f(a), a.workspace, stream_of(a));
    return;
  }
  float* product = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + s.product_offset);
  s.lt.forward(in_f(a, 0), in_f(a, 1), bias, product, a.workspace, stream_of(a));
  activation_forward(s.act, product, out_f(a), a.out[0].numel, stream_of(a));
}

// ---- matmul (the gradients of linear: dy W and dy^T x)
bool accepts_matmul(const Graph& g, const Node& node) {
  return float32_node(g, node) && numel_of(g, node.inputs[0]) > 0 && numel_of(g, node.inputs[1]) > 0;
}

PreparedNode prepare_matmul(const Graph& g, const Node& node) {
  const Shape &a = shape_of(g, node.inputs[0]), &b = shape_of(g, node.inputs[1]);
  MatmulConfig c;
  c.trans_a = node.attrs.i_or("trans_a", 0) != 0;
  c.trans_b = node.attrs.i_or("trans_b", 0) != 0;
  c.m = c.trans_a ? a[1] : a[0];
  c.k = c.trans_a ? a[0] : a[1];
  c.n = c.trans_b ? b[0] : b[1];
  c.math = math_of(node.attrs);
  auto s = std::make_shared<LtMatmul>(lt_handle(), c);
  const std::size_t ws = s->workspace_bytes();
  return with_state(std::move(s), ws);
}

void matmul_kernel(const KernelArgs& a) {
  state_of<LtMatmul>(a).run(in_f(a, 0), in_f(a, 1), out_f(a), false, a.workspace, stream_of(a));
}

// ---- sum_to over any dimensions the core allows (the gradient of broadcasting): the layout of kept
// and summed dimensions once per node; (..., C) -> (C,) and its like are column sums (bias gradients).
bool sum_to_layout_of(const Graph& g, const Node& node, SumToLayout& layout) {
  return sum_to_layout(shape_of(g, node.inputs[0]), shape_of(g, node.outputs[0]), layout);
}

bool accepts_sum_to(const Graph& g, const Node& node) {
  SumToLayout unused;
  return float32_node(g, node) && sum_to_layout_of(g, node, unused);
}

PreparedNode prepare_sum_to(const Graph& g, const Node& node) {
  auto l = std::make_shared<SumToLayout>();
  if (!sum_to_layout_of(g, node, *l))
    throw_value_error("sum_to: no CUDA layout for ", shape_str(shape_of(g, node.inputs[0])), " -> ",
                      shape_str(shape_of(g, node.outputs[0])));
  const std::size_t ws = sum_to_workspace_bytes(*l);
  return with_state(std::move(l), ws);
}

void sum_to_kernel(const KernelArgs& a) {
  sum_to(in_f(a, 0), out_f(a), state_of<SumToLayout>(a), a.workspace, stream_of(a));
}

// ---- activations: the forward op's name, or the backward op's without "_backward"
bool accepts_elementwise(const Graph& g, const Node& node) { return float32_node(g, node); }

PreparedNode prepare_activation(const Graph&, const Node& node) {
  std::string name = op_name(node);
  if (name.ends_with("_backward")) name.resize(name.size() - 9);
  return with_state(std::make_shared<Activation>(activation_named(name, node.attrs)));
}

void activation_kernel(const KernelArgs& a) {
  activation_forward(state_of<Activation>(a), in_f(a, 0), out_f(a), a.out[0].numel, stream_of(a));
}

// (saved, dy) -> dx, `saved` being y or x exactly as the core's backward op takes it.
void activation_backward_kernel(const KernelArgs& a) {
  activation_backward(state_of<Activation>(a), in_f(a, 0), in_f(a, 1), out_f(a), a.out[0].numel, stream_of(a));
}

// ---- softmax over attribute "axis" (prepare_axis_split, shared with log_softmax)
void softmax_kernel(const KernelArgs& a) {
  const AxisSplit& x = state_of<AxisSplit>(a);
  softmax_forward(in_f(a, 0), out_f(a), x.outer, x.axis, x.inner, stream_of(a));
}

void softmax_backward_kernel(const KernelArgs& a) {
  const AxisSplit& x = state_of<AxisSplit>(a);
  softmax_backward(in_f(a, 0), in_f(a, 1), out_f(a), x.outer, x.axis, x.inner, stream_of(a));
}

// ---- cross-entropy with int64 class indices: logits (C) or (N, C, d1, ...)
struct CrossEntropyState {
  int64_t outer = 1, classes = 1, inner = 1;
  Reduction reduction = Reduction::mean;
};

CrossEntropyState cross_entropy_geometry(const Graph& g, const Node& node) {
  const Shape& s = shape_of(g, node.inputs[0]);
  CrossEntropyState c;
  c.reduction = node.attrs.s("reduction") == "sum" ? Reduction::sum : Reduction::mean;
  if (s.size() == 1) {
    c.classes = s[0];
    return c;
  }
  c.outer = s[0];
  c.classes = s[1];
  for (std::size_t d = 2; d < s.size(); ++d) c.inner *= s[d];
  return c;
}

bool accepts_cross_entropy(const Graph& g, const Node& node) {
  return float32_node(g, node) && numel_of(g, node.inputs[0]) > 0;
}

PreparedNode prepare_cross_entropy(const Graph& g, const Node& node) {
  auto c = std::make_shared<CrossEntropyState>(cross_entropy_geometry(g, node));
  const std::size_t ws = op_name(node) == "cross_entropy" ? cross_entropy_workspace_bytes(c->outer, c->inner) : 0;
  return with_state(std::move(c), ws);
}

void cross_entropy_kernel(const KernelArgs& a) {
  const CrossEntropyState& c = state_of<CrossEntropyState>(a);
  cross_entropy_forward(in_f(a, 0), static_cast<const int64_t*>(a.in[1].data), out_f(a), c.outer, c.classes, c.inner,
                        c.reduction, a.workspace, stream_of(a));
}

void cross_entropy_backward_kernel(const KernelArgs& a) {
  const CrossEntropyState& c = state_of<CrossEntropyState>(a);
  cross_entropy_backward(in_f(a, 0), static_cast<const int64_t*>(a.in[1].data), in_f(a, 2), out_f(a), c.outer,
                         c.classes, c.inner, c.reduction, stream_of(a));
}

// ---- constant: a float32 fill (the loss's seed)
PreparedNode prepare_constant(const Graph&, const Node& node) {
  return with_state(std::make_shared<float>(static_cast<float>(node.attrs.f("value"))));
}

void constant_kernel(const KernelArgs& a) { fill(out_f(a), state_of<float>(a), a.out[0].numel, stream_of(a)); }

}  // namespace

PreparedNode prepare_axis_split(const Graph& g, const Node& node) {
  const Shape& s = shape_of(g, node.inputs[0]);
  const int64_t ax = node.attrs.i("axis");
  auto split = std::make_shared<AxisSplit>();
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    int64_t& part = d < ax ? split->outer : d == ax ? split->axis : split->inner;
    part *= s[d];
  }
  return with_state(std::move(split));
}

std::vector<OpEntry> op_entries() {
  std::vector<OpEntry> e = {
      {"linear", accepts_linear, prepare_linear, linear_kernel, false},
      {"matmul", accepts_matmul, prepare_matmul, matmul_kernel, false},
      {"sum_to", accepts_sum_to, prepare_sum_to, sum_to_kernel},
      {"softmax", accepts_elementwise, prepare_axis_split, softmax_kernel},
      {"softmax_backward", accepts_elementwise, prepare_axis_split, softmax_backward_kernel},
      {"cross_entropy", accepts_cross_entropy, prepare_cross_entropy, cross_entropy_kernel},
      {"cross_entropy_backward", accepts_cross_entropy, prepare_cross_entropy, cross_entropy_backward_kernel},
      {"constant", accepts_elementwise, prepare_constant, constant_kernel},
  };
  for (const std::string act : {"relu", "tanh", "sigmoid", "gelu", "silu"}) {
    e.push_back({act, accepts_elementwise, prepare_activation, activation_kernel});
    e.push_back({act + "_backward", accepts_elementwise, prepare_activation, activation_backward_kernel});
  }
  return e;
}

cublasLtHandle_t lt_handle() {
  // One per device for the process, made on the current device by its first prepare and kept to the
  // end of the process: destroying it during static destruction could run after the driver shut down.
  static std::mutex made;
  static std::map<int, const CublasLtHandle*> handles;
  const int device = current_device();
  std::lock_guard<std::mutex> lock(made);
  const CublasLtHandle*& handle = handles[device];
  if (!handle) handle = new CublasLtHandle();
  return handle->get();
}

}  // namespace treadle::cuda

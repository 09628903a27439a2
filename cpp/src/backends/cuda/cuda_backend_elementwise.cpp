// Op adapters of the CUDA backend for elementwise work (float32): add, sub and mul with the core's
// broadcasting (the layout computed once per node), scale, mul3, leaky_relu / elu / softplus and their
// backward ops, the losses mse_loss / l1_loss / huber_loss / bce_with_logits and their backward ops
// (the total's partial sums in the plan workspace), and dropout (the reference's mask bit for bit:
// it is a pure function of the context's seed, the step's RNG counter, the node's "stream"
// attribute and the element index). Kernels: elementwise_kernels.hpp, loss_kernels.hpp.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/device_rng.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "backends/cuda/loss_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// Empty tensors are taken (float32_dtypes, not float32_node): these kernels enqueue nothing for
// them (a loss of no elements still writes its total: NaN for a mean, 0 for a sum).



// The op's name without "_backward": the forward op a backward node belongs to.
std::string forward_name(const Node& node) {
  std::string name = op_name(node);
  if (name.ends_with("_backward")) name.resize(name.size() - 9);
  return name;
}

// ---- add, sub, mul: numpy broadcasting as one strided layout (at most kMaxLayoutDims after merging)
struct BinaryState {
  BinaryOp op = BinaryOp::add;
  StridedLayout layout;
};

bool binary_layout(const Graph& g, const Node& node, StridedLayout& layout) {
  return broadcast_layout(shape_of(g, node.inputs[0]), shape_of(g, node.inputs[1]), shape_of(g, node.outputs[0]),
                          layout);
}

bool accepts_binary(const Graph& g, const Node& node) {
  StridedLayout unused;
  return float32_dtypes(g, node) && binary_layout(g, node, unused);
}

PreparedNode prepare_binary(const Graph& g, const Node& node) {
  auto s = std::make_shared<BinaryState>();
  const std::string& name = op_name(node);
  s->op = name == "add" ? BinaryOp::add : name == "sub" ? BinaryOp::sub : BinaryOp::mul;
  if (!binary_layout(g, node, s->layout))
    throw_value_error(name, ": no CUDA layout for shapes ", shape_str(shape_of(g, node.inputs[0])), " and ",
                      shape_str(shape_of(g, node.inputs[1])));
  return with_state(std::move(s));
}

void binary_kernel(const KernelArgs& a) {
  const BinaryState& s = state_of<BinaryState>(a);
  binary_forward(s.op, in_f(a, 0), in_f(a, 1), out_f(a), a.out[0].numel, s.layout, stream_of(a));
}

// ---- scale: alpha rounded to float32 as the reference
bool accepts_elementwise(const Graph& g, const Node& node) { return float32_dtypes(g, node); }

PreparedNode prepare_scale(const Graph&, const Node& node) {
  return with_state(std::make_shared<float>(static_cast<float>(node.attrs.f("alpha"))));
}

void scale_kernel(const KernelArgs& a) {
  scale_forward(in_f(a, 0), out_f(a), state_of<float>(a), a.out[0].numel, stream_of(a));
}

// ---- mul3 (a, b, c of one shape): alpha rounded as scale's
void mul3_kernel(const KernelArgs& a) {
  mul3_forward(in_f(a, 0), in_f(a, 1), in_f(a, 2), out_f(a), state_of<float>(a), a.out[0].numel, stream_of(a));
}

// ---- leaky_relu, elu, softplus and their backward ops (x, dy): attributes as the op normalised them
PreparedNode prepare_param_activation(const Graph&, const Node& node) {
  const std::string name = forward_name(node);
  auto p = std::make_shared<ParamActivation>();
  if (name == "leaky_relu") {
    p->kind = ParamActivation::Kind::leaky_relu;
    p->negative_slope = static_cast<float>(node.attrs.f("negative_slope"));
  } else if (name == "elu") {
    p->kind = ParamActivation::Kind::elu;
    p->alpha = static_cast<float>(node.attrs.f("alpha"));
  } else if (name == "softplus") {
    p->kind = ParamActivation::Kind::softplus;
    p->beta = static_cast<float>(node.attrs.f("beta"));
    p->threshold = static_cast<float>(node.attrs.f("threshold"));
  } else {
    throw_runtime_error("cuda: no activation kernel named '", name, "'");
  }
  return with_state(std::move(p));
}

void param_activation_kernel(const KernelArgs& a) {
  param_activation_forward(state_of<ParamActivation>(a), in_f(a, 0), out_f(a), a.out[0].numel, stream_of(a));
}

void param_activation_backward_kernel(const KernelArgs& a) {
  param_activation_backward(state_of<ParamActivation>(a), in_f(a, 0), in_f(a, 1), out_f(a), a.out[0].numel,
                            stream_of(a));
}

// ---- losses of (pred, target) of one shape; backward (pred, target, upstream scalar)
struct LossState {
  PointLoss kind = PointLoss::mse;
  Reduction reduction = Reduction::mean;
  float delta = 1.0f;
};

PointLoss point_loss_named(const std::string& name) {
  if (name == "mse_loss") return PointLoss::mse;
  if (name == "l1_loss") return PointLoss::l1;
  if (name == "huber_loss") return PointLoss::huber;
  if (name == "bce_with_logits") return PointLoss::bce_with_logits;
  throw_runtime_error("cuda: no loss kernel named '", name, "'");
}

PreparedNode prepare_loss(const Graph& g, const Node& node) {
  auto s = std::make_shared<LossState>();
  s->kind = point_loss_named(forward_name(node));
  s->reduction = node.attrs.s("reduction") == "sum" ? Reduction::sum : Reduction::mean;
  if (s->kind == PointLoss::huber) s->delta = static_cast<float>(node.attrs.f("delta"));
  const bool forward = !op_name(node).ends_with("_backward");
  const std::size_t ws = forward ? point_loss_workspace_bytes(shape_numel(shape_of(g, node.inputs[0]))) : 0;
  return with_state(std::move(s), ws);
}

void loss_kernel(const KernelArgs& a) {
  const LossState& s = state_of<LossState>(a);
  point_loss_forward(s.kind, in_f(a, 0), in_f(a, 1), out_f(a), a.in[0].numel, s.reduction, s.delta, a.workspace,
                     stream_of(a));
}

void loss_backward_kernel(const KernelArgs& a) {
  const LossState& s = state_of<LossState>(a);
  point_loss_backward(s.kind, in_f(a, 0), in_f(a, 1), in_f(a, 2), out_f(a), a.in[0].numel, s.reduction, s.delta,
                      stream_of(a));
}

// ---- dropout (x) -> (y, mask)
struct DropoutState {
  double p = 0.5;
  uint64_t stream = 0;  // the node's "stream" attribute: which sequence of the step it draws
};

PreparedNode prepare_dropout(const Graph&, const Node& node) {
  auto s = std::make_shared<DropoutState>();
  s->p = node.attrs.f("p");
  s->stream = static_cast<uint64_t>(node.attrs.i("stream"));
  return with_state(std::move(s));
}

// The step's RNG counter reaches the kernel as an argument, unless the trainer's captured step
// named a device slot for the stream (device_rng.hpp): then the kernel reads the seed and counter
// there, so each replay of the graph draws its own step's mask. A capture without such a slot
// would freeze the captured counter, the same mask on every replay: refused.
void dropout_kernel(const KernelArgs& a) {
  const DropoutState& s = state_of<DropoutState>(a);
  if (const DeviceRngState* rng = device_rng_for(stream_of(a))) {
    dropout_forward_indirect(in_f(a, 0), out_f(a, 0), out_f(a, 1), a.in[0].numel, rng, s.stream, s.p, stream_of(a));
    return;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TREADLE_CUDA_CHECK(cudaStreamIsCapturing(stream_of(a), &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw_value_error("dropout: cannot run inside a CUDA graph capture without a device RNG slot for its stream: a ",
                      "replay would draw the captured step's mask again (Trainer's cuda_graph steps provide one)");
  dropout_forward(in_f(a, 0), out_f(a, 0), out_f(a, 1), a.in[0].numel, dropout_key(a.rng_seed, a.rng_counter, s.stream),
                  s.p, stream_of(a));
}

}  // namespace

std::vector<OpEntry> elementwise_op_entries() {
  std::vector<OpEntry> e = {
      {"add", accepts_binary, prepare_binary, binary_kernel},
      {"sub", accepts_binary, prepare_binary, binary_kernel},
      {"mul", accepts_binary, prepare_binary, binary_kernel},
      {"scale", accepts_elementwise, prepare_scale, scale_kernel},
      {"mul3", accepts_elementwise, prepare_scale, mul3_kernel},
      {"dropout", accepts_elementwise, prepare_dropout, dropout_kernel},
  };
  for (const std::string act : {"leaky_relu", "elu", "softplus"}) {
    e.push_back({act, accepts_elementwise, prepare_param_activation, param_activation_kernel});
    e.push_back({act + "_backward", accepts_elementwise, prepare_param_activation, param_activation_backward_kernel});
  }
  for (const std::string loss : {"mse_loss", "l1_loss", "huber_loss", "bce_with_logits"}) {
    e.push_back({loss, accepts_elementwise, prepare_loss, loss_kernel});
    e.push_back({loss + "_backward", accepts_elementwise, prepare_loss, loss_backward_kernel});
  }
  return e;
}

}  // namespace treadle::cuda

// LSTM and GRU layers of the CUDA backend on cuDNN's RNN API (cudnn_rnn.hpp): float32, full-length
// sequences, one direction as given. A `reverse` layer (the second half of a bidirectional module)
// and variable lengths have no CUDA kernel: such a device plan fails at finalize, naming the op.
//
// cuDNN keeps the weights in a weight space of its own layout and what its backward needs in a
// reserve space. As with oneDNN's recurrent workspace (docs/architecture.md), the forward of a
// training plan declares the layer's `saved` value an opaque output holding [weight space |
// reserve]; the backward op, the layer's whole gradient (ops/recurrent.hpp), reads both from there,
// so the weights are packed once per step. cuDNN's backward_data also writes into the reserve
// ("completes" it for backward_weights): `saved` is read by that one backward node only, so this
// is safe. An inference plan (nobody reads `saved`) keeps both spaces in the forward's workspace.
#include <memory>
#include <optional>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cudnn_rnn.hpp"
#include "core/op_registry.hpp"
#include "ops/recurrent.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// An optional operand: null when the slot is absent (-1).
const float* opt_in(const KernelArgs& a, int k) { return k < 0 ? nullptr : in_f(a, k); }
float* opt_out(const KernelArgs& a, int k) { return k < 0 ? nullptr : out_f(a, k); }

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

rnn::Cell cell_of(const Node& node) { return op_name(node).starts_with("gru") ? rnn::Cell::gru : rnn::Cell::lstm; }

// The cuDNN layer of a forward (backward = false) or backward node, when this backend can run it.
std::optional<RnnConfig> config_of(const Graph& g, const Node& node, bool backward) {
  const rnn::Cell cell = cell_of(node);
  const rnn::CellInfo ci = rnn::cell_info(cell);
  const int num_in = static_cast<int>(node.inputs.size());
  int w_hh = 0, b_ih = -1, lengths = -1;
  bool valid = false;
  if (backward) {
    const rnn::BackwardSlots s = rnn::backward_slots(ci, num_in);
    valid = s.valid;
    w_hh = s.w_hh, b_ih = s.b_ih, lengths = s.lengths;
  } else {
    const rnn::ForwardSlots s = rnn::forward_slots(ci, num_in);
    valid = s.valid;
    w_hh = s.w_hh, b_ih = s.b_ih, lengths = s.lengths;
  }
  if (!valid || lengths >= 0 || node.attrs.i_or("reverse", 0) != 0) return std::nullopt;
  for (int v : node.inputs)
    if (g.info(v).dtype != DType::f32) return std::nullopt;
  const Shape& x = g.info(node.inputs[0]).shape;
  RnnConfig c;
  c.cell = cell == rnn::Cell::gru ? RnnCell::gru : RnnCell::lstm;
  c.batch_first = node.attrs.i_or("batch_first", 0) != 0;
  c.seq_len = c.batch_first ? x[1] : x[0];
  c.batch = c.batch_first ? x[0] : x[1];
  c.input_size = x[2];
  c.hidden_size = g.info(node.inputs[w_hh]).shape[1];
  c.bias = b_ih >= 0;
  try {
    validate_rnn(c);
  } catch (const ValueError&) {
    return std::nullopt;
  }
  return c;
}

struct RnnState {
  explicit RnnState(const RnnConfig& c) : rnn(cudnn_handle(nullptr), c) {}
  CudnnRnn rnn;
  bool in_saved = false;            // forward: the spaces in `saved` (training) or in the workspace
  std::size_t reserve_offset = 0;   // the reserve, after the weight space
  std::size_t work_offset = 0;      // cuDNN's workspace within the node's workspace
  std::size_t dweights_offset = 0;  // backward: the gradient weight space within the workspace
};

const RnnState& state_of(const KernelArgs& a) { return *static_cast<const RnnState*>(a.state); }

// The forward: inference when nobody reads `saved`; else training, when only the layer's backward
// op reads it (the host reading cuDNN's spaces would get no numbers of ours).
bool accepts_forward(const Graph& g, const Node& node) {
  if (!config_of(g, node, false)) return false;
  const int saved = node.outputs.back();
  const ValueInfo& info = g.info(saved);
  return !info.read || read_only_by(g, saved, op_name(node) + "_backward");
}

PreparedNode prepare_forward(const Graph& g, const Node& node) {
  const std::optional<RnnConfig> c = config_of(g, node, false);
  if (!c) throw_runtime_error(op_name(node), ": no cuDNN layer at prepare time");
  auto s = std::make_shared<RnnState>(*c);
  s->reserve_offset = align256(s->rnn.weight_space_bytes());
  const std::size_t spaces = s->reserve_offset + align256(s->rnn.reserve_bytes());
  s->in_saved = g.info(node.outputs.back()).read;
  PreparedNode p;
  if (s->in_saved) {
    p.opaque_outputs.push_back({static_cast<int>(node.outputs.size()) - 1, spaces});
    p.workspace = s->rnn.workspace_bytes();
  } else {
    s->work_offset = spaces;
    p.workspace = spaces + s->rnn.workspace_bytes();
  }
  p.state = std::move(s);
  return p;
}

void forward_kernel(const KernelArgs& a) {
  const RnnState& s = state_of(a);
  const rnn::CellInfo ci = rnn::cell_info(cell_of(a.node));
  const rnn::ForwardSlots f = rnn::forward_slots(ci, a.num_in);
  cudnnHandle_t h = cudnn_handle(stream_of(a));
  char* spaces = static_cast<char*>(s.in_saved ? a.out[a.num_out - 1].data : a.workspace);
  s.rnn.pack_weights(h, opt_in(a, f.w_ih), opt_in(a, f.w_hh), opt_in(a, f.b_ih), opt_in(a, f.b_hh), spaces);
  s.rnn.forward_training(h, opt_in(a, f.x), opt_in(a, f.h0), opt_in(a, f.c0), spaces, opt_out(a, 0), opt_out(a, 1),
                         ci.has_cell_state ? opt_out(a, 2) : nullptr, static_cast<char*>(a.workspace) + s.work_offset,
                         spaces + s.reserve_offset);
}

// The backward runs where its forward ran: a device plan runs every node on this backend, and the
// forward is taken whenever this backward can be (same layer, `saved` read by this op only).
bool accepts_backward(const Graph& g, const Node& node) { return config_of(g, node, true).has_value(); }

PreparedNode prepare_backward(const Graph& g, const Node& node) {
  const std::optional<RnnConfig> c = config_of(g, node, true);
  if (!c) throw_runtime_error(op_name(node), ": no cuDNN layer at prepare time");
  auto s = std::make_shared<RnnState>(*c);
  s->reserve_offset = align256(s->rnn.weight_space_bytes());
  s->dweights_offset = align256(s->rnn.workspace_bytes());
  PreparedNode p;
  p.workspace = s->dweights_offset + s->rnn.weight_space_bytes();
  p.state = std::move(s);
  return p;
}

void backward_kernel(const KernelArgs& a) {
  const RnnState& s = state_of(a);
  const rnn::CellInfo ci = rnn::cell_info(cell_of(a.node));
  const rnn::BackwardSlots b = rnn::backward_slots(ci, a.num_in);
  cudnnHandle_t h = cudnn_handle(stream_of(a));
  char* spaces = static_cast<char*>(a.in[b.saved].data);  // read by this node only (see the top)
  void* reserve = spaces + s.reserve_offset;
  void* work = a.workspace;
  void* dweights = static_cast<char*>(a.workspace) + s.dweights_offset;
  s.rnn.backward_data(h, opt_in(a, b.y), opt_in(a, b.dy), opt_in(a, b.dh_n), opt_in(a, b.dc_n), opt_in(a, b.h0),
                      opt_in(a, b.c0), spaces, opt_out(a, b.dx), opt_out(a, b.dh0), opt_out(a, b.dc0), work, reserve);
  s.rnn.backward_weights(h, opt_in(a, b.x), opt_in(a, b.h0), opt_in(a, b.y), dweights, false, work, reserve);
  s.rnn.unpack_weight_grads(h, dweights, opt_out(a, b.dw_ih), opt_out(a, b.dw_hh), opt_out(a, b.db_ih),
                            opt_out(a, b.db_hh));
}

}  // namespace

std::vector<OpEntry> rnn_op_entries() {
  std::vector<OpEntry> entries;
  for (const char* cell : {"lstm_layer", "gru_layer"}) {
    // Not claimed bitwise repeatable: cuDNN's RNN weight gradients are not documented to be.
    entries.push_back({cell, &accepts_forward, &prepare_forward, &forward_kernel, false});
    entries.push_back({std::string(cell) + "_backward", &accepts_backward, &prepare_backward, &backward_kernel, false});
  }
  return entries;
}

}  // namespace treadle::cuda

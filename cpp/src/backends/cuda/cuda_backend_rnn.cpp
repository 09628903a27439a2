// LSTM, GRU and plain RNN layers of the CUDA backend on cuDNN's RNN API (cudnn_rnn.hpp): float32, forward or
// reversed (`reverse`: a bidirectional module's second half; the wrapper reverses each sequence
// within its length around cuDNN's forward direction), full-length or variable-length sequences.
//
// cuDNN keeps the weights in a weight space of its own layout and what its backward needs in a
// reserve space. As with oneDNN's recurrent workspace (docs/architecture.md), the forward of a
// training plan declares the layer's `saved` value an opaque output holding [weight space |
// reserve]; the backward op, the layer's whole gradient (ops/recurrent.hpp), reads both from there,
// so the weights are packed once per step. cuDNN's backward_data also writes into the reserve
// ("completes" it for backward_weights): `saved` is read by that one backward node only, so this
// is safe. An inference plan (nobody reads `saved`) keeps both spaces in the forward's workspace.
//
// The plain RNN (rnn_layer, tanh or relu) has no `saved` output: the core's backward needs only y.
// Its forward keeps the spaces in its workspace, and its backward recomputes the forward (packing
// the weights, cuDNN's training forward into its own y and h_n) to get a reserve of its own, then
// runs cuDNN's backward on that y. One more forward per step, for an unchanged op signature.
//
// Sequence lengths. Full-length layers read the lengths cuDNN wants on the device from the
// wrapper's copy, uploaded once when the node is prepared: a call copies nothing from the host and
// a training step holding them can be captured as a CUDA graph. The `lengths` input lives in device
// memory (int64), but cuDNN's descriptors need the lengths on the host: each call converts them to
// int32 on the device (cuDNN's devSeqLengths, in the node's workspace), copies them into a pinned
// buffer of the node's state and synchronises the stream, checks them as the core does (ValueError
// naming the layer), then builds its descriptors. That is one stream synchronisation per layer call
// (forward and backward each), and such a call cannot be captured in a CUDA graph: it refuses to
// run on a capturing stream with a ValueError naming the layer.
#include <memory>
#include <mutex>
#include <optional>

#include "backends/cuda/cuda_backend_ops.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cudnn_rnn.hpp"
#include "backends/cuda/device_copy.hpp"
#include "backends/cuda/train_kernels.hpp"
#include "core/op_registry.hpp"
#include "ops/recurrent.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

// An optional operand: null when the slot is absent (-1).
const float* opt_in(const KernelArgs& a, int k) { return k < 0 ? nullptr : in_f(a, k); }
float* opt_out(const KernelArgs& a, int k) { return k < 0 ? nullptr : out_f(a, k); }

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

rnn::Cell cell_of(const Node& node) {
  const std::string& name = op_name(node);
  return name.starts_with("gru") ? rnn::Cell::gru : name.starts_with("rnn") ? rnn::Cell::rnn : rnn::Cell::lstm;
}

// The wrapper's cell; the plain RNN by its `nonlinearity` (the core stores "tanh" when none is given).
RnnCell cudnn_cell(rnn::Cell cell, const Node& node) {
  if (cell == rnn::Cell::gru) return RnnCell::gru;
  if (cell == rnn::Cell::lstm) return RnnCell::lstm;
  const bool relu = node.attrs.has("nonlinearity") && node.attrs.s("nonlinearity") == "relu";
  return relu ? RnnCell::rnn_relu : RnnCell::rnn_tanh;
}

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
  if (!valid) return std::nullopt;
  for (int k = 0; k < num_in; ++k)
    if (g.info(node.inputs[k]).dtype != (k == lengths ? DType::i64 : DType::f32)) return std::nullopt;
  const Shape& x = g.info(node.inputs[0]).shape;
  RnnConfig c;
  c.cell = cudnn_cell(cell, node);
  c.batch_first = node.attrs.i_or("batch_first", 0) != 0;
  c.seq_len = c.batch_first ? x[1] : x[0];
  c.batch = c.batch_first ? x[0] : x[1];
  c.input_size = x[2];
  c.hidden_size = g.info(node.inputs[w_hh]).shape[1];
  c.bias = b_ih >= 0;
  c.reverse = node.attrs.i_or("reverse", 0) != 0;
  c.variable_lengths = lengths >= 0;
  try {
    validate_rnn(c);
  } catch (const ValueError&) {
    return std::nullopt;
  }
  return c;
}

// The node's prepared layer. With a `lengths` input also the pinned host buffer the lengths are
// read back into (N int64, then N int32 for the descriptors), shared by the contexts that run the
// plan: a call holds `mu` from the read-back until its cuDNN calls are enqueued.
struct RnnState {
  RnnState(const Node& node, const RnnConfig& c)
      : rnn(cudnn_handle(nullptr), c), layer(node.attrs.s("name")) {
    if (!c.variable_lengths) return;
    lengths_bytes = align256(static_cast<std::size_t>(c.batch) * sizeof(int32_t));
    host_lengths = PinnedHostBuffer(static_cast<std::size_t>(c.batch) * (sizeof(int64_t) + sizeof(int32_t)));
  }
  CudnnRnn rnn;
  std::string layer;                // the layer named in errors (the op's `name` attribute)
  bool in_saved = false;            // forward: the spaces in `saved` (training) or in the workspace
  std::size_t lengths_bytes = 0;    // the int32 device lengths at the start of the node's workspace
  std::size_t spaces_offset = 0;    // inference: the spaces within the workspace
  std::size_t reserve_offset = 0;   // the reserve, after the weight space
  std::size_t work_offset = 0;      // the wrapper's workspace within the node's workspace
  std::size_t dweights_offset = 0;  // backward: the gradient weight space within the workspace
  std::size_t y_offset = 0;         // plain RNN backward: the recomputed y, then h_n, in the workspace
  mutable std::mutex mu;
  mutable PinnedHostBuffer host_lengths;
};

const RnnState& state_of(const KernelArgs& a) { return *static_cast<const RnnState*>(a.state); }

// Refuses a capturing stream: the lengths are read back to the host below, which a graph cannot do.
void refuse_capture(const RnnState& s, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw_value_error(s.layer, ": variable sequence lengths (the `lengths` input) are copied to the host and the ",
                      "stream synchronised on every call (cuDNN's descriptors need them there), which a CUDA graph ",
                      "cannot capture; turn cuda_graph off for this model, or use full-length sequences");
}

// The `lengths` input (int64, device) as the wrapper takes it: int32 on the device in the node's
// workspace, and on the host, checked as the core checks them. Caller holds s.mu.
RnnLengths read_lengths(const RnnState& s, const KernelArgs& a, int slot) {
  const cudaStream_t stream = stream_of(a);
  refuse_capture(s, stream);
  const RnnConfig& c = s.rnn.config();
  const auto* src = static_cast<const int64_t*>(a.in[slot].data);
  auto* dev = static_cast<int32_t*>(a.workspace);
  lengths_to_int32(src, dev, c.batch, stream);
  auto* host64 = s.host_lengths.ptr<int64_t>();
  auto* host32 = reinterpret_cast<int32_t*>(host64 + c.batch);
  copy_to_host(host64, src, static_cast<std::size_t>(c.batch) * sizeof(int64_t), stream);  // waits for the stream
  for (int64_t n = 0; n < c.batch; ++n) {
    if (host64[n] < 1 || host64[n] > c.seq_len)
      throw_value_error(s.layer, ": lengths must be in [1, ", c.seq_len, "] (the sequence length), got lengths[", n,
                        "] = ", host64[n]);
    host32[n] = static_cast<int32_t>(host64[n]);
  }
  return {host32, dev};
}

// The forward: inference when nobody reads `saved`; else training, when only the layer's backward
// op reads it (the host reading cuDNN's spaces would get no numbers of ours).
bool accepts_forward(const Graph& g, const Node& node) {
  if (!config_of(g, node, false)) return false;
  if (cell_of(node) == rnn::Cell::rnn) return true;  // no `saved` output (see the top)
  const int saved = node.outputs.back();
  const ValueInfo& info = g.info(saved);
  return !info.read || read_only_by(g, saved, op_name(node) + "_backward");
}

// Workspace: [int32 lengths (variable lengths only) | the spaces (inference only) | the wrapper's].
PreparedNode prepare_forward(const Graph& g, const Node& node) {
  const std::optional<RnnConfig> c = config_of(g, node, false);
  if (!c) throw_runtime_error(op_name(node), ": no cuDNN layer at prepare time");
  auto s = std::make_shared<RnnState>(node, *c);
  s->reserve_offset = align256(s->rnn.weight_space_bytes());
  const std::size_t spaces = s->reserve_offset + align256(s->rnn.reserve_bytes());
  s->in_saved = cell_of(node) != rnn::Cell::rnn && g.info(node.outputs.back()).read;
  s->spaces_offset = s->lengths_bytes;
  s->work_offset = s->lengths_bytes + (s->in_saved ? 0 : spaces);
  PreparedNode p;
  if (s->in_saved) p.opaque_outputs.push_back({static_cast<int>(node.outputs.size()) - 1, spaces});
  p.workspace = s->work_offset + s->rnn.workspace_bytes();
  p.state = std::move(s);
  return p;
}

void forward_kernel(const KernelArgs& a) {
  const RnnState& s = state_of(a);
  const rnn::CellInfo ci = rnn::cell_info(cell_of(a.node));
  const rnn::ForwardSlots f = rnn::forward_slots(ci, a.num_in);
  cudnnHandle_t h = cudnn_handle(stream_of(a));
  char* work = static_cast<char*>(a.workspace);
  char* spaces = s.in_saved ? static_cast<char*>(a.out[a.num_out - 1].data) : work + s.spaces_offset;
  std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
  RnnLengths lengths;
  if (f.lengths >= 0) {
    lock.lock();
    lengths = read_lengths(s, a, f.lengths);
  }
  s.rnn.pack_weights(h, opt_in(a, f.w_ih), opt_in(a, f.w_hh), opt_in(a, f.b_ih), opt_in(a, f.b_hh), spaces);
  s.rnn.forward_training(h, opt_in(a, f.x), opt_in(a, f.h0), opt_in(a, f.c0), spaces, opt_out(a, 0), opt_out(a, 1),
                         ci.has_cell_state ? opt_out(a, 2) : nullptr, work + s.work_offset, spaces + s.reserve_offset,
                         lengths);
}

// The backward runs where its forward ran: a device plan runs every node on this backend, and the
// forward is taken whenever this backward can be (same layer, `saved` read by this op only).
bool accepts_backward(const Graph& g, const Node& node) { return config_of(g, node, true).has_value(); }

// Workspace: [int32 lengths (variable lengths only) | plain RNN: the spaces, y, h_n | the wrapper's |
// the gradient weight space].
PreparedNode prepare_backward(const Graph& g, const Node& node) {
  const std::optional<RnnConfig> c = config_of(g, node, true);
  if (!c) throw_runtime_error(op_name(node), ": no cuDNN layer at prepare time");
  auto s = std::make_shared<RnnState>(node, *c);
  s->reserve_offset = align256(s->rnn.weight_space_bytes());
  s->work_offset = s->lengths_bytes;
  if (cell_of(node) == rnn::Cell::rnn) {
    s->spaces_offset = s->lengths_bytes;
    s->y_offset = s->spaces_offset + s->reserve_offset + align256(s->rnn.reserve_bytes());
    const std::size_t y_bytes = static_cast<std::size_t>(c->seq_len * c->batch * c->hidden_size) * sizeof(float);
    const std::size_t h_bytes = static_cast<std::size_t>(c->batch * c->hidden_size) * sizeof(float);
    s->work_offset = s->y_offset + align256(y_bytes) + align256(h_bytes);
  }
  s->dweights_offset = s->work_offset + align256(s->rnn.workspace_bytes());
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
  char* ws = static_cast<char*>(a.workspace);
  // `saved` is read by this node only (see the top); the plain RNN recomputes its spaces below.
  char* spaces = b.saved >= 0 ? static_cast<char*>(a.in[b.saved].data) : ws + s.spaces_offset;
  void* reserve = spaces + s.reserve_offset;
  void* work = ws + s.work_offset;
  void* dweights = ws + s.dweights_offset;
  std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
  RnnLengths lengths;
  if (b.lengths >= 0) {
    lock.lock();
    lengths = read_lengths(s, a, b.lengths);
  }
  const float* y = opt_in(a, b.y);
  if (b.saved < 0) {  // the reserve cuDNN's backward needs, from a forward of our own
    const RnnConfig& c = s.rnn.config();
    auto* y_own = reinterpret_cast<float*>(ws + s.y_offset);
    auto* h_own = reinterpret_cast<float*>(
        ws + s.y_offset + align256(static_cast<std::size_t>(c.seq_len * c.batch * c.hidden_size) * sizeof(float)));
    s.rnn.pack_weights(h, opt_in(a, b.w_ih), opt_in(a, b.w_hh), opt_in(a, b.b_ih), opt_in(a, b.b_hh), spaces);
    s.rnn.forward_training(h, opt_in(a, b.x), opt_in(a, b.h0), nullptr, spaces, y_own, h_own, nullptr, work,
                           reserve, lengths);
    y = y_own;
  }
  s.rnn.backward_data(h, y, opt_in(a, b.dy), opt_in(a, b.dh_n), opt_in(a, b.dc_n), opt_in(a, b.h0),
                      opt_in(a, b.c0), spaces, opt_out(a, b.dx), opt_out(a, b.dh0), opt_out(a, b.dc0), work, reserve,
                      lengths);
  s.rnn.backward_weights(h, opt_in(a, b.x), opt_in(a, b.h0), y, dweights, false, work, reserve,
                         lengths);
  s.rnn.unpack_weight_grads(h, dweights, opt_out(a, b.dw_ih), opt_out(a, b.dw_hh), opt_out(a, b.db_ih),
                            opt_out(a, b.db_hh));
}

}  // namespace

std::vector<OpEntry> rnn_op_entries() {
  std::vector<OpEntry> entries;
  for (const char* cell : {"lstm_layer", "gru_layer", "rnn_layer"}) {
    // Not claimed bitwise repeatable: cuDNN's RNN weight gradients are not documented to be.
    entries.push_back({cell, &accepts_forward, &prepare_forward, &forward_kernel, false});
    entries.push_back({std::string(cell) + "_backward", &accepts_backward, &prepare_backward, &backward_kernel, false});
  }
  return entries;
}

}  // namespace treadle::cuda

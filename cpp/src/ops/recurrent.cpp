// Recurrent layer ops: one fused op per layer and direction (rnn_layer, gru_layer, lstm_layer), each
// with one fused backward op that runs backpropagation through time. Slot layout, saved buffers and
// scratch sizes are described in ops/recurrent.hpp. Semantics follow torch.nn.RNN/GRU/LSTM (gate
// order LSTM i, f, g, o; GRU r, z, n with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))).
//
// Attributes: batch_first (0/1), reverse (0/1: run each sample from its last valid step back to
// step 0), nonlinearity ("tanh"/"relu", rnn_layer only) and name (the layer named in error
// messages).
#include "ops/recurrent.hpp"


#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_recurrent.hpp"
#include "treadle/ops.hpp"

namespace treadle {
namespace {

using rnn::Cell;
using rnn::CellInfo;

// Integer attribute with a default, which must be 0 or 1; stored back so kernels can read it.
bool flag_attr(const std::string& name, Attrs& attrs, const char* key, bool dflt) {
  if (!attrs.has(key)) {
    attrs.set(key, int64_t{dflt});
    return dflt;
  }
  const int64_t v = attrs.i(key);
  if (v != 0 && v != 1) throw_value_error(name, ": attribute '", key, "' must be 0 or 1, got ", v);
  return v != 0;
}

std::string layer_name(const Cell c, Attrs& attrs) {
  if (!attrs.has("name")) attrs.set("name", std::string(rnn::layer_op_name(c)));
  return attrs.s("name");
}

void check_nonlinearity(const std::string& name, Cell c, Attrs& attrs) {
  if (c != Cell::rnn) return;
  if (!attrs.has("nonlinearity")) attrs.set("nonlinearity", std::string("tanh"));
  const std::string& nl = attrs.s("nonlinearity");
  if (nl != "tanh" && nl != "relu")
    throw_value_error(name, ": nonlinearity must be 'tanh' or 'relu', got '", nl, "'");
}

void expect_shape(const std::string& name, const char* what, const TensorMeta& m, const Shape& want) {
  if (m.shape != want) throw_value_error(name, ": expected ", what, " of shape ", shape_str(want), ", got ", shape_str(m.shape));
}

struct SeqDims {
  int64_t T, N, I, H;
};

// Every input but the lengths shares the first input's floating dtype.
void check_dtypes(const std::string& name, const std::vector<TensorMeta>& in, int lengths) {
  check_floating(name, in[0]);
  for (std::size_t k = 0; k < in.size(); ++k)
    if (static_cast<int>(k) != lengths && in[k].dtype != in[0].dtype)
      throw_type_error(name, ": inputs must share one dtype, got ", dtype_name(in[0].dtype), " and ",
                       dtype_name(in[k].dtype));
  if (lengths >= 0 && in[lengths].dtype != DType::i64)
    throw_type_error(name, ": lengths must be int64, got ", dtype_name(in[lengths].dtype));
}

// Returns the hidden size that weight_hh (G*H, H) implies.
int64_t check_weight_hh(const std::string& name, const CellInfo& ci, const TensorMeta& w) {
  const Shape& ws = w.shape;
  if (ws.size() != 2 || ws[1] <= 0 || ws[0] != ci.gates * ws[1])
    throw_value_error(name, ": weight_hh must have shape (", ci.gates, " * hidden_size, hidden_size), got ", shape_str(ws));
  return ws[1];
}

// T and N of a sequence tensor of width `width` (x or y), in the layer's layout.
SeqDims check_sequence(const std::string& name, const char* what, const TensorMeta& m, int64_t width,
                       bool batch_first) {
  const Shape& xs = m.shape;
  if (xs.size() != 3 || xs[2] != width || xs[0] <= 0 || xs[1] <= 0)
    throw_value_error(name, ": expected ", what, " of shape ", batch_first ? "(N, T, " : "(T, N, ", width,
                      ") with N, T >= 1, got ", shape_str(xs));
  return {batch_first ? xs[1] : xs[0], batch_first ? xs[0] : xs[1], 0, 0};
}

Shape seq_shape(const SeqDims& d, int64_t width, bool batch_first) {
  return batch_first ? Shape{d.N, d.T, width} : Shape{d.T, d.N, width};
}

std::vector<TensorMeta> infer_forward(Cell c, const std::vector<TensorMeta>& in, Attrs& attrs) {
  const CellInfo ci = rnn::cell_info(c);
  const std::string name = layer_name(c, attrs);
  const rnn::ForwardSlots s = rnn::forward_slots(ci, static_cast<int>(in.size()));
  if (!s.valid) throw_value_error(name, ": unexpected number of inputs (", in.size(), ")");
  const bool bf = flag_attr(name, attrs, "batch_first", false);
  flag_attr(name, attrs, "reverse", false);
  check_nonlinearity(name, c, attrs);
  check_dtypes(name, in, s.lengths);
  const int64_t H = check_weight_hh(name, ci, in[s.w_hh]), GH = ci.gates * H;
  const Shape& wi = in[s.w_ih].shape;
  if (wi.size() != 2 || wi[0] != GH || wi[1] <= 0)
    throw_value_error(name, ": weight_ih must have shape (", GH, ", input_size), got ", shape_str(wi));
  SeqDims d = check_sequence(name, "input", in[s.x], wi[1], bf);
  d.I = wi[1];
  d.H = H;
  expect_shape(name, "h0", in[s.h0], {d.N, H});
  if (s.c0 >= 0) expect_shape(name, "c0", in[s.c0], {d.N, H});
  if (s.b_ih >= 0) expect_shape(name, "bias_ih", in[s.b_ih], {GH});
  if (s.b_hh >= 0) expect_shape(name, "bias_hh", in[s.b_hh], {GH});
  if (s.lengths >= 0) expect_shape(name, "lengths", in[s.lengths], {d.N});
  const DType dt = in[0].dtype;
  std::vector<TensorMeta> out{{seq_shape(d, H, bf), dt}, {{d.N, H}, dt}};
  if (ci.has_cell_state) out.push_back({{d.N, H}, dt});
  if (ci.saved_width > 0) out.push_back({seq_shape(d, ci.saved_width * H, bf), dt});
  return out;
}

std::vector<TensorMeta> infer_backward(Cell c, const std::vector<TensorMeta>& in, Attrs& attrs) {
  const CellInfo ci = rnn::cell_info(c);
  const std::string name = layer_name(c, attrs) + "_backward";
  const rnn::BackwardSlots s = rnn::backward_slots(ci, static_cast<int>(in.size()));
  if (!s.valid) throw_value_error(name, ": unexpected number of inputs (", in.size(), ")");
  const bool bf = flag_attr(name, attrs, "batch_first", false);
  flag_attr(name, attrs, "reverse", false);
  flag_attr(name, attrs, "needs_dx", true);
  check_nonlinearity(name, c, attrs);
  check_dtypes(name, in, s.lengths);
  const int64_t H = check_weight_hh(name, ci, in[s.w_hh]), GH = ci.gates * H;
  const Shape& wi = in[s.w_ih].shape;
  if (wi.size() != 2 || wi[0] != GH || wi[1] <= 0)
    throw_value_error(name, ": weight_ih must have shape (", GH, ", input_size), got ", shape_str(wi));
  const SeqDims d = check_sequence(name, "y", in[s.y], H, bf);
  expect_shape(name, "x", in[s.x], seq_shape(d, wi[1], bf));
  expect_shape(name, "dy", in[s.dy], seq_shape(d, H, bf));
  if (s.saved >= 0) expect_shape(name, "saved", in[s.saved], seq_shape(d, ci.saved_width * H, bf));
  for (int k : {s.h0, s.h_n, s.dh_n, s.c0, s.c_n, s.dc_n})
    if (k >= 0) expect_shape(name, "state", in[k], {d.N, H});
  if (s.b_ih >= 0) expect_shape(name, "bias_ih", in[s.b_ih], {GH});
  if (s.b_hh >= 0) expect_shape(name, "bias_hh", in[s.b_hh], {GH});
  if (s.lengths >= 0) expect_shape(name, "lengths", in[s.lengths], {d.N});
  std::vector<TensorMeta> out(s.num_outputs, TensorMeta{{d.N, H}, in[0].dtype});
  out[s.dx].shape = in[s.x].shape;
  out[s.dw_ih].shape = wi;
  out[s.dw_hh].shape = in[s.w_hh].shape;
  if (s.db_ih >= 0) out[s.db_ih].shape = out[s.db_hh].shape = {GH};
  return out;
}

Value zeros_like(Graph& g, const Value& v) {
  return g.apply1("constant", {}, {{"shape", v.shape()}, {"value", 0.0}, {"dtype", std::string(dtype_name(v.dtype()))}});
}

// The whole gradient as one backward op (ops/recurrent.hpp), reading the forward's inputs and outputs.
std::vector<Value> grad_layer(Cell c, const GradContext& ctx) {
  const CellInfo ci = rnn::cell_info(c);
  const rnn::ForwardSlots s = rnn::forward_slots(ci, static_cast<int>(ctx.inputs.size()));
  auto grad_or_zeros = [&](int k) {
    return ctx.grad_outputs[k].defined() ? ctx.grad_outputs[k] : zeros_like(ctx.graph, ctx.outputs[k]);
  };
  std::vector<Value> in{ctx.inputs[s.x], ctx.inputs[s.h0]};
  if (s.c0 >= 0) in.push_back(ctx.inputs[s.c0]);
  in.push_back(ctx.inputs[s.w_ih]);
  in.push_back(ctx.inputs[s.w_hh]);
  if (s.b_ih >= 0) {
    in.push_back(ctx.inputs[s.b_ih]);
    in.push_back(ctx.inputs[s.b_hh]);
  }
  in.push_back(ctx.outputs[0]);  // y, h_n, [c_n]
  in.push_back(ctx.outputs[1]);
  if (ci.has_cell_state) in.push_back(ctx.outputs[2]);
  if (ci.saved_width > 0) in.push_back(ctx.outputs.back());
  in.push_back(grad_or_zeros(0));
  in.push_back(grad_or_zeros(1));
  if (ci.has_cell_state) in.push_back(grad_or_zeros(2));
  if (s.lengths >= 0) in.push_back(ctx.inputs[s.lengths]);
  Attrs attrs = ctx.node.attrs;
  attrs.set("needs_dx", int64_t{ctx.needs_grad[s.x] ? 1 : 0});
  std::vector<Value> g = ctx.graph.apply(std::string(rnn::layer_op_name(c)) + "_backward", in, std::move(attrs));

  const rnn::BackwardSlots b = rnn::backward_slots(ci, static_cast<int>(in.size()));
  std::vector<Value> out(ctx.inputs.size());
  if (ctx.needs_grad[s.x]) out[s.x] = g[b.dx];
  out[s.h0] = g[b.dh0];
  if (s.c0 >= 0) out[s.c0] = g[b.dc0];
  out[s.w_ih] = g[b.dw_ih];
  out[s.w_hh] = g[b.dw_hh];
  if (s.b_ih >= 0) {
    out[s.b_ih] = g[b.db_ih];
    out[s.b_hh] = g[b.db_hh];
  }
  for (std::size_t k = 0; k < out.size(); ++k)
    if (!ctx.needs_grad[k]) out[k] = Value();
  return out;
}

void register_cell(OpRegistry& r, Cell c) {
  const std::string name = rnn::layer_op_name(c);
  OpDef f;
  f.name = name;
  f.infer = [c](const std::vector<TensorMeta>& in, Attrs& a) { return infer_forward(c, in, a); };
  f.grad = [c](const GradContext& ctx) { return grad_layer(c, ctx); };
  f.workspace = [c](const std::vector<TensorMeta>& in, const Attrs&) {
    const Shape& h0 = in[1].shape;  // (N, H)
    return rnn::forward_workspace_bytes(rnn::cell_info(c), h0[0], h0[1], dtype_size(in[0].dtype));
  };
  r.add(std::move(f));
  OpDef b;
  b.name = name + "_backward";
  b.infer = [c](const std::vector<TensorMeta>& in, Attrs& a) { return infer_backward(c, in, a); };
  b.workspace = [c](const std::vector<TensorMeta>& in, const Attrs&) {
    const Shape& h0 = in[1].shape;  // (N, H)
    const int64_t T = shape_numel(in[0].shape) / (h0[0] * in[0].shape[2]);  // x: (T, N, I) or (N, T, I)
    return rnn::backward_workspace_bytes(rnn::cell_info(c), T, h0[0], h0[1], dtype_size(in[0].dtype));
  };
  r.add(std::move(b));
}

}  // namespace

void register_recurrent_ops(OpRegistry& r) {
  register_cell(r, Cell::rnn);
  register_cell(r, Cell::gru);
  register_cell(r, Cell::lstm);
}

namespace ops {

RecurrentLayerOutput recurrent_layer(const std::string& cell, Value x, Value h0, Value c0, Value w_ih, Value w_hh,
                                     Value b_ih, Value b_hh, Value lengths, bool batch_first, bool reverse,
                                     const std::string& name) {
  if (!x.defined() || !h0.defined() || !w_ih.defined() || !w_hh.defined())
    throw_value_error("recurrent_layer: x, h0, w_ih and w_hh must be defined");
  if (b_ih.defined() != b_hh.defined()) throw_value_error("recurrent_layer: give both biases or neither");
  Cell c;
  Attrs attrs{{"batch_first", int64_t{batch_first}}, {"reverse", int64_t{reverse}}};
  if (cell == "rnn_tanh" || cell == "rnn_relu") {
    c = Cell::rnn;
    attrs.set("nonlinearity", std::string(cell == "rnn_tanh" ? "tanh" : "relu"));
  } else if (cell == "gru") {
    c = Cell::gru;
  } else if (cell == "lstm") {
    c = Cell::lstm;
  } else {
    throw_value_error("recurrent_layer: cell must be 'rnn_tanh', 'rnn_relu', 'gru' or 'lstm', got '", cell, "'");
  }
  if (!name.empty()) attrs.set("name", name);
  const bool lstm = c == Cell::lstm;
  if (lstm != c0.defined())
    throw_value_error(name.empty() ? "recurrent_layer" : name, lstm ? ": LSTM needs c0" : ": only LSTM takes c0");
  std::vector<Value> in{x, h0};
  if (lstm) in.push_back(c0);
  in.push_back(w_ih);
  in.push_back(w_hh);
  if (b_ih.defined()) {
    in.push_back(b_ih);
    in.push_back(b_hh);
  }
  if (lengths.defined()) in.push_back(lengths);
  std::vector<Value> out = x.graph().apply(rnn::layer_op_name(c), in, std::move(attrs));
  return {out[0], out[1], lstm ? out[2] : Value()};
}

}  // namespace ops
}  // namespace treadle

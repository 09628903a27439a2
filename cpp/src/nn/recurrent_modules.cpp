// RNN, GRU and LSTM modules: parameters named and initialised as in PyTorch, and a forward that
// stacks one fused layer op per layer and direction (ops/recurrent.cpp), with dropout between
// layers. Shapes are checked here first so that errors name the module (e.g. "LSTM: expected
// input of shape (T, N, 16), got (5, 3, 8)").
#include "treadle/nn_recurrent.hpp"

#include <cmath>

#include "treadle/error.hpp"

namespace treadle::nn {

namespace {

// U(-bound, bound) drawn from the process-wide init generator in row-major order.
std::shared_ptr<Parameter> uniform_parameter(Shape shape, DType dtype, double bound) {
  Tensor t(std::move(shape), DType::f64);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = init_uniform(-bound, bound);
  return std::make_shared<Parameter>(dtype == DType::f64 ? t : t.to(dtype));
}

Value zeros(Graph& g, Shape shape, DType dtype) {
  return g.apply1("constant", {}, {{"shape", std::move(shape)}, {"value", 0.0}, {"dtype", std::string(dtype_name(dtype))}});
}

}  // namespace

Recurrent::Recurrent(std::string type, std::string cell, int gates, int64_t input_size, int64_t hidden_size,
                     RecurrentOptions opt)
    : type_(std::move(type)), cell_(std::move(cell)), gates_(gates), input_size_(input_size),
      hidden_size_(hidden_size), opt_(opt) {
  if (input_size <= 0 || hidden_size <= 0)
    throw_value_error(type_, ": input_size and hidden_size must be positive, got (", input_size, ", ", hidden_size, ")");
  if (opt.num_layers < 1) throw_value_error(type_, ": num_layers must be at least 1, got ", opt.num_layers);
  if (!(opt.dropout >= 0.0 && opt.dropout <= 1.0))
    throw_value_error(type_, ": dropout must be in [0, 1], got ", opt.dropout);
  if (opt.dtype != DType::f32 && opt.dtype != DType::f64)
    throw_type_error(type_, ": dtype must be float32 or float64, got ", dtype_name(opt.dtype));
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  const int dirs = opt.bidirectional ? 2 : 1;
  const int64_t GH = shape_numel({gates, hidden_size});  // checked: absurd sizes raise, never overflow
  for (int64_t layer = 0; layer < opt.num_layers; ++layer)
    for (int dir = 0; dir < dirs; ++dir) {
      const std::string suffix = "_l" + std::to_string(layer) + (dir ? "_reverse" : "");
      const int64_t in = layer == 0 ? input_size : dirs * hidden_size;
      Weights w;
      w.w_ih = uniform_parameter({GH, in}, opt.dtype, bound);
      w.w_hh = uniform_parameter({GH, hidden_size}, opt.dtype, bound);
      register_parameter("weight_ih" + suffix, w.w_ih);
      register_parameter("weight_hh" + suffix, w.w_hh);
      if (opt.bias) {
        w.b_ih = uniform_parameter({GH}, opt.dtype, bound);
        w.b_hh = uniform_parameter({GH}, opt.dtype, bound);
        register_parameter("bias_ih" + suffix, w.b_ih);
        register_parameter("bias_hh" + suffix, w.b_hh);
      }
      weights_.push_back(std::move(w));
    }
}

// The initial state of every layer and direction as (N, H) values: slices of the given
// (D*num_layers, N, H) tensor, or zeros.
Value Recurrent::initial_state(Value x, Value given, const char* what, int64_t N) const {
  const int64_t LD = opt_.num_layers * (opt_.bidirectional ? 2 : 1);
  if (!given.defined()) return Value();
  const Shape want{LD, N, hidden_size_};
  if (given.shape() != want)
    throw_value_error(type_, ": expected ", what, " of shape ", shape_str(want), ", got ", shape_str(given.shape()));
  if (given.dtype() != x.dtype())
    throw_type_error(type_, ": expected ", what, " of dtype ", dtype_name(x.dtype()), ", got ", dtype_name(given.dtype()));
  return given;
}

ops::RecurrentLayerOutput Recurrent::run_direction(Value in, Value h0, Value c0, Value lengths, int64_t layer,
                                                   int dir) {
  Graph& g = in.graph();
  const Weights& w = weights_.at(layer * (opt_.bidirectional ? 2 : 1) + dir);
  const std::string name =
      type_ + " (layer " + std::to_string(layer) + (dir ? ", reverse" : "") + ")";
  Value b_ih = w.b_ih ? g.add_parameter(w.b_ih) : Value();
  Value b_hh = w.b_hh ? g.add_parameter(w.b_hh) : Value();
  return ops::recurrent_layer(cell_, in, h0, c0, g.add_parameter(w.w_ih), g.add_parameter(w.w_hh), b_ih, b_hh, lengths,
                              opt_.batch_first, dir == 1, name);
}

RecurrentOutput Recurrent::forward_all(Value x, Value h0, Value c0, Value lengths) {
  if (!x.defined()) throw_value_error(type_, ": input is undefined");
  const bool lstm = cell_ == "lstm";
  if (c0.defined() && !lstm) throw_value_error(type_, ": only LSTM takes a cell state c0");
  const char* layout = opt_.batch_first ? "(N, T, " : "(T, N, ";
  if (x.ndim() != 3 || x.dim(2) != input_size_)
    throw_value_error(type_, ": expected input of shape ", layout, input_size_, "), got ", shape_str(x.shape()));
  Graph& g = x.graph();
  const int64_t N = opt_.batch_first ? x.dim(0) : x.dim(1), H = hidden_size_;
  h0 = initial_state(x, h0, "h0", N);
  c0 = initial_state(x, c0, "c0", N);
  if (lengths.defined() && (lengths.dtype() != DType::i64 || lengths.shape() != Shape{N}))
    throw_value_error(type_, ": expected lengths of shape (", N, ",) and dtype int64, got ", shape_str(lengths.shape()),
                      " ", dtype_name(lengths.dtype()));
  const Value zero = zeros(g, {N, H}, x.dtype());
  auto state_at = [&](Value all, int64_t idx) {
    if (!all.defined()) return zero;
    return ops::reshape(ops::slice(all, 0, idx, idx + 1), {N, H});
  };
  const int dirs = opt_.bidirectional ? 2 : 1;
  std::vector<Value> hs, cs;
  Value in = x;
  for (int64_t layer = 0; layer < opt_.num_layers; ++layer) {
    if (layer > 0) in = ops::dropout(in, opt_.dropout);
    std::vector<Value> outs;
    for (int dir = 0; dir < dirs; ++dir) {
      const int64_t idx = layer * dirs + dir;
      auto r = run_direction(in, state_at(h0, idx), lstm ? state_at(c0, idx) : Value(), lengths, layer, dir);
      outs.push_back(r.output);
      hs.push_back(ops::reshape(r.h_n, {1, N, H}));
      if (lstm) cs.push_back(ops::reshape(r.c_n, {1, N, H}));
    }
    in = dirs == 1 ? outs[0] : ops::concat(outs, 2);
  }
  RecurrentOutput out;
  out.output = in;
  out.h_n = hs.size() == 1 ? hs[0] : ops::concat(hs, 0);
  if (lstm) out.c_n = cs.size() == 1 ? cs[0] : ops::concat(cs, 0);
  return out;
}

namespace {
std::string rnn_cell(const std::string& nonlinearity) {
  if (nonlinearity != "tanh" && nonlinearity != "relu")
    throw_value_error("RNN: nonlinearity must be 'tanh' or 'relu', got '", nonlinearity, "'");
  return "rnn_" + nonlinearity;
}
}  // namespace

RNN::RNN(int64_t input_size, int64_t hidden_size, RecurrentOptions opt, const std::string& nonlinearity)
    : Recurrent("RNN", rnn_cell(nonlinearity), 1, input_size, hidden_size, opt) {}

GRU::GRU(int64_t input_size, int64_t hidden_size, RecurrentOptions opt)
    : Recurrent("GRU", "gru", 3, input_size, hidden_size, opt) {}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, RecurrentOptions opt)
    : Recurrent("LSTM", "lstm", 4, input_size, hidden_size, opt) {}

}  // namespace treadle::nn

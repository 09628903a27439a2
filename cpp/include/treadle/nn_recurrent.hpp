#pragma once
// Recurrent layers with torch.nn.RNN / GRU / LSTM semantics: multi-layer, batch_first, dropout
// between layers (training only), optional bidirectional, optional initial states, and
// variable-length batches (int64 lengths per sample: no compute past each length, zeros in the
// output there, final states taken at each sample's own last step).
//
// Parameters are named and laid out as in PyTorch: weight_ih_l{k} (G*H, in), weight_hh_l{k}
// (G*H, H), bias_ih_l{k}, bias_hh_l{k} (G*H), with the suffix "_reverse" for the backward
// direction; gate order LSTM (i, f, g, o), GRU (r, z, n); all initialised U(-1/sqrt(H), 1/sqrt(H)).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "treadle/module.hpp"

namespace treadle {

namespace ops {

struct RecurrentLayerOutput {
  Value output;  // (T, N, H), or (N, T, H) with batch_first
  Value h_n;     // (N, H)
  Value c_n;     // (N, H), LSTM only
};

// One layer, one direction, as one fused op. cell: "rnn_tanh", "rnn_relu", "gru" or "lstm".
// c0 only for LSTM; biases both or neither; lengths (int64, (N)) optional. `name` is the layer
// named in error messages.
TREADLE_API RecurrentLayerOutput recurrent_layer(const std::string& cell, Value x, Value h0, Value c0, Value w_ih,
                                                 Value w_hh, Value b_ih, Value b_hh, Value lengths,
                                                 bool batch_first = false, bool reverse = false,
                                                 const std::string& name = "");

}  // namespace ops

namespace nn {

struct RecurrentOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;
  bool bidirectional = false;
  DType dtype = DType::f32;
};

struct RecurrentOutput {
  Value output;  // last layer's outputs, (T, N, D*H) or (N, T, D*H); D = 2 if bidirectional
  Value h_n;     // (D*num_layers, N, H)
  Value c_n;     // LSTM only
};

// Shared implementation of RNN, GRU and LSTM.
class TREADLE_API Recurrent : public Module {
 public:
  // h0/c0: (D*num_layers, N, H) or undefined (zeros); lengths: int64 (N) or undefined.
  RecurrentOutput forward_all(Value x, Value h0 = {}, Value c0 = {}, Value lengths = {});
  // The output sequence only (so the layer fits in a Sequential).
  Value forward(Value x) override { return forward_all(x).output; }
  std::string type_name() const override { return type_; }

  int64_t input_size() const { return input_size_; }
  int64_t hidden_size() const { return hidden_size_; }
  const RecurrentOptions& options() const { return opt_; }
  const std::string& cell() const { return cell_; }

 protected:
  // cell: "rnn_tanh", "rnn_relu", "gru", "lstm"; type: "RNN", "GRU", "LSTM".
  Recurrent(std::string type, std::string cell, int gates, int64_t input_size, int64_t hidden_size,
            RecurrentOptions opt);

 private:
  Value initial_state(Value x, Value given, const char* what, int64_t N) const;
  ops::RecurrentLayerOutput run_direction(Value in, Value h0, Value c0, Value lengths, int64_t layer, int dir);

  struct Weights {
    std::shared_ptr<Parameter> w_ih, w_hh, b_ih, b_hh;
  };
  std::string type_, cell_;
  int gates_;
  std::vector<Weights> weights_;  // per layer and direction, in PyTorch's order
  int64_t input_size_, hidden_size_;
  RecurrentOptions opt_;
};

class TREADLE_API RNN : public Recurrent {
 public:
  // nonlinearity: "tanh" or "relu".
  RNN(int64_t input_size, int64_t hidden_size, RecurrentOptions opt = {}, const std::string& nonlinearity = "tanh");
};

class TREADLE_API GRU : public Recurrent {
 public:
  GRU(int64_t input_size, int64_t hidden_size, RecurrentOptions opt = {});
};

class TREADLE_API LSTM : public Recurrent {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, RecurrentOptions opt = {});
};

}  // namespace nn
}  // namespace treadle

#pragma once
// One LSTM or GRU layer (one direction) over a whole sequence through cuDNN's v8 RNN API, as the
// core's lstm_layer / gru_layer ops define it: PyTorch's gate order (LSTM i, f, g, o; GRU r, z, n
// with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))) and weights w_ih (G*H, F), w_hh (G*H, H),
// b_ih, b_hh (G*H). x and y are (T, N, F) / (T, N, H), or (N, T, ...) with batch_first; the states
// h0, h_n, c0, c_n are (N, H). Every sequence has the full length T (the core's `lengths` input is
// not supported here).
//
// cuDNN keeps all weights in one "weight space" of its own layout: pack_weights copies the core's
// four tensors into it (one device-to-device copy per gate matrix and bias, on the handle's stream),
// and unpack_weight_grads copies a gradient weight space back into the core's layout. The calls:
//   forward_training  y, h_n, c_n; fills the reserve space the two backward calls read;
//   backward_data     dx, dh0, dc0 from dy, dh_n, dc_n (must come first: it completes the reserve);
//   backward_weights  the gradient weight space, set or accumulated (cuDNN's WGRAD_MODE_ADD).
// Prepared once per shape; the caller provides weight_space_bytes() (weights, and as much again for
// their gradients), workspace_bytes() and reserve_bytes() of device memory. Math: float32 with FMA
// only, or tensor ops allowed (TF32: looser agreement).
#include <cudnn_adv.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cuda/cudnn_descriptors.hpp"

namespace treadle::cuda {

enum class RnnCell { lstm, gru };
const char* rnn_cell_name(RnnCell c);

struct RnnConfig {
  RnnCell cell = RnnCell::lstm;
  int64_t seq_len = 0, batch = 0, input_size = 0, hidden_size = 0;
  bool batch_first = false;
  bool bias = true;
  bool tensor_op = false;
};

// ValueError naming "rnn_cudnn" and the values; no device needed.
void validate_rnn(const RnnConfig& c);

class CudnnRnn {
 public:
  CudnnRnn(cudnnHandle_t handle, const RnnConfig& config);
  CudnnRnn(const CudnnRnn&) = delete;
  CudnnRnn& operator=(const CudnnRnn&) = delete;

  const RnnConfig& config() const { return config_; }
  int gates() const { return config_.cell == RnnCell::lstm ? 4 : 3; }
  std::size_t weight_space_bytes() const { return weight_space_; }
  std::size_t workspace_bytes() const { return workspace_; }
  std::size_t reserve_bytes() const { return reserve_; }

  // b_ih / b_hh: null exactly when the layer has no bias.
  void pack_weights(cudnnHandle_t handle, const float* w_ih, const float* w_hh, const float* b_ih, const float* b_hh,
                    void* weight_space) const;
  void unpack_weight_grads(cudnnHandle_t handle, const void* dweight_space, float* dw_ih, float* dw_hh, float* db_ih,
                           float* db_hh) const;

  // h0 / c0 may be null (zeros); c0, c_n only for LSTM (null for GRU).
  void forward_training(cudnnHandle_t handle, const float* x, const float* h0, const float* c0,
                        const void* weight_space, float* y, float* h_n, float* c_n, void* workspace,
                        void* reserve) const;
  // dh_n / dc_n may be null (zero gradients); dc0 and dc_n only for LSTM.
  void backward_data(cudnnHandle_t handle, const float* y, const float* dy, const float* dh_n, const float* dc_n,
                     const float* h0, const float* c0, const void* weight_space, float* dx, float* dh0, float* dc0,
                     void* workspace, void* reserve) const;
  void backward_weights(cudnnHandle_t handle, const float* x, const float* h0, const float* y, void* dweight_space,
                        bool accumulate, void* workspace, void* reserve) const;

 private:
  // Copies between the core's tensors and the weight space, in either direction.
  void copy_weights(cudnnHandle_t handle, const void* space, bool to_space, const float* const* core,
                    float* const* core_out) const;
  const int32_t* upload_lengths(cudnnHandle_t handle, void* workspace) const;
  void check_spaces(const char* who, const void* workspace, const void* reserve) const;

  RnnConfig config_;
  std::vector<int32_t> lengths_;  // all seq_len: the host copy the descriptors and uploads use
  DropoutDescriptor dropout_;
  RnnDescriptor rnn_;
  RnnDataDescriptor x_, y_;
  TensorDescriptor h_;
  std::size_t weight_space_ = 0, workspace_ = 0, reserve_ = 0, lengths_bytes_ = 0;
};

}  // namespace treadle::cuda

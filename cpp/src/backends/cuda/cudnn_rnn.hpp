#pragma once
// One LSTM, GRU or plain RNN layer (one direction) over a whole sequence through cuDNN's v8 RNN API,
// as the core's lstm_layer / gru_layer / rnn_layer ops define it: PyTorch's gate order (LSTM i, f,
// g, o; GRU r, z, n with n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); the plain RNN
// h' = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or relu) and weights w_ih (G*H, F), w_hh (G*H, H),
// b_ih, b_hh (G*H). x and y are (T, N, F) / (T, N, H), or (N, T, ...) with batch_first; the states
// h0, h_n, c0, c_n are (N, H).
//
// Sequence lengths (RnnLengths): by default every sequence has the full length T, and cuDNN reads
// them from the layer's own device copy, uploaded once at construction, so no call copies anything
// from the host and every call can be captured in a CUDA graph. A layer built with
// `variable_lengths` may be given per-call lengths in [1, T] (cuDNN's padded layouts): y is zero
// past each length, h_n / c_n are the states after each sequence's last valid step, dy past a
// length is ignored and dx is zero there, as the core's `lengths` input defines them. The caller
// gives them on the host (descriptors) and on the device; the layer copies neither, so these calls
// can be captured too; the host lengths are then frozen into the graph (replay with the same ones).
// `reverse` (the core's attribute, a bidirectional module's second half): each sequence runs from
// its last valid step back to step 0. cuDNN has no such single direction; the layer reverses each
// sequence within its length into the workspace (sequence_copy), runs the forward direction on it
// and reverses the outputs back (y, dx). The states need no reversal: h0 enters at the sequence's
// last valid step, h_n leaves after step 0, which is where cuDNN's forward direction puts them.
//
#include <cudnn_adv.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cuda/cudnn_descriptors.hpp"

namespace treadle::cuda {

enum class RnnCell { lstm, gru, rnn_tanh, rnn_relu };
// Gates per cell: the rows of w_ih are gates * H.
int rnn_cell_gates(RnnCell c);
const char* rnn_cell_name(RnnCell c);

struct RnnConfig {
  RnnCell cell = RnnCell::lstm;
  int64_t seq_len = 0, batch = 0, input_size = 0, hidden_size = 0;
  bool batch_first = false;
  bool bias = true;
  bool tensor_op = false;
  bool reverse = false;           // each sequence from its last valid step back to step 0
  bool variable_lengths = false;  // calls may pass per-sequence lengths (workspace for masked dy)
};

// The sequence lengths of one call. Both null: every sequence T long (the layer's own device copy).
// Else `host`: N values in [1, T] for cuDNN's descriptors (checked: ValueError naming the call), and
// `device`: the same values as int32 in device memory (cuDNN's devSeqLengths, the sequence kernels').
struct RnnLengths {
  const int32_t* host = nullptr;
  const int32_t* device = nullptr;
  bool variable() const { return host != nullptr || device != nullptr; }
};

// ValueError naming "rnn_cudnn" and the values; no device needed.
void validate_rnn(const RnnConfig& c);

class CudnnRnn {
 public:
  // Uploads the full-length sequence lengths once (a copy on a stream of its own, waited for).
  CudnnRnn(cudnnHandle_t handle, const RnnConfig& config);
  ~CudnnRnn();
  CudnnRnn(const CudnnRnn&) = delete;
  CudnnRnn& operator=(const CudnnRnn&) = delete;

  const RnnConfig& config() const { return config_; }
  int gates() const { return rnn_cell_gates(config_.cell); }
  std::size_t weight_space_bytes() const { return weight_space_; }
  std::size_t workspace_bytes() const { return workspace_; }
  std::size_t reserve_bytes() const { return reserve_; }

  // b_ih / b_hh: null exactly when the layer has no bias.
  void pack_weights(cudnnHandle_t handle, const float* w_ih, const float* w_hh, const float* b_ih, const float* b_hh,
                    void* weight_space) const;
  void unpack_weight_grads(cudnnHandle_t handle, const void* dweight_space, float* dw_ih, float* dw_hh, float* db_ih,
                           float* db_hh) const;

  // h0 / c0 may be null (zeros); c0, c_n only for LSTM (null otherwise).
  void forward_training(cudnnHandle_t handle, const float* x, const float* h0, const float* c0,
                        const void* weight_space, float* y, float* h_n, float* c_n, void* workspace,
                        void* reserve, const RnnLengths& lengths = {}) const;
  // dh_n / dc_n may be null (zero gradients); dc0 and dc_n only for LSTM. y is this layer's output
  // (as forward_training wrote it); the lengths must be the forward's.
  void backward_data(cudnnHandle_t handle, const float* y, const float* dy, const float* dh_n, const float* dc_n,
                     const float* h0, const float* c0, const void* weight_space, float* dx, float* dh0, float* dc0,
                     void* workspace, void* reserve, const RnnLengths& lengths = {}) const;
  void backward_weights(cudnnHandle_t handle, const float* x, const float* h0, const float* y, void* dweight_space,
                        bool accumulate, void* workspace, void* reserve, const RnnLengths& lengths = {}) const;

 private:
  // Copies between the core's tensors and the weight space, in either direction.
  void copy_weights(cudnnHandle_t handle, const void* space, bool to_space, const float* const* core,
                    float* const* core_out) const;
  void check_spaces(const char* who, const void* workspace, const void* reserve) const;
  class Call;  // one call's descriptors and device lengths (cudnn_rnn.cpp)
  // x / y data descriptors (padded layout, padding filled with 0) for N lengths on the host.
  void set_data_descriptors(RnnDataDescriptor& x, RnnDataDescriptor& y, const int32_t* lengths) const;
  // The float32 sequence at byte offset `off` of the workspace.
  static float* at(void* workspace, std::size_t off) {
    return reinterpret_cast<float*>(static_cast<char*>(workspace) + off);
  }

  RnnConfig config_;
  std::vector<int32_t> lengths_;  // all seq_len: the host copy of the full-length descriptors
  int32_t* device_lengths_ = nullptr;  // the same on the device (cudaMalloc'd here, freed by the destructor)
  DropoutDescriptor dropout_;
  RnnDescriptor rnn_;
  RnnDataDescriptor x_, y_;
  TensorDescriptor h_;
  std::size_t weight_space_ = 0, workspace_ = 0, reserve_ = 0;
  // Workspace layout: reversed x, reversed y, masked or reversed dy, reversed dx (each present only
  // when needed, 256-byte aligned), then cuDNN's own workspace of cudnn_workspace_ bytes.
  std::size_t off_x_ = 0, off_y_ = 0, off_dy_ = 0, off_dx_ = 0, off_cudnn_ = 0, cudnn_workspace_ = 0;
};

}  // namespace treadle::cuda

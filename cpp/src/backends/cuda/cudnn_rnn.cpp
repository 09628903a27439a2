// LSTM / GRU layers through cuDNN's v8 RNN API: descriptors, weight packing, launches.
#include "backends/cuda/cudnn_rnn.hpp"

#include <limits>
#include <optional>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/cuda_status.hpp"
#include "backends/cuda/cuda_stream.hpp"
#include "backends/cuda/device_copy.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

constexpr const char* kWho = "rnn_cudnn";

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

cudaStream_t stream_of(cudnnHandle_t handle) {
  cudaStream_t s = nullptr;
  TREADLE_CUDNN_CHECK(cudnnGetStream(handle, &s));
  return s;
}

}  // namespace

const char* rnn_cell_name(RnnCell c) {
  switch (c) {
    case RnnCell::lstm: return "lstm";
    case RnnCell::gru: return "gru";
    case RnnCell::rnn_tanh: return "rnn_tanh";
    case RnnCell::rnn_relu: return "rnn_relu";
  }
  return "?";
}

int rnn_cell_gates(RnnCell c) { return c == RnnCell::lstm ? 4 : c == RnnCell::gru ? 3 : 1; }

namespace {

cudnnRNNMode_t rnn_mode(RnnCell c) {
  switch (c) {
    case RnnCell::lstm: return CUDNN_LSTM;
    case RnnCell::gru: return CUDNN_GRU;
    case RnnCell::rnn_tanh: return CUDNN_RNN_TANH;
    case RnnCell::rnn_relu: return CUDNN_RNN_RELU;
  }
  return CUDNN_LSTM;
}

}  // namespace

void validate_rnn(const RnnConfig& c) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  const int64_t sizes[] = {c.seq_len, c.batch, c.input_size, c.hidden_size};
  for (int64_t v : sizes)
    if (v < 1 || v > kMax)
      throw_value_error(kWho, ": seq_len, batch, input_size and hidden_size must be in [1, 2^31 - 1], got (",
                        c.seq_len, ", ", c.batch, ", ", c.input_size, ", ", c.hidden_size, ")");
  const int64_t g = rnn_cell_gates(c.cell);
  check_cudnn_sizes(kWho, "x (T, N, F)", c.seq_len, c.batch, c.input_size, 1);
  check_cudnn_sizes(kWho, "y (T, N, H)", c.seq_len, c.batch, c.hidden_size, 1);
  check_cudnn_sizes(kWho, "w_ih (G*H, F)", g * c.hidden_size, c.input_size, 1, 1);
  check_cudnn_sizes(kWho, "w_hh (G*H, H)", g * c.hidden_size, c.hidden_size, 1, 1);
}

CudnnRnn::CudnnRnn(cudnnHandle_t handle, const RnnConfig& c) : config_(c) {
  validate_rnn(c);
  check_cudnn_handle(kWho, handle);
  const int t = static_cast<int>(c.seq_len), n = static_cast<int>(c.batch);
  const int f = static_cast<int>(c.input_size), h = static_cast<int>(c.hidden_size);
  lengths_.assign(static_cast<std::size_t>(n), t);
  // A single layer has no inter-layer dropout; cuDNN still wants a descriptor (dropout 0, no states).
  TREADLE_CUDNN_CHECK(cudnnSetDropoutDescriptor(dropout_.get(), handle, 0.0f, nullptr, 0, 0));
  TREADLE_CUDNN_CHECK(cudnnSetRNNDescriptor_v8(
      rnn_.get(), CUDNN_RNN_ALGO_STANDARD, rnn_mode(c.cell),
      c.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS, CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT,
      CUDNN_DATA_FLOAT, c.tensor_op ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : CUDNN_FMA_MATH, f, h, h, 1,
      dropout_.get(), CUDNN_RNN_PADDED_IO_ENABLED));
  set_data_descriptors(x_, y_, lengths_.data());
  h_.set_3d(kWho, "state (1, N, H)", 1, n, h);
  TREADLE_CUDNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, rnn_.get(), &weight_space_));
  // Sized for full-length sequences: the largest any call needs.
  TREADLE_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(handle, rnn_.get(), CUDNN_FWD_MODE_TRAINING, x_.get(),
                                                &cudnn_workspace_, &reserve_));
  const std::size_t xs = align256(static_cast<std::size_t>(c.seq_len * c.batch * c.input_size) * sizeof(float));
  const std::size_t ys = align256(static_cast<std::size_t>(c.seq_len * c.batch * c.hidden_size) * sizeof(float));
  off_x_ = 0;
  off_y_ = off_x_ + (c.reverse ? xs : 0);
  off_dy_ = off_y_ + (c.reverse ? ys : 0);
  off_dx_ = off_dy_ + (c.reverse || c.variable_lengths ? ys : 0);
  off_cudnn_ = off_dx_ + (c.reverse ? xs : 0);
  workspace_ = off_cudnn_ + cudnn_workspace_;
  // The full lengths once on the device, so that no call copies from the host (CUDA graphs).
  const std::size_t bytes = lengths_.size() * sizeof(int32_t);
  TREADLE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_lengths_), bytes));
  try {
    CudaStream upload;
    copy_to_device(device_lengths_, lengths_.data(), bytes, upload.get());
  } catch (...) {
    cudaFree(device_lengths_);
    throw;
  }
}

CudnnRnn::~CudnnRnn() {
  if (device_lengths_ != nullptr) cudaFree(device_lengths_);  // errors ignored: destructors never throw
}

void CudnnRnn::set_data_descriptors(RnnDataDescriptor& x, RnnDataDescriptor& y, const int32_t* lengths) const {
  const cudnnRNNDataLayout_t layout =
      config_.batch_first ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED;
  const int t = static_cast<int>(config_.seq_len), n = static_cast<int>(config_.batch);
  float fill = 0.0f;  // what cuDNN writes at output positions past a sequence's length
  TREADLE_CUDNN_CHECK(cudnnSetRNNDataDescriptor(x.get(), CUDNN_DATA_FLOAT, layout, t, n,
                                                static_cast<int>(config_.input_size), lengths, &fill));
  TREADLE_CUDNN_CHECK(cudnnSetRNNDataDescriptor(y.get(), CUDNN_DATA_FLOAT, layout, t, n,
                                                static_cast<int>(config_.hidden_size), lengths, &fill));
}

// One call's view of the lengths: the prepared full-length descriptors and device copy, or
// descriptors of its own for the given lengths (checked on the host first).
class CudnnRnn::Call {
 public:
  Call(const CudnnRnn& rnn, const char* who, const RnnLengths& l) : x_(rnn.x_.get()), y_(rnn.y_.get()) {
    dev_ = rnn.device_lengths_;
    if (!l.variable()) return;
    if (!rnn.config_.variable_lengths)
      throw_value_error(who, ": the layer was built for full-length sequences (RnnConfig::variable_lengths off) ",
                        "but the call passes lengths");
    if (l.host == nullptr || l.device == nullptr)
      throw_value_error(who, ": give the lengths both on the host and on the device (got host ",
                        l.host ? "set" : "null", ", device ", l.device ? "set" : "null", ")");
    const int64_t T = rnn.config_.seq_len;
    for (int64_t n = 0; n < rnn.config_.batch; ++n)
      if (l.host[n] < 1 || l.host[n] > T)
        throw_value_error(who, ": lengths must be in [1, ", T, "] (the sequence length), got lengths[", n, "] = ",
                          l.host[n]);
    own_x_.emplace();
    own_y_.emplace();
    rnn.set_data_descriptors(*own_x_, *own_y_, l.host);
    x_ = own_x_->get();
    y_ = own_y_->get();
    dev_ = l.device;
    kernel_lengths_ = l.device;
  }
  cudnnRNNDataDescriptor_t x() const { return x_; }
  cudnnRNNDataDescriptor_t y() const { return y_; }
  const int32_t* device() const { return dev_; }           // cuDNN's devSeqLengths
  const int32_t* kernel_lengths() const { return kernel_lengths_; }  // the sequence kernels' (null: full)
  bool variable() const { return kernel_lengths_ != nullptr; }

 private:
  std::optional<RnnDataDescriptor> own_x_, own_y_;
  cudnnRNNDataDescriptor_t x_, y_;
  const int32_t* dev_ = nullptr;
  const int32_t* kernel_lengths_ = nullptr;
};

void CudnnRnn::copy_weights(cudnnHandle_t handle, const void* space, bool to_space, const float* const* core,
                            float* const* core_out) const {
  const int g = gates();
  const int64_t h = config_.hidden_size;
  const cudaStream_t stream = stream_of(handle);
  TensorDescriptor m_desc, b_desc;
  for (int id = 0; id < 2 * g; ++id) {
    const bool recurrent = id >= g;  // linLayerID 0..G-1: W (input side), G..2G-1: R (hidden side)
    const int gate = recurrent ? id - g : id;
    const int64_t cols = recurrent ? h : config_.input_size;
    void* m_addr = nullptr;
    void* b_addr = nullptr;
    TREADLE_CUDNN_CHECK(cudnnGetRNNWeightParams(handle, rnn_.get(), 0, weight_space_, space, id, m_desc.get(), &m_addr,
                                                b_desc.get(), &b_addr));
    std::size_t m_bytes = 0;
    TREADLE_CUDNN_CHECK(cudnnGetTensorSizeInBytes(m_desc.get(), &m_bytes));
    const std::size_t want = static_cast<std::size_t>(h * cols) * sizeof(float);
    if (m_addr == nullptr || m_bytes != want)
      throw RuntimeError(detail::concat(kWho, ": cuDNN's matrix ", id, " has ", m_bytes, " bytes at ", m_addr,
                                        ", expected ", want, " (", h, " x ", cols, " float32)"));
    const std::size_t m_off = static_cast<std::size_t>(gate * h * cols), b_off = static_cast<std::size_t>(gate * h);
    const int mi = recurrent ? 1 : 0, bi = recurrent ? 3 : 2;  // w_ih, w_hh, b_ih, b_hh
    if (to_space) check_cuda(cudaMemcpyAsync(m_addr, core[mi] + m_off, want, cudaMemcpyDeviceToDevice, stream),
                             "rnn_cudnn: cudaMemcpyAsync (weights)");
    else check_cuda(cudaMemcpyAsync(core_out[mi] + m_off, m_addr, want, cudaMemcpyDeviceToDevice, stream),
                    "rnn_cudnn: cudaMemcpyAsync (weight gradients)");
    if (!config_.bias) continue;
    if (b_addr == nullptr) throw RuntimeError(detail::concat(kWho, ": cuDNN's bias ", id, " is missing"));
    const std::size_t b_bytes = static_cast<std::size_t>(h) * sizeof(float);
    if (to_space) check_cuda(cudaMemcpyAsync(b_addr, core[bi] + b_off, b_bytes, cudaMemcpyDeviceToDevice, stream),
                             "rnn_cudnn: cudaMemcpyAsync (biases)");
    else check_cuda(cudaMemcpyAsync(core_out[bi] + b_off, b_addr, b_bytes, cudaMemcpyDeviceToDevice, stream),
                    "rnn_cudnn: cudaMemcpyAsync (bias gradients)");
  }
}

void CudnnRnn::pack_weights(cudnnHandle_t handle, const float* w_ih, const float* w_hh, const float* b_ih,
                            const float* b_hh, void* weight_space) const {
  const char* who = "rnn_cudnn pack_weights";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "w_ih", w_ih);
  check_device_pointer(who, "w_hh", w_hh);
  check_device_pointer(who, "weight_space", weight_space);
  if (config_.bias != (b_ih != nullptr) || config_.bias != (b_hh != nullptr))
    throw_value_error(who, ": the layer was built ", config_.bias ? "with" : "without", " biases; give b_ih and b_hh ",
                      config_.bias ? "both" : "as null");
  const float* core[4] = {w_ih, w_hh, b_ih, b_hh};
  copy_weights(handle, weight_space, true, core, nullptr);
}

void CudnnRnn::unpack_weight_grads(cudnnHandle_t handle, const void* dweight_space, float* dw_ih, float* dw_hh,
                                   float* db_ih, float* db_hh) const {
  const char* who = "rnn_cudnn unpack_weight_grads";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "dw_ih", dw_ih);
  check_device_pointer(who, "dw_hh", dw_hh);
  check_device_pointer(who, "dweight_space", dweight_space);
  if (config_.bias != (db_ih != nullptr) || config_.bias != (db_hh != nullptr))
    throw_value_error(who, ": the layer was built ", config_.bias ? "with" : "without", " biases; give db_ih and db_hh ",
                      config_.bias ? "both" : "as null");
  float* core[4] = {dw_ih, dw_hh, db_ih, db_hh};
  copy_weights(handle, dweight_space, false, nullptr, core);
}

void CudnnRnn::check_spaces(const char* who, const void* workspace, const void* reserve) const {
  check_device_pointer(who, "workspace", workspace);
  if (reserve_ > 0) check_device_pointer(who, "reserve", reserve);
}

void CudnnRnn::forward_training(cudnnHandle_t handle, const float* x, const float* h0, const float* c0,
                                const void* weight_space, float* y, float* h_n, float* c_n, void* workspace,
                                void* reserve, const RnnLengths& lengths) const {
  const char* who = "rnn_cudnn forward_training";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "weight_space", weight_space);
  check_device_pointer(who, "y", y);
  check_spaces(who, workspace, reserve);
  if (config_.cell != RnnCell::lstm && (c0 != nullptr || c_n != nullptr))
    throw_value_error(who, ": only an LSTM has a cell state; c0 and c_n must be null for ", rnn_cell_name(config_.cell));
  const Call call(*this, who, lengths);
  const cudaStream_t s = stream_of(handle);
  const RnnConfig& c = config_;
  const float* x_in = x;
  float* y_out = y;
  if (c.reverse) {  // cuDNN's forward direction over the sequences reversed within their lengths
    sequence_copy(x, at(workspace, off_x_), c.seq_len, c.batch, c.input_size, call.kernel_lengths(), c.batch_first,
                  true, s);
    x_in = at(workspace, off_x_);
    y_out = at(workspace, off_y_);
  }
  TREADLE_CUDNN_CHECK(cudnnRNNForward(handle, rnn_.get(), CUDNN_FWD_MODE_TRAINING, call.device(), call.x(), x_in,
                                      call.y(), y_out, h_.get(), h0, h_n, h_.get(), c0, c_n, weight_space_,
                                      weight_space, cudnn_workspace_, at(workspace, off_cudnn_), reserve_, reserve));
  if (c.reverse)
    sequence_copy(y_out, y, c.seq_len, c.batch, c.hidden_size, call.kernel_lengths(), c.batch_first, true, s);
  else if (call.variable())  // zeros past each length whatever cuDNN's padding fill did
    sequence_zero_padding(y, c.seq_len, c.batch, c.hidden_size, call.kernel_lengths(), c.batch_first, s);
}

void CudnnRnn::backward_data(cudnnHandle_t handle, const float* y, const float* dy, const float* dh_n,
                             const float* dc_n, const float* h0, const float* c0, const void* weight_space, float* dx,
                             float* dh0, float* dc0, void* workspace, void* reserve,
                             const RnnLengths& lengths) const {
  const char* who = "rnn_cudnn backward_data";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "y", y);
  check_device_pointer(who, "dy", dy);
  check_device_pointer(who, "weight_space", weight_space);
  check_device_pointer(who, "dx", dx);
  check_spaces(who, workspace, reserve);
  if (config_.cell != RnnCell::lstm && (c0 != nullptr || dc_n != nullptr || dc0 != nullptr))
    throw_value_error(who, ": only an LSTM has a cell state; c0, dc_n and dc0 must be null for ",
                      rnn_cell_name(config_.cell));
  const Call call(*this, who, lengths);
  const cudaStream_t s = stream_of(handle);
  const RnnConfig& c = config_;
  const int32_t* len = call.kernel_lengths();
  const float* y_in = y;
  const float* dy_in = dy;
  float* dx_out = dx;
  if (c.reverse) {
    sequence_copy(y, at(workspace, off_y_), c.seq_len, c.batch, c.hidden_size, len, c.batch_first, true, s);
    y_in = at(workspace, off_y_);
    dx_out = at(workspace, off_dx_);
  }
  if (c.reverse || call.variable()) {  // dy reversed, and zero past each length: cuDNN never sees it there
    sequence_copy(dy, at(workspace, off_dy_), c.seq_len, c.batch, c.hidden_size, len, c.batch_first, c.reverse, s);
    dy_in = at(workspace, off_dy_);
  }
  TREADLE_CUDNN_CHECK(cudnnRNNBackwardData_v8(handle, rnn_.get(), call.device(), call.y(), y_in, dy_in, call.x(),
                                              dx_out, h_.get(), h0, dh_n, dh0, h_.get(), c0, dc_n, dc0, weight_space_,
                                              weight_space, cudnn_workspace_, at(workspace, off_cudnn_), reserve_,
                                              reserve));
  if (c.reverse)
    sequence_copy(dx_out, dx, c.seq_len, c.batch, c.input_size, len, c.batch_first, true, s);
  else if (call.variable())
    sequence_zero_padding(dx, c.seq_len, c.batch, c.input_size, len, c.batch_first, s);
}

void CudnnRnn::backward_weights(cudnnHandle_t handle, const float* x, const float* h0, const float* y,
                                void* dweight_space, bool accumulate, void* workspace, void* reserve,
                                const RnnLengths& lengths) const {
  const char* who = "rnn_cudnn backward_weights";
  check_cudnn_handle(who, handle);
  check_device_pointer(who, "x", x);
  check_device_pointer(who, "y", y);
  check_device_pointer(who, "dweight_space", dweight_space);
  check_spaces(who, workspace, reserve);
  const Call call(*this, who, lengths);
  const cudaStream_t s = stream_of(handle);
  const RnnConfig& c = config_;
  const float* x_in = x;
  const float* y_in = y;
  if (c.reverse) {  // the sequences cuDNN's forward saw
    const int32_t* len = call.kernel_lengths();
    sequence_copy(x, at(workspace, off_x_), c.seq_len, c.batch, c.input_size, len, c.batch_first, true, s);
    sequence_copy(y, at(workspace, off_y_), c.seq_len, c.batch, c.hidden_size, len, c.batch_first, true, s);
    x_in = at(workspace, off_x_);
    y_in = at(workspace, off_y_);
  }
  // cuDNN documents only WGRAD_MODE_ADD for this call: setting is adding onto zeros.
  if (!accumulate)
    check_cuda(cudaMemsetAsync(dweight_space, 0, weight_space_, s), "rnn_cudnn: cudaMemsetAsync");
  TREADLE_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(handle, rnn_.get(), CUDNN_WGRAD_MODE_ADD, call.device(), call.x(),
                                                 x_in, h_.get(), h0, call.y(), y_in, weight_space_, dweight_space,
                                                 cudnn_workspace_, at(workspace, off_cudnn_), reserve_, reserve));
}

}  // namespace treadle::cuda

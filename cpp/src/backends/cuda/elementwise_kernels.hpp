#pragma once
// Elementwise kernels beyond the activations of cuda_kernels.hpp, as the core's ops define them:
// arithmetic with numpy broadcasting (add, sub, mul), scale, mul3, the activations with parameters
// (leaky_relu, elu, softplus) and their backward maps, sum_to over any broadcast dimensions, and
// dropout's mask (the reference's counter-based hash, bit for bit). Conventions of cuda_kernels.hpp:
// float32, arguments checked on the host (ValueError naming the function and the values), the
// stream explicit, nothing allocated, no atomics (a result depends only on the inputs and shapes).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace treadle::cuda {

constexpr int kMaxLayoutDims = 8;

// A row-major iteration space and the element strides two operands take through it (0 along a
// dimension an operand is broadcast over). Unit dimensions are dropped and neighbours that both
// operands traverse contiguously are merged, so the usual cases need one or two dimensions. Passed
// to the kernels by value.
struct StridedLayout {
  int ndim = 0;
  int64_t dims[kMaxLayoutDims] = {};
  int64_t stride_a[kMaxLayoutDims] = {};
  int64_t stride_b[kMaxLayoutDims] = {};
};

// The layout of out = a (op) b, `out` being the broadcast shape of the contiguous tensors a and b
// (the core's broadcast_shapes). False when more than kMaxLayoutDims dimensions remain after
// merging; throws ValueError when a or b does not broadcast to `out`.
bool broadcast_layout(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int64_t>& out,
                      StridedLayout& layout);

// ---- y = a (op) b over a broadcast layout (n = the output's element count)
enum class BinaryOp { add, sub, mul };
void binary_forward(BinaryOp op, const float* a, const float* b, float* y, int64_t n, const StridedLayout& layout,
                    cudaStream_t stream);

// ---- y = alpha * x (the core's scale op; alpha already rounded to float32, as the reference does)
void scale_forward(const float* x, float* y, float alpha, int64_t n, cudaStream_t stream);

// ---- y = alpha * ((a * b) * c) over n elements (the core's mul3; alpha rounded to float32)
void mul3_forward(const float* a, const float* b, const float* c, float* y, float alpha, int64_t n,
                  cudaStream_t stream);

// ---- the activations with attributes; the backward maps take (x, dy), as the core's ops do
struct ParamActivation {
  enum class Kind { leaky_relu, elu, softplus };
  Kind kind = Kind::leaky_relu;
  float negative_slope = 0.01f;  // leaky_relu
  float alpha = 1.0f;            // elu
  float beta = 1.0f;             // softplus: log(1 + exp(beta x)) / beta, nonzero
  float threshold = 20.0f;       // softplus: x itself where beta x > threshold
};
const char* param_activation_name(ParamActivation::Kind kind);
void param_activation_forward(const ParamActivation& act, const float* x, float* y, int64_t n, cudaStream_t stream);
void param_activation_backward(const ParamActivation& act, const float* x, const float* dy, float* dx, int64_t n,
                               cudaStream_t stream);

// ---- sum_to: x summed over the dimensions where the target shape is 1 or absent. x's dimensions
// split into those the output keeps (output element o walks them in row-major order) and those it
// sums, each with x's strides, merged as in StridedLayout.
struct SumToLayout {
  int kept_ndim = 0, reduced_ndim = 0;
  int64_t kept_dims[kMaxLayoutDims] = {}, kept_strides[kMaxLayoutDims] = {};
  int64_t reduced_dims[kMaxLayoutDims] = {}, reduced_strides[kMaxLayoutDims] = {};
  int64_t outputs = 1;  // the output's element count
  int64_t reduced = 1;  // elements summed into each output (0 when x is empty)
  // (rows, cols) -> (cols,) after merging: the column_sum kernel (cuda_kernels.hpp).
  bool columns() const { return reduced_ndim == 1 && kept_ndim == 1 && kept_strides[0] == 1 &&
                                reduced_strides[0] == kept_dims[0]; }
};
// False when the merged dimensions do not fit; ValueError when `target` does not broadcast to x.
bool sum_to_layout(const std::vector<int64_t>& x, const std::vector<int64_t>& target, SumToLayout& layout);
std::size_t sum_to_workspace_bytes(const SumToLayout& layout);
// Each output is summed in double in an order fixed by the shape (one thread per output for short
// sums, one block per output otherwise); (rows, cols) -> (cols,) goes to column_sum.
void sum_to(const float* x, float* y, const SumToLayout& layout, void* workspace, cudaStream_t stream);

// ---- dropout: the reference's mask (backends/eigen/dropout_kernels.cpp). Element i draws the i-th
// value of a splitmix64 sequence keyed by (seed, step counter, the node's "stream" attribute), a
// 53-bit uniform compared with p in double: the same integer arithmetic on the device, so the same
// mask bit for bit. mask = 0 or 1 / (1 - p) (0 for every element when p == 1); y = x * mask.
uint64_t dropout_key(uint64_t seed, uint64_t counter, uint64_t stream);
void dropout_forward(const float* x, float* y, float* mask, int64_t n, uint64_t key, double p, cudaStream_t stream);
// The step's RNG state as device memory holds it (see device_rng.hpp).
struct DeviceRngState {
  uint64_t seed = 0;
  uint64_t counter = 0;
};
// The same mask with the seed and the counter read from `rng` (device memory) when the kernel runs,
// and the key mixed on the device as dropout_key does: a CUDA graph replays it with the counter its
// step wrote there, so each replay draws that counter's mask.
void dropout_forward_indirect(const float* x, float* y, float* mask, int64_t n, const DeviceRngState* rng,
                              uint64_t stream_id, double p, cudaStream_t stream);

}  // namespace treadle::cuda

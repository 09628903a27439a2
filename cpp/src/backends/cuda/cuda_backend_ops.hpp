#pragma once
// The CUDA backend's op adapters (cuda_backend_ops.cpp, cuda_backend_cnn.cpp): for each op it covers, whether a node
// qualifies, what `prepare` builds once per node (cuBLASLt products, sizes), and the kernel that
// maps KernelArgs onto one call of the kernel layer on the context's stream (KernelArgs::stream).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend_kernels.hpp"
#include "backends/cuda/precision_kernels.hpp"
#include "backends/kernel.hpp"
#include "core/op_registry.hpp"
#include "ops/precision.hpp"

namespace treadle::cuda {

// Every family registers OpEntry lists (backends/kernel.hpp: op, accepts, prepare, kernel,
// deterministic), float32. Deterministic: the own kernels are (no atomics); cuBLASLt products are not
// claimed to be, since the heuristic's algorithm may split K and reduce with atomics.

// What every adapter reads: the context's stream, float operands, shapes and the op's name.
inline cudaStream_t stream_of(const KernelArgs& a) { return static_cast<cudaStream_t>(a.stream); }
inline const float* in_f(const KernelArgs& a, int k) { return static_cast<const float*>(a.in[k].data); }
inline float* out_f(const KernelArgs& a, int k = 0) { return static_cast<float*>(a.out[k].data); }
inline const Shape& shape_of(const Graph& g, int value) { return g.info(value).shape; }
inline const std::string& op_name(const Node& node) { return OpRegistry::instance().at(node.op).name; }

// Every floating operand float32 (integer operands, such as class labels or indices, are the op's
// business) and at least one output.
inline bool float32_dtypes(const Graph& g, const Node& node) {
  for (const std::vector<int>* list : {&node.inputs, &node.outputs})
    for (int v : *list)
      if (is_floating(g.info(v).dtype) && g.info(v).dtype != DType::f32) return false;
  return !node.outputs.empty();
}
// The same, and something to compute: the first output is not empty.
inline bool float32_node(const Graph& g, const Node& node) {
  return float32_dtypes(g, node) && shape_numel(shape_of(g, node.outputs[0])) > 0;
}

// What prepare returns: the adapter's state and the node's workspace bytes.
template <typename T>
PreparedNode with_state(std::shared_ptr<T> state, std::size_t workspace = 0) {
  PreparedNode p;
  p.state = std::move(state);
  p.workspace = workspace;
  return p;
}
// The state prepare built, in a kernel.
template <typename T>
const T& state_of(const KernelArgs& a) {
  return *static_cast<const T*>(a.state);
}

// A tensor seen as (outer, axis, inner) around the attribute "axis" (non-negative after the op's
// check) of input 0: the state of softmax and log_softmax and their backward ops.
struct AxisSplit {
  int64_t outer = 1, axis = 1, inner = 1;
};
PreparedNode prepare_axis_split(const Graph& g, const Node& node);

// The operand rounding a node's "precision" attribute asks for (the core's rounding_of, in the
// kernel layer's terms: precision_kernels.hpp cannot include the core's headers).
inline OperandRounding operand_rounding(const Attrs& attrs) {
  switch (treadle::rounding_of(attrs)) {
    case treadle::OperandRounding::bf16: return OperandRounding::bf16;
    case treadle::OperandRounding::fp16: return OperandRounding::fp16;
    case treadle::OperandRounding::none: break;
  }
  return OperandRounding::none;
}

// The MLP family (cuda_backend_ops.cpp), the convolution / pooling family (cuda_backend_cnn.cpp).
std::vector<OpEntry> op_entries();
std::vector<OpEntry> cnn_op_entries();
// LSTM and GRU layers and their backward ops (cuda_backend_rnn.cpp).
std::vector<OpEntry> rnn_op_entries();
// Normalisation and log_softmax (cuda_backend_norm.cpp); shape, bmm, causal mask, embedding, resampling
// (cuda_backend_shape.cpp).
std::vector<OpEntry> norm_op_entries();
std::vector<OpEntry> shape_op_entries();
// Broadcast arithmetic, scale, leaky_relu/elu/softplus, the elementwise losses, dropout
// (cuda_backend_elementwise.cpp).
std::vector<OpEntry> elementwise_op_entries();

// Where a product that a fused activation reads back sits in a node's workspace: after the
// product's own scratch, 256-byte aligned (the workspace base is 64-byte aligned in the arena).
inline std::size_t post_product_offset(std::size_t scratch_bytes) { return (scratch_bytes + 255) / 256 * 256; }

// The backend's cuBLASLt handle for device 0 (thread-safe to share), created on first use.
cublasLtHandle_t lt_handle();
// The calling thread's cuDNN handle for device 0, bound to `stream` (created on first use).
cudnnHandle_t cudnn_handle(cudaStream_t stream);

}  // namespace treadle::cuda

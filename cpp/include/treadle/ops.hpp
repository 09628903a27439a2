#pragma once
// The symbolic op API: what a module's forward (or a functional model) calls while tracing.
// Each function records one node; the op's checks and gradient rule live in cpp/src/ops.
#include <optional>
#include <string>
#include <vector>

#include "treadle/graph.hpp"

namespace treadle::ops {

// Linear algebra
TREADLE_API Value linear(Value x, Value weight, Value bias);  // x @ weight^T + bias; bias may be undefined
TREADLE_API Value matmul(Value a, Value b, bool trans_a = false, bool trans_b = false);  // 2-D

// Elementwise with numpy broadcasting
TREADLE_API Value add(Value a, Value b);
TREADLE_API Value sub(Value a, Value b);
TREADLE_API Value mul(Value a, Value b);
TREADLE_API Value scale(Value a, double alpha);  // alpha * a
// alpha * a * b * c, multiplied in that order; a, b and c of one shape (no broadcasting).
TREADLE_API Value mul3(Value a, Value b, Value c, double alpha = 1.0);
TREADLE_API Value scalar_like(Value like, double value);  // a 0-d constant of like's dtype (broadcasts)
TREADLE_API Value full_like(Value like, double value);    // a constant of like's shape and dtype
TREADLE_API Value sum_to(Value a, const Shape& shape);  // reduce broadcast dimensions back to `shape`
TREADLE_API Value sum(Value a, int axis, bool keepdim = false);
TREADLE_API Value mean(Value a, int axis, bool keepdim = false);
// Over several dims at once; an empty list reduces over every dim (x.sum() in torch).
TREADLE_API Value sum(Value a, const std::vector<int64_t>& dims, bool keepdim = false);
TREADLE_API Value mean(Value a, const std::vector<int64_t>& dims, bool keepdim = false);
TREADLE_API Value div(Value a, Value b);

// Elementwise math (PyTorch's semantics; each differentiable twice)
TREADLE_API Value exp(Value x);
TREADLE_API Value log(Value x);
TREADLE_API Value log1p(Value x);
TREADLE_API Value sqrt(Value x);
TREADLE_API Value abs(Value x);
TREADLE_API Value pow(Value x, double exponent);
TREADLE_API Value clamp(Value x, std::optional<double> min, std::optional<double> max);  // at least one bound

// Shape
TREADLE_API Value reshape(Value a, const Shape& shape);  // one entry may be -1
TREADLE_API Value flatten(Value a, int start_dim = 1, int end_dim = -1);
TREADLE_API Value concat(const std::vector<Value>& parts, int axis);
TREADLE_API Value slice(Value a, int axis, int64_t start, int64_t stop);
// torch's view-like methods, recorded as reshape / permute / slice nodes.
TREADLE_API Value transpose(Value a, int dim0, int dim1);
TREADLE_API Value unsqueeze(Value a, int dim);
TREADLE_API Value squeeze(Value a, std::optional<int> dim = std::nullopt);  // all size-1 dims, or `dim` if it is 1
TREADLE_API std::vector<Value> split(Value a, int64_t split_size, int dim = 0);  // the last part may be smaller
TREADLE_API std::vector<Value> split(Value a, const std::vector<int64_t>& sizes, int dim = 0);
TREADLE_API std::vector<Value> chunk(Value a, int64_t chunks, int dim = 0);  // parts of ceil(n / chunks)

// Attention building blocks
TREADLE_API Value bmm(Value a, Value b, bool trans_a = false, bool trans_b = false);  // (B, M, K) @ (B, K, N)
TREADLE_API Value permute(Value a, const std::vector<int64_t>& dims);                  // like torch.permute
TREADLE_API Value causal_mask(Graph& g, int64_t rows, int64_t cols, DType dtype);      // 0 on/below diagonal, -inf above

// Activations
TREADLE_API Value relu(Value x);
TREADLE_API Value leaky_relu(Value x, double negative_slope = 0.01);
TREADLE_API Value elu(Value x, double alpha = 1.0);
TREADLE_API Value gelu(Value x, bool tanh_approximation = false);
TREADLE_API Value silu(Value x);
TREADLE_API Value tanh(Value x);
TREADLE_API Value sigmoid(Value x);
TREADLE_API Value softplus(Value x, double beta = 1.0, double threshold = 20.0);
TREADLE_API Value softmax(Value x, int axis = -1);
TREADLE_API Value log_softmax(Value x, int axis = -1);

// Derivatives inside a graph (torch.autograd.grad with create_graph=True): the gradients of
// sum_i <outputs[i], grad_outputs[i]> with respect to each of `inputs`, recorded as ordinary graph
// ops, so a loss may use them and be differentiated again. grad_outputs may be empty when every
// output is a scalar. An input the outputs do not depend on is an error unless allow_unused, in
// which case its gradient is an undefined Value; an input they depend on through ops of zero
// derivative (relu's mask) gets zeros.
TREADLE_API std::vector<Value> grad(const std::vector<Value>& outputs, const std::vector<Value>& inputs,
                                    const std::vector<Value>& grad_outputs = {}, bool allow_unused = false);

// Selection. Comparisons ("gt", "lt", "ge", "le", "eq", "ne") give 1 or 0 in the operands' dtype
// (there is no bool dtype) and no gradient; where() takes any nonzero condition as true and
// broadcasts its three operands; gather() is torch.gather (index of input's rank, int64).
TREADLE_API Value compare(const std::string& op, Value a, Value b);
TREADLE_API Value where(Value cond, Value a, Value b);
// indices.shape + (num_classes,) of 0/1 in dtype (torch's one_hot, in the model's float dtype).
TREADLE_API Value one_hot(Value indices, int64_t num_classes, DType dtype);
TREADLE_API Value gather(Value input, int dim, Value index);
// torch's max_unpool: x (N, C, *spatial) and max_pool's indices (into each input plane of
// output_size, flattened) -> zeros of (N, C, *output_size) with x written at the indices.
TREADLE_API Value max_unpool(Value x, Value indices, const Shape& output_size);

// Regularisation: identity when the graph is not training.
TREADLE_API Value dropout(Value x, double p);
// Noise of like's shape and dtype from the context's counter-based RNG (new every step, reproducible
// for a seed): uniform in [0, 1), or standard normal. No gradient flows into the noise.
TREADLE_API Value rand_like(Value like);
TREADLE_API Value randn_like(Value like);

// Losses (reduction: "mean" or "sum"); each returns a scalar value.
TREADLE_API Value mse_loss(Value pred, Value target, const std::string& reduction = "mean");
TREADLE_API Value l1_loss(Value pred, Value target, const std::string& reduction = "mean");
TREADLE_API Value huber_loss(Value pred, Value target, double delta = 1.0, const std::string& reduction = "mean");
TREADLE_API Value cross_entropy(Value logits, Value labels, const std::string& reduction = "mean");
TREADLE_API Value bce_with_logits(Value logits, Value target, const std::string& reduction = "mean");

}  // namespace treadle::ops

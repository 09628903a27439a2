#pragma once
// An op is data: a name, a shape/dtype rule that also validates, and a gradient rule written as
// other graph ops. Kernels live in the backends. Adding an op = a definition in cpp/src/ops,
// one Eigen kernel, its family's register_*_ops(), and tests.
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "treadle/graph.hpp"

namespace treadle {

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
};

// What a gradient rule sees of the node it differentiates.
struct GradContext {
  Graph& graph;
  const Node& node;
  std::vector<Value> inputs;
  std::vector<Value> outputs;
  std::vector<Value> grad_outputs;  // undefined where no gradient flows into that output
  std::vector<bool> needs_grad;     // per input: is its gradient wanted?
};

struct OpDef {
  std::string name;
  // Validates inputs and attributes, may normalise attributes (e.g. a negative axis), and
  // returns the outputs' shapes and dtypes. Throws ValueError/TypeError naming the problem.
  std::function<std::vector<TensorMeta>(const std::vector<TensorMeta>& inputs, Attrs& attrs)> infer;
  // Returns one gradient per input (undefined Value where none). Null: not differentiable.
  std::function<std::vector<Value>(const GradContext&)> grad;
  // Bytes of scratch the kernel needs (0 by default). Planned once; steps allocate nothing.
  std::function<std::size_t(const std::vector<TensorMeta>& inputs, const Attrs& attrs)> workspace;
  int view_of = -1;          // output 0 shares the memory of this input (reshape-like ops)
  bool uses_rng = false;     // kernel draws from the context's counter-based RNG
  // Inputs the kernel updates in place (e.g. BatchNorm's running statistics, which are parameters
  // with requires_grad=false). Such ops may only appear in training plans; the planner refuses
  // them elsewhere, so inference never writes to parameters.
  std::vector<int> writes_inputs = {};
  // Each output element is a function of the same element of each input alone when every input has
  // the output's shape (add, mul, tanh, tanh_backward, ...). The planner may then run a chain of such
  // steps block by block (plan_elementwise.cpp), so a new pointwise op joins those runs by saying so.
  bool pointwise = false;
};

class OpRegistry {
 public:
  static const OpRegistry& instance();
  int id(const std::string& name) const;  // throws naming the op if unknown
  const OpDef& at(int id) const { return defs_.at(id); }
  const OpDef& at(const std::string& name) const { return defs_.at(id(name)); }
  int size() const { return static_cast<int>(defs_.size()); }
  void add(OpDef def);

 private:
  std::vector<OpDef> defs_;
  std::unordered_map<std::string, int> ids_;
};

// Each op family file provides one of these; OpRegistry::instance() calls them in turn.
void register_linear_ops(OpRegistry& r);
void register_elementwise_ops(OpRegistry& r);
void register_math_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_activation_ops(OpRegistry& r);
void register_softmax_ops(OpRegistry& r);
void register_dropout_ops(OpRegistry& r);
void register_random_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
void register_recurrent_ops(OpRegistry& r);
void register_attention_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_embedding_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);
void register_conv_ops(OpRegistry& r);
void register_pool_ops(OpRegistry& r);
void register_select_ops(OpRegistry& r);

// Helpers shared by op definitions.
TensorMeta same_as(const TensorMeta& m);
void check_num_inputs(const std::string& op, const std::vector<TensorMeta>& in, std::size_t n);
void check_same_dtype(const std::string& op, const std::vector<TensorMeta>& in);
void check_floating(const std::string& op, const TensorMeta& m);
int normalize_axis(const std::string& op, int64_t axis, int ndim);
// numpy broadcasting of two shapes; ValueError naming `op` when they do not broadcast.
Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b);

}  // namespace treadle

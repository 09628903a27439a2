#pragma once
// The graph: ops over symbolic values, recorded by tracing a model's forward.
// A node records only its op, inputs and attributes; its meaning lives in the op's definition
// (cpp/src/ops) and its kernels in the backends.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "treadle/dtype.hpp"
#include "treadle/tensor.hpp"

namespace treadle {

class Graph;
class Parameter;

// Attribute values an op may carry: an integer, a float, an integer list or a string.
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

class TREADLE_API Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const char*, AttrValue>> items);
  Attrs& set(const std::string& name, AttrValue v);
  bool has(const std::string& name) const;
  int64_t i(const std::string& name) const;
  double f(const std::string& name) const;
  const std::vector<int64_t>& ints(const std::string& name) const;
  const std::string& s(const std::string& name) const;
  int64_t i_or(const std::string& name, int64_t dflt) const { return has(name) ? i(name) : dflt; }
  double f_or(const std::string& name, double dflt) const { return has(name) ? f(name) : dflt; }
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }

 private:
  const AttrValue& get(const std::string& name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

enum class ValueKind : uint8_t {
  input,         // data bound by the caller at run time (model inputs)
  target,        // loss targets bound at run time
  seed,          // gradient of the model output, bound at run time (host-driven backward)
  parameter,     // lives in the model's flat parameter buffer
  intermediate,  // produced by a node, placed by the memory plan
};

struct ValueInfo {
  Shape shape;
  DType dtype = DType::f32;
  ValueKind kind = ValueKind::intermediate;
  int producer = -1;     // node index for intermediates
  int slot = -1;         // input/target/seed/parameter index
  bool requires_grad = false;
  // Set when a plan is finalized: a node consumes the value or the host reads it after a run. A
  // backend may leave an output that nobody reads unwritten (a recurrent layer's saved buffer in
  // an inference plan).
  bool read = false;
  bool host_read = false;  // the host reads it after a run (an output, the loss, a gradient)
  // Set when a plan is finalized, for an output that a backend writes in a layout of its own (the
  // oneDNN recurrent workspace in a layer's `saved`): that backend's name and the bytes it needs.
  // Only that backend's kernels read such a value, and anomaly mode does not check its numbers.
  const char* layout_owner = nullptr;
  int64_t layout_bytes = 0;
};

struct Node {
  int op = -1;  // index in the op registry
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;
  std::string scope;  // the module path that emitted it ("0", "encoder.fc1"), for profiles and errors
};

// A symbolic value handle: what module forwards pass around while a graph is traced.
class TREADLE_API Value {
 public:
  Value() = default;
  Value(Graph* g, int id);
  bool defined() const { return graph_ != nullptr; }
  // Throws if the graph this value was recorded in is gone (a symbol kept past tracing).
  Graph& graph() const;
  int id() const { return id_; }
  // By value: recording more ops may move the graph's value table.
  Shape shape() const;
  DType dtype() const;
  int ndim() const;
  int64_t dim(int i) const;

 private:
  Graph* graph_ = nullptr;
  std::weak_ptr<const int> life_;  // expires with the graph
  int id_ = -1;
};

class TREADLE_API Graph {
 public:
  explicit Graph(bool training = false) : training_(training) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  const std::shared_ptr<const int>& life() const { return life_; }

  bool training() const { return training_; }

  Value add_input(Shape shape, DType dtype, ValueKind kind = ValueKind::input);
  // Registers (once) a parameter and returns its symbolic value.
  Value add_parameter(const std::shared_ptr<Parameter>& p);
  // Records a node of op `op_name`; shapes/dtypes of outputs come from the op's definition,
  // which also validates the inputs and throws ValueError/TypeError naming the problem.
  std::vector<Value> apply(const std::string& op_name, const std::vector<Value>& inputs, Attrs attrs = {});
  Value apply1(const std::string& op_name, const std::vector<Value>& inputs, Attrs attrs = {}) {
    return apply(op_name, inputs, std::move(attrs)).at(0);
  }

  const std::vector<ValueInfo>& values() const { return values_; }
  std::vector<ValueInfo>& values() { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }  // for plan-time rewrites of attributes
  const std::vector<std::shared_ptr<Parameter>>& parameters() const { return params_; }
  const ValueInfo& info(int id) const { return values_.at(id); }

  // Module scope for the nodes recorded next (a stack: push on entering a module).
  void push_scope(const std::string& name);
  void pop_scope();

  // A named value the host reads after a training step (e.g. a loss's terms: Trainer::step with
  // StepOutputs). Its memory stays valid to the end of the run. Names are unique per graph.
  void observe(const std::string& name, Value v);
  const std::vector<std::pair<std::string, int>>& observed() const { return observed_; }

 private:
  int new_value(Shape shape, DType dtype, ValueKind kind, int producer, int slot);
  bool training_;
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  std::vector<ValueInfo> values_;
  std::vector<Node> nodes_;
  std::vector<std::shared_ptr<Parameter>> params_;
  std::vector<int> param_values_;
  std::vector<int> num_kind_ = std::vector<int>(5, 0);
  std::vector<std::string> scope_;
  std::vector<std::pair<std::string, int>> observed_;
};

class ScopeGuard {
 public:
  ScopeGuard(Graph& g, const std::string& name) : g_(g) { g_.push_scope(name); }
  ~ScopeGuard() { g_.pop_scope(); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  Graph& g_;
};

}  // namespace treadle

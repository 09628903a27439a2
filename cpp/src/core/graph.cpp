#include "treadle/graph.hpp"

#include "core/op_registry.hpp"
#include "treadle/error.hpp"
#include "treadle/module.hpp"

namespace treadle {

Attrs::Attrs(std::initializer_list<std::pair<const char*, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(const std::string& name, AttrValue v) {
  for (auto& [k, old] : items_)
    if (k == name) {
      old = std::move(v);
      return *this;
    }
  items_.emplace_back(name, std::move(v));
  return *this;
}

bool Attrs::has(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return true;
  return false;
}

const AttrValue& Attrs::get(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return item.second;
  throw_value_error("missing attribute '", name, "'");
}

int64_t Attrs::i(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<double>(&v)) return static_cast<int64_t>(*p);
  throw_type_error("attribute '", name, "' is not an integer");
}

double Attrs::f(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  throw_type_error("attribute '", name, "' is not a number");
}

const std::vector<int64_t>& Attrs::ints(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto p = std::get_if<std::vector<int64_t>>(&v)) return *p;
  throw_type_error("attribute '", name, "' is not an integer list");
}

const std::string& Attrs::s(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw_type_error("attribute '", name, "' is not a string");
}

Value::Value(Graph* g, int id) : graph_(g), id_(id), life_(g ? g->life() : nullptr) {}

Graph& Value::graph() const {
  if (!graph_) throw_value_error("symbolic value is undefined");
  if (life_.expired())
    throw_value_error("symbolic value used after its graph was compiled (symbols exist only while a forward is traced)");
  return *graph_;
}

Shape Value::shape() const { return graph().info(id_).shape; }
int Value::ndim() const { return static_cast<int>(graph().info(id_).shape.size()); }
DType Value::dtype() const { return graph().info(id_).dtype; }
int64_t Value::dim(int i) const {
  const Shape& s = graph().info(id_).shape;
  int k = i < 0 ? i + static_cast<int>(s.size()) : i;
  if (k < 0 || k >= static_cast<int>(s.size()))
    throw_value_error("dim ", i, " out of range for shape ", shape_str(s));
  return s[k];
}

int Graph::new_value(Shape shape, DType dtype, ValueKind kind, int producer, int slot) {
  ValueInfo v;
  v.shape = std::move(shape);
  v.dtype = dtype;
  v.kind = kind;
  v.producer = producer;
  v.slot = slot;
  values_.push_back(std::move(v));
  return static_cast<int>(values_.size()) - 1;
}

Value Graph::add_input(Shape shape, DType dtype, ValueKind kind) {
  int slot = num_kind_[static_cast<int>(kind)]++;
  return Value(this, new_value(std::move(shape), dtype, kind, -1, slot));
}

Value Graph::add_parameter(const std::shared_ptr<Parameter>& param) {
  const std::shared_ptr<Parameter>& p = Parameter::resolve(param);  // a tied parameter is its target
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i] == p) return Value(this, param_values_[i]);
  const Tensor& t = p->value();
  int id = new_value(t.shape(), t.dtype(), ValueKind::parameter, -1, static_cast<int>(params_.size()));
  values_[id].requires_grad = p->requires_grad();
  params_.push_back(p);
  param_values_.push_back(id);
  return Value(this, id);
}

std::vector<Value> Graph::apply(const std::string& op_name, const std::vector<Value>& inputs, Attrs attrs) {
  const OpRegistry& reg = OpRegistry::instance();
  int op = reg.id(op_name);
  std::vector<TensorMeta> metas;
  metas.reserve(inputs.size());
  for (const Value& v : inputs) {
    if (!v.defined()) throw_value_error(op_name, ": an input is undefined");
    if (&v.graph() != this) throw_value_error(op_name, ": an input belongs to another graph");
    metas.push_back({info(v.id()).shape, info(v.id()).dtype});
  }
  std::vector<TensorMeta> outs = reg.at(op).infer(metas, attrs);
  // An output no machine could hold (a size an attribute decides: upsample, adaptive pooling, a
  // constant) is refused here, before any workspace or memory plan multiplies it further.
  for (const TensorMeta& m : outs) {
    int64_t n = 0;
    try {
      n = shape_numel(m.shape);  // throws on overflow
    } catch (const ValueError& e) {
      throw_value_error(op_name, ": an output's ", e.what());
    }
    if (n > max_tensor_bytes() / static_cast<int64_t>(dtype_size(m.dtype)))
      throw_value_error(op_name, ": an output of shape ", shape_str(m.shape), " and dtype ", dtype_name(m.dtype),
                        " needs more than this machine's ", max_tensor_bytes(), " bytes of memory");
  }
  Node node;
  node.op = op;
  for (const Value& v : inputs) node.inputs.push_back(v.id());
  node.attrs = std::move(attrs);
  for (std::size_t i = 0; i < scope_.size(); ++i) node.scope += (i ? "." : "") + scope_[i];
  int node_id = static_cast<int>(nodes_.size());
  std::vector<Value> result;
  for (auto& m : outs) {
    int id = new_value(std::move(m.shape), m.dtype, ValueKind::intermediate, node_id, -1);
    node.outputs.push_back(id);
    result.emplace_back(this, id);
  }
  nodes_.push_back(std::move(node));
  return result;
}

void Graph::observe(const std::string& name, Value v) {
  if (name.empty()) throw_value_error("observe: the name is empty");
  if (!v.defined() || &v.graph() != this) throw_value_error("observe: '", name, "' is not a value of this graph");
  for (const auto& [n, id] : observed_)
    if (n == name) throw_value_error("observe: the name '", name, "' is used twice");
  observed_.emplace_back(name, v.id());
}

void Graph::push_scope(const std::string& name) { scope_.push_back(name); }
void Graph::pop_scope() {
  if (!scope_.empty()) scope_.pop_back();
}

}  // namespace treadle

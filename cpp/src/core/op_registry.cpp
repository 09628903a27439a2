#include "core/op_registry.hpp"

#include <algorithm>

#include "treadle/backend.hpp"
#include "treadle/error.hpp"

namespace treadle {

const OpRegistry& OpRegistry::instance() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_linear_ops(r);
    register_elementwise_ops(r);
    register_math_ops(r);
    register_shape_ops(r);
    register_activation_ops(r);
    register_softmax_ops(r);
    register_dropout_ops(r);
    register_random_ops(r);
    register_loss_ops(r);
    register_recurrent_ops(r);
    register_attention_ops(r);
    register_norm_ops(r);
    register_embedding_ops(r);
    register_misc_ops(r);
    register_conv_ops(r);
    register_pool_ops(r);
    register_select_ops(r);
    return r;
  }();
  return registry;
}

void OpRegistry::add(OpDef def) {
  if (ids_.count(def.name)) throw_runtime_error("OpRegistry::add: op '", def.name, "' registered twice");
  ids_[def.name] = static_cast<int>(defs_.size());
  defs_.push_back(std::move(def));
}

int OpRegistry::id(const std::string& name) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) throw_value_error("unknown op '", name, "'");
  return it->second;
}

TensorMeta same_as(const TensorMeta& m) { return m; }

void check_num_inputs(const std::string& op, const std::vector<TensorMeta>& in, std::size_t n) {
  if (in.size() != n) throw_value_error(op, ": expected ", n, " inputs, got ", in.size());
}

void check_same_dtype(const std::string& op, const std::vector<TensorMeta>& in) {
  for (const auto& m : in)
    if (m.dtype != in.at(0).dtype)
      throw_type_error(op, ": inputs must share one dtype, got ", dtype_name(in[0].dtype), " and ", dtype_name(m.dtype));
}

void check_floating(const std::string& op, const TensorMeta& m) {
  if (m.dtype != DType::f32 && m.dtype != DType::f64)
    throw_type_error(op, ": expected float32 or float64, got ", dtype_name(m.dtype));
}

int normalize_axis(const std::string& op, int64_t axis, int ndim) {
  int64_t a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) throw_value_error(op, ": axis ", axis, " out of range for ", ndim, "-d input");
  return static_cast<int>(a);
}

}  // namespace treadle

namespace treadle {

std::vector<std::string> differentiable_ops() {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<std::string> names;
  for (int id = 0; id < reg.size(); ++id)
    if (reg.at(id).grad) names.push_back(reg.at(id).name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace treadle

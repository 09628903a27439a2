// Bindings for the normalisation, embedding and small layers (treadle/nn_layers.hpp): the C++
// modules that python/treadle/nn_layers.py wraps, and their functional ops for forward functions.
#include <optional>

#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_layers.hpp"

namespace treadle::py_bind {
namespace {

template <typename M>
using ModuleClass = py::class_<M, Module, std::shared_ptr<M>>;

void bind_norm_modules(py::module_& m) {
  ModuleClass<nn::LayerNorm>(m, "LayerNorm")
      .def(py::init([](Shape shape, double eps, bool affine, bool bias, const py::object& dtype) {
             return std::make_shared<nn::LayerNorm>(std::move(shape), eps, affine, bias, dtype_from_py(dtype));
           }),
           py::arg("normalized_shape"), py::arg("eps") = 1e-5, py::arg("elementwise_affine") = true,
           py::arg("bias") = true, py::arg("dtype") = "float32");
  ModuleClass<nn::RMSNorm>(m, "RMSNorm")
      .def(py::init([](Shape shape, std::optional<double> eps, bool affine, const py::object& dtype) {
             return std::make_shared<nn::RMSNorm>(std::move(shape), eps, affine, dtype_from_py(dtype));
           }),
           py::arg("normalized_shape"), py::arg("eps") = py::none(), py::arg("elementwise_affine") = true,
           py::arg("dtype") = "float32");
  ModuleClass<nn::GroupNorm>(m, "GroupNorm")
      .def(py::init([](int64_t groups, int64_t channels, double eps, bool affine, const py::object& dtype, bool bias) {
             return std::make_shared<nn::GroupNorm>(groups, channels, eps, affine, dtype_from_py(dtype), bias);
           }),
           py::arg("num_groups"), py::arg("num_channels"), py::arg("eps") = 1e-5, py::arg("affine") = true,
           py::arg("dtype") = "float32", py::arg("bias") = true);
  ModuleClass<nn::BatchNorm>(m, "BatchNorm")
      .def(py::init([](int dims, int64_t features, double eps, std::optional<double> momentum, bool affine,
                       bool track, const py::object& dtype, bool bias) {
             return std::make_shared<nn::BatchNorm>(dims, features, eps, momentum, affine, track, dtype_from_py(dtype),
                                                    bias);
           }),
           py::arg("spatial_dims"), py::arg("num_features"), py::arg("eps") = 1e-5, py::arg("momentum") = 0.1,
           py::arg("affine") = true, py::arg("track_running_stats") = true, py::arg("dtype") = "float32",
           py::arg("bias") = true);
}

void bind_other_modules(py::module_& m) {
  ModuleClass<nn::Embedding>(m, "Embedding")
      .def(py::init([](int64_t num, int64_t dim, std::optional<int64_t> padding_idx, const py::object& dtype,
                       std::optional<double> max_norm, double norm_type, bool scale_grad_by_freq) {
             return std::make_shared<nn::Embedding>(num, dim, padding_idx, dtype_from_py(dtype),
                                                    ops::EmbeddingOptions{max_norm, norm_type, scale_grad_by_freq});
           }),
           py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("padding_idx") = py::none(),
           py::arg("dtype") = "float32", py::arg("max_norm") = py::none(), py::arg("norm_type") = 2.0,
           py::arg("scale_grad_by_freq") = false)
      .def_property_readonly("padding_idx", &nn::Embedding::padding_idx);
  ModuleClass<nn::Unflatten>(m, "Unflatten")
      .def(py::init<int, Shape>(), py::arg("dim"), py::arg("unflattened_size"));
  ModuleClass<nn::Upsample>(m, "Upsample")
      .def(py::init<Shape, std::vector<double>, std::string, std::optional<bool>, bool>(), py::arg("size"),
           py::arg("scale_factor"), py::arg("mode") = "nearest", py::arg("align_corners") = py::none(),
           py::arg("recompute_scale_factor") = false);
  ModuleClass<nn::Identity>(m, "IdentityModule").def(py::init<>());
  ModuleClass<nn::OutputTransform>(m, "OutputTransform")
      .def(py::init([](std::vector<double> scale, std::vector<double> shift, std::vector<std::string> acts,
                       const py::object& dtype) {
             return std::make_shared<nn::OutputTransform>(std::move(scale), std::move(shift), std::move(acts),
                                                          dtype_from_py(dtype));
           }),
           py::arg("scale"), py::arg("shift"), py::arg("activations"), py::arg("dtype") = "float32")
      .def_property_readonly("num_outputs", &nn::OutputTransform::num_outputs);
}

Value opt(const std::optional<Value>& v) { return v ? *v : Value(); }

// The number of trailing dimensions normalised, after checking they equal `shape`.
int normalized_ndim(const char* op, const Value& x, const Shape& shape) {
  const Shape xs = x.shape();  // by value: keep one copy for the iterators below
  if (shape.empty() || shape.size() > xs.size() ||
      Shape(xs.end() - static_cast<std::ptrdiff_t>(shape.size()), xs.end()) != shape)
    throw_value_error(op, ": normalized_shape ", shape_str(shape), " does not match input of shape ", shape_str(xs));
  return static_cast<int>(shape.size());
}

void bind_functional_layers(py::module_& m) {
  py::module_ f = m.attr("functional").cast<py::module_>();
  f.def("layer_norm",
        [](Value x, const Shape& shape, std::optional<Value> w, std::optional<Value> b, double eps) {
          return ops::layer_norm(x, normalized_ndim("layer_norm", x, shape), opt(w), opt(b), eps);
        },
        py::arg("x"), py::arg("normalized_shape"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
        py::arg("eps") = 1e-5);
  f.def("rms_norm",
        [](Value x, const Shape& shape, std::optional<Value> w, std::optional<double> eps) {
          return ops::rms_norm(x, normalized_ndim("rms_norm", x, shape), opt(w), eps.value_or(-1.0));
        },
        py::arg("x"), py::arg("normalized_shape"), py::arg("weight") = py::none(), py::arg("eps") = py::none());
  f.def("group_norm",
        [](Value x, int64_t groups, std::optional<Value> w, std::optional<Value> b, double eps) {
          return ops::group_norm(x, groups, opt(w), opt(b), eps);
        },
        py::arg("x"), py::arg("num_groups"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
        py::arg("eps") = 1e-5);
  // torch's F.batch_norm: running statistics (buffers or parameters) are updated in place on a
  // training step; a prediction (whose plan never writes) normalises with the batch's own statistics
  // when training=True, as torch's output is. A lone weight or bias: ops::batch_norm completes it.
  f.def("batch_norm",
        [](Value x, std::optional<Value> running_mean, std::optional<Value> running_var, std::optional<Value> weight,
           std::optional<Value> bias, bool training, double momentum, double eps) {
          if (running_mean.has_value() != running_var.has_value())
            throw_value_error("batch_norm: give both running_mean and running_var, or neither");
          if (!training && !running_mean) throw_value_error("batch_norm: training=False needs running_mean and running_var");
          if (x.ndim() < 2) throw_value_error("batch_norm: expected input of shape (N, C, *), got ", shape_str(x.shape()));
          const Value w = weight.value_or(Value()), b = bias.value_or(Value());
          const bool update = training && x.graph().training() && running_mean;
          return ops::batch_norm(x, update || !training ? *running_mean : Value(),
                                 update || !training ? *running_var : Value(), w, b, Value(), training, momentum, eps);
        },
        py::arg("input"), py::arg("running_mean"), py::arg("running_var"), py::arg("weight") = py::none(),
        py::arg("bias") = py::none(), py::arg("training") = false, py::arg("momentum") = 0.1, py::arg("eps") = 1e-5);
  f.def("embedding",
        [](Value indices, Value weight, std::optional<int64_t> padding_idx, std::optional<double> max_norm,
           double norm_type, bool scale_grad_by_freq, bool /*sparse: the gradient is dense, the values torch's*/) {
          int64_t p = padding_idx.value_or(-1);
          if (padding_idx && p < 0) p += weight.dim(0);
          return ops::embedding(indices, weight, p, {max_norm, norm_type, scale_grad_by_freq});
        },
        py::arg("input"), py::arg("weight"), py::arg("padding_idx") = py::none(), py::arg("max_norm") = py::none(),
        py::arg("norm_type") = 2.0, py::arg("scale_grad_by_freq") = false, py::arg("sparse") = false);
}

}  // namespace

void bind_layers(py::module_& m) {
  bind_norm_modules(m);
  bind_other_modules(m);
  bind_functional_layers(m);
}

}  // namespace treadle::py_bind

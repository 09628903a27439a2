// Convolution and pooling bindings: the modules (wrapped by python/treadle/nn_conv.py, which
// normalises PyTorch-style arguments into lists) and the functional ops, added to the
// `functional` submodule that bind_core creates.
#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/nn_conv.hpp"

namespace treadle::py_bind {
namespace {

nn::ConvPadding padding_from(const py::object& p) {
  if (py::isinstance<py::str>(p)) return nn::ConvPadding(p.cast<std::string>());
  return nn::ConvPadding(p.cast<Shape>());
}

void bind_conv_modules(py::module_& m) {
  py::class_<nn::ConvNd, Module, std::shared_ptr<nn::ConvNd>>(m, "Conv")
      .def(py::init([](int nd, int64_t in, int64_t out, Shape k, Shape stride, const py::object& padding, Shape dil,
                       int64_t groups, bool bias, const py::object& dtype) {
             return std::make_shared<nn::ConvNd>(nd, in, out, std::move(k), std::move(stride), padding_from(padding),
                                                 std::move(dil), groups, bias, dtype_from_py(dtype));
           }),
           py::arg("nd"), py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"),
           py::arg("stride") = Shape{1}, py::arg("padding") = Shape{0}, py::arg("dilation") = Shape{1},
           py::arg("groups") = 1, py::arg("bias") = true, py::arg("dtype") = "float32")
      .def_property_readonly("padding", &nn::ConvNd::padding);
  py::class_<nn::ConvTransposeNd, Module, std::shared_ptr<nn::ConvTransposeNd>>(m, "ConvTranspose")
      .def(py::init([](int nd, int64_t in, int64_t out, Shape k, Shape stride, Shape padding, Shape output_padding,
                       int64_t groups, bool bias, Shape dil, const py::object& dtype) {
             return std::make_shared<nn::ConvTransposeNd>(nd, in, out, std::move(k), std::move(stride),
                                                          std::move(padding), std::move(output_padding), groups, bias,
                                                          std::move(dil), dtype_from_py(dtype));
           }),
           py::arg("nd"), py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"),
           py::arg("stride") = Shape{1}, py::arg("padding") = Shape{0}, py::arg("output_padding") = Shape{0},
           py::arg("groups") = 1, py::arg("bias") = true, py::arg("dilation") = Shape{1},
           py::arg("dtype") = "float32");
  py::class_<nn::MaxPoolNd, Module, std::shared_ptr<nn::MaxPoolNd>>(m, "MaxPool")
      .def(py::init<int, Shape, Shape, Shape, Shape, bool>(), py::arg("nd"), py::arg("kernel_size"),
           py::arg("stride") = Shape{}, py::arg("padding") = Shape{0}, py::arg("dilation") = Shape{1},
           py::arg("ceil_mode") = false);
  py::class_<nn::AvgPoolNd, Module, std::shared_ptr<nn::AvgPoolNd>>(m, "AvgPool")
      .def(py::init<int, Shape, Shape, Shape, bool, bool, int64_t>(), py::arg("nd"), py::arg("kernel_size"),
           py::arg("stride") = Shape{}, py::arg("padding") = Shape{0}, py::arg("ceil_mode") = false,
           py::arg("count_include_pad") = true, py::arg("divisor_override") = 0);
  py::class_<nn::AdaptiveAvgPoolNd, Module, std::shared_ptr<nn::AdaptiveAvgPoolNd>>(m, "AdaptiveAvgPool")
      .def(py::init<int, Shape>(), py::arg("nd"), py::arg("output_size"));
  py::class_<nn::GlobalAvgPool2d, Module, std::shared_ptr<nn::GlobalAvgPool2d>>(m, "GlobalAvgPool2d")
      .def(py::init<>());
}

Value optional(const std::optional<Value>& v) { return v ? *v : Value(); }

// PyTorch accepts an int or a tuple for every window argument.
Shape to_dims(const py::handle& v, const std::string& fn, const char* name) {
  if (py::isinstance<py::int_>(v)) return {v.cast<int64_t>()};
  if (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) return v.cast<Shape>();
  throw_type_error(fn, ": ", name, " must be an int or a tuple of ints, got ", std::string(py::str(py::type::of(v))));
}

void check_rank(const std::string& fn, const Value& x, int nd) {
  if (x.ndim() != nd + 2)
    throw_value_error(fn, ": expected a batched input with ", nd, " spatial dimensions (", nd + 2, "-d), got ",
                      shape_str(x.shape()));
}

// conv{1,2,3}d with PyTorch's signature, including padding='same' / 'valid'.
Value conv_nd(int nd, Value x, Value w, std::optional<Value> b, const py::object& stride, const py::object& padding,
              const py::object& dilation, int64_t groups) {
  const std::string fn = "conv" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  Shape s = to_dims(stride, fn, "stride"), d = to_dims(dilation, fn, "dilation"), begin, end;
  if (!py::isinstance<py::str>(padding)) {
    begin = end = to_dims(padding, fn, "padding");
  } else if (padding.cast<std::string>() == "valid") {
    begin = end = {0};
  } else if (padding.cast<std::string>() == "same") {
    for (int64_t v : s)
      if (v != 1) throw_value_error(fn, ": padding='same' is not supported for strided convolutions");
    for (int i = 0; i < nd && w.ndim() == nd + 2; ++i) {
      const int64_t total = (d.size() == 1 ? d[0] : d.at(i)) * (w.dim(2 + i) - 1);
      begin.push_back(total / 2);
      end.push_back(total - total / 2);
    }
  } else {
    throw_value_error(fn, ": padding must be an int, a tuple, 'same' or 'valid', got '", padding.cast<std::string>(),
                      "'");
  }
  return ops::conv(x, w, optional(b), s, begin, d, groups, end);
}

Value conv_transpose_nd(int nd, Value x, Value w, std::optional<Value> b, const py::object& stride,
                        const py::object& padding, const py::object& output_padding, int64_t groups,
                        const py::object& dilation) {
  const std::string fn = "conv_transpose" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  return ops::conv_transpose(x, w, optional(b), to_dims(stride, fn, "stride"), to_dims(padding, fn, "padding"),
                             to_dims(output_padding, fn, "output_padding"), to_dims(dilation, fn, "dilation"), groups);
}

// The pooled values, or (values, indices) with return_indices.
py::object max_pool_nd(int nd, Value x, const py::object& k, const py::object& stride, const py::object& padding,
                       const py::object& dilation, bool ceil_mode, bool return_indices) {
  const std::string fn = "max_pool" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  Shape s = stride.is_none() ? Shape{} : to_dims(stride, fn, "stride");
  auto [y, indices] = ops::max_pool_with_indices(x, to_dims(k, fn, "kernel_size"), s, to_dims(padding, fn, "padding"),
                                                 to_dims(dilation, fn, "dilation"), ceil_mode);
  return return_indices ? py::object(py::make_tuple(y, indices)) : py::cast(y);
}

// An int or nd ints, as nd values.
Shape per_dim(const py::handle& v, int nd, const std::string& fn, const char* name) {
  Shape d = to_dims(v, fn, name);
  if (d.size() == 1) d.assign(nd, d[0]);
  if (static_cast<int>(d.size()) != nd) throw_value_error(fn, ": ", name, " must have 1 or ", nd, " values, got ", d.size());
  return d;
}

// torch's max_unpool{1,2,3}d: the output size (N, C, *size) defaults to (in - 1) * stride - 2 * padding +
// kernel_size per dim; a given output_size (nd values, or with N and C first) must lie strictly within
// stride of that default, as torch checks.
Value max_unpool_nd(int nd, Value x, Value indices, const py::object& k, const py::object& stride,
                    const py::object& padding, const py::object& output_size) {
  const std::string fn = "max_unpool" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  const Shape kernel = per_dim(k, nd, fn, "kernel_size");
  const Shape s = stride.is_none() ? kernel : per_dim(stride, nd, fn, "stride");
  const Shape p = per_dim(padding, nd, fn, "padding");
  Shape out(nd);
  for (int i = 0; i < nd; ++i) out[i] = (x.dim(2 + i) - 1) * s[i] - 2 * p[i] + kernel[i];
  if (!output_size.is_none()) {
    Shape given = output_size.cast<Shape>();
    if (static_cast<int>(given.size()) == nd + 2) given.erase(given.begin(), given.begin() + 2);
    if (static_cast<int>(given.size()) != nd)
      throw_value_error(fn, ": output_size must have ", nd, " or ", nd + 2, " values, got ", shape_str(given));
    for (int i = 0; i < nd; ++i)
      if (given[i] <= out[i] - s[i] || given[i] >= out[i] + s[i])
        throw_value_error(fn, ": output_size ", shape_str(given), " is invalid for input of shape ", shape_str(x.shape()),
                          " (dim ", i, " must be between ", out[i] - s[i] + 1, " and ", out[i] + s[i] - 1, ")");
    out = given;
  }
  return ops::max_unpool(x, indices, out);
}

Value avg_pool_nd(int nd, Value x, const py::object& k, const py::object& stride, const py::object& padding,
                  bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor) {
  const std::string fn = "avg_pool" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  if (divisor && *divisor <= 0) throw_value_error(fn, ": divisor_override must be positive, got ", *divisor);
  Shape s = stride.is_none() ? Shape{} : to_dims(stride, fn, "stride");
  return ops::avg_pool(x, to_dims(k, fn, "kernel_size"), s, to_dims(padding, fn, "padding"), ceil_mode,
                       count_include_pad, divisor.value_or(0));
}

// output_size: an int, or a tuple whose None entries keep that input dim (PyTorch).
Value adaptive_avg_pool_nd(int nd, Value x, const py::object& size) {
  const std::string fn = "adaptive_avg_pool" + std::to_string(nd) + "d";
  check_rank(fn, x, nd);
  py::list items = py::isinstance<py::tuple>(size) || py::isinstance<py::list>(size) ? py::list(size) : py::list();
  if (items.empty()) items.append(size);
  if (items.size() != 1 && items.size() != static_cast<std::size_t>(nd))
    throw_value_error(fn, ": output_size must have 1 or ", nd, " values");
  Shape out;
  for (int i = 0; i < nd; ++i) {
    py::object v = items[items.size() == 1 ? 0 : i];
    out.push_back(v.is_none() ? x.dim(2 + i) : v.cast<int64_t>());
  }
  return ops::adaptive_avg_pool(x, out);
}

// conv1d ... adaptive_avg_pool3d with PyTorch's names, arguments and defaults.
void bind_conv_functional(py::module_& m) {
  py::module_ f = m.attr("functional").cast<py::module_>();
  for (int nd = 1; nd <= 3; ++nd) {
    const std::string sfx = std::to_string(nd) + "d";
    f.def(("conv" + sfx).c_str(),
          [nd](Value x, Value w, std::optional<Value> b, py::object s, py::object p, py::object d, int64_t groups) {
            return conv_nd(nd, x, w, b, s, p, d, groups);
          },
          py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("stride") = 1,
          py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1);
    f.def(("conv_transpose" + sfx).c_str(),
          [nd](Value x, Value w, std::optional<Value> b, py::object s, py::object p, py::object op, int64_t groups,
               py::object d) { return conv_transpose_nd(nd, x, w, b, s, p, op, groups, d); },
          py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("stride") = 1,
          py::arg("padding") = 0, py::arg("output_padding") = 0, py::arg("groups") = 1, py::arg("dilation") = 1);
    f.def(("max_pool" + sfx).c_str(),
          [nd](Value x, py::object k, py::object s, py::object p, py::object d, bool ceil_mode, bool return_indices) {
            return max_pool_nd(nd, x, k, s, p, d, ceil_mode, return_indices);
          },
          py::arg("input"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
          py::arg("dilation") = 1, py::arg("ceil_mode") = false, py::arg("return_indices") = false);
    f.def(("max_unpool" + sfx).c_str(),
          [nd](Value x, Value indices, py::object k, py::object s, py::object p, py::object output_size) {
            return max_unpool_nd(nd, x, indices, k, s, p, output_size);
          },
          py::arg("input"), py::arg("indices"), py::arg("kernel_size"), py::arg("stride") = py::none(),
          py::arg("padding") = 0, py::arg("output_size") = py::none());
    f.def(("avg_pool" + sfx).c_str(),
          [nd](Value x, py::object k, py::object s, py::object p, bool ceil_mode, bool include_pad,
               std::optional<int64_t> divisor) { return avg_pool_nd(nd, x, k, s, p, ceil_mode, include_pad, divisor); },
          py::arg("input"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
          py::arg("ceil_mode") = false, py::arg("count_include_pad") = true, py::arg("divisor_override") = py::none());
    f.def(("adaptive_avg_pool" + sfx).c_str(), [nd](Value x, py::object size) { return adaptive_avg_pool_nd(nd, x, size); },
          py::arg("input"), py::arg("output_size"));
  }
}

}  // namespace

void bind_conv(py::module_& m) {
  bind_conv_modules(m);
  bind_conv_functional(m);
}

}  // namespace treadle::py_bind

// Recurrent layer bindings: the RNN/GRU/LSTM modules (python/treadle/nn_recurrent.py wraps them)
// and the one-layer symbolic op.
#include <optional>

#include "bindings.hpp"
#include "treadle/nn_recurrent.hpp"

namespace treadle::py_bind {
namespace {

Value or_undefined(const std::optional<Value>& v) { return v ? *v : Value(); }

py::object value_or_none(const Value& v) { return v.defined() ? py::cast(v) : py::none(); }

nn::RecurrentOptions options(int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional,
                             const py::object& dtype) {
  nn::RecurrentOptions o;
  o.num_layers = num_layers;
  o.bias = bias;
  o.batch_first = batch_first;
  o.dropout = dropout;
  o.bidirectional = bidirectional;
  o.dtype = dtype_from_py(dtype);
  return o;
}

// Binds one module class whose constructor is make(input_size, hidden_size, options).
template <typename M, typename Make>
void bind_cell(py::module_& m, const char* name, Make make) {
  py::class_<M, nn::Recurrent, std::shared_ptr<M>>(m, name).def(
      py::init([make](int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first,
                      double dropout, bool bidirectional, const py::object& dtype) {
        return make(input_size, hidden_size, options(num_layers, bias, batch_first, dropout, bidirectional, dtype));
      }),
      py::arg("input_size"), py::arg("hidden_size"), py::arg("num_layers") = 1, py::arg("bias") = true,
      py::arg("batch_first") = false, py::arg("dropout") = 0.0, py::arg("bidirectional") = false,
      py::arg("dtype") = "float32");
}

}  // namespace

void bind_recurrent(py::module_& m) {
  py::class_<nn::Recurrent, Module, std::shared_ptr<nn::Recurrent>>(m, "Recurrent")
      .def("forward_all",
           [](nn::Recurrent& r, Value x, std::optional<Value> h0, std::optional<Value> c0,
              std::optional<Value> lengths) {
             nn::RecurrentOutput o = r.forward_all(x, or_undefined(h0), or_undefined(c0), or_undefined(lengths));
             return py::make_tuple(o.output, o.h_n, value_or_none(o.c_n));
           },
           py::arg("x"), py::arg("h0") = py::none(), py::arg("c0") = py::none(), py::arg("lengths") = py::none(),
           "(output, h_n, c_n or None) as symbolic values.")
      .def_property_readonly("input_size", &nn::Recurrent::input_size)
      .def_property_readonly("hidden_size", &nn::Recurrent::hidden_size)
      .def_property_readonly("num_layers", [](const nn::Recurrent& r) { return r.options().num_layers; })
      .def_property_readonly("batch_first", [](const nn::Recurrent& r) { return r.options().batch_first; })
      .def_property_readonly("bidirectional", [](const nn::Recurrent& r) { return r.options().bidirectional; })
      .def_property_readonly("dropout", [](const nn::Recurrent& r) { return r.options().dropout; })
      .def_property_readonly("bias", [](const nn::Recurrent& r) { return r.options().bias; })
      .def_property_readonly("cell", &nn::Recurrent::cell);

  py::class_<nn::RNN, nn::Recurrent, std::shared_ptr<nn::RNN>>(m, "RNN").def(
      py::init([](int64_t input_size, int64_t hidden_size, int64_t num_layers, const std::string& nonlinearity,
                  bool bias, bool batch_first, double dropout, bool bidirectional, const py::object& dtype) {
        return std::make_shared<nn::RNN>(input_size, hidden_size,
                                         options(num_layers, bias, batch_first, dropout, bidirectional, dtype),
                                         nonlinearity);
      }),
      py::arg("input_size"), py::arg("hidden_size"), py::arg("num_layers") = 1, py::arg("nonlinearity") = "tanh",
      py::arg("bias") = true, py::arg("batch_first") = false, py::arg("dropout") = 0.0,
      py::arg("bidirectional") = false, py::arg("dtype") = "float32");
  bind_cell<nn::GRU>(m, "GRU", [](int64_t i, int64_t h, nn::RecurrentOptions o) {
    return std::make_shared<nn::GRU>(i, h, o);
  });
  bind_cell<nn::LSTM>(m, "LSTM", [](int64_t i, int64_t h, nn::RecurrentOptions o) {
    return std::make_shared<nn::LSTM>(i, h, o);
  });

  py::module_ f = m.attr("functional").cast<py::module_>();
  f.def("recurrent_layer",
        [](const std::string& cell, Value x, Value h0, Value w_ih, Value w_hh, std::optional<Value> c0,
           std::optional<Value> b_ih, std::optional<Value> b_hh, std::optional<Value> lengths, bool batch_first,
           bool reverse) {
          auto o = ops::recurrent_layer(cell, x, h0, or_undefined(c0), w_ih, w_hh, or_undefined(b_ih),
                                        or_undefined(b_hh), or_undefined(lengths), batch_first, reverse);
          return py::make_tuple(o.output, o.h_n, value_or_none(o.c_n));
        },
        py::arg("cell"), py::arg("x"), py::arg("h0"), py::arg("w_ih"), py::arg("w_hh"), py::arg("c0") = py::none(),
        py::arg("b_ih") = py::none(), py::arg("b_hh") = py::none(), py::arg("lengths") = py::none(),
        py::arg("batch_first") = false, py::arg("reverse") = false,
        "One recurrent layer in one direction: (output, h_n, c_n or None). cell: rnn_tanh, rnn_relu, gru, lstm.");
}

}  // namespace treadle::py_bind

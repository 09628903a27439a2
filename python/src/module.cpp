#include "bindings.hpp"
#include "treadle/error.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "treadle's compiled core";
  py::register_exception<treadle::ValueError>(m, "_ValueError", PyExc_ValueError);
  py::register_exception<treadle::TypeError>(m, "_TypeError", PyExc_TypeError);
  py::register_exception<treadle::TimeoutError>(m, "_TimeoutError", PyExc_TimeoutError);
  treadle::py_bind::bind_executor(m);
  treadle::py_bind::bind_core(m);
  treadle::py_bind::bind_math(m);
  treadle::py_bind::bind_nn(m);
  treadle::py_bind::bind_optim(m);
  treadle::py_bind::bind_train(m);
  treadle::py_bind::bind_loss(m);
  treadle::py_bind::bind_recurrent(m);
  treadle::py_bind::bind_attention(m);
  treadle::py_bind::bind_layers(m);
  treadle::py_bind::bind_serialize(m);
  treadle::py_bind::bind_conv(m);
  treadle::py_bind::bind_dispatch(m);
  treadle::py_bind::bind_verify(m);
  treadle::py_bind::bind_replay(m);
  treadle::py_bind::bind_data_parallel(m);
}

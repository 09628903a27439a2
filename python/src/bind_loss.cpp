// treadle._core.Loss: the C++ loss description the trainer takes (python/treadle/loss.py wraps it).
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/loss.hpp"
#include "treadle/ops.hpp"

namespace treadle::py_bind {
namespace {

// The named values a loss function returned next to its loss: observed, so a step can return them.
void observe_named(const std::string& loss_name, const py::dict& named) {
  for (const auto& [key, value] : named) {
    if (!py::isinstance<py::str>(key))
      throw_type_error(loss_name, ": the names of the values it returns must be strings");
    if (!py::isinstance<Value>(value))
      throw_type_error(loss_name, ": the value named '", key.cast<std::string>(), "' must be a symbol, got ",
                       std::string(py::str(py::type::of(value).attr("__name__"))));
    Value v = value.cast<Value>();
    v.graph().observe(key.cast<std::string>(), v);
  }
}

// A custom loss around a Python function f(outputs, target, inputs) -> Symbol, or (Symbol, {name: Symbol}). The function is held through
// a shared_ptr whose deleter takes the GIL, so the C++ copies of the Loss (the trainer's, a plan
// compile's) may be made and dropped without it; each call takes the GIL as a traced forward does.
Loss custom_loss(py::function f, const std::string& name) {
  std::shared_ptr<py::function> held(new py::function(std::move(f)), [](py::function* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  InputLossFn fn = [held, name](const std::vector<Value>& outputs, Value target, const std::vector<Value>& inputs) {
    py::gil_scoped_acquire gil;
    py::object r = (*held)(outputs, target, inputs);
    if (py::isinstance<py::tuple>(r) && py::len(r) == 2 && py::isinstance<py::dict>(r[py::int_(1)])) {
      observe_named(name, r[py::int_(1)].cast<py::dict>());  // (loss, {"name": symbol, ...})
      r = r[py::int_(0)];
    }
    if (!py::isinstance<Value>(r))
      throw_type_error(name, ": must return a symbol built from its arguments with tl.functional ops, got ",
                       std::string(py::str(py::type::of(r).attr("__name__"))));
    return r.cast<Value>();
  };
  return loss::custom(std::move(fn), name);
}

}  // namespace

// The built-in losses as functions over symbols (torch.nn.functional's names), for custom losses.
void bind_loss_functions(py::module_& m) {
  py::module_ f = m.attr("functional").cast<py::module_>();
  f.def("mse_loss", &ops::mse_loss, py::arg("input"), py::arg("target"), py::arg("reduction") = "mean");
  f.def("l1_loss", &ops::l1_loss, py::arg("input"), py::arg("target"), py::arg("reduction") = "mean");
  f.def("huber_loss", [](Value x, Value t, const std::string& reduction, double delta) {
          return ops::huber_loss(x, t, delta, reduction);
        }, py::arg("input"), py::arg("target"), py::arg("reduction") = "mean", py::arg("delta") = 1.0);
  f.def("cross_entropy", &ops::cross_entropy, py::arg("input"), py::arg("target"), py::arg("reduction") = "mean",
        "Logits (N, C) or (N, C, d...) against int64 class indices.");
  f.def("binary_cross_entropy_with_logits", &ops::bce_with_logits, py::arg("input"), py::arg("target"),
        py::arg("reduction") = "mean");
}

void bind_loss(py::module_& m) {
  bind_loss_functions(m);
  py::class_<Loss>(m, "Loss", "A loss description: kind, reduction and (huber) delta. Build it with a factory.")
      .def_static("mse", &loss::mse, py::arg("reduction") = "mean")
      .def_static("l1", &loss::l1, py::arg("reduction") = "mean")
      .def_static("huber", &loss::huber, py::arg("delta") = 1.0, py::arg("reduction") = "mean")
      .def_static("cross_entropy", &loss::cross_entropy, py::arg("reduction") = "mean")
      .def_static("bce_with_logits", &loss::bce_with_logits, py::arg("reduction") = "mean")
      .def_static("custom", &custom_loss, py::arg("fn"), py::arg("name"),
                  "fn(outputs, target, inputs) -> 0-d Symbol, called while a plan is compiled (outputs, inputs: lists)")
      .def_property_readonly("kind", [](const Loss& l) { return l.kind; })
      .def_property_readonly("name", [](const Loss& l) { return l.name; })
      .def_property_readonly("reduction", [](const Loss& l) { return l.reduction; })
      .def_property_readonly("delta", [](const Loss& l) { return l.delta; })
      .def("key", &Loss::key, "Identifies the loss in a plan key.")
      .def(
          "target_dtype",
          [](const Loss& l, const py::handle& pred_dtype) {
            return std::string(dtype_name(l.target_dtype(dtype_from_py(pred_dtype))));
          },
          py::arg("pred_dtype"), "The dtype name a target must have for a prediction of `pred_dtype`.")
      .def(
          "check_target",
          [](const Loss& l, const std::vector<int64_t>& pred_shape, const py::handle& pred_dtype,
             const py::handle& target) {
            const Tensor t = tensor_from_numpy(target, "target");
            l.check_target(Shape(pred_shape.begin(), pred_shape.end()), dtype_from_py(pred_dtype), t);
          },
          py::arg("pred_shape"), py::arg("pred_dtype"), py::arg("target"),
          "Raises ValueError/TypeError if `target` does not fit a prediction of this shape and dtype.")
      .def("__repr__", [](const Loss& l) {
        std::string r = "Loss(kind='" + l.kind + "', reduction='" + l.reduction + "'";
        if (l.kind == "huber") r += ", delta=" + py::repr(py::float_(l.delta)).cast<std::string>();
        return r + ")";
      });
}

}  // namespace treadle::py_bind

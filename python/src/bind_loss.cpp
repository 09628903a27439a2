// treadle._core.Loss: the C++ loss description the trainer takes (python/treadle/loss.py wraps it).
#include <string>
#include <vector>

#include "bindings.hpp"
#include "treadle/loss.hpp"

namespace treadle::py_bind {

void bind_loss(py::module_& m) {
  py::class_<Loss>(m, "Loss", "A loss description: kind, reduction and (huber) delta. Build it with a factory.")
      .def_static("mse", &loss::mse, py::arg("reduction") = "mean")
      .def_static("l1", &loss::l1, py::arg("reduction") = "mean")
      .def_static("huber", &loss::huber, py::arg("delta") = 1.0, py::arg("reduction") = "mean")
      .def_static("cross_entropy", &loss::cross_entropy, py::arg("reduction") = "mean")
      .def_static("bce_with_logits", &loss::bce_with_logits, py::arg("reduction") = "mean")
      .def_property_readonly("kind", [](const Loss& l) { return l.kind; })
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

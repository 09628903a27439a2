// Module and model bindings. Python composes modules itself (python/treadle/nn.py); the C++ side
// holds parameters, records ops while tracing, and owns the compiled plans.
#include <pybind11/functional.h>

#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/model.hpp"
#include "treadle/module.hpp"

namespace treadle::py_bind {
namespace {

// "what: message" as "what (input i of n): message", for a model with several inputs.
std::string name_input(const char* message, const char* what, std::size_t i, std::size_t n) {
  const std::string m(message), prefix = std::string(what) + ":";
  const std::string rest = m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : " " + m;
  return std::string(what) + " (input " + std::to_string(i) + " of " + std::to_string(n) + "):" + rest;
}

// An array or a tuple of arrays is borrowed (the caller's arguments keep it alive for the whole
// call); items of a list are not, since another thread may replace them while the GIL is released.
std::vector<Tensor> tensors_from(const py::handle& xs, const char* what) {
  std::vector<Tensor> out;
  if (py::isinstance<py::array>(xs) || py::hasattr(xs, "__cuda_array_interface__")) {
    out.push_back(tensor_from_array(xs, what, false, /*borrowed=*/true));
  } else if (py::isinstance<py::list>(xs) || py::isinstance<py::tuple>(xs)) {
    const bool borrowed = py::isinstance<py::tuple>(xs);
    const std::size_t n = py::len(xs);
    for (auto x : xs) {
      try {  // a refused array of several is named by its position (costs nothing unless thrown)
        out.push_back(tensor_from_array(x, what, false, borrowed));
      } catch (const ValueError& e) {
        if (n < 2) throw;
        throw_value_error(name_input(e.what(), what, out.size(), n));
      } catch (const TypeError& e) {
        if (n < 2) throw;
        throw_type_error(name_input(e.what(), what, out.size(), n));
      }
    }
  } else {
    out.push_back(tensor_from_numpy(xs, what));  // raises TypeError naming the type
  }
  return out;
}

// Results are written straight into numpy arrays (fresh ones, or the caller's `out`).
py::object predict_py(Model& model, const py::handle& xs, const py::object& context, const py::object& out) {
  // The context is taken as an object: pybind11's caster looks None up as a foreign type first
  // (a failed attribute lookup, about 1 us), a third of a batch-1 prediction.
  if (!context.is_none() && !py::isinstance<Context>(context))
    throw_type_error("predict: context must be a treadle Context or None, got ",
                     std::string(py::str(py::type::handle_of(context).attr("__name__"))));
  Context* ctx = context.is_none() ? nullptr : context.cast<Context*>();
  std::vector<Tensor> in = tensors_from(xs, "predict");
  std::shared_ptr<const Plan> plan = model.last_infer_plan(in);  // the batch-1 hot path keeps the GIL
  if (!plan) {
    py::gil_scoped_release release;  // compiles, which re-acquires the GIL to trace
    plan = model.infer_plan(in);
  }
  const std::size_t outputs = Model::num_outputs(*plan);
  std::vector<Tensor> dst;
  dst.reserve(outputs);
  py::object result;
  if (!out.is_none()) {
    if (outputs != 1) throw_value_error("predict: out= needs a single-output model");
    const Shape& shape = Model::output_shape(*plan, 0);
    const DType dtype = Model::output_dtype(*plan, 0);
    dst.push_back(tensor_from_array(out, "predict(out=...)", /*writable=*/true, /*borrowed=*/true));
    if (dst[0].shape() != shape || dst[0].dtype() != dtype)
      throw_value_error("predict: out must be ", dtype_name(dtype), shape_str(shape), ", got ",
                        dtype_name(dst[0].dtype()), shape_str(dst[0].shape()));
    result = out;
  } else {
    py::tuple arrays(outputs);
    for (std::size_t k = 0; k < outputs; ++k) {
      const Shape& shape = Model::output_shape(*plan, k);
      const DType dtype = Model::output_dtype(*plan, k);
      // An output no machine could hold is refused before numpy is asked for it.
      const int64_t n = shape_numel(shape);  // throws on overflow
      if (n > max_tensor_bytes() / static_cast<int64_t>(dtype_size(dtype)))
        throw_value_error("predict: the output ", shape_str(shape), " of ", dtype_name(dtype), " needs more than this ",
                          "machine's ", max_tensor_bytes(), " bytes of memory");
      py::array a(numpy_dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()));
      dst.push_back(Tensor::wrap(a.mutable_data(), shape, dtype));  // fresh, C-contiguous, aligned; `a` holds it
      arrays[k] = std::move(a);
    }
    result = outputs == 1 ? py::object(arrays[0]) : py::object(std::move(arrays));
  }
  {
    py::gil_scoped_release release;
    model.predict_into(*plan, in, dst, ctx);
  }
  return result;
}

std::map<std::string, Tensor> state_from_dict(const py::dict& d) {
  std::map<std::string, Tensor> state;
  for (auto [k, v] : d) {
    std::string name = py::str(k);
    py::object arr = py::reinterpret_borrow<py::object>(v);
    if (!py::isinstance<py::array>(v) && py::hasattr(v, "detach"))  // a torch tensor
      arr = v.attr("detach")().attr("cpu")().attr("numpy")();
    arr = py::module_::import("numpy").attr("asarray")(arr, py::arg("order") = "C");  // keeps 0-d arrays 0-d
    state.emplace(name, tensor_from_numpy(arr, ("load_state_dict['" + name + "']").c_str()).clone());
  }
  return state;
}

}  // namespace

void bind_nn(py::module_& m) {
  py::class_<Parameter, std::shared_ptr<Parameter>>(m, "Parameter")
      .def(py::init([](const py::handle& data, bool requires_grad, const py::object& dtype) {
             py::object arr = py::module_::import("numpy").attr("asarray")(data, py::arg("dtype") = dtype,
                                                                          py::arg("order") = "C");
             Tensor t = tensor_from_numpy(arr, "Parameter").clone();
             if (t.dtype() != DType::f32 && t.dtype() != DType::f64)
               throw_type_error("Parameter: dtype must be float32 or float64, got ", dtype_name(t.dtype()));
             return std::make_shared<Parameter>(std::move(t), requires_grad);
           }),
           py::arg("data"), py::arg("requires_grad") = true, py::arg("dtype") = "float32")
      .def("tie_to", &Parameter::tie_to, py::arg("target"))
      .def_property_readonly("packed", [](const Parameter& p) { return p.owner() != nullptr; },
                             "Whether the parameter lives in a compiled model's flat buffer.")
      .def_property_readonly("owner_id", [](const Parameter& p) { return reinterpret_cast<std::uintptr_t>(p.owner()); })
      .def_property_readonly("data", [](py::object self) {
        auto& p = self.cast<Parameter&>();
        return numpy_view(p.value(), self);
      })
      .def_property_readonly("shape", [](const Parameter& p) { return py::tuple(py::cast(p.value().shape())); })
      .def_property("requires_grad", &Parameter::requires_grad, &Parameter::set_requires_grad);

  py::class_<Module, std::shared_ptr<Module>>(m, "Module")
      .def("forward", &Module::forward)
      .def("named_parameters", [](const Module& mod) { return mod.named_parameters(); })
      .def("tie_parameter", &Module::tie_parameter, py::arg("name"), py::arg("target"))
      .def_property_readonly("type_name", &Module::type_name);
  py::class_<nn::Linear, Module, std::shared_ptr<nn::Linear>>(m, "Linear")
      .def(py::init([](int64_t in, int64_t out, bool bias, const py::object& dtype) {
             return std::make_shared<nn::Linear>(in, out, bias, dtype_from_py(dtype));
           }),
           py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true, py::arg("dtype") = "float32")
      .def_property_readonly("in_features", &nn::Linear::in_features)
      .def_property_readonly("out_features", &nn::Linear::out_features);
  py::class_<nn::Activation, Module, std::shared_ptr<nn::Activation>>(m, "Activation")
      .def(py::init<std::string, double, double>(), py::arg("kind"), py::arg("param") = nn::Activation::kDefault,
           py::arg("param2") = nn::Activation::kDefault);
  // The pointwise activation modules' one list: (torch.nn class name, op, doc, [(option, default)],
  // (ONNX operator, [its attribute per option]) or None).
  m.def("activation_modules", [] {
    py::list out;
    for (const nn::ActivationModule& a : nn::activation_modules()) {
      py::list params;
      for (const auto& [name, value] : a.params) params.append(py::make_tuple(name, value));
      py::object onnx = py::none();
      if (!a.onnx_op.empty()) onnx = py::make_tuple(a.onnx_op, py::cast(a.onnx_attributes));
      out.append(py::make_tuple(a.module, a.op, a.doc, params, onnx));
    }
    return out;
  });
  py::class_<nn::Dropout, Module, std::shared_ptr<nn::Dropout>>(m, "Dropout").def(py::init<double>(), py::arg("p") = 0.5);
  py::class_<nn::Flatten, Module, std::shared_ptr<nn::Flatten>>(m, "Flatten")
      .def(py::init<int, int>(), py::arg("start_dim") = 1, py::arg("end_dim") = -1);

  m.def("init_draws", [](int64_t n, bool normal, double a, double b) {
    if (n < 0) throw_value_error("init_draws: n must be >= 0");
    py::array_t<double> out(n);
    init_draws(out.mutable_data(), n, normal, a, b);
    return out;
  }, py::arg("n"), py::arg("normal"), py::arg("a"), py::arg("b"),
  "n draws from the parameter-initialisation generator (manual_seed): U(a, b), or N(a, b^2) if normal.");
  py::class_<Model, std::shared_ptr<Model>>(m, "Model")
      .def(py::init([](py::function trace, std::vector<NamedParameter> params) {
             // Called while a plan is compiled (the GIL is re-acquired); the graph is lent by reference.
             Model::ForwardFn fn = [trace](Graph& g, const std::vector<Value>& inputs) {
               py::gil_scoped_acquire gil;
               py::object out = trace(py::cast(&g, py::return_value_policy::reference), inputs);
               return out.cast<std::vector<Value>>();
             };
             return std::make_shared<Model>(std::move(fn), std::move(params));
           }),
           py::arg("forward"), py::arg("parameters"))
      .def_property_readonly("id", [](const Model& mm) { return reinterpret_cast<std::uintptr_t>(&mm); })
      .def_property_readonly("dtype", [](const Model& mm) { return std::string(dtype_name(mm.dtype())); })
      .def_property_readonly("num_parameters", &Model::num_parameters)
      .def_property_readonly("layout", [](const Model& mm) {
        py::list l;
        for (const ParamSlot& s : mm.layout()) l.append(py::make_tuple(s.name, py::tuple(py::cast(s.shape)), s.offset));
        return l;
      })
      .def("flat_parameters", [](py::object self) { return numpy_view(self.cast<Model&>().flat_parameters(), self); })
      .def("flat_gradients", [](py::object self) { return numpy_view(self.cast<Model&>().flat_gradients(), self); })
      .def("gradient", [](py::object self, const std::string& name) {
        Model& mm = self.cast<Model&>();
        for (const ParamSlot& s : mm.layout())
          if (s.name == name)
            return numpy_view(Tensor(mm.flat_gradients().storage(), s.offset * dtype_size(mm.dtype()), s.shape, mm.dtype()),
                              self);
        throw_value_error("gradient: no parameter named '", name, "'");
      })
      .def("to", [](Model& mm, const py::object& dt) {
        const DType dtype = dtype_from_py(dt);
        py::gil_scoped_release release;  // takes the model's lock
        mm.to(dtype);
      })
      .def("zero_grad", &Model::zero_grad)
      .def("set_backend", &Model::set_backend, py::call_guard<py::gil_scoped_release>())
      // Setters take the model's lock: never while holding the GIL (a compile traces under the GIL).
      .def_property("deterministic", &Model::deterministic,
                    py::cpp_function(&Model::set_deterministic, py::call_guard<py::gil_scoped_release>()))
      .def_property("plan_cache_limit", &Model::plan_cache_limit,
                    py::cpp_function(&Model::set_plan_cache_limit, py::call_guard<py::gil_scoped_release>()))
      .def_property("fusion", &Model::fusion,
                    py::cpp_function(&Model::set_fusion, py::call_guard<py::gil_scoped_release>()))
      .def_property_readonly("backend", &Model::backend)
      .def("set_precision", &Model::set_precision, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("precision", &Model::precision)
      .def("predict", &predict_py, py::arg("x"), py::arg("ctx") = py::none(), py::arg("out") = py::none())
      .def("state_dict", [](const Model& mm) {
        py::dict d;
        for (const auto& [name, p] : mm.named_parameters()) d[py::str(name)] = numpy_copy(p->value());  // torch order
        return d;
      })
      .def("load_state_dict", [](Model& mm, const py::dict& d, bool strict) { mm.load_state_dict(state_from_dict(d), strict); },
           py::arg("state"), py::arg("strict") = true)
      .def("memory_report", [](Model& mm, const py::handle& xs, bool training) {
        std::vector<Tensor> in = tensors_from(xs, "memory_report");
        MemoryReport r;
        {
          py::gil_scoped_release release;  // may compile, which re-acquires the GIL to trace
          r = mm.memory_report(in, training);
        }
        return memory_dict(r);
      }, py::arg("x"), py::arg("training") = true)
      .def_property_readonly("num_plans",
                             py::cpp_function(&Model::num_plans, py::call_guard<py::gil_scoped_release>()))
      .def("describe_plans", &Model::describe_plans, py::call_guard<py::gil_scoped_release>(),
           "The compiled plans, one line per step: node, op, [backend that runs it], output shapes.");
}

}  // namespace treadle::py_bind

// Trainer bindings: every call validates its arrays, then releases the GIL for the whole step.
#include <cmath>

#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/trainer.hpp"

namespace treadle::py_bind {

py::dict memory_dict(const MemoryReport& r) {
  py::dict d;
  d["parameters"] = r.parameters;
  d["gradients"] = r.gradients;
  d["optimizer_state"] = r.optimizer_state;
  d["activations"] = r.activations;
  d["total"] = r.total();
  return d;
}

namespace {
// A model's inputs: one array, or a list/tuple of arrays for models with several inputs (e.g. a
// sequence and its lengths). The trainer keeps no input past the call (forward copies), so an
// array or a tuple's items are borrowed from the caller's arguments; a list's items are not (another
// thread may replace them while the GIL is released).
std::vector<Tensor> model_inputs(const py::handle& x, const char* what) {
  std::vector<Tensor> out;
  if (py::isinstance<py::list>(x) || py::isinstance<py::tuple>(x)) {
    const bool borrowed = py::isinstance<py::tuple>(x);
    for (auto item : x) out.push_back(tensor_from_array(item, what, false, borrowed));
    if (out.empty()) throw_value_error(what, ": no inputs given");
  } else {
    out.push_back(tensor_from_array(x, what, false, /*borrowed=*/true));
  }
  return out;
}

// The target, borrowed like an input array.
Tensor target_of(const py::handle& y, const char* what) { return tensor_from_array(y, what, false, true); }

// step / compute_gradients / evaluate: the loss, or with_outputs the tuple (loss, [outputs...],
// {name: value}) that trainer.py turns into a StepResult. The GIL is released while the step runs.
template <class Run>
py::object run_loss_call(const py::handle& x, const py::handle& y, bool with_outputs, const std::string& what,
                         Run run) {
  std::vector<Tensor> xs = model_inputs(x, (what + "(x)").c_str());
  Tensor ty = target_of(y, (what + "(y)").c_str());
  StepOutputs out;
  double loss;
  {
    py::gil_scoped_release release;
    loss = run(Trainer::Inputs(xs), ty, with_outputs ? &out : nullptr);
  }
  if (!with_outputs) return py::float_(loss);
  py::list outputs;
  for (const Tensor& o : out.outputs) outputs.append(numpy_copy(o));
  py::dict values;
  for (const auto& [name, v] : out.values) values[py::str(name)] = numpy_copy(v);
  return py::make_tuple(loss, outputs, values);
}
}  // namespace

void bind_train(py::module_& m) {
  using Mode = LossScaling::Mode;
  py::class_<LossScaling>(m, "LossScaling")
      .def(py::init<>())
      .def_property("mode",
                    [](const LossScaling& o) {
                      return o.mode == Mode::off ? "off" : o.mode == Mode::fixed ? "fixed" : "dynamic";
                    },
                    [](LossScaling& o, const std::string& mode) {
                      if (mode == "off") o.mode = Mode::off;
                      else if (mode == "fixed") o.mode = Mode::fixed;
                      else if (mode == "dynamic") o.mode = Mode::dynamic;
                      else throw_value_error("LossScaling: unknown mode '", mode, "' (expected off, fixed or dynamic)");
                    })
      .def_readwrite("init_scale", &LossScaling::init_scale)
      .def_readwrite("growth_factor", &LossScaling::growth_factor)
      .def_readwrite("backoff_factor", &LossScaling::backoff_factor)
      .def_readwrite("growth_interval", &LossScaling::growth_interval);

  py::class_<TrainerOptions>(m, "TrainerOptions")
      .def(py::init<>())
      .def_readwrite("clip_grad_norm", &TrainerOptions::clip_grad_norm)
      .def_readwrite("check_finite", &TrainerOptions::check_finite)
      .def_readwrite("skip_nonfinite", &TrainerOptions::skip_nonfinite)
      .def_readwrite("verify_parameters", &TrainerOptions::verify_parameters)
      .def_readwrite("memory_budget", &TrainerOptions::memory_budget)
      .def_readwrite("loss_scaling", &TrainerOptions::loss_scaling)
#ifdef TREADLE_WITH_CUDA
      .def_readwrite("cuda_graph", &TrainerOptions::cuda_graph)  // backend "cuda": steps as CUDA graphs
#endif
      ;

  py::class_<StepTask>(m, "StepTask")
      .def_readonly("name", &StepTask::name)
      .def_readonly("deps", &StepTask::deps)
      .def_readonly("params", &StepTask::params)
      .def_readonly("grad_ranges", &StepTask::grad_ranges)
      .def("__repr__", [](const StepTask& t) {
        std::string deps;
        for (int d : t.deps) deps += (deps.empty() ? "" : ", ") + std::to_string(d);
        return "StepTask('" + t.name + "', deps=[" + deps + "], params=" + std::to_string(t.params.size()) + ")";
      });

  py::class_<Trainer, std::shared_ptr<Trainer>>(m, "Trainer")
      .def(py::init([](std::shared_ptr<Model> model, const Loss& loss, std::shared_ptr<Optimizer> opt,
                       TrainerOptions options, uint64_t seed, Executor* executor) {
             return std::make_shared<Trainer>(std::move(model), loss, std::move(opt), options, executor, seed);
           }),
           py::arg("model"), py::arg("loss"), py::arg("optimizer"), py::arg("options") = TrainerOptions(),
           py::arg("seed") = 0, py::arg("executor") = nullptr, py::keep_alive<1, 2>(), py::keep_alive<1, 7>())
      // With backend "cuda" the optimizer's state lives on the device: this copies it back (and marks
      // the host copy as the one to upload before the next device update), so that reading or
      // writing the optimizer's state from Python sees and changes the current values.
      .def("optimizer_to_host", [](Trainer& t) {
        py::gil_scoped_release release;
        t.optimizer();
      })
      .def("step", [](Trainer& t, const py::handle& x, const py::handle& y, bool with_outputs) {
        return run_loss_call(x, y, with_outputs, "step", [&t](Trainer::Inputs xs, const Tensor& ty, StepOutputs* o) {
          return t.step(xs, ty, o);
        });
      }, py::arg("x"), py::arg("y"), py::arg("with_outputs") = false)
      .def("compute_gradients", [](Trainer& t, const py::handle& x, const py::handle& y, bool with_outputs) {
        return run_loss_call(x, y, with_outputs, "compute_gradients",
                             [&t](Trainer::Inputs xs, const Tensor& ty, StepOutputs* o) {
                               return t.compute_gradients(xs, ty, o);
                             });
      }, py::arg("x"), py::arg("y"), py::arg("with_outputs") = false)
      .def("evaluate", [](Trainer& t, const py::handle& x, const py::handle& y, bool with_outputs) {
        return run_loss_call(x, y, with_outputs, "evaluate", [&t](Trainer::Inputs xs, const Tensor& ty, StepOutputs* o) {
          return t.evaluate(xs, ty, o);
        });
      }, py::arg("x"), py::arg("y"), py::arg("with_outputs") = false)
      .def("forward", [](Trainer& t, const py::handle& x, bool input_grad) -> py::object {
        std::vector<Tensor> xs = model_inputs(x, "forward(x)");
        std::vector<Tensor> outs;
        {
          py::gil_scoped_release release;
          outs = t.forward_outputs(Trainer::Inputs(xs), input_grad);
        }
        if (outs.size() == 1) return numpy_copy(outs[0]);
        py::tuple result(outs.size());
        for (std::size_t k = 0; k < outs.size(); ++k) result[k] = numpy_copy(outs[k]);
        return result;
      }, py::arg("x"), py::arg("input_grad") = false)
      .def("backward", [](Trainer& t, const py::handle& g, bool input_grad) -> py::object {
        // One array, or a tuple with one entry per output (None: the loss does not use it).
        std::vector<Tensor> grads;
        if (py::isinstance<py::tuple>(g)) {  // trainer.py turns a list of arrays into a tuple
          for (const py::handle& gk : g.cast<py::sequence>())
            grads.push_back(gk.is_none() ? Tensor() : target_of(gk, "backward(grad_outputs)"));
        } else {
          grads.push_back(target_of(g, "backward(grad_output)"));
        }
        Tensor dx;
        {
          py::gil_scoped_release release;
          t.backward(std::span<const Tensor>(grads), input_grad ? &dx : nullptr);
        }
        if (!input_grad) return py::none();
        return numpy_copy(dx);
      }, py::arg("grad_output"), py::arg("input_grad") = false)
      .def("begin_step", [](Trainer& t, const py::handle& x, const py::handle& y, int depth) {
        std::vector<Tensor> xs = model_inputs(x, "begin_step(x)");
        Tensor ty = target_of(y, "begin_step(y)");
        py::gil_scoped_release release;  // may compile, which re-acquires the GIL to trace
        return t.begin_step(Trainer::Inputs(xs), ty, depth);
      }, py::arg("x"), py::arg("y"), py::arg("depth") = 1)
      .def("run_task", &Trainer::run_task, py::call_guard<py::gil_scoped_release>())
      .def("finish_step", &Trainer::finish_step, py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &Trainer::zero_grad, py::call_guard<py::gil_scoped_release>())
      .def("update", &Trainer::update, py::call_guard<py::gil_scoped_release>())
      .def("set_schedule", &Trainer::set_schedule)
      .def_property_readonly("lr", &Trainer::current_lr)
      .def_property_readonly("steps", &Trainer::steps)
      .def_property_readonly("skipped_steps", &Trainer::skipped_steps)
      .def_property_readonly("loss_scale", &Trainer::loss_scale)
      .def_property_readonly("loss_scale_growth_tracker", &Trainer::loss_scale_growth_tracker)
      .def("set_loss_scale_state", &Trainer::set_loss_scale_state, py::arg("scale"), py::arg("growth_tracker"))
      .def_property_readonly("loss_scaling", [](Trainer& t) { return t.options().loss_scaling; })
      .def("reseal_parameters", &Trainer::reseal_parameters, py::call_guard<py::gil_scoped_release>())
      .def("memory_report", [](Trainer& t, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& y_shape,
                               const py::object& y_dtype) {
        const DType x_dtype = t.model().dtype();
        MemoryReport r;
        {
          py::gil_scoped_release release;  // may compile, which re-acquires the GIL to trace
          r = t.memory_report(Shape(x_shape.begin(), x_shape.end()), x_dtype, Shape(y_shape.begin(), y_shape.end()),
                              y_dtype.is_none() ? t.loss().target_dtype(x_dtype) : dtype_from_py(y_dtype));
        }
        return memory_dict(r);
      }, py::arg("x_shape"), py::arg("y_shape"), py::arg("y_dtype") = py::none())
      .def_property_readonly("context", &Trainer::context, py::return_value_policy::reference_internal)
      .def_property("clip_grad_norm", [](Trainer& t) { return t.options().clip_grad_norm; },
                    [](Trainer& t, double v) {
                      if (!(v >= 0) || !std::isfinite(v))
                        throw_value_error("clip_grad_norm must be finite and >= 0 (0: off), got ", v);
                      t.options().clip_grad_norm = v;
                    })
      .def_property("check_finite", [](Trainer& t) { return t.options().check_finite; },
                    [](Trainer& t, bool v) { t.options().check_finite = v; })
      .def_property_readonly("skip_nonfinite", [](Trainer& t) { return t.options().skip_nonfinite; })
      .def_property_readonly("verify_parameters", [](Trainer& t) { return t.options().verify_parameters; });
}

}  // namespace treadle::py_bind

// Bindings for optimizers, learning-rate schedules and gradient clipping (module treadle._core.optim).
// The trainer takes the Optimizer / Schedule objects as they are; bind/step/state on flat numpy
// buffers are the low-level path used by tests and by hosts that own their own parameter buffers.
#include <cstdint>
#include <cstring>
#include <vector>

#include "bindings.hpp"
#include "treadle/testing.hpp"
#include "treadle/error.hpp"
#include "treadle/executor.hpp"
#include "treadle/model.hpp"
#include "treadle/optim.hpp"

namespace treadle::py_bind {
namespace {

DType float_dtype(const py::handle& obj, const std::string& who) {
  const py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  if (dt.kind() == 'f' && dt.itemsize() == 4) return DType::f32;
  if (dt.kind() == 'f' && dt.itemsize() == 8) return DType::f64;
  throw_type_error(who, ": dtype must be float32 or float64, got ", std::string(py::str(dt)));
}

// Wraps a flat numpy buffer after the checks a raw pointer needs: a 1-D, C-contiguous, aligned,
// native-order float32/float64 array (writable when it is written to).
Tensor wrap_flat(const py::handle& obj, const std::string& who, const char* what, bool writable) {
  if (!py::isinstance<py::array>(obj))
    throw_type_error(who, ": ", what, " must be a numpy array, got ",
                     std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  py::array a = py::reinterpret_borrow<py::array>(obj);
  DType dt;
  if (py::isinstance<py::array_t<float>>(a) && a.dtype().kind() == 'f' && a.itemsize() == 4)
    dt = DType::f32;
  else if (py::isinstance<py::array_t<double>>(a) && a.dtype().kind() == 'f' && a.itemsize() == 8)
    dt = DType::f64;
  else
    throw_type_error(who, ": ", what, " must be a native float32 or float64 array, got dtype ",
                     std::string(py::str(a.dtype())));
  if (a.ndim() != 1) throw_value_error(who, ": ", what, " must be a flat 1-D array, got ", a.ndim(), " dimensions");
  if (!(a.flags() & py::array::c_style)) throw_value_error(who, ": ", what, " must be contiguous");
  if (reinterpret_cast<std::uintptr_t>(a.data()) % a.itemsize() != 0)
    throw_value_error(who, ": ", what, " must be aligned to its element size");
  if (writable && !a.writeable()) throw_value_error(who, ": ", what, " must be writable (it is updated in place)");
  return Tensor::wrap(const_cast<void*>(a.data()), Shape{static_cast<int64_t>(a.shape(0))}, dt);
}

template <typename T>
py::array copy_out(const Tensor& t) {
  py::array_t<T> out(static_cast<py::ssize_t>(t.numel()));
  if (t.numel() > 0) std::memcpy(out.mutable_data(), t.data(), t.nbytes());
  return out;
}

py::dict state_dict_of(Optimizer& o) {
  py::dict d;
  for (auto& [name, t] : o.state())
    d[py::str(name)] = t.dtype() == DType::f32 ? copy_out<float>(t) : copy_out<double>(t);
  return d;
}

template <typename T>
py::array as_dtype(const py::handle& obj) {
  return py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
}

// Writes arrays into the state buffers with the same names. Every name must be given; nothing is
// written unless all of them fit.
void load_state(Optimizer& o, const py::dict& d) {
  const std::string who = o.name() + ".load_state";
  if (!o.bound()) throw_runtime_error(who, ": the optimizer is not bound; call bind first");
  std::vector<py::array> arrays;
  for (auto& [name, t] : o.state()) {
    if (!d.contains(name)) throw_value_error(who, ": missing state '", name, "'");
    py::object item = d[py::str(name)];
    py::array a = t.dtype() == DType::f32 ? as_dtype<float>(item) : as_dtype<double>(item);
    if (!a) {
      PyErr_Clear();
      throw_type_error(who, ": state '", name, "' is not convertible to a ", dtype_name(t.dtype()), " array");
    }
    if (a.size() != t.numel())
      throw_value_error(who, ": state '", name, "' has ", a.size(), " elements, expected ", t.numel());
    arrays.push_back(std::move(a));
  }
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const Tensor& t = o.state()[i].second;
    if (t.numel() > 0) std::memcpy(t.data(), arrays[i].data(), t.nbytes());
  }
}

// Python's bind: slots [(name, shape), ...] packed back to back from offset 0.
void bind_slots(Optimizer& o, const py::iterable& slots, const py::handle& dtype) {
  const std::string who = o.name() + ".bind";
  if (o.claimed())
    throw_value_error(who, ": this optimizer serves a Trainer, which binds it to its model; create another optimizer ",
                      "for flat buffers of your own");
  std::vector<ParamSlot> layout;
  int64_t offset = 0;
  for (const py::handle item : slots) {
    auto pair = py::cast<py::tuple>(item);
    if (pair.size() != 2)
      throw_value_error(who, ": each slot must be (name, shape), got ", std::string(py::repr(item)));
    ParamSlot s;
    s.name = py::cast<std::string>(pair[0]);
    for (const py::handle d : py::cast<py::iterable>(pair[1])) s.shape.push_back(py::cast<int64_t>(d));
    for (int64_t d : s.shape)
      if (d < 0) throw_value_error(who, ": slot '", s.name, "' has a negative dimension in ", shape_str(s.shape));
    s.offset = offset;
    s.numel = shape_numel(s.shape);
    offset += s.numel;
    layout.push_back(std::move(s));
  }
  o.bind(layout, offset, float_dtype(dtype, who));
}

void step_flat(Optimizer& o, const py::handle& params, const py::handle& grads, const py::object& lr, int workers) {
  const std::string who = o.name() + ".step";
  if (workers < 1) throw_value_error(who, ": workers must be >= 1, got ", workers);
  Tensor p = wrap_flat(params, who, "params", true);
  Tensor g = wrap_flat(grads, who, "grads", false);
  ChunkingExecutor chunked(workers);
  Executor& exec = workers == 1 ? serial_executor() : chunked;
  if (lr.is_none()) {  // each parameter group at its own lr
    py::gil_scoped_release release;
    o.step(p, g, static_cast<const Schedule*>(nullptr), exec);
    return;
  }
  const double rate = py::cast<double>(lr);
  py::gil_scoped_release release;
  o.step(p, g, rate, exec);
}

// For updates driven from Python (optimizer.step() on an attached model). A trainer binds (and
// claims) the optimizer itself; an optimizer bound to this very layout keeps its state untouched.
void bind_model(Optimizer& o, const Model& m) {
  if (o.claimed()) return;
  const std::vector<ParamSlot>& want = m.trainable_layout();
  bool same = o.bound() && o.numel() == m.num_trainable() && o.dtype() == m.dtype() && o.layout().size() == want.size();
  for (std::size_t i = 0; same && i < want.size(); ++i)
    same = o.layout()[i].name == want[i].name && o.layout()[i].offset == want[i].offset;
  if (!same) o.bind(want, m.num_trainable(), m.dtype());
}

// groups: [(names, {option: value}), ...]; values are numbers (flags as bool or 0/1).
void set_groups(Optimizer& o, const py::list& groups) {
  std::vector<ParamGroup> out;
  for (const py::handle item : groups) {
    auto pair = py::cast<py::tuple>(item);
    if (pair.size() != 2) throw_value_error(o.name(), ".set_param_groups: each group must be (names, options)");
    ParamGroup g;
    for (const py::handle n : py::cast<py::iterable>(pair[0])) g.params.push_back(py::cast<std::string>(n));
    for (auto [k, v] : py::cast<py::dict>(pair[1]))
      g.options.emplace_back(py::cast<std::string>(k), py::cast<double>(v));
    out.push_back(std::move(g));
  }
  o.set_param_groups(out);
}

void bind_optimizer_class(py::module_& om) {
  py::class_<Optimizer, std::shared_ptr<Optimizer>>(om, "Optimizer",
                                                     "A fused optimizer over one flat parameter buffer.")
      .def_property_readonly("name", &Optimizer::name)
      .def_property("lr", &Optimizer::lr, &Optimizer::set_lr, "base learning rate (before any schedule)")
      .def_property("step_count", &Optimizer::step_count, &Optimizer::set_step_count)
      .def_property_readonly("bound", &Optimizer::bound)
      .def_property_readonly("numel", &Optimizer::numel)
      .def_property_readonly("dtype", [](const Optimizer& o) { return std::string(dtype_name(o.dtype())); })
      .def("bind", &bind_slots, py::arg("slots"), py::arg("dtype"),
           "Allocates state for slots [(name, shape), ...] packed back to back, in float32 or float64.")
      .def("step", &step_flat, py::arg("params"), py::arg("grads"), py::arg("lr") = py::none(),
           py::arg("workers") = 1,
           "One update in place on flat 1-D numpy buffers. lr=None uses the base lr. workers > 1 splits the "
           "work as a multi-worker executor would (run serially; for determinism checks).")
      .def("bind_model", &bind_model, py::arg("model"),
           "Binds to the model's trainable layout unless a Trainer holds the optimizer or it is bound to it.")
      .def("set_param_groups", &set_groups, py::arg("groups"),
           "Parameter groups [(slot names, {option: value}), ...]; [] for one group of every parameter.")
      .def_property_readonly("num_groups", &Optimizer::num_groups)
      .def("group_lr", &Optimizer::group_lr, py::arg("group"))
      .def("set_group_lr", &Optimizer::set_group_lr, py::arg("group"), py::arg("lr"))
      .def("set_group_option", &Optimizer::set_group_option, py::arg("group"), py::arg("key"), py::arg("value"))
      .def_property_readonly("uniform_options", &Optimizer::uniform_options,
                             "One set of options over every trainable parameter (no groups, or one group of all).")
      .def_property_readonly("options_version", &Optimizer::options_version)
      .def("segments", [](const Optimizer& o) { return o.segments(); },
           "The (begin, end, group) element ranges an update walks (after bind).")
      .def("state", &state_dict_of, "Copies of the state buffers by name.")
      .def("load_state", &load_state, py::arg("state"), "Writes state buffers from a dict name -> array.")
      .def("__repr__", [](const Optimizer& o) { return "<treadle Optimizer " + o.name() + ">"; });
}

void bind_optimizer_factories(py::module_& om) {
  om.def("sgd", [](double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
        return optim::sgd({lr, momentum, dampening, weight_decay, nesterov});
      }, py::arg("lr"), py::arg("momentum") = 0.0, py::arg("dampening") = 0.0, py::arg("weight_decay") = 0.0,
      py::arg("nesterov") = false);
  auto adam_like = [](double lr, double beta1, double beta2, double eps, double weight_decay, bool amsgrad) {
    return optim::AdamOptions{lr, beta1, beta2, eps, weight_decay, amsgrad};
  };
  om.def("adam", [adam_like](double lr, double b1, double b2, double eps, double wd, bool amsgrad) {
        return optim::adam(adam_like(lr, b1, b2, eps, wd, amsgrad));
      }, py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("weight_decay") = 0.0, py::arg("amsgrad") = false);
  om.def("adamw", [adam_like](double lr, double b1, double b2, double eps, double wd, bool amsgrad) {
        return optim::adamw(adam_like(lr, b1, b2, eps, wd, amsgrad));
      }, py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("weight_decay") = 1e-2, py::arg("amsgrad") = false);
  om.def("rmsprop", [](double lr, double alpha, double eps, double weight_decay, double momentum, bool centered) {
        return optim::rmsprop({lr, alpha, eps, weight_decay, momentum, centered});
      }, py::arg("lr") = 1e-2, py::arg("alpha") = 0.99, py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.0,
      py::arg("momentum") = 0.0, py::arg("centered") = false);
  using AdagradFactory = std::shared_ptr<Optimizer> (*)(const optim::AdagradOptions&);
  auto def_adagrad = [&om](const char* name, AdagradFactory make) {
    om.def(name, [make](double lr, double lr_decay, double weight_decay, double initial, double eps) {
          return make({lr, lr_decay, weight_decay, initial, eps});
        }, py::arg("lr") = 1e-2, py::arg("lr_decay") = 0.0, py::arg("weight_decay") = 0.0,
        py::arg("initial_accumulator_value") = 0.0, py::arg("eps") = 1e-10);
  };
  def_adagrad("adagrad", &optim::adagrad);
  def_adagrad("rowwise_adagrad", &optim::rowwise_adagrad);
  def_adagrad("columnwise_adagrad", &optim::columnwise_adagrad);
  om.def("adadelta", [](double lr, double rho, double eps, double wd) { return optim::adadelta({lr, rho, eps, wd}); },
         py::arg("lr") = 1.0, py::arg("rho") = 0.9, py::arg("eps") = 1e-6, py::arg("weight_decay") = 0.0);
  om.def("adamax", [](double lr, double b1, double b2, double eps, double wd) {
        return optim::adamax({lr, b1, b2, eps, wd});
      }, py::arg("lr") = 2e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("weight_decay") = 0.0);
  om.def("nadam", [](double lr, double b1, double b2, double eps, double wd, double md, bool decoupled) {
        return optim::nadam({lr, b1, b2, eps, wd, md, decoupled});
      }, py::arg("lr") = 2e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("weight_decay") = 0.0, py::arg("momentum_decay") = 4e-3, py::arg("decoupled_weight_decay") = false);
  om.def("radam", [](double lr, double b1, double b2, double eps, double wd, bool decoupled) {
        return optim::radam({lr, b1, b2, eps, wd, decoupled});
      }, py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("weight_decay") = 0.0, py::arg("decoupled_weight_decay") = false);
}

void bind_schedules(py::module_& om) {
  py::class_<Schedule, std::shared_ptr<Schedule>>(om, "Schedule", "A learning-rate schedule lr_at(step, base_lr).")
      .def("lr_at", &Schedule::lr_at, py::arg("step"), py::arg("base_lr"))
      .def_property_readonly("name", &Schedule::name)
      .def("__repr__", [](const Schedule& s) { return "<treadle Schedule " + s.name() + ">"; });
  om.def("constant_schedule", &schedule::constant, py::arg("factor") = 1.0, py::arg("total_iters") = 0);
  om.def("step_schedule", &schedule::step, py::arg("step_size"), py::arg("gamma") = 0.1);
  om.def("exponential_schedule", &schedule::exponential, py::arg("gamma"));
  om.def("cosine_schedule", &schedule::cosine, py::arg("t_max"), py::arg("eta_min") = 0.0);
  om.def("warmup_cosine_schedule", &schedule::warmup_cosine, py::arg("warmup"), py::arg("total"),
         py::arg("eta_min") = 0.0, py::arg("start_factor") = 0.0);
}

}  // namespace

void bind_optim(py::module_& m) {
  py::module_ om = m.def_submodule("optim", "Optimizers, learning-rate schedules, gradient clipping.");
  bind_optimizer_class(om);
  bind_optimizer_factories(om);
  bind_schedules(om);
  om.def("clip_grad_norm", [](const py::handle& grads, double max_norm, int workers) {
        if (workers < 1) throw_value_error("clip_grad_norm: workers must be >= 1, got ", workers);
        Tensor g = wrap_flat(grads, "clip_grad_norm", "grads", true);
        ChunkingExecutor chunked(workers);
        Executor& exec = workers == 1 ? serial_executor() : chunked;
        py::gil_scoped_release release;
        return clip_grad_norm(g, max_norm, exec);
      }, py::arg("grads"), py::arg("max_norm"), py::arg("workers") = 1,
      "Scales a flat gradient buffer in place to global L2 norm <= max_norm; returns the norm before.");
}

}  // namespace treadle::py_bind

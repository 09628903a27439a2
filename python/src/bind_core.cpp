// Core bindings: dtypes, backends, the symbolic Value used while tracing, functional ops,
// contexts and the op runner used by the verification suite.
#include <algorithm>
#include <memory>
#include <string>

#include "bindings.hpp"
#include "treadle/backend.hpp"
#include "treadle/context.hpp"
#include "treadle/error.hpp"
#include "treadle/module.hpp"
#include "treadle/ops.hpp"
#include "treadle/profile.hpp"
#include "treadle/testing.hpp"

namespace treadle::py_bind {
namespace {

Attrs attrs_from_dict(const py::dict& d) {
  Attrs a;
  for (auto [k, v] : d) {
    std::string name = py::str(k);
    if (py::isinstance<py::bool_>(v)) a.set(name, int64_t{v.cast<bool>()});
    else if (py::isinstance<py::int_>(v)) a.set(name, v.cast<int64_t>());
    else if (py::isinstance<py::float_>(v)) a.set(name, v.cast<double>());
    else if (py::isinstance<py::str>(v)) a.set(name, v.cast<std::string>());
    else a.set(name, v.cast<std::vector<int64_t>>());
  }
  return a;
}

OpRunResult run_op_checked(const std::string& op, const py::list& inputs, const py::dict& attrs,
                           const py::object& grads, const std::string& backend, bool training, uint64_t seed,
                           int workers, bool all_kernels = false) {
  std::vector<Tensor> in, go;
  for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(tensor_from_numpy(inputs[i], "run_op input"));
  if (!grads.is_none())
    for (auto g : grads) go.push_back(g.is_none() ? Tensor() : tensor_from_numpy(g, "run_op grad_output"));
  Attrs a = attrs_from_dict(attrs);
  OpRunResult r;
  {
    py::gil_scoped_release release;
    r = run_op(op, in, a, go, backend, training, seed, workers, all_kernels);
  }
  return r;
}

py::tuple run_op_py(const std::string& op, const py::list& inputs, const py::dict& attrs, const py::object& grads,
                    const std::string& backend, bool training, uint64_t seed, int workers, bool all_kernels,
                    bool return_plan) {
  OpRunResult r = run_op_checked(op, inputs, attrs, grads, backend, training, seed, workers, all_kernels);
  py::list outs, in_grads;
  // An output a device backend kept in its own layout (run_op) is not returned: None.
  for (const Tensor& t : r.outputs) outs.append(t.defined() ? py::object(numpy_copy(t)) : py::none());
  for (const Tensor& t : r.input_grads) in_grads.append(t.defined() ? py::object(numpy_copy(t)) : py::none());
  if (return_plan) return py::make_tuple(outs, in_grads, r.plan);
  return py::make_tuple(outs, in_grads);
}

// `a @ b` as torch reads it for the shapes a model uses: 2-D products, a stack of rows times a matrix
// ((..., M, K) @ (K, N)), and batched products of equal leading dims ((..., M, K) @ (..., K, N)).
Value matmul_operator(Value a, Value b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  if (sa.size() == 2 && sb.size() == 2) return ops::matmul(a, b);
  if (sa.size() < 2 || sb.size() < 2 || (sb.size() > 2 && sb.size() != sa.size()))
    throw_value_error("matmul: operands ", shape_str(sa), " @ ", shape_str(sb), " are not supported (2-D and above, ",
                      "with b 2-D or of a's rank; reshape or unsqueeze first)");
  const int64_t m = sa[sa.size() - 2], k = sa.back();
  int64_t lead = 1;
  for (std::size_t i = 0; i + 2 < sa.size(); ++i) lead *= sa[i];
  Shape out(sa.begin(), sa.end() - 1);
  out.push_back(sb.back());
  if (sb.size() == 2) return ops::reshape(ops::matmul(ops::reshape(a, {lead * m, k}), b), out);
  if (!std::equal(sa.begin(), sa.end() - 2, sb.begin()))
    throw_value_error("matmul: the leading dims of ", shape_str(sa), " and ", shape_str(sb), " differ (no broadcasting)");
  Value prod = ops::bmm(ops::reshape(a, {lead, m, k}), ops::reshape(b, {lead, sb[sb.size() - 2], sb.back()}));
  return sa.size() == 3 ? prod : ops::reshape(prod, out);
}

void bind_symbol(py::module_& m) {
  py::class_<Value>(m, "Symbol", "A symbolic tensor recorded while a model's forward is traced.")
      .def_property_readonly("shape", [](const Value& v) { return py::tuple(py::cast(v.shape())); })
      .def_property_readonly("dtype", [](const Value& v) { return std::string(dtype_name(v.dtype())); })
      .def_property_readonly("ndim", &Value::ndim)
      .def_property_readonly("training", [](const Value& v) { return v.graph().training(); })
      .def("__add__", [](Value a, Value b) { return ops::add(a, b); })
      .def("__add__", [](Value a, double s) { return ops::add(a, ops::scalar_like(a, s)); })
      .def("__radd__", [](Value a, double s) { return ops::add(a, ops::scalar_like(a, s)); })
      .def("__sub__", [](Value a, Value b) { return ops::sub(a, b); })
      .def("__sub__", [](Value a, double s) { return ops::add(a, ops::scalar_like(a, -s)); })
      .def("__rsub__", [](Value a, double s) { return ops::add(ops::scale(a, -1.0), ops::scalar_like(a, s)); })
      .def("__mul__", [](Value a, Value b) { return ops::mul(a, b); })
      .def("__mul__", [](Value a, double s) { return ops::scale(a, s); })
      .def("__rmul__", [](Value a, double s) { return ops::scale(a, s); })
      .def("__neg__", [](Value a) { return ops::scale(a, -1.0); })
      .def("__matmul__", &matmul_operator)
      .def("__repr__", [](const Value& v) {
        return "Symbol(shape=" + shape_str(v.shape()) + ", dtype=" + dtype_name(v.dtype()) + ")";
      });
}

void bind_functional(py::module_& m) {
  py::module_ f = m.def_submodule("functional", "Symbolic ops for forward functions.");
  f.def("linear", [](Value x, Value w, std::optional<Value> b) { return ops::linear(x, w, b ? *b : Value()); },
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  f.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false);
  f.def("_one_hot", [](Value indices, int64_t num_classes, const std::string& dtype) {
    return ops::one_hot(indices, num_classes, dtype_from_name(dtype));
  }, py::arg("indices"), py::arg("num_classes"), py::arg("dtype"));
  f.def("bmm", &ops::bmm, py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false,
        "(B, M, K) @ (B, K, N), as torch.bmm.");
  f.def("add", &ops::add);
  f.def("sub", &ops::sub);
  f.def("mul", &ops::mul);
  f.def("scale", &ops::scale);
  f.def("reshape", &ops::reshape);
  f.def("flatten", &ops::flatten, py::arg("x"), py::arg("start_dim") = 1, py::arg("end_dim") = -1);
  f.def("concat", &ops::concat, py::arg("parts"), py::arg("axis") = -1);
  f.def("slice", &ops::slice, py::arg("x"), py::arg("axis"), py::arg("start"), py::arg("stop"));
  f.def("relu", &ops::relu);
  f.def("leaky_relu", &ops::leaky_relu, py::arg("x"), py::arg("negative_slope") = 0.01);
  f.def("elu", &ops::elu, py::arg("x"), py::arg("alpha") = 1.0);
  f.def("gelu", [](Value x, const std::string& approximate) {
    if (approximate != "none" && approximate != "tanh")
      throw_value_error("gelu: approximate must be 'none' or 'tanh', got '", approximate, "'");
    return ops::gelu(x, approximate == "tanh");
  }, py::arg("x"), py::arg("approximate") = "none");
  f.def("silu", &ops::silu);
  f.def("tanh", &ops::tanh);
  f.def("sigmoid", &ops::sigmoid);
  f.def("softplus", &ops::softplus, py::arg("x"), py::arg("beta") = 1.0, py::arg("threshold") = 20.0);
  f.def("softmax", &ops::softmax, py::arg("x"), py::arg("dim") = -1);
  f.def("log_softmax", &ops::log_softmax, py::arg("x"), py::arg("dim") = -1);
  f.def("dropout", &ops::dropout, py::arg("x"), py::arg("p") = 0.5);
}

}  // namespace

namespace {
void bind_profiler(py::module_& m) {
  py::class_<Profiler>(m, "Profiler", "Per-node kernel times of plan runs (treadle/profile.hpp).")
      .def(py::init<>())
      .def("nodes", [](const Profiler& p) {
        py::list out;
        for (const NodeProfile& n : p.nodes()) {
          py::dict d;
          d["plan"] = n.plan;
          d["node"] = n.node;
          d["op"] = n.op;
          d["module"] = n.scope;
          d["backend"] = n.backend;
          d["pass"] = n.pass;
          d["output_shape"] = py::tuple(py::cast(std::vector<int64_t>(n.output_shape.begin(), n.output_shape.end())));
          d["calls"] = n.calls;
          d["seconds"] = n.seconds;
          out.append(d);
        }
        return out;
      })
      .def_property_readonly("total_seconds", &Profiler::total_seconds)
      .def("report", &Profiler::report, py::arg("top") = 20)
      .def("reset", &Profiler::reset);
  // Installs `p` (or None) process-wide; the Python side keeps the installed object alive.
  m.def("_set_global_profiler", [](Profiler* p) { set_global_profiler(p); }, py::arg("profiler").none(true));
}
}  // namespace

void bind_core(py::module_& m) {
  m.def("backends", &backend_names);
  m.def("build_info", [] {
    py::dict d;
    for (const BuildInfoEntry& e : build_info()) d[py::str(e.key)] = e.value;
    return d;
  });
  m.def("backend_ops", [](const std::string& backend) {
    py::dict ops;
    for (const OpSupport& s : backend_ops(backend)) ops[py::str(s.op)] = py::cast(s.dtypes);
    return ops;
  }, py::arg("backend"));
  m.def("differentiable_ops", &differentiable_ops,
        "The ops with a gradient rule; a gradient op listed here can be differentiated again.");
  // `with _core.AllocationBudget(bytes, what):` bounds the tensors this thread creates inside (tl.load
  // builds a file's architecture under one; see treadle::AllocationBudget).
  struct BudgetScope {
    int64_t bytes;
    std::string what;
    std::unique_ptr<AllocationBudget> active;
  };
  py::class_<BudgetScope>(m, "AllocationBudget")
      .def(py::init([](int64_t bytes, std::string what) { return BudgetScope{bytes, std::move(what), nullptr}; }),
           py::arg("bytes"), py::arg("what"))
      .def("__enter__", [](BudgetScope& b) {
        if (b.active) throw_value_error("AllocationBudget: already entered");
        b.active = std::make_unique<AllocationBudget>(b.bytes, b.what);
      })
      .def("__exit__", [](BudgetScope& b, const py::args&) { b.active.reset(); });
  // `with _core.AllKernels():` plans compiled inside let backends take what they decline for speed
  // (treadle::AllKernelsScope): tests reach a backend's kernels through whole models on any CPU.
  struct AllKernels {
    std::unique_ptr<AllKernelsScope> active;
  };
  py::class_<AllKernels>(m, "AllKernels")
      .def(py::init<>())
      .def("__enter__", [](AllKernels& k) {
        if (k.active) throw_value_error("AllKernels: already entered");
        k.active = std::make_unique<AllKernelsScope>();
      })
      .def("__exit__", [](AllKernels& k, const py::args&) { k.active.reset(); });
  m.def("manual_seed", &manual_seed, py::arg("seed"), "Seeds the generator used to initialise parameters.");
  m.def("run_op", &run_op_py, py::arg("op"), py::arg("inputs"), py::arg("attrs"), py::arg("grad_outputs") = py::none(),
        py::arg("backend") = "", py::arg("training") = true, py::arg("seed") = 0, py::arg("workers") = 1,
        py::arg("all_kernels") = false, py::arg("return_plan") = false,
        "One op on one backend, forward (and backward given grad_outputs): (outputs, input_grads[, plan]). "
        "all_kernels: the backend also takes nodes below its profitability thresholds (verification).");
  m.def("describe_op", [](const std::string& op, const py::list& inputs, const py::dict& attrs, const py::object& grads,
                          const std::string& backend, bool training) {
          return run_op_checked(op, inputs, attrs, grads, backend, training, 0, 1).plan;
        }, py::arg("op"), py::arg("inputs"), py::arg("attrs"), py::arg("grad_outputs") = py::none(),
        py::arg("backend") = "", py::arg("training") = true,
        "Runs an op like run_op and returns its plan: one line per step with the backend that ran it.");
  py::class_<Context>(m, "Context", "Per-caller activations, RNG and the host's executor.")
      .def(py::init([](uint64_t seed, Executor* executor, bool check_numerics, std::size_t memory_budget) {
             auto* c = new Context(executor, seed);
             c->set_check_numerics(check_numerics);
             c->set_memory_budget(memory_budget);
             return c;
           }),
           py::arg("seed") = 0, py::arg("executor") = nullptr, py::arg("check_numerics") = false,
           py::arg("memory_budget") = 0, py::keep_alive<1, 3>())
      .def_property("check_numerics", &Context::check_numerics, &Context::set_check_numerics,
                    "Anomaly mode: check every node's outputs for NaN/Inf and raise ValueError naming the node.")
      .def_property("memory_budget", &Context::memory_budget, &Context::set_memory_budget,
                    "Activation arena budget in bytes (0: none); a bigger plan is refused before it runs.")
      .def_property_readonly("seed", &Context::seed)
      .def_property_readonly("rng_counter", &Context::rng_counter)
      .def("set_rng_state", &Context::set_rng_state)
      .def_property_readonly("arena_bytes", &Context::arena_bytes);
  py::class_<Graph>(m, "Graph", "The graph being traced (passed to forward functions).")
      .def_property_readonly("training", &Graph::training)
      .def("parameter", &Graph::add_parameter, py::arg("parameter"),
           "The symbol of a parameter (registered with the graph once; a tied parameter is its target).")
      .def("constant",
           [](Graph& g, const Shape& shape, double value, const std::string& dtype) {
             return g.apply1("constant", {}, {{"shape", shape}, {"value", value}, {"dtype", dtype}});
           },
           py::arg("shape"), py::arg("value"), py::arg("dtype"),
           "A tensor of `shape` filled with `value` (torch.zeros / ones / full inside a forward).")
      .def("push_scope", &Graph::push_scope)
      .def("pop_scope", &Graph::pop_scope);
  bind_symbol(m);
  bind_functional(m);
  bind_profiler(m);
}

}  // namespace treadle::py_bind

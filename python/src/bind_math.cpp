// Functional math and torch's view-like shape ops, added to the `functional` submodule that
// bind_core creates: exp, log, log1p, sqrt, abs, pow, clamp, div, sum/mean over any dims, cat
// (torch's dim=0 default), permute, transpose, unsqueeze, squeeze, split, chunk, bmm.
// Dimension arguments are called `dim` as in torch; `axis` is accepted as numpy users write it.
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "treadle/error.hpp"
#include "treadle/ops.hpp"

namespace treadle::py_bind {
namespace {

// One integer from Python; bools (a subclass of int) and floats are refused, naming the argument.
int64_t integer(const char* op, const char* name, const py::handle& v) {
  if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v))
    throw_type_error(op, ": ", name, " must be an integer, got ", std::string(py::str(py::type::of(v).attr("__name__"))));
  return v.cast<int64_t>();
}

// `dim` or its numpy spelling `axis`; `dflt` when neither is given.
int dim_or_axis(const char* op, const py::object& dim, const py::object& axis, std::optional<int> dflt) {
  if (!dim.is_none() && !axis.is_none()) throw_type_error(op, ": give dim or axis, not both");
  const py::object& v = dim.is_none() ? axis : dim;
  if (v.is_none()) {
    if (!dflt) throw_type_error(op, ": missing the dimension (dim=)");
    return *dflt;
  }
  return static_cast<int>(integer(op, "dim", v));
}

// None: every dim; an int; or a sequence of ints.
std::vector<int64_t> dims_list(const char* op, const py::object& dim) {
  std::vector<int64_t> dims;
  if (dim.is_none()) return dims;
  if (py::isinstance<py::int_>(dim) && !py::isinstance<py::bool_>(dim)) return {dim.cast<int64_t>()};
  if (!py::isinstance<py::sequence>(dim) || py::isinstance<py::str>(dim))
    throw_type_error(op, ": dim must be an integer, a sequence of integers or None");
  for (const py::handle& d : dim.cast<py::sequence>()) dims.push_back(integer(op, "dim", d));
  if (dims.empty()) throw_value_error(op, ": dim is an empty sequence (pass None to reduce over every dim)");
  return dims;
}

std::vector<int64_t> int_list(const char* op, const char* name, const py::object& v) {
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v))
    throw_type_error(op, ": ", name, " must be a sequence of integers");
  std::vector<int64_t> out;
  for (const py::handle& d : v.cast<py::sequence>()) out.push_back(integer(op, name, d));
  return out;
}

std::optional<double> bound(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  return v.cast<double>();
}

void bind_elementwise_math(py::module_& f) {
  f.def("exp", &ops::exp, py::arg("input"));
  f.def("log", &ops::log, py::arg("input"));
  f.def("log1p", &ops::log1p, py::arg("input"));
  f.def("sqrt", &ops::sqrt, py::arg("input"));
  f.def("abs", &ops::abs, py::arg("input"));
  f.def("pow", &ops::pow, py::arg("input"), py::arg("exponent"), "input ** exponent (a Python number).");
  f.def("clamp", [](Value x, const py::object& min, const py::object& max) {
          if (min.is_none() && max.is_none()) throw_value_error("clamp: at least one of min and max must be given");
          return ops::clamp(x, bound(min), bound(max));
        }, py::arg("input"), py::arg("min") = py::none(), py::arg("max") = py::none());
  f.def("div", &ops::div, py::arg("input"), py::arg("other"));
  f.def("div", [](Value a, double b) { return ops::div(a, ops::scalar_like(a, b)); }, py::arg("input"), py::arg("other"));
  f.def("rand_like", &ops::rand_like, py::arg("input"),
        "Uniform [0, 1) noise of input's shape and dtype, drawn anew each step from the context's RNG.");
  f.def("randn_like", &ops::randn_like, py::arg("input"),
        "Standard normal noise of input's shape and dtype, drawn anew each step from the context's RNG.");
  f.def("_scalar_like", &ops::scalar_like, py::arg("like"), py::arg("value"),
        "A 0-d constant of like's dtype (broadcasts against it).");
}

void bind_reductions(py::module_& f) {
  f.def("sum", [](Value x, const py::object& dim, bool keepdim, const py::object& axis) {
          if (!dim.is_none() && !axis.is_none()) throw_type_error("sum: give dim or axis, not both");
          return ops::sum(x, dims_list("sum", dim.is_none() ? axis : dim), keepdim);
        }, py::arg("input"), py::arg("dim") = py::none(), py::arg("keepdim") = false, py::kw_only(),
        py::arg("axis") = py::none(), "Sum over dim (an int or a sequence of ints; None: every dim).");
  f.def("mean", [](Value x, const py::object& dim, bool keepdim, const py::object& axis) {
          if (!dim.is_none() && !axis.is_none()) throw_type_error("mean: give dim or axis, not both");
          return ops::mean(x, dims_list("mean", dim.is_none() ? axis : dim), keepdim);
        }, py::arg("input"), py::arg("dim") = py::none(), py::arg("keepdim") = false, py::kw_only(),
        py::arg("axis") = py::none(), "Mean over dim (an int or a sequence of ints; None: every dim).");
}

void bind_shape_methods(py::module_& f) {
  f.def("cat", [](const std::vector<Value>& parts, const py::object& dim, const py::object& axis) {
          return ops::concat(parts, dim_or_axis("cat", dim, axis, 0));
        }, py::arg("tensors"), py::arg("dim") = py::none(), py::kw_only(), py::arg("axis") = py::none(),
        "torch.cat: joins along dim (default 0).");
  f.def("permute", [](Value x, const py::object& dims) { return ops::permute(x, int_list("permute", "dims", dims)); },
        py::arg("input"), py::arg("dims"));
  f.def("transpose", &ops::transpose, py::arg("input"), py::arg("dim0"), py::arg("dim1"));
  f.def("unsqueeze", &ops::unsqueeze, py::arg("input"), py::arg("dim"));
  f.def("squeeze", [](Value x, const py::object& dim) {
          return ops::squeeze(x, dim.is_none() ? std::nullopt : std::optional<int>(integer("squeeze", "dim", dim)));
        }, py::arg("input"), py::arg("dim") = py::none());
  f.def("split", [](Value x, const py::object& size_or_sections, int dim) {
          if (py::isinstance<py::int_>(size_or_sections) && !py::isinstance<py::bool_>(size_or_sections))
            return ops::split(x, size_or_sections.cast<int64_t>(), dim);
          return ops::split(x, int_list("split", "split_size_or_sections", size_or_sections), dim);
        }, py::arg("tensor"), py::arg("split_size_or_sections"), py::arg("dim") = 0);
  f.def("chunk", &ops::chunk, py::arg("input"), py::arg("chunks"), py::arg("dim") = 0);
  f.def("bmm", &ops::bmm, py::arg("input"), py::arg("mat2"), py::arg("trans_a") = false, py::arg("trans_b") = false);
}

}  // namespace

// Behind tl.functional.grad (functional.py turns torch's argument forms into these lists).
void bind_derivatives(py::module_& f) {
  f.def("_grad", [](const std::vector<Value>& outputs, const std::vector<Value>& inputs,
                    const std::vector<py::object>& grad_outputs, bool allow_unused) {
          std::vector<Value> seeds;
          for (const py::object& g : grad_outputs) seeds.push_back(g.is_none() ? Value() : g.cast<Value>());
          py::list result;
          for (const Value& v : ops::grad(outputs, inputs, seeds, allow_unused))
            result.append(v.defined() ? py::cast(v) : py::none());
          return result;
        }, py::arg("outputs"), py::arg("inputs"), py::arg("grad_outputs"), py::arg("allow_unused"));
  f.def("ones_like", [](Value x) { return ops::full_like(x, 1.0); }, py::arg("input"));
  f.def("zeros_like", [](Value x) { return ops::full_like(x, 0.0); }, py::arg("input"));
  f.def("full_like", &ops::full_like, py::arg("input"), py::arg("fill_value"));
}

// A comparison or where operand: a symbol, or a Python number made a 0-d constant like `like`.
Value operand(const py::handle& v, const Value& like, const char* op) {
  if (py::isinstance<Value>(v)) return v.cast<Value>();
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)))
    throw_type_error(op, ": operands must be symbols or numbers, got ", std::string(py::str(py::type::of(v).attr("__name__"))));
  return ops::scalar_like(like, v.cast<double>());
}

void bind_selection(py::module_& f) {
  for (const char* name : {"gt", "lt", "ge", "le", "eq", "ne"}) {
    const std::string op = name;
    f.def(name, [op](Value input, const py::object& other) { return ops::compare(op, input, operand(other, input, op.c_str())); },
          py::arg("input"), py::arg("other"), "1 where the comparison holds, 0 elsewhere (the operands' dtype).");
  }
  f.def("where", [](Value condition, const py::object& input, const py::object& other) {
          const Value like = py::isinstance<Value>(input) ? input.cast<Value>()
                             : py::isinstance<Value>(other) ? other.cast<Value>() : condition;
          return ops::where(condition, operand(input, like, "where"), operand(other, like, "where"));
        }, py::arg("condition"), py::arg("input"), py::arg("other"),
        "torch.where: input where condition is nonzero, other elsewhere (numbers allowed for either branch).");
  f.def("gather", &ops::gather, py::arg("input"), py::arg("dim"), py::arg("index"), "torch.gather.");
}

void bind_math(py::module_& m) {
  py::module_ f = m.attr("functional").cast<py::module_>();
  bind_elementwise_math(f);
  bind_reductions(f);
  bind_shape_methods(f);
  bind_derivatives(f);
  bind_selection(f);
}

}  // namespace treadle::py_bind

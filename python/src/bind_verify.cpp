// treadle.verify's engine: the C++ verification (treadle/verify.hpp), with Python callbacks for progress
// and, in tests, for tampering with a kernel's results.
#include <string>

#include "bindings.hpp"
#include "treadle/verify.hpp"

namespace treadle::py_bind {

namespace {

py::list views(const std::vector<Tensor>& tensors) {
  py::list out;
  for (const Tensor& t : tensors) out.append(t.defined() ? py::object(numpy_view(t, py::none())) : py::none());
  return out;
}

// Returns (the report as JSON, the report as text).
py::tuple run_verify(bool quick, const std::vector<std::string>& ops, const std::vector<std::string>& backends,
                     uint64_t seed, const py::object& progress, const py::object& tamper) {
  VerifyOptions o;
  o.quick = quick, o.ops = ops, o.backends = backends, o.seed = seed;
  if (!progress.is_none())
    o.progress = [progress](int done, int total) {
      py::gil_scoped_acquire gil;
      progress(done, total);
    };
  // The callback sees writable views of the results for the duration of the call only.
  if (!tamper.is_none())
    o.tamper = [tamper](const std::string& op, const std::string& backend, const std::string& dtype, OpRunResult& r) {
      py::gil_scoped_acquire gil;
      tamper(op, backend, dtype, views(r.outputs), views(r.input_grads));
    };
  VerifyReport report;
  {
    py::gil_scoped_release release;
    report = verify(o);
  }
  return py::make_tuple(report.json(), report.text());
}

}  // namespace

void bind_verify(py::module_& m) {
  m.def("verify", &run_verify, py::arg("quick") = false, py::arg("ops") = std::vector<std::string>{},
        py::arg("backends") = std::vector<std::string>{}, py::arg("seed") = 0, py::arg("progress") = py::none(),
        py::arg("tamper") = py::none(),
        "Runs the verification catalog (treadle/verify.hpp); returns (report JSON, report text). "
        "tamper(op, backend, dtype, outputs, input_grads), test-only, may change the results in place.");
  m.def("verify_cases", [] {
    py::list out;
    for (const VerifyCaseInfo& c : verify_cases()) out.append(py::make_tuple(c.name, c.op));
    return out;
  }, "[(case name, op)] of the verification catalog.");
  m.def("verify_usable_backends", &verify_usable_backends,
        "The backends this build has that can run here (\"cuda\" needs a device).");
  m.def("verify_uncovered_ops", [] {
    py::dict out;
    for (const auto& [op, why] : verify_uncovered_ops()) out[py::str(op)] = why;
    return out;
  }, "{op: why} for the forward ops the verification catalog has no case for.");
}

}  // namespace treadle::py_bind

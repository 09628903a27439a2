// treadle::verify: the catalog's cases on every usable backend and dtype, against the float64 Eigen
// reference and (for the reference's gradients) central differences.
#include "treadle/verify.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "treadle/error.hpp"
#include "verify/verify_inputs.hpp"

namespace treadle {
namespace {

using verify_detail::Case;
using verify_detail::Inputs;
using verify_detail::Rng;

// Central differences (h = 1e-6) of f = sum(go * out) carry rounding noise of about eps * |f| / h: the
// absolute tolerance grows with the magnitude of the summed outputs.
constexpr double kStep = 1e-6, kRtol = 1e-6, kAtol = 1e-9, kNoise = 4e-10;
constexpr int kQuickElements = 6;  // finite differences on this many elements per input with `quick`

double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-10 : 1e-5; }  // against the float64 reference

int thread_count() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec); !ec && it != std::filesystem::end(it);
       it.increment(ec))
    ++n;
  return n;
}

// The backend ran none of the case's nodes here (the CPU lacks the kernel, or it does not take these shapes).
struct Declined {
  std::string why;
};

struct Runner {
  const VerifyOptions& options;

  OpRunResult run(const Case& c, const Inputs& inputs, const std::vector<Tensor>& grads, const std::string& backend,
                  bool pinned = false) const {
    OpRunResult r = run_op(c.op, inputs, c.attrs, grads, backend, c.training, 0, 1, pinned);
    if (options.tamper) {
      auto floating = std::find_if(inputs.begin(), inputs.end(), [](const Tensor& t) { return is_floating(t.dtype()); });
      options.tamper(c.op, backend, floating == inputs.end() ? "" : dtype_name(floating->dtype()), r);
    }
    return r;
  }

  // The case on `backend` with every kernel it has, also below its profitability thresholds (the planner
  // would give such small shapes to Eigen): the backend's own kernels are what is checked.
  OpRunResult run_pinned(const Case& c, const Inputs& inputs, const std::vector<Tensor>& grads,
                         const std::string& backend) const {
    OpRunResult r = run(c, inputs, grads, backend, true);
    if (backend == "eigen" || r.plan.find("[" + backend + "]") != std::string::npos) return r;
    const std::size_t hash = r.plan.find('#');
    if (hash != std::string::npos) {
      std::string why = r.plan.substr(hash + 1, r.plan.find('\n', hash) - hash - 1);
      why.erase(0, why.find_first_not_of(' '));
      throw Declined{why};
    }
    throw Declined{backend + " took none of these nodes: it lists the op, but not for these attributes or this plan "
                   "(its LSTM serves inference plans, which keep no gates)"};
  }
};

double objective(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads) {
  double f = 0;
  for (std::size_t k = 0; k < outputs.size() && k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    const double *o = outputs[k].data_as<double>(), *g = grads[k].data_as<double>();
    for (int64_t i = 0; i < outputs[k].numel(); ++i) f += g[i] * o[i];
  }
  return f;
}

// Worst |analytic - numeric| / tolerance over the case's differentiable inputs (float64, Eigen).
double gradcheck(const Runner& runner, const Case& c, Inputs inputs, const std::vector<Tensor>& grads, bool quick,
                 Rng& rng) {
  for (Tensor& t : inputs) t = t.clone();  // perturbed in place below
  const OpRunResult ref = runner.run(c, inputs, grads, "eigen");
  double magnitude = 0;
  for (std::size_t k = 0; k < ref.outputs.size(); ++k)
    if (grads[k].defined())
      for (int64_t i = 0; i < grads[k].numel(); ++i)
        magnitude += std::abs(grads[k].data_as<double>()[i] * ref.outputs[k].data_as<double>()[i]);
  const double atol = std::max(kAtol, kNoise * magnitude);
  double worst = 0;
  for (int i : c.wrt) {
    if (!ref.input_grads.at(i).defined()) throw_value_error("no gradient for input ", i);
    double* x = inputs[i].data_as<double>();
    std::vector<int64_t> elements(static_cast<std::size_t>(inputs[i].numel()));
    for (std::size_t j = 0; j < elements.size(); ++j) elements[j] = static_cast<int64_t>(j);
    if (quick && elements.size() > kQuickElements) {
      std::shuffle(elements.begin(), elements.end(), rng.engine());
      elements.resize(kQuickElements);
    }
    for (int64_t j : elements) {
      const double original = x[j];
      double values[2];
      for (int side = 0; side < 2; ++side) {
        x[j] = original + (side ? -kStep : kStep);
        values[side] = objective(runner.run(c, inputs, {}, "eigen").outputs, grads);
      }
      x[j] = original;
      const double numeric = (values[0] - values[1]) / (2 * kStep);
      const double got = ref.input_grads[i].data_as<double>()[j];
      worst = std::max(worst, std::abs(got - numeric) / (atol + kRtol * std::abs(numeric)));
    }
  }
  return worst;
}

// Worst |got - ref| / (rtol * (|ref| + scale)), scale the reference's largest magnitude (at least 1).
// NaN and Inf must appear where the reference has them, and only there.
double fraction(const Tensor& got_any, const Tensor& ref, double rtol, const std::string& what) {
  if (!got_any.defined()) throw_value_error(what, ": missing");
  if (got_any.shape() != ref.shape())
    throw_value_error(what, ": shape ", shape_str(got_any.shape()), ", the reference has ", shape_str(ref.shape()));
  const Tensor got = got_any.to(DType::f64);
  const double *g = got.data_as<double>(), *r = ref.data_as<double>();
  double scale = 1.0, worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    if (std::isfinite(r[i])) scale = std::max(scale, std::abs(r[i]));
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const bool finite = std::isfinite(r[i]);
    if (finite != std::isfinite(g[i]) || (!finite && (std::isnan(r[i]) ? !std::isnan(g[i]) : g[i] != r[i])))
      throw_value_error(what, " element ", i, ": ", g[i], " where the reference has ", r[i]);
    if (std::isfinite(r[i])) worst = std::max(worst, std::abs(g[i] - r[i]) / (rtol * (std::abs(r[i]) + scale)));
  }
  return worst;
}

// Worst error of `backend` in `dtype` against the float64 reference, outputs and gradients.
double compare(const Runner& runner, const Case& c, const Inputs& inputs, const std::vector<Tensor>& grads,
               const OpRunResult& reference, const std::string& backend, DType dtype) {
  Inputs cast;
  for (const Tensor& t : inputs) cast.push_back(is_floating(t.dtype()) ? t.to(dtype) : t);
  std::vector<Tensor> cast_grads;
  for (const Tensor& g : grads) cast_grads.push_back(g.defined() ? g.to(dtype) : Tensor());
  const OpRunResult got = runner.run_pinned(c, cast, cast_grads, backend);
  const double rtol = tolerance(dtype);
  double worst = 0;
  for (std::size_t k = 0; k < reference.outputs.size(); ++k) {
    const Tensor& ref = reference.outputs[k];
    const std::string what = "output " + std::to_string(k);
    if (k >= got.outputs.size()) throw_value_error(what, ": missing");
    // An output a device backend keeps in its own layout (a saved buffer nobody seeds) is not returned.
    if (!got.outputs[k].defined() && !(k < grads.size() && grads[k].defined())) continue;
    if (!is_floating(ref.dtype())) {  // indices: exact
      const Tensor& g = got.outputs[k];
      if (!g.defined() || g.shape() != ref.shape() || g.dtype() != ref.dtype() ||
          std::memcmp(g.clone().data(), ref.data(), ref.nbytes()) != 0)
        throw_value_error(what, ": the indices differ from the reference's");
      continue;
    }
    worst = std::max(worst, fraction(got.outputs[k], ref, rtol, what));
  }
  for (int i : c.wrt)
    worst = std::max(worst, fraction(got.input_grads.at(i), reference.input_grads.at(i), rtol,
                                     "gradient of input " + std::to_string(i)));
  return worst;
}

struct Column {
  std::string title, backend;
  DType dtype;
};

// Finite differences first, then every backend x dtype it lists (float64 and float32), the float64
// Eigen reference itself excepted.
std::vector<Column> columns(const std::vector<std::string>& backends) {
  std::vector<Column> cols{{"finite differences", "eigen", DType::f64}};
  for (const std::string& b : backends) {
    std::set<std::string> listed;
    for (const OpSupport& s : backend_ops(b)) listed.insert(s.dtypes.begin(), s.dtypes.end());
    for (const char* d : {"float64", "float32"})
      if (listed.count(d) && !(b == "eigen" && std::string(d) == "float64"))
        cols.push_back({b + " " + d, b, dtype_from_name(d)});
  }
  return cols;
}

bool lists(const std::vector<OpSupport>& ops, const std::string& op, DType dtype) {
  for (const OpSupport& s : ops)
    if (s.op == op) return std::count(s.dtypes.begin(), s.dtypes.end(), dtype_name(dtype)) > 0;
  return false;
}

std::vector<Tensor> upstream(const Case& c, const std::vector<Tensor>& outputs, Rng& rng) {
  const verify_detail::Ints chosen = c.grad_outputs ? *c.grad_outputs : verify_detail::Ints{0};
  std::vector<Tensor> grads;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const bool seeded = std::count(chosen.begin(), chosen.end(), static_cast<int>(k)) > 0;
    grads.push_back(seeded ? verify_detail::filled(outputs[k].shape(), [&] { return rng.normal(); }) : Tensor());
  }
  return grads;
}

void check_filters(const VerifyOptions& o) {
  std::set<std::string> ops;
  for (const Case& c : verify_detail::catalog()) ops.insert(c.op);
  std::vector<std::string> missing, unknown;
  for (const std::string& op : o.ops)
    if (!ops.count(op)) missing.push_back(op);
  const std::vector<std::string> built = backend_names();
  for (const std::string& b : o.backends)
    if (std::find(built.begin(), built.end(), b) == built.end()) unknown.push_back(b);
  const auto list = [](const auto& items) {
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "'" : ", '") + std::string(i) + "'";
    return "[" + s + "]";
  };
  if (!unknown.empty())
    throw_value_error("verify: unknown backend(s) ", list(unknown), "; this build has ", list(built));
  if (!missing.empty()) throw_value_error("verify: no case for ", list(missing), "; the catalog covers ", list(ops));
}

}  // namespace

VerifyReport verify(const VerifyOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  VerifyReport report;
  report.threads_before = thread_count();
  report.quick = options.quick;
  report.build = build_info();
  check_filters(options);
  std::vector<std::string> chosen;
  for (const std::string& b : verify_usable_backends())
    if (options.backends.empty() || std::count(options.backends.begin(), options.backends.end(), b)) chosen.push_back(b);
  const std::vector<Column> cols = columns(chosen);
  for (const Column& col : cols) report.columns.push_back(col.title);
  std::vector<std::vector<OpSupport>> listed;
  for (const Column& col : cols) listed.push_back(backend_ops(col.backend));
  const Runner runner{options};
  const auto& cases = verify_detail::catalog();
  std::vector<const Case*> selected;
  for (const Case& c : cases)
    if (options.ops.empty() || std::count(options.ops.begin(), options.ops.end(), c.op)) selected.push_back(&c);
  for (std::size_t n = 0; n < selected.size(); ++n) {
    const Case& c = *selected[n];
    Rng rng(options.seed, static_cast<uint64_t>(&c - cases.data()));
    const Inputs inputs = c.make_inputs(rng);
    const std::vector<Tensor> grads = upstream(c, runner.run(c, inputs, {}, "eigen").outputs, rng);
    const OpRunResult reference = runner.run(c, inputs, grads, "eigen");
    VerifyRow row{c.name, c.op, {}};
    for (std::size_t k = 0; k < cols.size(); ++k) {
      const Column& col = cols[k];
      VerifyCell cell;
      const bool fd = k == 0;
      if (!fd && col.backend != "eigen" && !lists(listed[k], c.op, col.dtype)) {
        row.cells.push_back(cell);  // no kernel there: the plan would fall back to Eigen, checked already
        continue;
      }
      try {
        cell.fraction = fd ? (c.wrt.empty() ? 0.0 : gradcheck(runner, c, inputs, grads, options.quick, rng))
                           : compare(runner, c, inputs, grads, reference, col.backend, col.dtype);
        cell.state = VerifyCell::State::measured;
      } catch (const Declined& d) {  // not a failure: nothing of that backend ran here
        cell.state = VerifyCell::State::declined;
        cell.message = d.why;
      } catch (const std::exception& e) {  // a kernel that throws fails its cell, named
        cell.state = VerifyCell::State::error;
        cell.message = e.what();
      }
      if (!cell.passed()) {
        char fraction[32];
        std::snprintf(fraction, sizeof fraction, "%.6g", cell.fraction);
        report.failures.push_back({c.name, c.op, col.title, col.backend, dtype_name(col.dtype),
                                   cell.state == VerifyCell::State::error ? cell.message : fraction});
      }
      row.cells.push_back(cell);
    }
    report.rows.push_back(std::move(row));
    if (options.progress) options.progress(static_cast<int>(n + 1), static_cast<int>(selected.size()));
  }
  report.threads_after = thread_count();
  if (report.threads_after != report.threads_before)
    report.failures.push_back({"-", "-", "threads", "-", "-",
                               "the run changed the thread count from " + std::to_string(report.threads_before) +
                                   " to " + std::to_string(report.threads_after)});
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

std::vector<VerifyCaseInfo> verify_cases() {
  std::vector<VerifyCaseInfo> out;
  for (const Case& c : verify_detail::catalog()) out.push_back({c.name, c.op});
  return out;
}

std::vector<std::pair<std::string, std::string>> verify_uncovered_ops() { return verify_detail::uncovered_ops(); }

std::vector<std::string> verify_usable_backends() {
  std::vector<std::string> usable;
  for (const std::string& b : backend_names()) {
    if (b == "cuda") {
      try {
        Tensor one({1}, DType::f32);
        one.data_as<float>()[0] = 1;
        run_op("relu", {one}, {}, {}, "cuda", true, 0);
      } catch (const std::exception&) {
        continue;  // built with CUDA, no device here
      }
    }
    usable.push_back(b);
  }
  return usable;
}


}  // namespace treadle

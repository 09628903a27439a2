// treadle::verify from C++, as a host without Python runs it: the catalog passes on this machine, covers
// every forward op of the reference, leaves the thread count alone, and names the op, backend and dtype
// of a kernel made wrong through the test-only tamper hook. Prints one line per check; exit 1 on failure.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "treadle/treadle.hpp"

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

void test_catalog_passes_and_covers_every_forward_op() {
  treadle::VerifyOptions quick;
  quick.quick = true;
  const treadle::VerifyReport report = treadle::verify(quick);
  for (const auto& f : report.failures) std::printf("  %s [%s]: %s\n", f.case_name.c_str(), f.check.c_str(), f.error.c_str());
  check(report.passed(), "verify --quick passes (" + std::to_string(report.checks()) + " checks)");
  check(report.rows.size() == treadle::verify_cases().size() && report.checks() >= 2 * int(report.rows.size()),
        "a row per case, each with at least the finite-difference and eigen float32 checks");
  check(report.threads_before == report.threads_after, "the thread count is unchanged");
  check(report.columns.front() == "finite differences" &&
            std::count(report.columns.begin(), report.columns.end(), "eigen float32") == 1,
        "columns: finite differences first, eigen float32 among them");
  std::set<std::string> covered, exempt;
  for (const auto& c : treadle::verify_cases()) covered.insert(c.op);
  for (const auto& [op, why] : treadle::verify_uncovered_ops()) exempt.insert(op);
  std::string missing;
  for (const auto& s : treadle::backend_ops("eigen"))
    if (!s.op.ends_with("_backward") && !covered.count(s.op) && !exempt.count(s.op)) missing += " " + s.op;
  check(missing.empty(), "every forward op of the reference has a case" + (missing.empty() ? "" : ": missing" + missing));
  const std::string json = report.json();
  check(json.front() == '{' && json.find("\"failures\": []") != std::string::npos, "the JSON report lists no failure");
}

// linear's float32 input gradient on `backend`, 0.1% off.
treadle::VerifyReport with_wrong_linear(const std::string& backend) {
  treadle::VerifyOptions o;
  o.ops = {"linear"};
  o.backends = {backend};
  o.tamper = [backend](const std::string& op, const std::string& b, const std::string& dtype, treadle::OpRunResult& r) {
    if (op != "linear" || b != backend || dtype != "float32" || r.input_grads.empty() || !r.input_grads[0].defined()) return;
    float* g = r.input_grads[0].data_as<float>();
    for (int64_t i = 0; i < r.input_grads[0].numel(); ++i) g[i] *= 1.001f;
  };
  return treadle::verify(o);
}

void test_a_wrong_kernel_is_named() {
  for (const std::string& backend : treadle::verify_usable_backends()) {
    if (backend == "cuda") continue;
    const treadle::VerifyReport report = with_wrong_linear(backend);
    bool named = !report.failures.empty();
    for (const auto& f : report.failures)
      named = named && f.op == "linear" && f.backend == backend && f.dtype == "float32" && f.check == backend + " float32";
    check(named, "a wrong " + backend + " float32 linear gradient fails verify, named (" +
                     std::to_string(report.failures.size()) + " failures)");
    check(report.text().find("FAILED") != std::string::npos, "the text says FAILED");
  }
}

void test_bad_filters_throw() {
  for (const auto& [ops, backends] : {std::pair<std::vector<std::string>, std::vector<std::string>>{{"nope"}, {}},
                                     {{}, {"tpu"}}}) {
    treadle::VerifyOptions o;
    o.ops = ops, o.backends = backends;
    bool threw = false;
    try {
      treadle::verify(o);
    } catch (const treadle::ValueError& e) {
      threw = std::string(e.what()).find(ops.empty() ? "unknown backend" : "no case for") != std::string::npos;
    }
    check(threw, "ValueError for " + (ops.empty() ? "backend " + backends[0] : "op " + ops[0]));
  }
}

}  // namespace

int main() {
  test_catalog_passes_and_covers_every_forward_op();
  test_a_wrong_kernel_is_named();
  test_bad_filters_throw();
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}

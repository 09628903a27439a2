#pragma once
// The installation check: every op of the catalog on every backend and dtype this build has and this
// machine runs, against the float64 Eigen reference and, for the reference's own gradients, central
// differences. No torch and no Python: `python -m treadle verify`, the `treadle-verify` program and
// the C function treadle_verify() all run this one implementation.
//
// Each case (one or more per forward op, and one per gradient op that is differentiable itself)
// draws fresh random inputs, tiny (at most 40 elements per floating input) and shaped so that central
// differences never straddle a kink. A cell of the matrix is the worst error of one check as a
// fraction of its tolerance: at most 1 passes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "treadle/backend.hpp"
#include "treadle/export.hpp"
#include "treadle/testing.hpp"

namespace treadle {

struct VerifyOptions {
  bool quick = false;                 // central differences on 6 elements per input instead of all
  std::vector<std::string> ops;       // only these ops (empty: every op in the catalog)
  std::vector<std::string> backends;  // only these backends (empty: every usable one)
  uint64_t seed = 0;                  // of the random inputs
  std::function<void(int done, int total)> progress;  // after each case
  // Test-only: sees (and may alter) every result a backend returns, before it is checked, so a test
  // can make one kernel wrong and watch the check name it. Arguments: op, backend, dtype name.
  std::function<void(const std::string&, const std::string&, const std::string&, OpRunResult&)> tamper;
};

struct VerifyCell {
  enum class State { not_listed, declined, measured, error } state = State::not_listed;
  double fraction = 0;  // measured: worst error / tolerance
  std::string message;  // declined: why; error: what went wrong
  bool passed() const { return state != State::measured ? state != State::error : fraction <= 1.0; }
};

struct VerifyRow {
  std::string name, op;
  std::vector<VerifyCell> cells;  // one per column
};

struct VerifyFailure {
  std::string case_name, op, check, backend, dtype, error;
};

struct TREADLE_API VerifyReport {
  std::vector<BuildInfoEntry> build;
  bool quick = false;
  int threads_before = 0, threads_after = 0;
  std::vector<std::string> columns;  // "finite differences", then "<backend> <dtype>"
  std::vector<VerifyRow> rows;
  std::vector<VerifyFailure> failures;
  double seconds = 0;

  bool passed() const { return failures.empty(); }
  int checks() const;        // measured or failed cells
  std::string json() const;  // the whole report (strict JSON)
  std::string text() const;  // the build, the matrix and the verdict, as the command line prints them
};

// Runs the catalog. Throws ValueError for an op without a case or a backend this build lacks.
TREADLE_API VerifyReport verify(const VerifyOptions& options = {});

// The catalog: (case name, op) per case, and the forward ops that have no case, with the reason.
struct VerifyCaseInfo {
  std::string name, op;
};
TREADLE_API std::vector<VerifyCaseInfo> verify_cases();
TREADLE_API std::vector<std::pair<std::string, std::string>> verify_uncovered_ops();
// The backends this build has that can run here ("cuda" needs a device): the ones verify checks.
TREADLE_API std::vector<std::string> verify_usable_backends();

}  // namespace treadle

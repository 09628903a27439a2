#!/usr/bin/env bash
# The sanitizer step: builds treadle with AddressSanitizer + UndefinedBehaviorSanitizer in its own
# build directory, runs the C++ tests, then a representative subset of the Python tests with the
# sanitizer runtime preloaded into CPython. Exit status 0 means clean: any sanitizer report (from any
# process of the run) fails it, and the reports are printed. tests/test_sanitize.py runs it as part of
# the default test suite; docs/hardening.md explains the choices.
#
#   tools/sanitize.sh                  # build, cpp, python (in that order)
#   tools/sanitize.sh build|cpp|python # one stage (cpp and python expect a finished build)
#   tools/sanitize.sh cpp EXE ARGS...  # a sanitized executable under the C++ stage's options
#   tools/sanitize.sh exec CMD ARGS... # any command under the runtime and options of the python stage
#
# Environment: SANITIZE_BUILD_DIR (default build/sanitize), SANITIZE_JOBS (default: all cores),
# SANITIZE_PYTHON (the interpreter; default python3), SANITIZE_PYTESTS (test files/ids instead of the
# default subset), SANITIZE_PARAM_COVERAGE (1, 2 or all: see tools/sanitize_subset.py).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SANITIZE_BUILD_DIR:-$repo/build/sanitize}"
jobs="${SANITIZE_JOBS:-$(nproc 2>/dev/null || echo 2)}"
python="${SANITIZE_PYTHON:-python3}"

# The subset: the whole Python suite (every op family through the op suite, models and training end
# to end, trainer phases and the step API, bad input and failure behaviour, checkpoints and the
# safetensors loader, the fuzz tests), with parameter grids thinned by sanitize_subset.py, less the
# files that build or launch other programs (C++/Fortran/MPI builds, examples, the demo CLI, the
# other CI variants), time things, or drive a third-party runtime (onnxruntime) or an optional
# backend. A new test file is sanitized by default; list it here if it must not be.
default_pytests="tests --ignore=tests/test_sanitize.py --ignore=tests/test_onednn_build.py --ignore=tests/test_cuda_build.py
  --ignore=tests/test_onednn.py --ignore=tests/test_cpp.py --ignore=tests/test_distributed.py
  --ignore=tests/test_examples.py --ignore=tests/test_embedding_examples.py --ignore=tests/test_fortran_example.py
  --ignore=tests/test_demo.py --ignore=tests/test_readme.py --ignore=tests/test_bench.py
  --ignore=tests/test_onnx.py --ignore=tests/test_onnx_conv.py --ignore=tests/test_online_hosts.py
  --ignore=tests/test_mpi_hosts.py --ignore=tests/test_mpi_implementations.py"
pytests="${SANITIZE_PYTESTS:-$default_pytests}"

sanitize="-fsanitize=address,undefined"
# -fno-sanitize-recover: UB halts like a memory error instead of printing and carrying on. -O1 -g1:
# the usual sanitizer trade-off (fast enough to run, line numbers in reports, a quicker build); no
# NDEBUG, so assertions (Eigen's index checks among them) are live too.
cxx_flags="$sanitize -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
config_flags="-O1 -g1"

stage_build() {
  local launcher=() generator=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  command -v ninja >/dev/null && generator=(-G Ninja)
  mkdir -p "$build"
  echo "== configure ($build)"
  if ! cmake -S "$repo" -B "$build" "${generator[@]}" "${launcher[@]}" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$config_flags" \
      -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$sanitize" \
      -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" -DCMAKE_MODULE_LINKER_FLAGS="$sanitize" \
      -DTREADLE_NATIVE=OFF -DTREADLE_BUILD_TESTS=ON -DTREADLE_BUILD_PYTHON=ON \
      -DPython_EXECUTABLE="$(command -v "$python")" \
      -DCMAKE_PROJECT_treadle_INCLUDE="$repo/tools/sanitize_probe.cmake" >"$build/configure.log" 2>&1; then
    tail -n 40 "$build/configure.log" >&2
    echo "sanitize.sh: cmake configure failed (full log: $build/configure.log)" >&2
    return 1
  fi
  echo "== build"
  # ccache: CCACHE_BASEDIR makes paths relative to the checkout, and with -g ccache would also hash
  # the working directory, so NOHASHDIR lets a fresh clone elsewhere reuse the objects (the cost:
  # debug info may name the first clone's build directory).
  CCACHE_BASEDIR="$repo" CCACHE_NOHASHDIR=1 cmake --build "$build" -j "$jobs"
}

# The shared sanitizer runtimes the extension module links, in the order they must be preloaded
# (CPython itself is not instrumented, so ASan has to be first in the process).
runtimes() {
  local module
  module="$(compgen -G "$build/python/_core*.so" | head -n 1)" || true
  [[ -n "$module" ]] || { echo "sanitize.sh: no extension module in $build/python: run the build stage" >&2; return 1; }
  local libs
  libs="$(ldd "$module" | awk '$3 ~ /lib(asan|clang_rt\.asan)[^\/]*\.so/ {a=$3} $3 ~ /libubsan[^\/]*\.so/ {u=$3}
                               END {if (a) printf "%s", a; if (u) printf ":%s", u}')"
  [[ "$libs" == /* ]] || { echo "sanitize.sh: $module links no shared ASan runtime" >&2; return 1; }
  echo "$libs"
}

# Runs "$@" with ASan/LSan reports written to files (log_path) so that reports from every process
# count, including subprocesses whose output a test captures; any report fails the command. UBSan
# ignores log_path when it shares the process with GCC's ASan runtime and writes to stderr: with
# halt_on_error the process dies at the first report, and the Python stage keeps fd 2 uncaptured.
with_reports() {
  local logs rc=0
  logs="$(mktemp -d "$build/reports.XXXXXX")"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:report_error_type=1"
  ASAN_OPTIONS="$ASAN_OPTIONS:log_path=$logs/asan" "$@" || rc=$?
  if compgen -G "$logs/*" >/dev/null; then
    echo "== sanitizer report(s) from: $*" >&2
    cat "$logs"/* >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
  rm -rf "$logs"
  return "$rc"
}

# Shared by the C++ and Python stages: stop at the first error, abort (a distinct exit status), keep
# checking stack use after return and global initialisation order.
asan_common="halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"

stage_cpp() {  # [CMD ARGS...]: another sanitized executable instead of the C++ tests
  echo "== C++ tests"
  [[ $# -gt 0 ]] || set -- "$build/cpp/tests/test_core"
  # A C++ host owns all of its memory, so leaks are real here: leak detection stays on.
  ASAN_OPTIONS="$asan_common:detect_leaks=1" with_reports "$@"
}

sanitized_python() {
  local libs
  libs="$(runtimes)" || return 1
  # Leak detection is off in a Python host: CPython never frees interned strings, type objects,
  # module state and its small-object arenas at exit (by design), nor do numpy and torch, so LSan
  # would report thousands of "leaks" that are not treadle's; treadle's own ownership is checked by
  # the C++ stage, which runs with leak detection on. PYTHONMALLOC=malloc routes Python objects
  # through ASan's allocator, so an overflow into a numpy buffer or a Python object is caught too.
  LD_PRELOAD="$libs${LD_PRELOAD:+:$LD_PRELOAD}" ASAN_OPTIONS="$asan_common:detect_leaks=0" \
    PYTHONMALLOC=malloc TREADLE_BUILD_DIR="$build" TREADLE_SANITIZE=0 TREADLE_ONEDNN_CHECK=0 \
    PYTHONPATH="$repo/python:$repo/tools${PYTHONPATH:+:$PYTHONPATH}" with_reports "$@"
}

stage_python() {
  echo "== Python tests under ASan+UBSan"
  cd "$repo"
  # --capture=sys: tests' Python output is captured as usual, but a report written to fd 2 by the
  # runtime reaches our stderr even when it kills the interpreter mid-test.
  # shellcheck disable=SC2086  # the list is word-split on purpose
  sanitized_python "$python" -m pytest -q --capture=sys -p no:cacheprovider -p sanitize_subset $pytests
}

case "${1:-all}" in
  all) stage_build && stage_cpp && stage_python && echo "== sanitizers: clean" ;;
  build) stage_build ;;
  cpp) shift; stage_cpp "$@" ;;
  python) stage_python ;;
  exec) shift; sanitized_python "$@" ;;
  *) echo "usage: tools/sanitize.sh [all|build|cpp|python|exec CMD ARGS...]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Builds the other oneDNN variant of treadle in its own build directory and runs tests on it:
#
#   tools/variant_check.sh onednn   # TREADLE_WITH_ONEDNN=ON (what pip builds): the whole suite, every
#                                   # op on "onednn" against the float64 reference; for a session whose
#                                   # installed treadle is Eigen-only
#   tools/variant_check.sh eigen    # TREADLE_WITH_ONEDNN=OFF: the Eigen-only build still compiles and
#                                   # trains (the core suites; Eigen runs every op in every build)
#
# Environment: VARIANT_CHECK_BUILD_DIR (default build/<variant>-check), VARIANT_CHECK_JOBS (2),
# VARIANT_CHECK_PYTESTS (the pytest arguments). Exit status 0 means every test passed.
# The oneDNN variant needs the oneDNN wheels: pip install '.[onednn]'
set -euo pipefail

variant="${1:?usage: tools/variant_check.sh onednn|eigen}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${VARIANT_CHECK_BUILD_DIR:-$repo/build/$variant-check}"
jobs="${VARIANT_CHECK_JOBS:-2}"
case "$variant" in
  onednn)
    flag=ON
    # Everything but the suites that build other variants or time things (examples, sanitizers,
    # benchmarks, the installed-package checks): those do not depend on the backend.
    default_tests="tests --ignore=tests/test_sanitize.py --ignore=tests/test_variant_builds.py
      --ignore=tests/test_examples.py --ignore=tests/test_embedding_examples.py --ignore=tests/test_fortran_example.py
      --ignore=tests/test_bench.py --ignore=tests/test_demo.py --ignore=tests/test_readme.py
      --ignore=tests/test_distributed.py --ignore=tests/test_cpp.py --ignore=tests/test_isa_caps.py
      --ignore=tests/test_wheel.py" ;;
  eigen)
    flag=OFF
    default_tests="tests/test_model.py tests/test_trainer.py tests/test_threads.py tests/test_bf16.py
      tests/test_backend_ops.py tests/test_dispatch_auto.py tests/test_lock_order.py" ;;
  *) echo "tools/variant_check.sh: unknown variant '$variant' (onednn or eigen)" >&2; exit 2 ;;
esac
pytests="${VARIANT_CHECK_PYTESTS:-$default_tests}"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== configure ($build)"
cmake -S "$repo" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTREADLE_WITH_ONEDNN="$flag" -DTREADLE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python)" >/dev/null
echo "== build"
CCACHE_BASEDIR="$repo" cmake --build "$build" -j "$jobs"
echo "== tests on the $variant build"
cd "$repo"
TREADLE_BUILD_DIR="$build" PYTHONPATH="$repo/python" VARIANT="$variant" python - <<'PY'
import os
import treadle
has = "onednn" in treadle.backends()
assert has == (os.environ["VARIANT"] == "onednn"), f"the {os.environ['VARIANT']} build has backends {treadle.backends()}"
print("backends:", treadle.backends())
PY
# shellcheck disable=SC2086
TREADLE_BUILD_DIR="$build" PYTHONPATH="$repo/python" python -m pytest -q -p no:cacheprovider $pytests
echo "== $variant build: all passed"

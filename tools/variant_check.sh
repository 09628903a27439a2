#!/usr/bin/env bash
# Builds treadle with the oneDNN backend in its own build directory and runs the test suite on it:
# every op through opcheck.BACKENDS on "onednn" (float32 against the float64 reference), the oneDNN
# cross-checks, threads, training end to end. Exit status 0 means every test passed.
#
#   tools/onednn_check.sh                         # build dir: build/onednn-check
#   ONEDNN_CHECK_BUILD_DIR=/tmp/dnnl tools/onednn_check.sh
#   ONEDNN_CHECK_PYTESTS="tests/test_onednn.py" tools/onednn_check.sh
# Needs the oneDNN wheels: pip install onednn-devel-cpu-gomp==2023.2.0 onednn-cpu-gomp==2023.2.0
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ONEDNN_CHECK_BUILD_DIR:-$repo/build/onednn-check}"
jobs="${ONEDNN_CHECK_JOBS:-2}"
# Everything but the suites that build other variants or time things (examples, sanitizers,
# benchmarks, the installed-package checks): those do not depend on the backend.
pytests="${ONEDNN_CHECK_PYTESTS:-tests --ignore=tests/test_sanitize.py --ignore=tests/test_onednn_build.py
  --ignore=tests/test_examples.py --ignore=tests/test_embedding_examples.py --ignore=tests/test_fortran_example.py
  --ignore=tests/test_bench.py --ignore=tests/test_demo.py --ignore=tests/test_readme.py
  --ignore=tests/test_distributed.py --ignore=tests/test_cpp.py}"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== configure ($build)"
cmake -S "$repo" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTREADLE_WITH_ONEDNN=ON -DTREADLE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python)" >/dev/null
echo "== build"
CCACHE_BASEDIR="$repo" cmake --build "$build" -j "$jobs"
echo "== tests on the oneDNN build"
cd "$repo"
TREADLE_BUILD_DIR="$build" PYTHONPATH="$repo/python" python - <<'PY'
import treadle
assert "onednn" in treadle.backends(), f"the oneDNN build has backends {treadle.backends()}"
print("backends:", treadle.backends())
PY
# shellcheck disable=SC2086
TREADLE_BUILD_DIR="$build" PYTHONPATH="$repo/python" python -m pytest -q -p no:cacheprovider $pytests
echo "== oneDNN build: all passed"

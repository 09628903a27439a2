#!/usr/bin/env bash
# Builds treadle with AddressSanitizer + UndefinedBehaviorSanitizer in its own build directory,
# runs the C++ tests, then a representative subset of the Python tests with the sanitizer runtime
# preloaded into CPython. Exit status 0 means clean: any sanitizer report fails the run.
#
#   tools/sanitize.sh                      # build dir: build/sanitize
#   SANITIZE_BUILD_DIR=/tmp/asan tools/sanitize.sh
#   SANITIZE_PYTESTS="tests/test_model.py" tools/sanitize.sh
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SANITIZE_BUILD_DIR:-$repo/build/sanitize}"
jobs="${SANITIZE_JOBS:-2}"
# Core paths: tensors and plans, layers, losses, optimizers, trainer, checkpoints, executors, bad input.
pytests="${SANITIZE_PYTESTS:-tests/test_model.py tests/test_trainer.py tests/test_step_api.py tests/test_losses.py
  tests/test_optim.py tests/test_ops_activation.py tests/test_ops_softmax.py tests/test_bad_input.py
  tests/test_executor.py tests/test_checkpoint.py tests/test_hardening.py}"

flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== configure ($build)"
cmake -S "$repo" -B "$build" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTREADLE_NATIVE=OFF \
  -DTREADLE_BUILD_TESTS=ON -DTREADLE_BUILD_PYTHON=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
echo "== build"
CCACHE_BASEDIR="$repo" cmake --build "$build" -j "$jobs"

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "== C++ tests"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" "$build/cpp/tests/test_core"

echo "== Python tests under ASan+UBSan"
# CPython is not built with ASan: the runtime must come first in the process, and CPython's
# interned objects and arenas are never freed by design, so leak detection stays off here.
libasan="$(${CXX:-g++} -print-file-name=libasan.so)"
libubsan="$(${CXX:-g++} -print-file-name=libubsan.so)"
# shellcheck disable=SC2086
LD_PRELOAD="$libasan:$libubsan" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
  TREADLE_BUILD_DIR="$build" PYTHONPATH="$repo/python" PYTHONMALLOC=malloc \
  python -m pytest -q -p no:cacheprovider $pytests
echo "== sanitizers: clean"

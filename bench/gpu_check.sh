#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU, unattended, in about 8 minutes
# (BUDGET seconds, default 480; correctness first, timings with what is left):
#   1. build libtreadle with TREADLE_WITH_CUDA=ON, test_cuda and the Python module (-j16, ccache when
#      present). Eigen comes from the build's Python (cmeel-eigen) or from a carried wheel
#      .whl/cmeel_eigen-*.whl (unpacked, no install). Without Eigen: only the standalone kernel
#      project cpp/tests/cuda is built, and the steps that need the library are skipped.
#   2. test_cuda: every kernel against float64 host references, the allocator, the status paths, and
#      the core_* tests: the core's training plans compiled for "cuda" against Eigen, the C++ Trainer /
#      Model::predict on "cuda" (with and without CUDA graphs) against training on Eigen
#   3. the parameterised Python op suite on backend "cuda" only (TREADLE_TEST_BACKENDS=cuda): every op
#      the device covers against torch and the float64 reference, through run_op; the cases the
#      device does not cover are skipped and counted (op_suite.txt lists them)
#   4. training curves of the benchmark workloads W1-W6 on "cuda" against Eigen (bench/gpu_curves.py)
#   5. data parallel on the device (tools/gpu_dp_check.sh, when present)
#   6. W1-W6 against PyTorch on the GPU (bench/run.py --device cuda) and the crossover study of the
#      host and device backends (bench/crossover.py --quick)
#   7. test_cuda --bench: kernel timings (JSON), and the same operations in torch on the GPU
#   8. compute-sanitizer memcheck of the kernel tests, when the tool is present (time-boxed)
# Writes into OUT_DIR (first argument, else $OUT, else build/gpu-check): summary.txt, gpu_check.log,
# test_cuda.txt, op_suite.txt, workloads.md, and results.tgz with everything else (curves, benchmarks,
# crossover, kernel timings). Prints "== GPU check: ..." lines; exits 1 when a device test failed.
# Usage: bench/gpu_check.sh [OUT_DIR]   (PYTHON=... the interpreter holding torch and the NVIDIA wheels;
# GPU_CHECK_BUILD=<dir> reuses a configured CUDA build with the Python module, e.g. for a dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT_DIR=${1:-${OUT:-$REPO/build/gpu-check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS=$OUT_DIR/results
mkdir -p "$RESULTS"
LOG=$OUT_DIR/gpu_check.log
SUMMARY=$OUT_DIR/summary.txt
: >"$LOG"
: >"$SUMMARY"
START=$(date +%s)
BUDGET=${BUDGET:-480}
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
JOBS=${JOBS:-16}
SOLO=$REPO/build/gpu-check-solo
FULL=${GPU_CHECK_BUILD:-$REPO/build/gpu-check-full}
FAILED=0

say() { echo "== GPU check: $*" | tee -a "$SUMMARY" "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
# Each file under RESULTS goes into results.tgz at the end (at most 8 files come back from a run).
finish() {
  say "done in $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'all device tests passed' || echo 'SOMETHING FAILED')"
  tar -C "$OUT_DIR" -czf "$OUT_DIR/results.tgz" results 2>/dev/null && rm -rf "$RESULTS"
  exit $FAILED
}
# PASS/FAIL/SKIP of a test_cuda run (file $1, exit code $2, label $3).
judge_tests() {
  if grep -q "^SKIP: no CUDA device" "$1"; then
    say "SKIP $3: no device (see $(basename "$1"))"; FAILED=1
  elif [ "$2" -eq 0 ]; then
    say "PASS $3: $(grep '^cuda tests:' "$1")"
  else
    say "FAIL $3 (exit $2): $(grep '^FAIL' "$1" | awk '{print $2}' | tr '\n' ' ')"; FAILED=1
  fi
}

{
  echo "date: $(date -u)"; uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
  echo "python: $PYTHON"; "$PYTHON" --version 2>&1
  command -v nvcc >/dev/null && nvcc --version | tail -2 || /usr/local/cuda/bin/nvcc --version 2>&1 | tail -2
} >>"$LOG" 2>&1

LAUNCH=()
if command -v ccache >/dev/null; then
  LAUNCH=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$REPO
fi
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${CUDA_ARCH:-90}

# Eigen: the Python's cmeel-eigen, else a carried wheel unpacked into the build folder
# (bench/gpu_wheels.sh downloads the wheels a machine without network needs into .whl/).
PREFIX=()
if ! "$PYTHON" -c "import cmeel" 2>/dev/null; then
  wheel=$(ls "$REPO"/.whl/cmeel_eigen-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    mkdir -p "$REPO/build/gpu-eigen" && "$PYTHON" -m zipfile -e "$wheel" "$REPO/build/gpu-eigen" >>"$LOG" 2>&1
    PREFIX=(-DCMAKE_PREFIX_PATH="$REPO/build/gpu-eigen/cmeel.prefix")
  fi
fi

# ---- 1. build
t0=$(date +%s)
HAVE_LIB=0
HAVE_PY=0
configure_full() {  # $1: ON/OFF for the Python module
  timeout 120 cmake -S . -B "$FULL" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREADLE_WITH_CUDA=ON -DTREADLE_BUILD_TESTS=ON \
    -DTREADLE_BUILD_PYTHON="$1" -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DPython3_EXECUTABLE="$PYTHON" -DPython_EXECUTABLE="$PYTHON" "${PREFIX[@]}" "${LAUNCH[@]}" >>"$LOG" 2>&1
}
if [ -n "${GPU_CHECK_BUILD:-}" ] || configure_full ON; then
  HAVE_PY=1
elif configure_full OFF; then
  say "SKIP the Python module: configure failed with TREADLE_BUILD_PYTHON=ON (Python headers or pybind11 missing? see gpu_check.log)"
fi
if [ -f "$FULL/build.ninja" ]; then
  targets=(treadle test_cuda)
  [ $HAVE_PY -eq 1 ] && targets+=(_core)
  if timeout 300 cmake --build "$FULL" -j"$JOBS" --target "${targets[@]}" >>"$LOG" 2>&1; then
    HAVE_LIB=1
    EXE=$FULL/cpp/tests/cuda/test_cuda
    say "PASS build of libtreadle, test_cuda$([ $HAVE_PY -eq 1 ] && echo ' and the Python module') (sm_$ARCH, $(($(date +%s) - t0)) s)"
  else
    HAVE_PY=0
    say "FAIL build of libtreadle with TREADLE_WITH_CUDA=ON (see gpu_check.log); falling back to the kernel project"
    tail -30 "$LOG"; FAILED=1
  fi
else
  say "SKIP libtreadle with TREADLE_WITH_CUDA=ON: configure failed (Eigen missing? carry .whl/cmeel_eigen-*.whl)"
fi
if [ $HAVE_LIB -eq 0 ]; then
  if timeout 240 cmake -S cpp/tests/cuda -B "$SOLO" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPython3_EXECUTABLE="$PYTHON" "${LAUNCH[@]}" >>"$LOG" 2>&1 &&
     timeout 240 cmake --build "$SOLO" -j"$JOBS" >>"$LOG" 2>&1; then
    EXE=$SOLO/test_cuda
    say "PASS build of the standalone test_cuda (kernel layer only)"
  else
    say "FAIL build of test_cuda: see gpu_check.log"
    tail -40 "$LOG"; FAILED=1; finish
  fi
fi

# ---- 2. the C++ device tests (kernels, and with the library the core_* tests)
timeout 240 "$EXE" >"$OUT_DIR/test_cuda.txt" 2>&1
rc=$?
cat "$OUT_DIR/test_cuda.txt" >>"$LOG"
judge_tests "$OUT_DIR/test_cuda.txt" $rc "test_cuda$([ $HAVE_LIB -eq 1 ] && echo ' (kernels and core plans)')"

PYENV=(env TREADLE_BUILD_DIR="$FULL" PYTHONPATH="$REPO/python" PYTHONUNBUFFERED=1)
# ---- 3. the op suite on the device
OP_FILES=$(grep -v '^#' "$REPO/tests/cuda_op_suite.txt")  # shared with tests/test_cuda_build.py
if [ $HAVE_PY -eq 1 ] && [ "$(left)" -gt 120 ]; then
  xdist=()
  "$PYTHON" -c "import xdist" 2>/dev/null && xdist=(-n 8)
  # shellcheck disable=SC2086
  timeout $(($(left) > 300 ? 150 : $(left) / 2)) "${PYENV[@]}" TREADLE_TEST_BACKENDS=cuda "$PYTHON" -m pytest -q -rsx \
    -p no:cacheprovider "${xdist[@]}" $OP_FILES >"$OUT_DIR/op_suite.txt" 2>&1
  rc=$?
  counts=$(tail -1 "$OUT_DIR/op_suite.txt")
  uncovered=$(grep -c "cuda gap:" "$OUT_DIR/op_suite.txt")
  nodev=$(grep -c "needs a CUDA device" "$OUT_DIR/op_suite.txt")
  if [ "$nodev" -gt 0 ]; then
    say "SKIP op suite on cuda: the Python module saw no device ($counts)"; FAILED=1
  elif [ $rc -eq 0 ]; then
    say "PASS op suite on cuda: $counts ($uncovered xfail lines for the listed gaps, opcheck.CUDA_GAPS: op_suite.txt)"
  else
    say "FAIL op suite on cuda (exit $rc): $counts"; FAILED=1
    grep -E "^(FAILED|ERROR)" "$OUT_DIR/op_suite.txt" | head -20 | tee -a "$LOG"
  fi
else
  say "SKIP op suite on cuda: no Python module or too little time left"
fi

# ---- 4. training curves against Eigen
if [ $HAVE_PY -eq 1 ] && [ "$(left)" -gt 90 ]; then
  timeout 90 "${PYENV[@]}" "$PYTHON" bench/gpu_curves.py --json "$RESULTS/curves.json" >"$RESULTS/curves.txt" 2>&1
  rc=$?
  cat "$RESULTS/curves.txt" | tee -a "$LOG"
  if [ $rc -eq 0 ] && ! grep -q '^PASS' "$RESULTS/curves.txt"; then
    say "SKIP curves on cuda vs Eigen: no workload ran on the device ($(grep -m1 '^SKIP' "$RESULTS/curves.txt"))"
  elif [ $rc -eq 0 ]; then
    say "PASS curves W1-W6 on cuda vs Eigen: $(grep -c '^PASS' "$RESULTS/curves.txt") agree, $(grep -c '^SKIP' "$RESULTS/curves.txt") not covered"
  else
    say "FAIL curves on cuda vs Eigen (exit $rc): $(grep '^FAIL' "$RESULTS/curves.txt" | awk '{print $2}' | tr '\n' ' ')"; FAILED=1
  fi
else
  say "SKIP curves: no Python module or too little time left"
fi

# ---- 5. data parallel on the device (MPI: on PATH, or the carried mpich wheel installed into build/)
if ! command -v mpicc >/dev/null && ls "$REPO"/.whl/mpich-*.whl >/dev/null 2>&1; then
  # mpi4py (there already) finds this libmpi through LD_LIBRARY_PATH.
  "$PYTHON" -m pip install -q --no-index --no-deps --ignore-installed --prefix "$REPO/build/gpu-mpich" \
    "$REPO"/.whl/mpich-*.whl >>"$LOG" 2>&1 && export PATH="$REPO/build/gpu-mpich/bin:$PATH" \
    LD_LIBRARY_PATH="$REPO/build/gpu-mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -x tools/gpu_dp_check.sh ] && [ $HAVE_LIB -eq 1 ] && [ "$(left)" -gt 150 ]; then
  timeout 150 env DP_BUILD="$FULL" tools/gpu_dp_check.sh "$RESULTS" >"$RESULTS/dp.txt" 2>&1
  rc=$?
  tail -20 "$RESULTS/dp.txt" | tee -a "$LOG"
  if [ $rc -ne 0 ]; then
    say "FAIL data parallel on the device (exit $rc; results.tgz: dp.txt)"; FAILED=1
  elif grep -q 'GPU DP check: PASS' "$RESULTS/dp.txt"; then
    say "PASS data parallel on the device: $(grep -c 'GPU DP check: PASS' "$RESULTS/dp.txt") steps"
  else
    say "SKIP data parallel on the device: $(grep -m1 'SKIP' "$RESULTS/dp.txt")"
  fi
else
  say "SKIP data parallel on the device: no library, or too little time left"
fi

# ---- 6. W1-W6 against PyTorch on the GPU, and the crossover study
if [ $HAVE_PY -eq 1 ] && [ "$(left)" -gt 100 ]; then
  timeout 100 "${PYENV[@]}" "$PYTHON" bench/run.py --device cuda --threads 1 --min-time 0.3 --warmup 0.1 --quiet \
    --out "$RESULTS/workloads" >"$OUT_DIR/workloads.md" 2>>"$LOG"
  rc=$?
  cat "$OUT_DIR/workloads.md" >>"$LOG"
  [ $rc -eq 0 ] && say "PASS W1-W6 vs PyTorch on the GPU (workloads.md)" || say "FAIL W1-W6 benchmark (exit $rc; see gpu_check.log)"
else
  say "SKIP W1-W6 vs PyTorch on the GPU: no Python module or too little time left"
fi
if [ $HAVE_PY -eq 1 ] && [ "$(left)" -gt 80 ]; then
  timeout 70 "${PYENV[@]}" "$PYTHON" bench/crossover.py --quick --backends eigen,cuda --no-plot --quiet \
    --out "$RESULTS/crossover" >"$RESULTS/crossover.txt" 2>&1
  rc=$?
  cat "$RESULTS/crossover.txt" >>"$LOG"
  [ $rc -eq 0 ] && say "PASS crossover eigen vs cuda, quick sweep (results.tgz: crossover/)" ||
    say "FAIL crossover study (exit $rc; results.tgz: crossover.txt)"
else
  say "SKIP crossover study: no Python module or too little time left"
fi

# ---- 7. kernel timings, and torch on the same shapes
if [ "$(left)" -lt 60 ]; then
  say "SKIP bench: too little time left"
elif timeout 120 "$EXE" --bench --json "$RESULTS/bench.json" >>"$LOG" 2>&1 && [ -s "$RESULTS/bench.json" ]; then
  say "PASS bench: $(grep -c '"name"' "$RESULTS/bench.json") kernels timed (bench.json)"
else
  say "FAIL bench (see gpu_check.log)"
fi

if [ "$(left)" -lt 60 ]; then
  say "SKIP torch comparison: too little time left"
elif [ -s "$RESULTS/bench.json" ] && "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout 150 "$PYTHON" - "$RESULTS/bench.json" "$RESULTS/torch.json" >>"$LOG" 2>&1 <<'PY'
import json, sys
import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False  # our f32 linear uses exact float32 products
ours = json.load(open(sys.argv[1]))
dev = "cuda"


def timed(fn):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 20


def shape(rec):
    return [int(v) for v in rec["shape"].strip("()").split(",") if v.strip()]


def conv_case(op, s):
    # Ours: cuDNN with deterministic algorithms, FMA-only math (fp32) or TF32 tensor ops (tensor_op);
    # torch: its cuDNN heuristics with allow_tf32 set to match.
    n, c, h, w, k, kh, kw, stride, pad = s
    tf32 = op.endswith("tensor_op")
    x, wt = torch.rand(n, c, h, w, device=dev), torch.rand(k, c, kh, kw, device=dev)
    b = torch.rand(k, device=dev)
    dy = torch.rand_like(F.conv2d(x, wt, b, stride, pad))

    def with_tf32(fn):
        def call():
            torch.backends.cudnn.allow_tf32 = tf32
            return fn()
        return call
    if op.startswith("conv2d_fwd"):
        return f"torch conv2d + bias (cudnn.allow_tf32={tf32})", with_tf32(lambda: F.conv2d(x, wt, b, stride, pad))
    mask = [True, False, False] if op.startswith("conv2d_bwd_data") else [False, True, False]
    what = "input" if mask[0] else "weight"
    return f"torch convolution_backward, {what} only (cudnn.allow_tf32={tf32})", with_tf32(
        lambda: torch.ops.aten.convolution_backward(dy, x, wt, None, [stride] * 2, [pad] * 2, [1, 1], False,
                                                    [0, 0], 1, mask))


def lstm_case(op, s):
    # Ours: cuDNN's LSTM with FMA-only math; torch: nn.LSTM (cuDNN) with TF32 off.
    t, n, f, h = s
    torch.backends.cudnn.allow_tf32 = False
    lstm = torch.nn.LSTM(f, h).to(dev)
    x = torch.rand(t, n, f, device=dev, requires_grad=op == "lstm_fwd_bwd_fp32")
    dy = torch.rand(t, n, h, device=dev)
    if op == "lstm_fwd_fp32":
        return "torch nn.LSTM forward (training mode)", lambda: lstm(x)
    params = [x] + list(lstm.parameters())
    return "torch nn.LSTM forward + autograd.grad(x, weights)", \
        lambda: torch.autograd.grad(lstm(x)[0], params, dy)


def case(rec):
    op, s = rec["op"], shape(rec)
    if op.startswith("conv2d"):
        return conv_case(op, s)
    if op.startswith("lstm"):
        return lstm_case(op, s)
    aten = torch.ops.aten
    if len(s) == 1:
        x = torch.rand(s, device=dev) * 6 - 3
        dy = torch.rand_like(x)
        y = torch.relu(x)
        table = {"relu": lambda: torch.relu(x), "gelu": lambda: F.gelu(x), "silu": lambda: F.silu(x),
                 "tanh": lambda: torch.tanh(x),
                 "relu_backward": lambda: aten.threshold_backward(dy, y, 0.0),
                 "gelu_backward": lambda: aten.gelu_backward(dy, x), "silu_backward": lambda: aten.silu_backward(dy, x),
                 "tanh_backward": lambda: aten.tanh_backward(dy, y)}
        if op == "adamw":
            p = torch.nn.Parameter(x.clone())
            p.grad = dy
            opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
            return "torch.optim.AdamW(fused=True).step", lambda: opt.step()
        return f"torch {op}", table[op]
    if len(s) == 2:
        rows, cols = s
        x = torch.rand(rows, cols, device=dev) * 10 - 5
        dy = torch.rand_like(x)
        y = torch.softmax(x, -1)
        lab = torch.randint(0, cols, (rows,), device=dev)
        if op == "cross_entropy_backward":
            xr = x.clone().requires_grad_(True)
            return "torch cross_entropy forward+backward (ours: add the two rows)", \
                lambda: torch.autograd.grad(F.cross_entropy(xr, lab), xr)
        table = {"softmax": lambda: torch.softmax(x, -1),
                 "softmax_backward": lambda: aten._softmax_backward_data(dy, y, -1, torch.float32),
                 "cross_entropy": lambda: F.cross_entropy(x, lab), "column_sum": lambda: x.sum(0)}
        return f"torch {op}", table[op]
    n, i, o = s
    bf16 = "bf16" in op  # bf16 (fast math) and bf16_operands (exact rounding) alike
    dt = torch.bfloat16 if bf16 else torch.float32
    x, w = torch.rand(n, i, device=dev, dtype=dt), torch.rand(o, i, device=dev, dtype=dt)
    b, dy = torch.rand(o, device=dev, dtype=dt), torch.rand(n, o, device=dev, dtype=dt)
    note = " (torch: bf16 tensors; ours: f32 tensors, bf16 products)" if bf16 else ""
    if op.startswith("linear_relu"):
        return "torch relu(linear)" + note, lambda: torch.relu(F.linear(x, w, b))
    if op.startswith("linear_dx"):
        return "torch dy @ W" + note, lambda: dy @ w
    return "torch dy^T @ x" + note, lambda: dy.t() @ x


rows = []
print(f"{'kernel':24} {'shape':22} {'treadle ms':>11} {'torch ms':>10} {'torch/treadle':>13}  torch op")
for rec in ours:
    try:
        what, fn = case(rec)
        ms = timed(fn)
    except Exception as e:  # one missing aten op must not hide the rest
        what, ms = f"error: {e}", float("nan")
    rows.append(dict(rec, torch_ms=ms, torch_op=what))
    print(f"{rec['name']:24} {rec['shape']:22} {rec['ms']:11.4f} {ms:10.4f} {ms / rec['ms']:13.2f}  {what}")
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
  if [ $? -eq 0 ]; then
    say "PASS torch comparison (torch.json; table in gpu_check.log)"
  else
    say "FAIL torch comparison (see gpu_check.log)"
  fi
else
  say "SKIP torch comparison: no torch with CUDA under $PYTHON (only our timings)"
fi

# ---- 8. memcheck
if command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 150 ]; then
  timeout 140 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$EXE" >"$OUT_DIR/memcheck.txt" 2>&1
  rc=$?
  tail -5 "$OUT_DIR/memcheck.txt" >>"$LOG"
  case $rc in
    0) say "PASS compute-sanitizer memcheck: no errors" ;;
    3) say "FAIL compute-sanitizer memcheck: $(grep -c 'Invalid\|out of bounds' "$OUT_DIR/memcheck.txt") reports (see gpu_check.log)"
       grep -m 20 -A6 "=========" "$OUT_DIR/memcheck.txt" >>"$LOG"; FAILED=1 ;;
    124) say "SKIP compute-sanitizer memcheck: did not finish in 140 s" ;;
    *) say "SKIP compute-sanitizer memcheck: exit $rc (the tool may not support this machine; see gpu_check.log)" ;;
  esac
  cat "$OUT_DIR/memcheck.txt" >>"$LOG"
  rm -f "$OUT_DIR/memcheck.txt"
else
  say "SKIP compute-sanitizer memcheck: tool missing or too little time left"
fi

finish

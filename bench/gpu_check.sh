#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU, unattended, in under 8 minutes:
#   1. build test_cuda with nvcc for the GPU's architecture (standalone project cpp/tests/cuda: needs
#      CUDA and the NVIDIA cuBLAS/cuDNN wheels or libraries, not Eigen), ccache when present, -j16
#   2. run it: every kernel against float64 host references, the allocator, the status paths
#   3. libtreadle itself with TREADLE_WITH_CUDA=ON and test_cuda inside that build, run with
#      --only core_: the core's training plans (MLP, CNN, CNN with batch norm) compiled for "cuda"
#      against the same plans on Eigen, and the C++ Trainer / Model::predict on "cuda" (with and
#      without CUDA graphs) against training on Eigen (needs Eigen: skipped when CMake cannot find it)
#   4. test_cuda --bench: kernel timings (JSON)
#   5. the same operations in torch on the GPU, when torch with CUDA is importable (else skipped)
#   6. compute-sanitizer memcheck of the tests, when the tool is present (time-boxed)
# Writes into OUT_DIR (first argument, else $OUT, else build/gpu-check): gpu_check.log, test_cuda.txt,
# core_plans.txt, bench.json, torch.json, summary.txt. Prints "== GPU check: ..." lines; exits 1 when a test failed.
# Usage: bench/gpu_check.sh [OUT_DIR]        (PYTHON=... to choose the interpreter holding the wheels)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT_DIR=${1:-${OUT:-$REPO/build/gpu-check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
SUMMARY=$OUT_DIR/summary.txt
: >"$LOG"
: >"$SUMMARY"
START=$(date +%s)
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
JOBS=${JOBS:-16}
BUILD=$REPO/build/gpu-check-solo
FAILED=0

say() { echo "== GPU check: $*" | tee -a "$SUMMARY" "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
# Remaining seconds of the 7.5-minute budget (the caller's limit is 8).
left() { echo $((450 - $(elapsed))); }

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

# ---- 1. build
t0=$(date +%s)
if timeout 240 cmake -S cpp/tests/cuda -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPython3_EXECUTABLE="$PYTHON" "${LAUNCH[@]}" >>"$LOG" 2>&1 &&
   timeout 240 cmake --build "$BUILD" -j"$JOBS" >>"$LOG" 2>&1; then
  say "PASS build of test_cuda (sm_$ARCH, $(($(date +%s) - t0)) s)"
else
  say "FAIL build of test_cuda: see gpu_check.log"
  tail -40 "$LOG"
  exit 1
fi
EXE=$BUILD/test_cuda

# ---- 2. tests
timeout 180 "$EXE" >"$OUT_DIR/test_cuda.txt" 2>&1
rc=$?
cat "$OUT_DIR/test_cuda.txt" | tee -a "$LOG"
if grep -q "^SKIP: no CUDA device" "$OUT_DIR/test_cuda.txt"; then
  say "SKIP test_cuda found no device (see test_cuda.txt)"
  FAILED=1
elif [ $rc -eq 0 ]; then
  say "PASS test_cuda: $(grep '^cuda tests:' "$OUT_DIR/test_cuda.txt")"
else
  say "FAIL test_cuda (exit $rc): $(grep -c '^FAIL' "$OUT_DIR/test_cuda.txt") failing tests: $(grep '^FAIL' "$OUT_DIR/test_cuda.txt" | awk '{print $2}' | tr '\n' ' ')"
  FAILED=1
fi

# ---- 3. libtreadle with CUDA and the core's plans on the device (needs Eigen: the whole library)
# Right after the kernel tests: the core_* tests (training plans compiled for "cuda" against Eigen,
# core_trainer_*: 20-step trainings through the Trainer on "cuda" against Eigen) are the check of the
# backend inside the core; the timings, torch and memcheck get what is left.
if [ "$(left)" -gt 90 ]; then
  t0=$(date +%s)
  if timeout $(($(left) - 60)) bash -c "cmake -S . -B build/gpu-check-full -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTREADLE_WITH_CUDA=ON -DTREADLE_BUILD_TESTS=ON -DCMAKE_CUDA_COMPILER='$NVCC' -DCMAKE_CUDA_ARCHITECTURES='$ARCH' \
      -DPython3_EXECUTABLE='$PYTHON' ${LAUNCH[*]} && cmake --build build/gpu-check-full -j$JOBS --target treadle test_cuda" \
      >>"$LOG" 2>&1; then
    say "PASS libtreadle and test_cuda with TREADLE_WITH_CUDA=ON ($(($(date +%s) - t0)) s)"
    timeout 120 build/gpu-check-full/cpp/tests/cuda/test_cuda --only core_ >"$OUT_DIR/core_plans.txt" 2>&1
    rc=$?
    cat "$OUT_DIR/core_plans.txt" | tee -a "$LOG"
    if grep -q "^SKIP: no CUDA device" "$OUT_DIR/core_plans.txt"; then
      say "SKIP core plans on the device: no device (see core_plans.txt)"
      FAILED=1
    elif [ $rc -eq 0 ]; then
      say "PASS core plans on the device: $(grep '^cuda tests:' "$OUT_DIR/core_plans.txt")"
    else
      say "FAIL core plans on the device (exit $rc): $(grep '^FAIL' "$OUT_DIR/core_plans.txt" | awk '{print $2}' | tr '\n' ' ')"
      FAILED=1
    fi
  else
    say "SKIP libtreadle with TREADLE_WITH_CUDA=ON: configure/build failed or timed out (Eigen missing? see gpu_check.log)"
  fi
else
  say "SKIP libtreadle with TREADLE_WITH_CUDA=ON and the core plans: too little time left"
fi

# ---- 4. our timings
if [ "$(left)" -lt 60 ]; then
  say "SKIP bench: too little time left"
elif timeout 120 "$EXE" --bench --json "$OUT_DIR/bench.json" >>"$LOG" 2>&1 && [ -s "$OUT_DIR/bench.json" ]; then
  say "PASS bench: $(grep -c '"name"' "$OUT_DIR/bench.json") kernels timed (bench.json)"
else
  say "FAIL bench (see gpu_check.log)"
fi

# ---- 5. torch on the same shapes
if [ "$(left)" -lt 60 ]; then
  say "SKIP torch comparison: too little time left"
elif [ -s "$OUT_DIR/bench.json" ] && "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout 150 "$PYTHON" - "$OUT_DIR/bench.json" "$OUT_DIR/torch.json" >>"$LOG" 2>&1 <<'PY'
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

# ---- 6. memcheck
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

say "done in $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'all device tests passed' || echo 'SOMETHING FAILED')"
exit $FAILED

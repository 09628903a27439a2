"""Training curves on a device backend against the Eigen reference: `python bench/gpu_curves.py`.

Each benchmark workload (bench/workloads.py: MLPs, the CNN, the LSTM regressor, the transformer
encoder) is built twice with the same initial parameters; one copy trains on `--backend` (default
"cuda"), the other on "eigen", both with Adam on one fixed batch through the Python
`Trainer`. Compared: every step's loss, the predictions after training, and every parameter. A
workload whose plan needs an op the backend does not cover is reported as SKIP with the op named
(the CUDA backend has no fallback), not as a failure.

Prints one `PASS|FAIL|SKIP <workload> <detail>` line per workload and writes the curves to --json.
Exit status 1 when a workload failed. `--backend eigen` runs the harness against itself (the test
suite does, so this script keeps working on machines without a GPU).
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
try:
    import treadle as tl
except ImportError:
    sys.path.insert(0, str(here.parent / "python"))
    import treadle as tl
import workloads  # noqa: E402 (this folder's workload list)

NOT_COVERED = ("no CUDA kernel", "needs a CUDA device")


def _batches(w, steps, rng):
    """One fixed batch, every step: the loss must fall (the model fits it), so a curve that rises
    is a failure of the harness, not noise."""
    x = rng.standard_normal((w.batch,) + tuple(w.sample_shape)).astype(np.float32)
    if w.loss == "mse":
        y = rng.standard_normal((w.batch, w.out_features)).astype(np.float32)
    else:
        y = rng.integers(0, w.out_features, size=w.batch).astype(np.int64)
    return [x] * steps, [y] * steps


def _trained(w, backend, state, xs, ys, lr):
    model = w.build_treadle(tl)
    model.load_state_dict(state)
    model.set_backend(backend)
    loss = tl.loss.MSE() if w.loss == "mse" else tl.loss.CrossEntropy()
    trainer = tl.Trainer(model, loss, tl.optim.Adam(lr=lr))
    curve = [float(trainer.step(x, y)) for x, y in zip(xs, ys)]
    return curve, model.predict(xs[0]), {k: np.array(v) for k, v in model.state_dict().items()}


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b))))) if a.size else 0.0


def compare(w, backend, steps, tol, seed=0, lr=1e-3):
    """(status, detail, record) for one workload."""
    rng = np.random.default_rng(seed)
    init = w.build_treadle(tl)
    state = {k: np.array(v) for k, v in init.state_dict().items()}
    xs, ys = _batches(w, steps, rng)
    try:
        dev = _trained(w, backend, state, xs, ys, lr)
    except ValueError as e:
        if any(s in str(e) for s in NOT_COVERED):
            return "SKIP", f"not on {backend}: {e}", None
        raise
    ref = _trained(w, "eigen", state, xs, ys, lr)
    errors = {"loss": _rel(dev[0], ref[0]), "predict": _rel(dev[1], ref[1]),
              "parameters": max(_rel(dev[2][k], ref[2][k]) for k in ref[2])}
    record = {"workload": w.name, "title": w.title, "backend": backend, "steps": steps, "tolerance": tol,
              "loss_backend": dev[0], "loss_eigen": ref[0], "rel_errors": errors}
    worst = max(errors, key=errors.get)
    detail = (f"{steps} Adam steps, loss {ref[0][0]:.5g} -> {ref[0][-1]:.5g}; largest relative difference "
              f"{errors[worst]:.2e} ({worst}; tolerance {tol:g})")
    falling = ref[0][-1] < ref[0][0]
    ok = errors[worst] <= tol and falling
    if not falling:
        detail += "; the reference loss did not fall"
    return ("PASS" if ok else "FAIL"), detail, record


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tol", type=float, default=1e-4, help="largest relative difference (float32, 20 steps)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    by_name = {w.name: w for w in workloads.all_workloads()}
    records, failed = [], 0
    for name in [n for n in args.workloads.split(",") if n]:
        w = by_name[name]
        try:
            status, detail, record = compare(w, args.backend, args.steps, args.tol)
        except Exception as e:  # noqa: BLE001 (one broken workload must not hide the others)
            status, detail, record = "FAIL", f"{type(e).__name__}: {e}", None
        failed += status == "FAIL"
        print(f"{status} {name} {detail}", flush=True)
        if record:
            records.append(record)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m treadle verify`: checks this installation's ops on this machine, without torch.

For every op in the catalog (treadle/verify_cases.py: one or more small cases per forward op) it runs
- a float64 central-difference check of the Eigen reference's gradients, and
- every other backend and dtype this build has and this machine can run (Eigen in float32, oneDNN,
  CUDA with a device) against that float64 reference, outputs and input gradients alike,
each on fresh random inputs, at the test suite's tolerances. It prints a matrix (a row per case, a
column per check, each cell the worst error as a fraction of its tolerance: at most 1 passes), can
write the same as JSON, and exits with status 1 if any check fails. It also reports the build and
that the run started no thread (the thread count before and after must agree).
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np

from . import _core
from .verify_cases import CASES

# Central differences (h = 1e-6) of f = sum(go * out) carry rounding noise of about eps * |f| / h: the
# absolute tolerance grows with the magnitude of the summed outputs (as tests/opcheck.py does).
FD_STEP, FD_RTOL, FD_ATOL, FD_NOISE = 1e-6, 1e-6, 1e-9, 4e-10
# Against the float64 reference, relative to each tensor's scale (sums of products cancel).
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
QUICK_ELEMENTS = 6  # finite differences on this many elements per input with --quick


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: the Python-visible count
        return threading.active_count()


def usable_backends():
    """The backends built into this library that can run here ("cuda" needs a device)."""
    usable = []
    for b in _core.backends():
        if b == "cuda":
            try:
                _core.run_op("relu", [np.ones(1, np.float32)], {}, None, "cuda", True, 0)
            except ValueError:
                continue
        usable.append(b)
    return usable


def _run(case, inputs, grad_outputs, backend):
    return _core.run_op(case.op, list(inputs), dict(case.attrs), grad_outputs, backend, case.training, 0)


class Declined(Exception):
    """The backend ran none of the case's nodes on this machine (the CPU lacks the kernel, or the
    backend does not take these shapes)."""


def _run_pinned(case, inputs, grad_outputs, backend):
    """The case on `backend` with every kernel it has, also below its profitability thresholds (the
    planner would give such small shapes to Eigen): the backend's own kernels are what is checked."""
    outputs, grads, plan = _core.run_op(case.op, list(inputs), dict(case.attrs), grad_outputs, backend,
                                        case.training, 0, 1, True, True)
    ran = [line for line in plan.splitlines() if f"[{backend}]" in line]
    if backend != "eigen" and not ran:
        why = [line.split("#", 1)[1].strip() for line in plan.splitlines() if "#" in line]
        raise Declined(why[0] if why else f"{backend} took none of these nodes: it lists the op, but not for "
                       "these attributes or this plan (its LSTM serves inference plans, which keep no gates)")
    return outputs, grads


def _upstream(case, outputs, rng):
    chosen = case.grad_outputs if case.grad_outputs is not None else (0,)
    return [rng.standard_normal(o.shape) if k in chosen else None for k, o in enumerate(outputs)]


def _objective(outputs, grad_outputs):
    return sum(float(np.sum(g * o)) for g, o in zip(grad_outputs, outputs) if g is not None)


def gradcheck(case, inputs, grad_outputs, quick, rng):
    """Worst |analytic - numeric| / tolerance over the case's differentiable inputs (float64, Eigen)."""
    outputs, analytic = _run(case, inputs, grad_outputs, "eigen")
    magnitude = sum(float(np.sum(np.abs(g * o))) for g, o in zip(grad_outputs, outputs) if g is not None)
    atol = max(FD_ATOL, FD_NOISE * magnitude)
    worst = 0.0
    for i in case.wrt:
        if analytic[i] is None:
            raise AssertionError(f"no gradient for input {i}")
        flat = inputs[i].reshape(-1)
        elements = range(flat.size)
        if quick and flat.size > QUICK_ELEMENTS:
            elements = rng.choice(flat.size, QUICK_ELEMENTS, replace=False)
        for j in elements:
            original = flat[j]
            values = []
            for h in (FD_STEP, -FD_STEP):
                flat[j] = original + h
                values.append(_objective(_run(case, inputs, None, "eigen")[0], grad_outputs))
            flat[j] = original
            numeric = (values[0] - values[1]) / (2 * FD_STEP)
            got = float(analytic[i].reshape(-1)[j])
            worst = max(worst, abs(got - numeric) / (atol + FD_RTOL * abs(numeric)))
    return worst


def _fraction(got, ref, rtol):
    """Worst |got - ref| / (rtol * (|ref| + scale)), scale the tensor's largest magnitude (at least 1)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape}, the reference has {ref.shape}")
    if got.size == 0:
        return 0.0
    finite, infinite = np.isfinite(ref), np.isinf(ref)
    if np.any(np.isnan(got) != np.isnan(ref)) or np.any(np.isinf(got) != infinite) or \
            np.any(got[infinite] != ref[infinite]):
        return float("inf")  # NaN and Inf where the reference has them, and only there
    scale = max(1.0, float(np.max(np.abs(ref[finite]), initial=0.0)))
    return float(np.max(np.abs(got[finite] - ref[finite]) / (rtol * (np.abs(ref[finite]) + scale)), initial=0.0))


def compare(case, inputs, grad_outputs, reference, backend, dtype):
    """Worst error of `backend` in `dtype` against the float64 reference, outputs and gradients."""
    cast = [x.astype(dtype) if x.dtype.kind == "f" else x for x in inputs]
    grads = [None if g is None else g.astype(dtype) for g in grad_outputs]
    outputs, input_grads = _run_pinned(case, cast, grads, backend)
    ref_outputs, ref_grads = reference
    rtol = TOLERANCE[dtype]
    worst = 0.0
    for k, (got, ref) in enumerate(zip(outputs, ref_outputs)):
        if np.asarray(ref).dtype.kind != "f":  # indices: exact
            if not np.array_equal(got, ref):
                return float("inf")
            continue
        worst = max(worst, _fraction(got, ref, rtol))
    for i in case.wrt:
        worst = max(worst, _fraction(input_grads[i], ref_grads[i], rtol))
    return worst


def columns(backends):
    """("fd", "eigen", "float64") first, then every backend x dtype it lists (float32/float64), the
    float64 Eigen reference itself excepted."""
    cols = [("finite differences", "eigen", "float64")]
    for b in backends:
        listed = _core.backend_ops(b)
        dtypes = sorted({d for ds in listed.values() for d in ds} & set(TOLERANCE), reverse=True)
        cols += [(f"{b} {d}", b, d) for d in dtypes if (b, d) != ("eigen", "float64")]
    return cols


def run(quick=False, ops=None, backends=None, seed=0, progress=None):
    """The verification matrix: {"build", "threads", "columns", "rows": [{case, op, cells: {column:
    fraction, None (no kernel listed), {"declined": why} (none this CPU runs) or an error message}}],
    "failures": [...], "seconds"}."""
    from . import info

    started, threads_before = time.perf_counter(), _threads()
    available = usable_backends()
    chosen = available if not backends else [b for b in available if b in backends]
    unknown = sorted(set(backends or ()) - set(_core.backends()))
    if unknown:
        raise ValueError(f"verify: unknown backend(s) {unknown}; this build has {_core.backends()}")
    cols = columns(chosen)
    cases = [c for c in CASES if not ops or c.op in ops]
    missing = sorted(set(ops or ()) - {c.op for c in CASES})
    if missing:
        raise ValueError(f"verify: no case for {missing}; the catalog covers {sorted({c.op for c in CASES})}")
    listed = {b: _core.backend_ops(b) for b in chosen}
    rows, failures = [], []
    for n, case in enumerate(cases):
        rng = np.random.default_rng([seed, n])
        inputs = case.make_inputs(rng)
        reference_out, _ = _run(case, inputs, None, "eigen")
        grad_outputs = _upstream(case, reference_out, rng)
        reference = _run(case, inputs, grad_outputs, "eigen")
        cells = {}
        for title, backend, dtype in cols:
            if backend != "eigen" and dtype not in listed[backend].get(case.op, ()):
                cells[title] = None  # no kernel there: the plan would fall back to Eigen, checked already
                continue
            try:
                if title == "finite differences":
                    value = gradcheck(case, [x.copy() for x in inputs], grad_outputs, quick, rng) if case.wrt else 0.0
                else:
                    value = compare(case, inputs, grad_outputs, reference, backend, dtype)
            except Declined as e:  # not a failure: nothing of that backend ran here
                cells[title] = {"declined": str(e)}
                continue
            except Exception as e:  # a kernel that raises fails its cell, named
                value = f"{type(e).__name__}: {e}"
            cells[title] = value
            if isinstance(value, str) or not value <= 1.0:
                failures.append({"case": case.name, "op": case.op, "check": title, "backend": backend,
                                 "dtype": dtype, "error": value})
        rows.append({"case": case.name, "op": case.op, "cells": cells})
        if progress:
            progress(n + 1, len(cases))
    threads_after = _threads()
    if threads_after != threads_before:
        failures.append({"case": "-", "op": "-", "check": "threads", "backend": "-", "dtype": "-",
                         "error": f"the run changed the thread count from {threads_before} to {threads_after}"})
    return {"build": info(), "quick": quick, "threads": {"before": threads_before, "after": threads_after},
            "columns": [title for title, _b, _d in cols], "rows": rows, "failures": failures,
            "seconds": round(time.perf_counter() - started, 2)}


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, dict):
        return "n/a"
    if isinstance(value, str):
        return "ERROR"
    return f"{value:.2g}" if value <= 1.0 else f"FAIL {value:.3g}"


def table(report):
    """The matrix as text: worst error as a fraction of tolerance; '-' where the backend has no kernel."""
    cols = report["columns"]
    width = max(len(r["case"]) for r in report["rows"]) if report["rows"] else 4
    widths = [max(len(c), 8) for c in cols]
    lines = ["  ".join([f"{'case':<{width}}"] + [f"{c:>{w}}" for c, w in zip(cols, widths)])]
    for r in report["rows"]:
        cells = [f"{_cell(r['cells'][c]):>{w}}" for c, w in zip(cols, widths)]
        lines.append("  ".join([f"{r['case']:<{width}}"] + cells))
    return "\n".join(lines)


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true",
                        help=f"finite differences on {QUICK_ELEMENTS} elements per input instead of all")
    parser.add_argument("--ops", help="comma-separated op names (default: every op in the catalog)")
    parser.add_argument("--backend", help="comma-separated backends to compare (default: every usable one)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def main(args):
    split = lambda text: [s for s in (text or "").split(",") if s]  # noqa: E731
    try:
        report = run(quick=args.quick, ops=split(args.ops), backends=split(args.backend), seed=args.seed,
                     progress=lambda i, n: print(f"\rverify: {i}/{n} cases", end="", file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"\n{e}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    build = report["build"]
    print(f"treadle {build['version']}: backends {build['backends']}; " +
          "; ".join(f"{k} {v}" for k, v in build.items() if k not in ("version", "backends")))
    print(f"threads: {report['threads']['before']} before, {report['threads']['after']} after")
    print("cells: worst error as a fraction of its tolerance (at most 1 passes); '-': the backend lists no kernel "
          "for the op; 'n/a': it declined these shapes on this machine (--json says why)")
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    checks = sum(1 for r in report["rows"] for v in r["cells"].values() if v is not None and not isinstance(v, dict))
    if report["failures"]:
        print(f"\nFAILED: {len(report['failures'])} of {checks} checks ({report['seconds']} s)")
        for f in report["failures"]:
            print(f"  {f['case']} [{f['check']}]: {f['error']}")
        return 1
    print(f"\nall {checks} checks passed ({report['seconds']} s)")
    return 0

"""Pooling and normalisation: Eigen against oneDNN, per op and size (`python bench/onednn_norm_pool.py`).

Each case is a small model trained for a few steps on each backend (pinned with set_backend); the
profiler (tl.profile) gives the time of every kernel call of the op's forward and backward nodes, so
the numbers are per op, without the rest of the step. treadle computes on the calling thread only
(one core). The two backends run in alternating rounds; a round's time per call is its kernel time
divided by its calls, scaled to CPU time (the round's thread CPU time / wall time), and the table
gives the median over rounds. Eval-mode ops (batch_norm_eval) are timed through predict.

Writes bench/results/onednn-norm-pool-<time>.{json,md} (and latest-onednn-norm-pool.*) and prints
the markdown table. Needs a build with -DTREADLE_WITH_ONEDNN=ON.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import treadle as tl

# (name, builder() -> (module, input shape), eval mode) ; the 1x1 convolution in front of a pool
# gives it an input gradient, so that its backward op runs too.


def pool_case(kind, n, c, hw, **opts):
    def build():
        pool = tl.nn.MaxPool2d(**opts) if kind == "max" else tl.nn.AvgPool2d(**opts)
        return tl.nn.Sequential(tl.nn.Conv2d(c, c, 1), pool), (n, c, hw, hw)
    extra = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in opts.items())
    return (f"{kind}_pool2d {n}x{c}x{hw}x{hw} {extra}", build, False)


def adaptive_case(n, c, hw, out):
    def build():
        return tl.nn.Sequential(tl.nn.Conv2d(c, c, 1), tl.nn.AdaptiveAvgPool2d(out)), (n, c, hw, hw)
    return (f"adaptive_avg_pool2d {n}x{c}x{hw}x{hw} -> {out}", build, False)


def layer_norm_case(rows, width):
    return (f"layer_norm {rows}x{width}", lambda: (tl.nn.LayerNorm(width), (rows, width)), False)


def group_norm_case(n, c, hw, groups):
    def build():
        return tl.nn.Sequential(tl.nn.Conv2d(c, c, 1), tl.nn.GroupNorm(groups, c)), (n, c, hw, hw)
    return (f"group_norm {n}x{c}x{hw}x{hw} groups={groups}", build, False)


def batch_norm_case(n, c, hw, eval_mode):
    def build():
        return tl.nn.BatchNorm2d(c), (n, c, hw, hw)
    return (f"batch_norm{'_eval' if eval_mode else ''} {n}x{c}x{hw}x{hw}", build, eval_mode)


CASES = ([layer_norm_case(r, w) for r, w in [(8, 32), (16, 64), (64, 64), (32, 256), (256, 256), (4096, 256),
                                               (512, 1024), (64, 4096)]]
         + [pool_case(kind, n, c, hw, **opts)
            for kind in ("max", "avg")
            for (n, c, hw) in [(2, 4, 8), (8, 8, 16), (32, 16, 28), (8, 64, 56), (64, 32, 28), (64, 64, 14)]
            for opts in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1))]
         + [pool_case("avg", 32, 16, 28, kernel_size=3, stride=2, padding=1, count_include_pad=False)]
         + [adaptive_case(8, 64, hw, out) for hw, out in [(7, 1), (14, 1), (16, 1), (28, 1), (14, 7)]]
         + [group_norm_case(n, c, hw, 8) for (n, c, hw) in [(2, 16, 8), (32, 32, 8), (8, 64, 28)]]
         + [batch_norm_case(n, c, hw, ev) for ev in (False, True) for (n, c, hw) in [(8, 8, 8), (32, 64, 14)]])


def trainer_for(module, backend):
    module.set_backend(backend)
    return tl.Trainer(module, tl.loss.MSE(), tl.optim.SGD(lr=1e-6))


def round_times(run, steps):
    """CPU seconds per call of each (op, pass) node over `steps` runs, and the backends that ran it.

    The profiler's kernel times are wall time; they are scaled by the round's CPU time / wall time
    of the calling thread (treadle computes on it alone), which removes the time slices other
    processes of a shared machine took."""
    with tl.profile() as prof:
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            run()
        cpu_share = (time.thread_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    times, backends = {}, {}
    for node in prof.nodes():
        key = (node["op"], node["pass"])
        t, c = times.get(key, (0.0, 0))
        times[key] = (t + node["seconds"], c + node["calls"])
        backends.setdefault(key, set()).add(node["backend"])
    return {k: min(1.0, cpu_share) * t / c for k, (t, c) in times.items()}, backends


def measure(case, rounds, round_seconds, seed=0):
    name, build, eval_mode = case
    rng = np.random.default_rng(seed)
    runners = {}
    for backend in ("eigen", "onednn"):
        tl.manual_seed(seed)
        module, shape = build()
        x = rng.standard_normal(shape).astype(np.float32)
        if eval_mode:
            module.set_backend(backend)
            runners[backend] = lambda m=module, x=x: m.predict(x)
        else:
            trainer = trainer_for(module, backend)
            y = module.predict(x)
            target = rng.standard_normal(y.shape).astype(np.float32)
            runners[backend] = lambda t=trainer, x=x, y=target: t.step(x, y)
        runners[backend]()  # compile
    steps = {}
    for backend, run in runners.items():
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < round_seconds / 4:
            run()
            n += 1
        steps[backend] = max(1, int(n * 4))
    samples, used = {}, {}
    for _ in range(rounds):
        for backend, run in runners.items():
            per_call, backends = round_times(run, steps[backend])
            for key, t in per_call.items():
                samples.setdefault(backend, {}).setdefault(key, []).append(t)
                used.setdefault(backend, {})[key] = sorted(backends[key])
    median = {b: {k: float(np.median(v)) for k, v in per.items()} for b, per in samples.items()}
    return name, median, used


def op_keys(name, best):
    op = name.split()[0]
    ops = {"max_pool2d": ("max_pool", "max_pool_backward"), "avg_pool2d": ("avg_pool", "avg_pool_backward"),
           "layer_norm": ("layer_norm", "layer_norm_backward"), "batch_norm": ("batch_norm", "batch_norm_backward"),
           "batch_norm_eval": ("batch_norm_eval", None),
           "adaptive_avg_pool2d": ("adaptive_avg_pool", "adaptive_avg_pool_backward"),
           "group_norm": ("group_norm", "group_norm_backward")}[op]
    return [k for k in best["eigen"] if k[0] in ops]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--round-seconds", type=float, default=0.05)
    p.add_argument("--filter", default="", help="only cases whose name contains this")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    if "onednn" not in tl.backends():
        sys.exit("onednn_norm_pool: this build has no oneDNN backend (TREADLE_WITH_ONEDNN=OFF)")
    rows = []
    for case in CASES:
        if args.filter not in case[0]:
            continue
        name, best, used = measure(case, args.rounds, args.round_seconds)
        for key in op_keys(name, best):
            e, o = best["eigen"][key], best["onednn"].get(key, float("nan"))
            rows.append({"case": name, "op": key[0], "pass": key[1], "eigen_us": e * 1e6, "onednn_us": o * 1e6,
                         "ratio": e / o, "onednn_backend": "+".join(used["onednn"].get(key, []))})
            r = rows[-1]
            print(f"{name:55s} {key[0]:22s} eigen {r['eigen_us']:9.1f} us  onednn {r['onednn_us']:9.1f} us "
                  f"({r['onednn_backend']})  eigen/onednn {r['ratio']:.2f}", flush=True)
    md = ["| case | op | eigen (us) | onednn (us) | eigen / onednn | node ran on |", "|---|---|---|---|---|---|"]
    md += [f"| {r['case']} | {r['op']} | {r['eigen_us']:.1f} | {r['onednn_us']:.1f} | {r['ratio']:.2f} | "
           f"{r['onednn_backend']} |" for r in rows]
    text = "\n".join(md)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    meta = {"machine": platform.processor() or platform.machine(), "rounds": args.rounds, "time": stamp,
            "clock": "kernel time per call (profiler) scaled to thread CPU time, median over alternating rounds",
            "load_average": list(os.getloadavg())}
    for stem in (f"onednn-norm-pool-{stamp}", "latest-onednn-norm-pool"):
        (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / f"{stem}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

"""oneDNN backend vs Eigen vs PyTorch on the MLP training step (workloads W2 and W3), 1 and 2 threads.

    TREADLE_BUILD_DIR=$PWD/build/onednn PYTHONPATH=$PWD/python python bench/onednn_mlp.py [--min-time 1]

Three runners on the same weights and data, timed in alternating rounds (as treadle.bench does):
treadle pinned to "eigen", treadle pinned to "onednn" (nodes oneDNN does not take fall back to
Eigen), and PyTorch with torch.set_num_threads(1). A training step is zero-grad + forward +
cross-entropy + backward + Adam. Before timing, the first-step losses of all three must agree.
Each round records wall time and the calling thread's CPU time (time.thread_time). At 1 thread all
three run every step on the calling thread (treadle starts no threads; torch at 1 thread computes
on the caller), so CPU time is the robust measure on a shared, loaded machine, where wall time
counts the time slices other processes take; the 1-thread rows give it. With T > 1 threads,
treadle gets a tl.PoolExecutor over a concurrent.futures pool of T workers (the host's threads)
and torch.set_num_threads(T); those rows give wall time. Medians per step.
Writes bench/results/onednn_mlp.{json,md} and prints the table.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

here = Path(__file__).resolve().parent
try:
    import treadle as tl
except ImportError:
    sys.path.insert(0, str(here.parent / "python"))
    import treadle as tl
import treadle.bench as tb  # noqa: E402

sys.path.insert(0, str(here))
import workloads  # noqa: E402

LOSS_TOL = 1e-4


def build(w, torch, seed, executor=None):
    """(torch model, torch optimizer, {backend: trainer}, x, y) with identical initial weights."""
    torch.manual_seed(seed)
    tmodel = w.build_torch(torch).float().train()
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    trainers = {}
    for backend in ("eigen", "onednn"):
        model = w.build_treadle(tl)
        model.load_state_dict(state)
        model.set_backend(backend)
        trainers[backend] = tl.Trainer(model, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3), executor=executor)
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-3)
    x, y = tb._data(w, np.random.default_rng(seed))
    return tmodel, topt, trainers, x, y


def time_alternating(runners, min_time, warmup=0.3, settle=0.02):
    """Median wall and CPU seconds per step of each runner; rounds of ~10 ms alternate between them.

    Each round starts with `settle` seconds of untimed steps: a framework that ran just before may
    leave its OpenMP workers spinning on the other core (measured: after torch.mm with 2 threads, a
    2-worker bf16 product of treadle took 5.9, 5.0, 4.2 ms in its first three calls, then 2.7 ms,
    as with OMP_WAIT_POLICY=PASSIVE from the first call), which would be charged to whoever runs
    next. That is the two-runtimes contention of one node, not either framework's speed."""
    per_round = {}
    for name, run in runners.items():  # warm, then size the rounds from warm steps
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            run(1)
        per_round[name] = tb._steps_per_round(run)
    wall = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    spent = dict.fromkeys(runners, 0.0)
    while min(spent.values()) < min_time:
        for name, run in runners.items():
            k = per_round[name]
            t_settled = time.perf_counter() + settle
            while time.perf_counter() < t_settled:
                run(1)
            w0, c0 = time.perf_counter(), time.thread_time()
            run(k)
            c1, w1 = time.thread_time(), time.perf_counter()
            wall[name].append((w1 - w0) / k)
            cpu[name].append((c1 - c0) / k)
            spent[name] += w1 - w0
    return {name: {"wall_s": float(np.median(wall[name])), "cpu_s": float(np.median(cpu[name])),
                   "cpu_min_s": float(np.min(cpu[name]))} for name in runners}


def bench(w, torch, min_time, threads=1, executor=None, seed=0):
    torch.set_num_threads(threads)
    tmodel, topt, trainers, x, y = build(w, torch, seed, executor)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    tloss = torch.nn.CrossEntropyLoss()

    def torch_step():
        topt.zero_grad(set_to_none=True)
        loss = tloss(tmodel(tx), ty)
        loss.backward()
        topt.step()
        return loss.item()

    first = {"torch": torch_step()}
    for name, tr in trainers.items():
        first["treadle-" + name] = tr.step(x, y)
    ok = all(abs(v - first["torch"]) <= LOSS_TOL * max(1.0, abs(first["torch"])) for v in first.values())
    if not ok:
        return {"workload": w.name, "status": "mismatch", "first_loss": first}

    def runner(step):
        def run(k):
            for _ in range(k):
                step()
        return run

    runners = {"treadle-" + name: runner(lambda tr=tr: tr.step(x, y)) for name, tr in trainers.items()}
    runners["torch"] = runner(torch_step)
    timing = time_alternating(runners, min_time)
    flops = 3 * w.forward_flops * w.batch
    measure = "cpu_s" if threads == 1 else "wall_s"
    return {"workload": w.name, "title": w.title, "batch": w.batch, "threads": threads, "status": "ok",
            "first_loss": first, "measure": "cpu" if threads == 1 else "wall",
            "us": {k: v[measure] * 1e6 for k, v in timing.items()},
            "wall_us": {k: v["wall_s"] * 1e6 for k, v in timing.items()},
            "best_us": {k: v["cpu_min_s"] * 1e6 for k, v in timing.items()},
            "gflops": {k: flops / v[measure] / 1e9 for k, v in timing.items()},
            "plan": trainers["onednn"].model._compiled().describe_plans()}


def gemm_peak(torch, n=1024, min_time=0.5):
    """float32 GEMM n^3 in GFLOP/s (CPU time, 1 thread): treadle Linear predict per backend, torch.mm."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    out = np.empty((n, n), np.float32)
    runners = {}
    for backend in ("eigen", "onednn"):
        layer = tl.nn.Linear(n, n, bias=False)
        layer.set_backend(backend)
        runners["treadle-" + backend] = lambda k, layer=layer: [layer.predict(a, out=out) for _ in range(k)]
    ta, tb = torch.from_numpy(a), torch.from_numpy(a.copy())
    runners["torch"] = lambda k: [torch.mm(ta, tb) for _ in range(k)]
    timing = time_alternating(runners, min_time)
    return {k: 2 * n ** 3 / v["cpu_s"] / 1e9 for k, v in timing.items()}


def markdown(rows, peak=None):
    lines = ["Training step (us): median CPU time of the calling thread at 1 thread, median wall time at 2+.", "",
             "| workload | threads | treadle eigen | treadle onednn | torch | onednn vs eigen | torch / onednn | "
             "GFLOP/s onednn | GFLOP/s torch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['workload']} | {r.get('threads', '')} | {r['status']} | | | | | | |")
            continue
        u, g = r["us"], r["gflops"]
        lines.append(f"| {r['workload']} {r['title']}, batch {r['batch']} | {r['threads']} | {u['treadle-eigen']:.1f} | "
                     f"{u['treadle-onednn']:.1f} | {u['torch']:.1f} | {u['treadle-eigen'] / u['treadle-onednn']:.2f}x | "
                     f"{u['torch'] / u['treadle-onednn']:.2f}x | {g['treadle-onednn']:.1f} | {g['torch']:.1f} |")
    if peak:
        lines += ["", "float32 GEMM 1024^3, 1 thread (GFLOP/s): " +
                  ", ".join(f"{k} {v:.0f}" for k, v in peak.items())]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per runner")
    p.add_argument("--workloads", default="W2,W3")
    p.add_argument("--threads", default="1,2", help="thread counts (treadle: pool workers; torch: set_num_threads)")
    p.add_argument("--out", default=str(here / "results"))
    args = p.parse_args(argv)
    if "onednn" not in tl.backends():
        print("treadle was built without oneDNN (TREADLE_WITH_ONEDNN=ON); nothing to compare", file=sys.stderr)
        return 2
    import concurrent.futures
    import torch
    wanted = args.workloads.split(",")
    rows = []
    for t in (int(v) for v in args.threads.split(",")):
        pool = concurrent.futures.ThreadPoolExecutor(t) if t > 1 else None
        executor = tl.PoolExecutor(pool, t) if pool else None
        rows += [bench(w, torch, args.min_time, t, executor) for w in workloads.all_workloads() if w.name in wanted]
        if pool:
            pool.shutdown()
    torch.set_num_threads(1)
    peak = gemm_peak(torch)
    table = markdown(rows, peak)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    result = {"machine": tb.machine_info(), "loadavg": os.getloadavg()[0], "rows": rows, "gemm_gflops": peak}
    Path(args.out, "onednn_mlp.json").write_text(json.dumps(result, indent=1))
    Path(args.out, "onednn_mlp.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

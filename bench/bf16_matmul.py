"""bf16 matrix products: treadle's oneDNN bf16 path vs torch.mm on bf16 tensors, 1 and 2 threads.

    TREADLE_BUILD_DIR=$PWD/build/onednn PYTHONPATH=$PWD/python python bench/bf16_matmul.py [--min-time 1]

An n x n x n product (n = 1024, 2048): treadle runs a bias-free Linear(n, n) with
set_precision("bf16") pinned to oneDNN, predicting into a preallocated output (float32 in, both
operands converted to bf16 on every call, weights included, float32 out); torch runs
torch.mm(a, b) on bf16 tensors converted once beforehand (bf16 out). The float32 products of both
(treadle's oneDNN Linear, torch.mm on float32) run in the same rounds for context. Runners
alternate in rounds (bench/onednn_mlp.py's timing); medians per call. At 1 thread every runner
computes on the calling thread, so the median CPU time of that thread is the measure (robust on a
shared machine); at 2 threads treadle gets a tl.PoolExecutor over a 2-worker concurrent.futures
pool (the host's threads) through a Context, torch set_num_threads(2), and wall time is the measure.

A training step (W3: MLP 1024-1024x3-10, relu, batch 256, cross-entropy, Adam; same weights and
data) at 1 thread, CPU time: treadle on oneDNN in float32 and with set_precision("bf16"), torch in
float32 and under torch.autocast("cpu", bfloat16) (its CPU mixed precision: products in bf16).

Writes bench/results/bf16_matmul.{json,md} and prints the tables.
"""
import argparse
import concurrent.futures
import json
import os
import sys
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
from onednn_mlp import time_alternating  # noqa: E402
import workloads  # noqa: E402


def treadle_runner(n, precision, a, out, ctx):
    layer = tl.nn.Linear(n, n, bias=False)
    layer.set_backend("onednn").set_precision(precision)
    layer.predict(a, out=out, context=ctx)
    plan = layer._compiled().describe_plans()
    assert "[onednn]" in plan, plan
    return layer, (lambda k: [layer.predict(a, out=out, context=ctx) for _ in range(k)])


def bench_size(torch, n, threads, min_time):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    out = np.empty((n, n), np.float32)
    pool = concurrent.futures.ThreadPoolExecutor(threads) if threads > 1 else None
    ctx = tl.Context(executor=tl.PoolExecutor(pool, threads)) if pool else tl.Context()
    torch.set_num_threads(threads)
    runners = {}
    layer, runners["treadle-bf16"] = treadle_runner(n, "bf16", a, out, ctx)
    _, runners["treadle-f32"] = treadle_runner(n, "float32", a, np.empty_like(out), ctx)
    ta = torch.from_numpy(a)
    tw = torch.from_numpy(np.ascontiguousarray(layer.state_dict()["weight"].T))  # x @ W^T, like the Linear
    ta16, tw16 = ta.bfloat16(), tw.bfloat16()
    runners["torch-bf16"] = lambda k: [torch.mm(ta16, tw16) for _ in range(k)]
    runners["torch-f32"] = lambda k: [torch.mm(ta, tw) for _ in range(k)]
    # The two bf16 results differ by torch's rounding of its output to bf16 (~2^-9 relative).
    runners["treadle-bf16"](1)
    ref = torch.mm(ta.double(), tw.double()).numpy()
    scale = float(np.max(np.abs(ref)))
    diffs = {"treadle-bf16": float(np.max(np.abs(out - ref))) / scale,
             "torch-bf16": float(np.max(np.abs(torch.mm(ta16, tw16).float().numpy() - ref))) / scale}
    timing = time_alternating(runners, min_time)
    if pool:
        pool.shutdown()
    measure = "cpu_s" if threads == 1 else "wall_s"
    return {"n": n, "threads": threads, "measure": "cpu" if threads == 1 else "wall",
            "ms": {k: v[measure] * 1e3 for k, v in timing.items()},
            "gflops": {k: 2 * n ** 3 / v[measure] / 1e9 for k, v in timing.items()},
            "max_rel_err_vs_float64": diffs}


def bench_training_step(torch, min_time, seed=0):
    """W3 training step, 1 thread, CPU time: treadle oneDNN float32 / bf16, torch float32 / autocast bf16."""
    torch.set_num_threads(1)
    w = next(w for w in workloads.all_workloads() if w.name == "W3")
    torch.manual_seed(seed)
    tmodel = w.build_torch(torch).float().train()
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    x, y = tb._data(w, np.random.default_rng(seed))
    runners, first = {}, {}
    for precision in ("float32", "bf16"):
        model = w.build_treadle(tl)
        model.load_state_dict(state)
        model.set_backend("onednn").set_precision(precision)
        tr = tl.Trainer(model, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3))
        first["treadle-" + precision] = tr.step(x, y)
        runners["treadle-" + precision] = lambda k, tr=tr: [tr.step(x, y) for _ in range(k)]
    tx, ty, tloss = torch.from_numpy(x), torch.from_numpy(y), torch.nn.CrossEntropyLoss()
    for precision in ("float32", "bf16"):
        m = w.build_torch(torch).float().train()
        m.load_state_dict(tmodel.state_dict())
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)

        def step(m=m, opt=opt, bf16=precision == "bf16"):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = tloss(m(tx), ty)
            loss.backward()
            opt.step()
            return loss.item()
        first["torch-" + precision] = step()
        runners["torch-" + precision] = lambda k, step=step: [step() for _ in range(k)]
    timing = time_alternating(runners, min_time)
    flops = 3 * w.forward_flops * w.batch
    return {"workload": w.name, "title": w.title, "batch": w.batch, "threads": 1, "measure": "cpu",
            "first_loss": first, "us": {k: v["cpu_s"] * 1e6 for k, v in timing.items()},
            "gflops": {k: flops / v["cpu_s"] / 1e9 for k, v in timing.items()}}


def markdown_step(r):
    u, g = r["us"], r["gflops"]
    lines = [f"Training step {r['workload']} ({r['title']}, batch {r['batch']}), 1 thread, median CPU time:", "",
             "| runner | us | GFLOP/s | first loss |", "|---|---|---|---|"]
    for k in u:
        lines.append(f"| {k} | {u[k]:.0f} | {g[k]:.0f} | {r['first_loss'][k]:.5f} |")
    return "\n".join(lines)


def markdown(rows):
    lines = ["n^3 matrix product, GFLOP/s (median per call: CPU time of the calling thread at 1 thread, wall time "
             "at 2).", "",
             "| n | threads | treadle onednn bf16 | torch.mm bf16 | treadle / torch | treadle onednn f32 | torch.mm f32 "
             "| bf16 / f32 (treadle) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gflops"]
        lines.append(f"| {r['n']} | {r['threads']} | {g['treadle-bf16']:.0f} | {g['torch-bf16']:.0f} | "
                     f"{g['treadle-bf16'] / g['torch-bf16']:.2f}x | {g['treadle-f32']:.0f} | {g['torch-f32']:.0f} | "
                     f"{g['treadle-bf16'] / g['treadle-f32']:.2f}x |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed calls per runner")
    p.add_argument("--sizes", default="1024,2048")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--no-step", action="store_true", help="skip the W3 training-step comparison")
    p.add_argument("--out", default=str(here / "results"))
    args = p.parse_args(argv)
    if "onednn" not in tl.backends():
        print("treadle was built without oneDNN (TREADLE_WITH_ONEDNN=ON); nothing to compare", file=sys.stderr)
        return 2
    import torch
    rows = [bench_size(torch, int(n), int(t), args.min_time)
            for t in args.threads.split(",") for n in args.sizes.split(",")]
    step = None if args.no_step else bench_training_step(torch, args.min_time)
    torch.set_num_threads(1)
    table = markdown(rows) + ("\n\n" + markdown_step(step) if step else "")
    print(table)
    os.makedirs(args.out, exist_ok=True)
    result = {"machine": tb.machine_info(), "loadavg": os.getloadavg()[0], "rows": rows, "training_step": step}
    Path(args.out, "bf16_matmul.json").write_text(json.dumps(result, indent=1))
    Path(args.out, "bf16_matmul.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m treadle bench workers`: what lending treadle a second worker buys, per workload.

For each training workload at its benchmark batch and at 4x that batch, one treadle step on the
calling thread alone is timed against the same step with the host's workers lent through
`tl.PoolExecutor` (a host-owned `concurrent.futures.ThreadPoolExecutor` of W - 1 threads, plus the
calling thread), in alternating rounds, so the ratio of the two medians is robust on a noisy
machine. PyTorch's own 1-thread and W-thread steps run in the same rounds when it is importable
(context: what a host gets from torch.set_num_threads). Both treadle runs start from the same
weights and data, and their losses are checked to be bitwise equal after the timing (the executor
must never change a result).

Writes workers-<date>.json/.md and workers-latest.json/.md next to the main suite's results.
"""
import argparse
import concurrent.futures
import datetime
import importlib.util
import os
import sys
from dataclasses import replace

import numpy as np

from .bench_common import _default_out_dir, load_workloads, machine_info, treadle_info, write_result_files
from .bench_pair import _data, torch_loss, treadle_loss
from .bench_timing import time_alternating


def _treadle_trainer(tl, w, state, executor):
    model = w.build_treadle(tl)
    model.load_state_dict(state)
    return tl.Trainer(model, treadle_loss(w, tl), tl.optim.Adam(lr=1e-3), executor=executor), model


def _torch_step(torch, w, x, y, seed):
    torch.manual_seed(seed)
    model = w.build_torch(torch).float()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    if w.input_grad:
        tx.requires_grad_(True)
    loss_fn = torch_loss(w, torch, tx)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(tx), ty).backward()
        opt.step()

    return step


def measure(w, tl, torch, workers, pool, min_time, warmup, seed=0):
    """One row: medians of treadle 1 vs `workers` workers (and torch 1 vs `workers` threads)."""
    x, y = _data(w, np.random.default_rng(seed))
    tl.manual_seed(seed)
    state = {k: np.array(v) for k, v in w.build_treadle(tl).state_dict().items()}
    one, one_model = _treadle_trainer(tl, w, state, None)
    many, many_model = _treadle_trainer(tl, w, state, tl.PoolExecutor(pool, workers))
    runners = {"treadle_1": lambda k: [one.step(x, y) for _ in range(k)],
               f"treadle_{workers}": lambda k: [many.step(x, y) for _ in range(k)]}
    if torch is not None:
        torch_step = _torch_step(torch, w, x, y, seed)

        def on_threads(t):
            def run(k):
                torch.set_num_threads(t)
                for _ in range(k):
                    torch_step()
            return run

        runners["torch_1"], runners[f"torch_{workers}"] = on_threads(1), on_threads(workers)
    timing = time_alternating(runners, min_time, warmup)
    # Same weights, same data, one more step each: the executor must not change a bit.
    one_steps, many_steps = one.steps, many.steps
    while one_steps != many_steps:
        (one if one_steps < many_steps else many).step(x, y)
        one_steps, many_steps = one.steps, many.steps
    same = bool(np.array_equal(one_model.flat_parameters(), many_model.flat_parameters()))
    row = {"workload": w.name, "title": w.title, "batch": w.batch, "workers": workers,
           "us": {k: v["median_s"] * 1e6 for k, v in timing.items()}, "bitwise_equal": same,
           "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    us = row["us"]
    row["treadle_speedup"] = us["treadle_1"] / us[f"treadle_{workers}"]
    if torch is not None:
        row["torch_speedup"] = us["torch_1"] / us[f"torch_{workers}"]
    return row


def to_markdown(result):
    m, s = result["machine"], result["settings"]
    w = s["workers"]
    lines = [f"# treadle on lent workers ({result['date']})\n",
             f"- Machine: {m['cpu_model']}; {m['cpus_usable']} usable of {m['cpus_logical']} logical CPUs; load "
             f"average at start: {', '.join(f'{v:.2f}' for v in m['loadavg_at_start'] or [])}",
             f"- treadle {result['treadle']['version']} ({result['treadle']['git'] or 'no git'}), executor kind: "
             f"tl.PoolExecutor over a host concurrent.futures.ThreadPoolExecutor({w - 1}) plus the calling thread; "
             f"torch {result.get('torch_version') or 'not installed'} with set_num_threads(1 / {w})",
             f"- Median us per training step (Adam), all four alternated in rounds of ~10 ms, >= {s['min_time']} s "
             f"each after {s['warmup']} s warm-up. Speedup = 1-worker time / {w}-worker time. 'bitwise' checks "
             f"that both treadle trainers hold identical parameters after the run.", "",
             f"| workload | batch | treadle 1 | treadle {w} | treadle speedup | torch 1 | torch {w} | torch speedup | "
             f"bitwise | load |", "|" + "---|" * 10]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['batch']} | error: {r['error']} |" + " |" * 7)
            continue
        us = r["us"]
        t1, tw = us.get("torch_1"), us.get(f"torch_{w}")
        lines.append(f"| {r['workload']} {r['title']} | {r['batch']} | {us['treadle_1']:,.0f} | "
                     f"{us[f'treadle_{w}']:,.0f} | {r['treadle_speedup']:.2f}x | "
                     f"{'-' if t1 is None else f'{t1:,.0f}'} | {'-' if tw is None else f'{tw:,.0f}'} | "
                     f"{'-' if 'torch_speedup' not in r else format(r['torch_speedup'], '.2f') + 'x'} | "
                     f"{'yes' if r['bitwise_equal'] else 'NO'} | {r['loadavg']:.1f} |")
    return "\n".join(lines) + "\n"


def run(workloads, tl, torch, workers=2, multipliers=(1, 4), min_time=1.0, warmup=0.2, log=print):
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
              "treadle": treadle_info(tl), "torch_version": torch.__version__ if torch is not None else None,
              "settings": {"workers": workers, "multipliers": list(multipliers), "min_time": min_time,
                           "warmup": warmup}, "rows": []}
    saved = torch.get_num_threads() if torch is not None else None
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers - 1) as pool:
            for w in workloads:
                for mult in multipliers:
                    wb = replace(w, batch=w.batch * mult)
                    log(f"{wb.name} batch {wb.batch} ...")
                    try:
                        result["rows"].append(measure(wb, tl, torch, workers, pool, min_time, warmup))
                    except (AttributeError, NotImplementedError, RuntimeError, ValueError) as e:
                        result["rows"].append({"workload": wb.name, "batch": wb.batch, "error": f"{type(e).__name__}: {e}"})
    finally:
        if saved is not None:
            torch.set_num_threads(saved)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m treadle bench workers",
                                description="training steps on 1 vs W lent workers (tl.PoolExecutor)")
    p.add_argument("--workloads", default="W2,W3,W4,W5,W6", help="comma-separated training workloads")
    p.add_argument("--workers", type=int, default=2, help="workers lent in the second column (default 2)")
    p.add_argument("--batch-multipliers", default="1,4", help="batches as multiples of the benchmark batch")
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--warmup", type=float, default=0.2)
    p.add_argument("--out", default=None, help="results folder (default bench/results in the source tree)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.workers < 2:
        raise SystemExit(f"bench workers: --workers must be >= 2, got {args.workers}")
    import treadle as tl

    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch
    by_name = {w.name: w for w in load_workloads()}
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name or not by_name[n].train]
    if unknown:
        raise SystemExit(f"bench workers: not training workloads: {unknown}; known: "
                         f"{sorted(n for n, w in by_name.items() if w.train)}")
    mults = [int(m) for m in args.batch_multipliers.split(",") if m.strip()]
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    result = run([by_name[n] for n in names], tl, torch, args.workers, mults, args.min_time, args.warmup, log)
    print(to_markdown(result))
    for path in write_result_files(result, to_markdown(result), args.out or _default_out_dir(), "workers"):
        log(f"wrote {path}")
    return 0

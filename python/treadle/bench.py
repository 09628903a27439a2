"""Benchmarks against PyTorch: `python -m treadle bench` or `python bench/run.py` (see bench/README.md).

Each workload (treadle/bench_workloads.py) is built in treadle and in PyTorch with the same weights and
data. Before anything is timed, the two must agree: same inference output and the same first
training-step loss (so a ratio never compares different work). Then training steps (forward +
loss + backward + Adam update) and inference calls are timed alternately, treadle then PyTorch, in
rounds of a few milliseconds, until each side has run at least --min-time seconds; the tables give
the median per step. PyTorch runs with torch.set_num_threads(T) for each T, and treadle with T workers
lent as a Python host lends them (a tl.PoolExecutor over a host ThreadPoolExecutor of T - 1 threads,
plus the calling thread); treadle itself never starts a thread.

Results go to stdout (markdown) and to <out>/bench-<time>.{json,md} plus latest.{json,md}.
"""
import argparse
import datetime
import importlib.util
import os
import sys
import time

import numpy as np

# The shared helpers, the workload pair and the timing live in their own modules; these names stay
# importable from here.
from .bench_common import _default_out_dir, load_workloads, machine_info, treadle_info, write_result_files  # noqa: F401
from .bench_pair import INFER_CHECK_TOL, LOSS_CHECK_TOL, Missing, Pair, _as_arrays, _data  # noqa: F401
from .bench_timing import ROUND_SECONDS, _steps_per_round, time_alternating  # noqa: F401


def gemm_peak(torch, tl, threads, n=1024, min_time=0.3):
    """Measured float32 GEMM GFLOP/s (n x n x n): torch.mm per thread count, numpy, treadle Linear."""
    flops = 2.0 * n ** 3
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out = {"n": n, "torch": {}, "numpy": None, "treadle": None}
    for t in threads:
        torch.set_num_threads(t)
        r = time_alternating({"mm": lambda k: [torch.mm(ta, tb) for _ in range(k)]}, min_time, min_time / 4)
        out["torch"][str(t)] = flops / r["mm"]["median_s"] / 1e9
    r = time_alternating({"np": lambda k: [a @ b for _ in range(k)]}, min_time, min_time / 4)
    out["numpy"] = flops / r["np"]["median_s"] / 1e9
    # treadle's GEMM as a user reaches it: a bias-free Linear's predict (includes copying the output out)
    model = tl.nn.Sequential(tl.nn.Linear(n, n, bias=False))
    model.predict(a)
    r = time_alternating({"tl": lambda k: [model.predict(a) for _ in range(k)]}, min_time, min_time / 4)
    out["treadle"] = flops / r["tl"]["median_s"] / 1e9
    return out


def _row(w, threads):
    return {"workload": w.name, "title": w.title, "batch": w.batch, "threads_torch": threads, "threads_treadle": threads,
            "train": w.train, "status": "ok", "message": None, "check": None, "train_us": None, "infer_us": None,
            "train_ratio": None, "infer_ratio": None, "target_train": w.target_train, "target_infer": w.target_infer,
            "train_gflops": None, "infer_gflops": None}


def _timed(row, key, timing, flops):
    row[key + "_us"] = {name: r["median_s"] * 1e6 for name, r in timing.items()}
    row[key + "_spread_us"] = {name: [r["p25_s"] * 1e6, r["p75_s"] * 1e6] for name, r in timing.items()}
    row[key + "_ratio"] = timing["torch"]["median_s"] / timing["treadle"]["median_s"]
    row[key + "_best_us"] = {name: r["min_s"] * 1e6 for name, r in timing.items()}
    row[key + "_best_ratio"] = timing["torch"]["min_s"] / timing["treadle"]["min_s"]
    if flops:
        row[key + "_gflops"] = {name: flops / r["median_s"] / 1e9 for name, r in timing.items()}


def bench_workload(w, tl, torch, threads, min_time, warmup, seed=0, torch_adam="default", log=print, device="cpu"):
    """Rows (one per thread count) for workload `w`; missing/mismatch/error are rows too."""
    rows = [_row(w, t) for t in threads]
    try:
        if device == "cuda":
            from .bench_device import DevicePair as pair_type
        else:
            pair_type = Pair
        pair = pair_type(w, tl, torch, seed, torch_adam)
        torch.set_num_threads(threads[0])
        check = pair.check()
    except Missing as e:
        for r in rows:
            r.update(status="missing", message=str(e))
        return rows, None
    except Exception as e:  # noqa: BLE001 (a broken workload must not end the suite; it is reported)
        for r in rows:
            r.update(status="error", message=f"{type(e).__name__}: {e}")
        return rows, None
    for r in rows:
        r["check"] = check
    if not check["ok"]:
        for r in rows:
            r.update(status="mismatch", message="treadle and PyTorch disagree; not timed")
        return rows, pair
    try:
        for r, t in zip(rows, threads):
            torch.set_num_threads(t)
            if device == "cpu":
                pair.set_workers(tl, t)
            r["loadavg"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            log(f"  {w.name} threads={t} (load {r['loadavg']}) ...")
            if w.train:
                _timed(r, "train", pair.time_train(min_time, warmup), 3 * w.forward_flops * w.batch)
            _timed(r, "infer", pair.time_infer(min_time, warmup), w.forward_flops * w.batch)
    finally:
        if device == "cpu":
            pair.set_workers(tl, 1)  # back on the calling thread alone (the profile runs there); the pool closes
    return rows, pair


# -- profiling aid: per-node times from the core's profiler ------------------------------------------
def profile_workload(pair, tl, min_time=0.2, top=12):
    """Where a workload's training step spends its time: every kernel call timed by `tl.profile`.

    Runs training steps (inference when the workload has none) for about `min_time` seconds and
    returns the `top` slowest nodes and the time per module and pass, each with its share of the
    total kernel time (per-call overhead outside kernels is not in it: compare the total with the
    step time in the main table).
    """
    run = pair.treadle_train if pair.w.train else (lambda: pair.model.predict(pair.x))
    run()  # compile outside the profile
    calls, start = 0, time.perf_counter()
    with tl.profile() as prof:
        while time.perf_counter() - start < min_time:
            run()
            calls += 1
    total = prof.total_seconds or 1.0
    nodes = [{"op": n["op"], "backend": n["backend"], "pass": n["pass"], "module": n["module"] or "<root>",
              "output_shape": list(n["output_shape"]), "us_per_step": n["seconds"] / calls * 1e6,
              "share": n["seconds"] / total} for n in prof.nodes()[:top]]
    modules = [{"module": m, "pass": p, "us_per_step": sec / calls * 1e6, "share": sec / total}
               for (m, p), sec in prof.by_module()[:top]]
    return {"steps": calls, "kernel_us_per_step": prof.total_seconds / calls * 1e6, "nodes": nodes,
            "modules": modules}


def call_overhead(tl, min_time=0.2):
    """Time of the smallest possible calls (Linear 1->1, batch 1): treadle's fixed cost per call."""
    model = tl.nn.Sequential(tl.nn.Linear(1, 1))
    x, y = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    r = time_alternating({"predict": lambda n: [model.predict(x) for _ in range(n)],
                          "step": lambda n: [trainer.step(x, y) for _ in range(n)]}, min_time, min_time / 4)
    return {k: v["median_s"] * 1e6 for k, v in r.items()}


# -- report ---------------------------------------------------------------------------------------
def _us(v):
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def _target(r):
    parts = []
    for kind in ("train", "infer"):
        goal = r[f"target_{kind}"]
        if goal is None:
            continue
        got = r[f"{kind}_ratio"]
        verdict = "?" if got is None else ("met" if got >= goal else "not met")
        parts.append(f"{kind} >= {goal:g}x: {verdict}")
    return "; ".join(parts) or "-"


def _check(r):
    c = r["check"]
    if r["status"] in ("missing", "error"):
        return f"{r['status']}: {r['message']}"
    parts = [f"out diff {c['infer_max_abs_diff']:.1e}" if c["infer_max_abs_diff"] is not None else "out shape differs"]
    if "loss_check" in c:
        parts.append("losses differ by design (noise)")
    elif "loss_abs_diff" in c:
        parts.append(f"loss diff {c['loss_abs_diff']:.1e}")
    text = ", ".join(parts)
    return text if r["status"] == "ok" else f"MISMATCH ({text}): not timed"


def _load(r):
    return "-" if r.get("loadavg") is None else f"{r['loadavg']:.1f}"


def _gflops(r, kind):
    g = r[f"{kind}_gflops"]
    return "-" if not g else f"{g['treadle']:.1f} / {g['torch']:.1f}"


def gemm_peak_1t(result):
    """The measured single-thread float32 GEMM peak: the faster of torch.mm and treadle's Linear
    (treadle runs on one thread), or None without the GEMM line."""
    g = result.get("gemm")
    if not g:
        return None
    return max(v for v in (g["torch"].get("1"), g["treadle"]) if v)


def _peak_share(r, peak):
    g = r["train_gflops"]
    return "-" if not g or not peak else f"{g['treadle'] / peak:.0%}"


def _busy(result):
    loads = [r.get("loadavg") for r in result["rows"] if r.get("loadavg") is not None]
    return max(loads) if loads and max(loads) > 0.5 * (result["machine"]["cpus_usable"] or 1) else None


def _header_lines(result):
    m, t, lines = result["machine"], result["treadle"], []
    flags = " ".join(f for f, on in m["flags"].items() if on) or "none of interest"
    lines.append(f"# treadle vs PyTorch ({result['date']})\n")
    lines.append(f"- Machine: {m['cpu_model']}; {m['cpus_usable']} usable of {m['cpus_logical']} logical CPUs; "
                 f"flags: {flags}; AMX: {'yes' if m['flags'].get('amx_tile') else 'no'}; "
                 f"load average at start: {', '.join(f'{v:.2f}' for v in m['loadavg_at_start'] or [])}")
    lines.append(f"- Versions: torch {result['torch']['version']} (Adam: {result['torch']['adam']}), treadle "
                 f"{t['version']} ({t['git'] or 'no git'}; backends {', '.join(t['backends'])}), numpy {m['numpy']}, "
                 f"Python {m['python']}")
    b = t.get("build") or {}
    if b:
        lines.append(f"- treadle build: core compiled {b.get('compiled_for')}; oneDNN "
                     f"{b.get('onednn.version', 'not built')} dispatching to {b.get('onednn.isa', '-')}")
    d = result.get("device")
    if d:
        lines.append(f"- **On the GPU**: {d['name']} (compute capability {d['capability']}, {d['memory_gib']} GiB, "
                     f"CUDA {d['cuda']}). treadle on backend \"cuda\", PyTorch on cuda:0, TF32 off on both; every "
                     f"step on both sides copies the batch from host memory and reads the loss (or the "
                     f"prediction) back, as a host driver does. 'threads' then only sets PyTorch's CPU threads.")
    g = result.get("gemm")
    if g:
        per_t = ", ".join(f"{k} thread{'s' if k != '1' else ''} {v:.0f}" for k, v in g["torch"].items())
        lines.append(f"- CPU peak, measured float32 GEMM {g['n']}^3 in GFLOP/s: torch.mm {per_t}; numpy (OpenBLAS, "
                     f"its default threads) {g['numpy']:.0f}; treadle Linear predict (1 thread, default "
                     f"dispatch) {g['treadle']:.0f}. '% of peak': treadle's training GFLOP/s over the faster "
                     f"single-thread GEMM ({gemm_peak_1t(result):.0f})")
    o = result.get("call_overhead_us")
    if o:
        lines.append(f"- treadle per-call floor (Linear 1->1, batch 1): predict {_us(o['predict'])} us, "
                     f"Adam train step {_us(o['step'])} us")
    lines.append(f"- Timing: median us per step, treadle and PyTorch alternated in rounds of ~{ROUND_SECONDS * 1e3:.0f} "
                 f"ms, >= {result['settings']['min_time']} s of steps each, after {result['settings']['warmup']} s "
                 f"warm-up. Ratio = PyTorch time / treadle time (> 1: treadle faster). 'threads' T is "
                 f"torch.set_num_threads(T) for PyTorch and T lent workers for treadle (on the CPU: a tl.PoolExecutor "
                 f"over a host ThreadPoolExecutor of T - 1 threads, plus the calling thread). GFLOP/s counts GEMM-like layers only (train = 3x forward). 'load' is "
                 f"the 1-minute load average when the row started.")
    busy = _busy(result)
    if busy:
        lines.append(f"- **Busy machine** (load up to {busy:.1f} on {m['cpus_usable']} CPUs): other processes "
                     f"took CPU time during the run, so absolute times are inflated and noisy; multi-threaded "
                     f"PyTorch rows suffer most (its OpenMP workers wait at barriers whenever one is descheduled).")
    return lines + [""]


def _main_table(rows, peak=None):
    lines = ["| workload | batch | threads | train treadle | train torch | train ratio | infer treadle | "
             "infer torch | infer ratio | GFLOP/s train (tl / torch) | % of peak | target | load | check |",
             "|" + "---|" * 14]
    for r in rows:
        tr, inf = r["train_us"] or {}, r["infer_us"] or {}
        lines.append(f"| {r['workload']} {r['title']} | {r['batch']} | {r['threads_torch']} | "
                     f"{_us(tr.get('treadle'))} | {_us(tr.get('torch'))} | {_ratio(r['train_ratio'])} | "
                     f"{_us(inf.get('treadle'))} | {_us(inf.get('torch'))} | {_ratio(r['infer_ratio'])} | "
                     f"{_gflops(r, 'train')} | {_peak_share(r, peak)} | {_target(r)} | {_load(r)} | {_check(r)} |")
    return lines


def _profile_lines(profile):
    lines = []
    for name, p in (profile or {}).items():
        lines.append(f"\n## Profile of {name} (treadle, {p['steps']} steps, kernel time "
                     f"{_us(p['kernel_us_per_step'])} per step)\n")
        lines.append("| share | us per step | op | backend | pass | module | output |\n|---|---|---|---|---|---|---|")
        for n in p["nodes"]:
            lines.append(f"| {n['share']:.1%} | {_us(n['us_per_step'])} | {n['op']} | {n['backend']} | {n['pass']} | "
                         f"{n['module']} | {tuple(n['output_shape'])} |")
        lines.append("\n| share | us per step | module | pass |\n|---|---|---|---|")
        for m in p["modules"]:
            lines.append(f"| {m['share']:.1%} | {_us(m['us_per_step'])} | {m['module']} | {m['pass']} |")
    return lines


def to_markdown(result):
    """The report as markdown: machine and method lines, the table, and optional extra tables."""
    lines = _header_lines(result) + _main_table(result["rows"], gemm_peak_1t(result))
    if _busy(result):
        lines += _best_round_table(result["rows"])
    lines += _profile_lines(result.get("profile"))
    return "\n".join(lines) + "\n"


def _best_round_table(rows):
    """The fastest round of each measurement: what a busy machine disturbs least (not a median)."""
    lines = ["\n## Fastest rounds (busy machine: the least disturbed ~10 ms round of each measurement)\n",
             "| workload | threads | train treadle | train torch | train ratio | infer treadle | infer torch | "
             "infer ratio |", "|" + "---|" * 8]
    for r in rows:
        if r["status"] != "ok":
            continue
        tr, inf = r.get("train_best_us") or {}, r.get("infer_best_us") or {}
        lines.append(f"| {r['workload']} | {r['threads_torch']} | {_us(tr.get('treadle'))} | {_us(tr.get('torch'))} | "
                     f"{_ratio(r.get('train_best_ratio'))} | {_us(inf.get('treadle'))} | {_us(inf.get('torch'))} | "
                     f"{_ratio(r.get('infer_best_ratio'))} |")
    return lines


def write_results(result, out_dir):
    return write_result_files(result, to_markdown(result), out_dir, "bench", latest="latest")


# -- the suite ------------------------------------------------------------------------------------
def run_suite(workloads, threads=(1, 2), min_time=1.0, warmup=0.2, gemm=True, profile=False, seed=0,
              torch_adam="default", log=print, device="cpu"):
    """Benchmarks `workloads`; returns the result dict (the JSON written by main). device "cuda":
    both frameworks on the GPU (treadle backend "cuda"; see treadle.bench_device)."""
    import torch

    import treadle as tl

    if device == "cuda":
        from .bench_device import device_info, require_device

        require_device(tl, torch)
        gemm = False  # the CPU GEMM peak says nothing about a GPU run

    threads = [int(t) for t in threads]
    saved_threads = torch.get_num_threads()
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
              "torch": {"version": torch.__version__, "adam": torch_adam,
                        "mkldnn": bool(torch.backends.mkldnn.is_available())},
              "treadle": treadle_info(tl), "settings": {"threads": threads, "min_time": min_time, "warmup": warmup,
                                                        "seed": seed},
              "rows": [], "profile": {}, "device": device_info(torch) if device == "cuda" else None}
    try:
        if gemm:
            log("GEMM peak ...")
            result["gemm"] = gemm_peak(torch, tl, threads, min_time=min(0.3, min_time))
        result["call_overhead_us"] = call_overhead(tl, min(0.2, min_time))
        for w in workloads:
            log(f"{w.name}: {w.title}")
            rows, pair = bench_workload(w, tl, torch, threads, min_time, warmup, seed, torch_adam, log, device)
            result["rows"].extend(rows)
            if profile and pair is not None and rows[0]["status"] == "ok":
                log(f"  {w.name} profile ...")
                result["profile"][w.name] = profile_workload(pair, tl, min(0.5, min_time))
    finally:
        torch.set_num_threads(saved_threads)
    return result


def _parser():
    p = argparse.ArgumentParser(prog="python -m treadle bench", description="treadle vs PyTorch benchmarks")
    p.add_argument("--workloads", default="all", help="comma-separated names (W1,W2,...,W1-b1) or 'all'")
    p.add_argument("--threads", default="1,2", help="PyTorch thread counts, comma-separated (default 1,2)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per side (default 1.0)")
    p.add_argument("--warmup", type=float, default=0.2, help="warm-up seconds per side (default 0.2)")
    p.add_argument("--out", default=None, help="results folder (default bench/results in the source tree)")
    p.add_argument("--no-gemm", action="store_true", help="skip the GEMM peak measurement")
    p.add_argument("--profile", action="store_true",
                   help="per-node treadle profile of each workload (where the step time goes)")
    p.add_argument("--torch-adam", choices=["default", "foreach", "fused"], default="default",
                   help="torch.optim.Adam implementation (default: torch's own choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: both frameworks on the GPU (a CUDA build of treadle, torch with CUDA)")
    p.add_argument("--workloads-file", default=None,
                   help="path to a workloads.py of your own (default: the suite's, treadle/bench_workloads.py)")
    p.add_argument("--quiet", action="store_true", help="no progress lines (the table is still printed)")
    return p


def main(argv=None, workloads=None):
    """Entry point of `python -m treadle bench [options]`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["crossover"]:
        from .bench_crossover import main as crossover_main  # the backend study (no torch needed)

        return crossover_main(argv[1:])
    if argv[:1] == ["activations"]:
        from .bench_activations import main as activations_main  # ns per element per activation

        return activations_main(argv[1:])
    if argv[:1] == ["workers"]:
        from .bench_workers import main as workers_main  # 1 vs W lent workers per workload

        return workers_main(argv[1:])
    args = _parser().parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        print("bench: the benchmarks time treadle against PyTorch, which is not importable here; install it "
              "(pip install torch==2.13.0, CPU build) or run `python -m treadle bench crossover`, which compares "
              "treadle's backends and needs no torch", file=sys.stderr)
        return 2
    if args.min_time <= 0 or args.warmup < 0:
        raise SystemExit(f"bench: --min-time must be > 0 and --warmup >= 0, got {args.min_time}, {args.warmup}")
    available = workloads if workloads is not None else load_workloads(args.workloads_file)
    if args.workloads != "all":
        wanted = [s.strip() for s in args.workloads.split(",") if s.strip()]
        by_name = {w.name: w for w in available}
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise SystemExit(f"bench: unknown workload(s) {unknown}; known: {sorted(by_name)}")
        available = [by_name[n] for n in wanted]
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if not threads or min(threads) < 1:
        raise SystemExit(f"bench: --threads must list positive integers, got {args.threads!r}")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    result = run_suite(available, threads, args.min_time, args.warmup, gemm=not args.no_gemm,
                       profile=args.profile,
                       seed=args.seed, torch_adam=args.torch_adam, log=log, device=args.device)
    print(to_markdown(result))
    for path in write_results(result, args.out or _default_out_dir()):
        log(f"wrote {path}")
    return 0

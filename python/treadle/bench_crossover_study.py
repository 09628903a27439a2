"""The backend crossover study: `python -m treadle bench crossover [--quick | --full] [options]`.

For a sweep of single-layer models (Linear widths, Conv2d channel counts, LSTM hidden sizes) and
log-spaced batch sizes, it times inference (`predict`, the inference plan) and a training step
(forward + MSE loss + backward + SGD update, `Trainer.step`) on every backend this build has, each
pinned with `model.set_backend(name)`, and reports where each backend wins. The backends of one
point are timed in alternating rounds (treadle.bench.time_alternating), so they see the same
machine noise; the result is the median time per step.

Outputs (under --out, default bench/results/ in a source tree, else ./bench-results):
crossover-<time>.{json,md}, latest-crossover.{json,md},
and with matplotlib installed (`pip install treadle[plot]`) one PNG per configuration in
crossover-<time>/ (time vs batch, one line per backend, crossovers marked). `--write-table PATH`
also writes the dispatch table that `model.set_backend("auto")` reads (see treadle.dispatch).

Backends that this build lacks are reported as unavailable, with what they need. A device backend
(cuda) is timed as a host calls it: the data starts on the host, so each timed call includes the
host-to-device copy of the input and the copy of the result back (predict and step take and return
numpy arrays).
"""
import argparse
import datetime
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from . import bench_crossover_report as report

TIE = 1.03        # a backend wins a point only when the next one is this much slower
TABLE_LEAD = 1.10  # ... and a rule of the dispatch table only with this lead (noise must not flip dispatch)
SEQ_LEN = 16      # LSTM sequence length
IMAGE = 16        # Conv2d input height and width


# -- what is compared -----------------------------------------------------------------------------
@dataclass(frozen=True)
class BackendSpec:
    name: str
    needs: str                      # how to get it when this build lacks it
    device: str = "cpu"             # where it computes; a device backend's timings include transfers
    transfers_included: bool = False


BACKENDS = [
    BackendSpec("eigen", "always built (the reference)"),
    BackendSpec("onednn", "a build with -DTREADLE_WITH_ONEDNN=ON (docs/onednn.md)"),
    BackendSpec("cuda", "a build with -DTREADLE_WITH_CUDA=ON and a GPU", device="cuda", transfers_included=True),
]


@dataclass(frozen=True)
class Config:
    """One layer configuration of the sweep."""
    name: str                            # "linear-512"
    title: str
    build: Callable                      # build(tl) -> model
    sample_shape: Callable               # sample_shape(batch) -> input shape (the batch included)
    macs: Callable                       # macs(batch) -> multiply-adds of one forward
    infer_op: str                        # the op whose table rule the inference timing decides
    train_op: Optional[str] = None       # the op whose table rule the training timing decides
    size: Optional[Callable] = None      # size(batch) -> infer_op's size in the dispatch table's measure
    train_size: Optional[Callable] = None  # size(batch) of train_op (default: `size`)


def linear_config(width):
    return Config(f"linear-{width}", f"Linear({width}, {width})", lambda tl: tl.nn.Sequential(tl.nn.Linear(width, width)),
                  lambda b: (b, width), lambda b: b * width * width, "linear", "matmul",
                  lambda b: b * width * width)  # rows x in x out; the gradient products have the same count


def conv_config(channels):
    per_sample = IMAGE * IMAGE * channels * channels * 9
    return Config(f"conv2d-{channels}", f"Conv2d({channels}, {channels}, 3, padding=1) on {IMAGE}x{IMAGE}",
                  lambda tl: tl.nn.Sequential(tl.nn.Conv2d(channels, channels, 3, padding=1)),
                  lambda b: (b, channels, IMAGE, IMAGE), lambda b: b * per_sample, "conv", None,
                  lambda b: b * per_sample)


def lstm_config(hidden):
    def build(tl):
        class LastHidden(tl.nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = tl.nn.LSTM(hidden, hidden)

            def forward(self, x):
                out, (h, c) = self.lstm(x)
                return h[-1]

        return LastHidden()

    # lstm_layer is measured in elements in the table, which depend on its saved state: no size is
    # derived here, so its inference timings write no rule. Its training plan computes the weight
    # gradients as products of (4H x seq*N) by (seq*N x H), which is what the training timing decides.
    return Config(f"lstm-{hidden}", f"LSTM({hidden}, {hidden}), {SEQ_LEN} steps, last hidden", build,
                  lambda b: (SEQ_LEN, b, hidden), lambda b: b * SEQ_LEN * 4 * hidden * 2 * hidden, "lstm_layer",
                  "matmul", None, lambda b: SEQ_LEN * b * 4 * hidden * hidden)


SWEEPS = {  # mode -> (linear widths, conv channels, lstm hidden sizes, batches, max MACs per forward, min time)
    "quick": ([32, 256], [8], [32], [1, 32, 1024], 1 << 24, 0.02),
    "default": ([32, 128, 512, 2048, 4096], [8, 32, 128], [32, 128, 512], [4 ** k for k in range(8)], 1 << 30, 0.1),
    "full": ([32, 64, 128, 256, 512, 1024, 2048, 4096], [4, 8, 16, 32, 64, 128], [32, 64, 128, 256, 512],
             [2 ** k for k in range(15)], 1 << 33, 0.3),
}


def sweep_configs(mode):
    widths, channels, hidden, _, _, _ = SWEEPS[mode]
    return [linear_config(w) for w in widths] + [conv_config(c) for c in channels] + [lstm_config(h) for h in hidden]


# -- timing ---------------------------------------------------------------------------------------
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
ROUND_SECONDS = 0.005


def time_backends(runners, min_time, clock="cpu"):
    """Median seconds per step of each runner (run(k) performs k steps), timed in alternating rounds.

    "cpu" reads the calling thread's CPU time: the host backends run every step on that thread (treadle
    starts none; oneDNN runs under a one-thread guard), so time the thread spends descheduled on a
    shared machine does not count. A device backend needs "wall": its work is not this thread's.
    """
    now = CLOCKS[clock]
    per_round = {}
    for name, run in runners.items():
        k, dt = 1, 0.0
        while True:  # calibrate: k steps take about one round
            t0 = now()
            run(k)
            dt = now() - t0
            if dt >= ROUND_SECONDS / 4 or k >= 1 << 16:
                break
            k *= 4
        per_round[name] = max(1, int(round(k * ROUND_SECONDS / max(dt, 1e-9))))
        run(per_round[name])  # warm-up
    samples = {name: [] for name in runners}
    spent = dict.fromkeys(runners, 0.0)
    deadline = time.perf_counter() + 30 * min_time + 2.0  # a heavily loaded machine must not hang the study
    while min(spent.values()) < min_time and time.perf_counter() < deadline:
        for name, run in runners.items():
            t0 = now()
            run(per_round[name])
            dt = now() - t0
            samples[name].append(dt / per_round[name])
            spent[name] += dt
    out = {}
    for name, s in samples.items():
        p25, med, p75 = np.percentile(s, [25, 50, 75])
        out[name] = {"median_s": float(med), "p25_s": float(p25), "p75_s": float(p75), "min_s": float(min(s))}
    return out


# -- one point --------------------------------------------------------------------------------------
def _backend_counts(model):
    """How many plan steps each backend runs, from describe_plans ("<node> <op> [<backend>] ...")."""
    counts = {}
    for line in model._compiled().describe_plans().splitlines():
        if "[" in line:
            name = line.split("[", 1)[1].split("]", 1)[0]
            if name != "view":
                counts[name] = counts.get(name, 0) + 1
    return counts


def _instances(tl, cfg, backends, state):
    models = {}
    for b in backends:
        m = cfg.build(tl)
        m.load_state_dict(state)
        m.set_backend(b)
        models[b] = m
    return models


def measure_point(tl, cfg, batch, backends, min_time, clock, seed=0):
    """Times inference and a training step of `cfg` at `batch` on every backend in `backends`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(cfg.sample_shape(batch)).astype(np.float32)
    reference = cfg.build(tl)
    state = {k: np.array(v) for k, v in reference.state_dict().items()}
    train_size = cfg.train_size or cfg.size
    point = {"batch": batch, "macs": cfg.macs(batch), "size": {"infer": cfg.size(batch) if cfg.size else None,
                                                              "train": train_size(batch) if train_size else None}}
    y = np.zeros_like(reference.predict(x))  # the MSE target of the training step
    for mode in ("infer", "train"):
        models = _instances(tl, cfg, backends, state)  # fresh models: describe_plans shows this mode's plans
        if mode == "infer":
            outs = {b: m.predict(x) for b, m in models.items()}
            runners = {b: (lambda k, m=m: [m.predict(x) for _ in range(k)]) for b, m in models.items()}
        else:
            trainers = {b: tl.Trainer(m, tl.loss.MSE(), tl.optim.SGD(lr=0.0)) for b, m in models.items()}
            outs = {b: np.array([t.step(x, y)]) for b, t in trainers.items()}
            runners = {b: (lambda k, t=t: [t.step(x, y) for _ in range(k)]) for b, t in trainers.items()}
        ran = {b: _backend_counts(models[b]) for b in backends}
        # A pinned backend that takes no node runs everything on the reference: timing it again would
        # only measure the same kernels twice.
        timed = [b for b in backends if b == "eigen" or ran[b].get(b, 0) > 0]
        result = time_backends({b: runners[b] for b in timed}, min_time, clock)
        ref = outs["eigen"]
        scale = max(1.0, float(np.max(np.abs(ref))))
        point[mode] = {
            "us": {b: result[b]["median_s"] * 1e6 for b in timed},
            "spread_us": {b: [result[b]["p25_s"] * 1e6, result[b]["p75_s"] * 1e6] for b in timed},
            "best_us": {b: result[b]["min_s"] * 1e6 for b in timed},
            "steps_by_backend": ran,
            "declined": [b for b in backends if b not in timed],
            "max_rel_diff": {b: float(np.max(np.abs(outs[b] - ref))) / scale for b in backends},
        }
        point[mode]["winner"], point[mode]["margin"] = winner(point[mode]["us"])
    return point


def winner(us):
    """(fastest backend, its lead: next-fastest time / its time); a lead under TIE is a "tie"."""
    ranked = sorted(us, key=us.get)
    if len(ranked) < 2:
        return ranked[0], None
    lead = us[ranked[1]] / us[ranked[0]]
    return (ranked[0] if lead >= TIE else "tie"), lead


def crossovers(points, mode):
    """Where the winner changes along the batch axis: [{between_batch: [b0, b1], before, after}]."""
    out, prev = [], None
    for p in points:
        w = p[mode]["winner"]
        if w == "tie":
            continue
        if prev is not None and w != prev[1]:
            out.append({"between_batch": [prev[0], p["batch"]], "before": prev[1], "after": w})
        prev = (p["batch"], w)
    return out


# -- the dispatch table -----------------------------------------------------------------------------
def dispatch_rules(configs_results):
    """Rules (op, dtype, measure, from, backend) from the sweep: for each op, its measured points sorted
    by size; each winner holds from its point's size up to the next point that another backend won
    (several points of one size vote). A backend must lead by TABLE_LEAD to win a point for the
    table; ties keep the backend before them (the reference at the start). Only ops that a backend
    other than the reference ran at some point get rules: elsewhere "auto" is the priority order.
    """
    per_op = {}
    for c in configs_results:
        for mode, op in (("infer", c["infer_op"]), ("train", c["train_op"])):
            if op is None:
                continue
            for p in c["points"]:
                # A point where only the reference ran casts no vote: the others decline that node anyway.
                if p.get(mode) and p["size"][mode] is not None and len(p[mode]["us"]) > 1:
                    per_op.setdefault(op, []).append((p["size"][mode], _table_winner(p[mode]["us"])))
    rules = []
    for op, pts in sorted(per_op.items()):
        by_size = {}
        for size, w in pts:
            by_size.setdefault(size, []).append(w)
        current = None
        for size in sorted(by_size):
            votes = Counter(w for w in by_size[size] if w != "tie")
            if votes:
                top = max(votes.values())
                choices = sorted(w for w, n in votes.items() if n == top)
                w = current if current in choices else choices[0]
            else:
                w = current or "eigen"
            if w != current:
                rules.append({"op": op, "dtype": "float32", "measure": _measure(op),
                              "from": 0 if current is None else int(size), "backend": w})
                current = w
    return rules


def _table_winner(us):
    ranked = sorted(us, key=us.get)
    return ranked[0] if us[ranked[1]] / us[ranked[0]] >= TABLE_LEAD else "tie"


def _measure(op):
    return "macs" if op in ("linear", "matmul", "bmm", "conv", "conv_backward_data") else "elements"


def write_table(result, path):
    """The dispatch table (JSON) for model.set_backend("auto"), with the study's conditions."""
    table = {"format": "treadle-dispatch-table", "version": 1,
             "conditions": {"date": result["date"], "machine": result["machine"], "treadle": result["treadle"],
                            "threads": result["settings"]["threads"], "sweep": result["settings"]["mode"],
                            "min_time": result["settings"]["min_time"], "clock": result["settings"]["clock"],
                            "lead_required": TABLE_LEAD,
                            "written_by": "python -m treadle bench crossover --write-table"},
             "rules": dispatch_rules(result["configs"])}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(table, indent=1) + "\n")
    return table


# -- the study --------------------------------------------------------------------------------------
def _cuda_device_usable(tl):
    """A CUDA build runs backend "cuda" only on a machine with a GPU (else plans raise 'needs a CUDA device')."""
    import numpy as np

    try:
        tl._core.run_op("relu", [np.ones(1, np.float32)], {}, None, "cuda", True, 0)
    except ValueError as e:
        if "needs a CUDA device" in str(e):
            return False
        raise
    return True


def run_study(configs, batches, max_macs, min_time, backends=None, log=print, mode="default"):
    import treadle as tl
    from treadle import bench_common as tb

    built = [b for b in tl.backends() if b != "cuda" or _cuda_device_usable(tl)]  # a CUDA build needs a GPU too
    wanted = [s.name for s in BACKENDS] if backends is None else backends
    available = [b for b in wanted if b in built]
    if "eigen" not in available:
        available.insert(0, "eigen")  # the reference: every comparison and check is against it
    devices = {s.name: s.device for s in BACKENDS}
    clock = "cpu" if all(devices.get(b, "cpu") == "cpu" for b in available) else "wall"
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"), "machine": tb.machine_info(),
              "treadle": tb.treadle_info(tl),
              "settings": {"mode": mode, "batches": list(batches), "max_macs": max_macs, "min_time": min_time,
                           "threads": 1, "tie": TIE, "clock": clock,
                           "threads_note": "treadle runs every step on the calling thread (no executor lent)"},
              "backends": {s.name: {"available": s.name in available, "device": s.device,
                                    "transfers_included": s.transfers_included,
                                    "note": None if s.name in available else f"unavailable: needs {s.needs}"}
                           for s in BACKENDS if s.name in wanted or s.name == "eigen"},
              "configs": []}
    for cfg in configs:
        entry = {"name": cfg.name, "title": cfg.title, "infer_op": cfg.infer_op, "train_op": cfg.train_op,
                 "size_measure": {"infer": _measure(cfg.infer_op) if cfg.size else None,
                                  "train": _measure(cfg.train_op) if cfg.train_op else None},
                 "points": [], "skipped": []}
        for b in batches:
            if cfg.macs(b) > max_macs:
                entry["skipped"].append(b)
                continue
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            log(f"  {cfg.name} batch {b} (load {load:.2f}) ..." if load is not None else f"  {cfg.name} batch {b}")
            point = measure_point(tl, cfg, b, available, min_time, clock)
            point["loadavg"] = load
            entry["points"].append(point)
        entry["crossovers"] = {m: crossovers(entry["points"], m) for m in ("infer", "train")}
        result["configs"].append(entry)
    result["machine"]["loadavg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return result


def write_results(result, out_dir, plot=True, log=print):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["date"].replace(":", "").replace("-", "").replace(" ", "-")
    md = report.to_markdown(result)
    paths = []
    for stem in (f"crossover-{stamp}", "latest-crossover"):
        (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (out_dir / f"{stem}.md").write_text(md)
        paths += [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    if plot:
        pngs = report.plot_all(result, out_dir / f"crossover-{stamp}")
        if pngs is None:
            log("crossover: matplotlib is not installed (pip install treadle[plot]); no plots")
        else:
            paths += pngs
    return paths


def _ints(text, what):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"bench crossover: {what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"bench crossover: {what} must list positive integers, got {text!r}")
    return values


def _parser():
    p = argparse.ArgumentParser(prog="python -m treadle bench crossover",
                                description="Where each backend wins: Linear/Conv2d/LSTM over batch sizes, "
                                            "inference and training step, every built backend.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a small sweep (seconds): a smoke test")
    size.add_argument("--full", action="store_true", help="the finest sweep (tens of minutes)")
    p.add_argument("--configs", default=None, help="comma-separated names to keep (linear-512,conv2d-8,...)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default: the sweep's)")
    p.add_argument("--max-macs", type=float, default=None, help="skip points whose forward needs more multiply-adds")
    p.add_argument("--min-time", type=float, default=None, help="seconds of timed steps per backend and point")
    p.add_argument("--backends", default=None, help="comma-separated backends to compare (default: all built)")
    p.add_argument("--out", default=None, help="results folder (default bench/results)")
    p.add_argument("--write-table", default=None, metavar="PATH",
                   help="also write the dispatch table for backend 'auto' (load it with tl.load_dispatch_table "
                        "or TREADLE_DISPATCH_TABLE)")
    p.add_argument("--from-result", default=None, metavar="JSON",
                   help="measure nothing: rewrite the report (and --write-table) from a saved crossover-*.json")
    p.add_argument("--no-plot", action="store_true", help="no PNGs even when matplotlib is installed")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv=None, out_default=None):
    args = _parser().parse_args(argv)
    mode = "quick" if args.quick else "full" if args.full else "default"
    _, _, _, batches, max_macs, min_time = SWEEPS[mode]
    configs = sweep_configs(mode)
    if args.configs:
        names = [n.strip() for n in args.configs.split(",") if n.strip()]
        known = {c.name: c for c in sweep_configs("full") + configs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"bench crossover: unknown configuration(s) {unknown}; known: {sorted(known)}")
        configs = [known[n] for n in names]
    batches = _ints(args.batches, "--batches") if args.batches else batches
    max_macs = max_macs if args.max_macs is None else args.max_macs
    min_time = min_time if args.min_time is None else args.min_time
    if min_time <= 0 or max_macs <= 0 or math.isnan(min_time):
        raise SystemExit(f"bench crossover: --min-time and --max-macs must be > 0, got {min_time}, {max_macs}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    unknown = sorted(set(backends or []) - {s.name for s in BACKENDS})
    if unknown:
        raise SystemExit(f"bench crossover: unknown backend(s) {unknown}; known: {[s.name for s in BACKENDS]}")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    if args.from_result:
        result = json.loads(Path(args.from_result).read_text())
        print(report.to_markdown(result))
    else:
        result = run_study(configs, batches, max_macs, min_time, backends, log, mode)
        print(report.to_markdown(result))
        out = args.out or out_default or default_out_dir()
        for path in write_results(result, out, plot=not args.no_plot, log=log):
            log(f"wrote {path}")
    if args.write_table:
        table = write_table(result, args.write_table)
        log(f"wrote {args.write_table} ({len(table['rules'])} rules)")
    return 0


def default_out_dir():
    """bench/results in the source tree this package sits in, else ./bench-results (an installed wheel)."""
    src = Path(__file__).resolve().parent.parent.parent / "bench"
    return src / "results" if src.is_dir() else Path.cwd() / "bench-results"


if __name__ == "__main__":
    sys.exit(main())

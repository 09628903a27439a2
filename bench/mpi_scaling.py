"""Step time vs ranks for data-parallel training (treadle.distributed), and the allreduce cost.

    python bench/mpi_scaling.py [--ranks 1 2] [--seconds 1.0] [--out bench/results/mpi_scaling.json]
    python bench/mpi_scaling.py --predict [--alpha 2e-6] [--bandwidth 12.5e9]   # cost model from that JSON

The driver launches `mpiexec -n P python bench/mpi_scaling.py --worker ...` for each P and collects:
- per model (a small and a wide MLP, float32, fixed global batch split over the ranks):
  step time (median and fastest of ~10 ms rounds, slowest rank), and inside it the gradient
  allreduce and the wait in the small count/loss allreduce (where ranks wait for the slowest);
  compute = step - allreduce - wait;
- at P = 1, the compute time of a plain Trainer.step at the local batch sizes B / P for P up to 64
  (what the cost model in docs/distributed.md scales);
- at P >= 2, an allreduce sweep (8 B .. 16 MiB float32, in place, SUM) to fit latency and bandwidth.
Writes JSON and prints tables. Measurements share the CPUs with whatever else runs: the JSON
records the core count and load average before and after.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

MODELS = {
    # name: (layer widths, global batch)
    "small": ([32, 64, 64, 8], 256),
    "wide": ([128, 1024, 1024, 10], 128),
}


# -- worker (one per rank) ----------------------------------------------------------------------------
def build(widths, seed=0):
    import treadle as tl

    tl.manual_seed(seed)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(tl.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(tl.nn.ReLU())
    return tl.Trainer(tl.nn.Sequential(*layers), tl.loss.MSE(), tl.optim.Adam(lr=1e-4))


def data(widths, n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, widths[0])).astype(np.float32),
            rng.standard_normal((n, widths[-1])).astype(np.float32))


def timed_rounds(comm, call, seconds, counters=lambda: (), calibrate=5, round_s=0.01):
    """Per-round seconds per call() over rounds of ~10 ms filling about `seconds`.

    Returns (per-round times, per-round deltas of counters() per call, calls). Every rank must make
    the same number of calls (they are collective): a short calibration on every rank, then rank 0's
    round size and count for all. Rounds let us report the median (typical) and the fastest round
    (least disturbed: this VM is shared), as bench/run.py does.
    """
    for _ in range(2):
        call()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calibrate):
        call()
    guess = max((time.perf_counter() - start) / calibrate, 1e-9)
    per_round = max(1, int(round_s / guess))
    rounds = max(7, int(seconds / (per_round * guess)))
    per_round, rounds = comm.bcast((per_round, rounds), root=0)
    comm.Barrier()
    times, deltas = [], []
    for _ in range(rounds):
        before = counters()
        start = time.perf_counter()
        for _ in range(per_round):
            call()
        times.append((time.perf_counter() - start) / per_round)
        deltas.append([(a - b) / per_round for a, b in zip(counters(), before)])
    return np.array(times), np.array(deltas), per_round * rounds


def stats(comm, values, op):
    """Median and minimum of per-round values, combined over ranks with `op` (MAX or MIN)."""
    return (comm.allreduce(float(np.median(values)), op=op), comm.allreduce(float(np.min(values)), op=op))


def bench_model(comm, name, seconds):
    from treadle.distributed import DataParallel

    widths, global_batch = MODELS[name]
    rank, size = comm.Get_rank(), comm.Get_size()
    trainer = build(widths)
    dp = DataParallel(trainer, comm)
    x, y = data(widths, global_batch, seed=1)
    mine = np.array_split(np.arange(global_batch), size)[rank]
    xs, ys = np.ascontiguousarray(x[mine]), np.ascontiguousarray(y[mine])
    MPI = _mpi()
    times, deltas, count = timed_rounds(comm, lambda: dp.step(xs, ys), seconds,
                                        counters=lambda: (dp.allreduce_seconds, dp.wait_seconds))
    step, allreduce, wait = times, deltas[:, 0], deltas[:, 1]
    # The flat buffers hold every tensor at an aligned offset: slightly more elements than parameters.
    row = dict(model=name, ranks=size, parameters=int(trainer.model.num_parameters()),
               gradient_bytes=int(trainer.model.flat_gradients().nbytes), global_batch=global_batch,
               local_batch=len(mine), steps=count, step_s=stats(comm, step, MPI.MAX),
               allreduce_s=stats(comm, allreduce, MPI.MAX),
               # The slowest rank barely waits in the small allreduce (its wait is that allreduce's
               # latency); the others wait for it. compute = step - allreduce - wait, per round.
               wait_s=stats(comm, wait, MPI.MIN), compute_s=stats(comm, step - allreduce - wait, MPI.MAX))
    return row


def compute_curve(name, seconds):
    """Plain (non-distributed) step time at the local batch sizes B / P, P = 1, 2, 4, ..., 64."""
    widths, global_batch = MODELS[name]
    trainer = build(widths)
    out = []
    for p in (1, 2, 4, 8, 16, 32, 64):
        local = max(global_batch // p, 1)
        x, y = data(widths, local, seed=2)
        times, _, _ = timed_rounds(_mpi().COMM_SELF, lambda: trainer.step(x, y), seconds / 2)
        out.append(dict(model=name, ranks=p, local_batch=local, step_s=(float(np.median(times)), float(times.min()))))
    return out


def allreduce_sweep(comm, seconds):
    """Seconds per in-place float32 SUM allreduce by message size (max over ranks)."""
    MPI = _mpi()
    out = []
    for k in range(3, 25):  # 8 B .. 16 MiB
        buf = np.ones(2 ** k // 4, dtype=np.float32)
        times, _, _ = timed_rounds(comm, lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), seconds / 10)
        t = stats(comm, times, MPI.MAX)
        out.append(dict(bytes=int(buf.nbytes), seconds=t))
    return out


def _mpi():
    from mpi4py import MPI

    return MPI


def worker(args):
    comm = _mpi().COMM_WORLD
    result = dict(ranks=comm.Get_size(), models=[bench_model(comm, m, args.seconds) for m in MODELS])
    if comm.Get_size() >= 2:
        result["allreduce"] = allreduce_sweep(comm, args.seconds)
    if comm.Get_rank() == 0:
        if comm.Get_size() == 1:
            result["compute_curve"] = [r for m in MODELS for r in compute_curve(m, args.seconds)]
        with open(args.worker, "w") as f:
            json.dump(result, f)


# -- driver ---------------------------------------------------------------------------------------
def conditions():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    from mpi4py import MPI

    return dict(cpu=cpu, cores=os.cpu_count(), mpi=MPI.Get_library_version().splitlines()[0].strip(),
                python=platform.python_version(), numpy=np.__version__, dtype="float32", optimizer="Adam",
                load_average_before=os.getloadavg())


def fit_alpha_beta(sweep):
    """Least squares t = a + b * bytes over the sweep (a: latency, 1/b: bandwidth)."""
    n = np.array([s["bytes"] for s in sweep], dtype=float)
    t = np.array([s["seconds"][0] for s in sweep])  # medians
    small = t[n <= 1024]
    big = n >= 1 << 20
    slope = np.polyfit(n[big], t[big], 1)[0] if big.sum() >= 2 else float("nan")
    return dict(latency_s=float(np.median(small)), bandwidth_Bps=float(1.0 / slope) if slope > 0 else float("nan"))


def table(rows, cols):
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows])


def main():
    parser = argparse.ArgumentParser(description="step time vs ranks for treadle.distributed")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per model and rank count")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "mpi_scaling.json"))
    parser.add_argument("--predict", action="store_true",
                        help="print the cost model's prediction from the JSON in --out (no measuring)")
    parser.add_argument("--alpha", type=float, default=2e-6, help="--predict: per-message latency, seconds")
    parser.add_argument("--bandwidth", type=float, default=12.5e9, help="--predict: link bandwidth, bytes/s")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.predict:
        with open(args.out) as f:
            return predict(json.load(f), args.alpha, args.bandwidth)

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    report = dict(conditions=conditions(), runs=[])
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.ranks:
            path = os.path.join(tmp, f"p{p}.json")
            subprocess.run([mpiexec, "-n", str(p), sys.executable, os.path.abspath(__file__), "--worker", path,
                            "--seconds", str(args.seconds)], check=True, timeout=600)
            with open(path) as f:
                report["runs"].append(json.load(f))
    report["conditions"]["load_average_after"] = os.getloadavg()
    for run in report["runs"]:
        if "allreduce" in run:
            run["fit"] = fit_alpha_beta(run["allreduce"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print_report(report)
    print(f"\nwrote {args.out}")


def us(pair):
    """'median (fastest)' in microseconds."""
    return f"{pair[0] * 1e6:.0f} ({pair[1] * 1e6:.0f})"


def print_report(report):
    c = report["conditions"]
    print(f"{c['cpu']}, {c['cores']} cores, {c['mpi']}; load average {c['load_average_before'][0]:.1f} before, "
          f"{c['load_average_after'][0]:.1f} after. Times: median over ~10 ms rounds (fastest round).")
    rows = []
    base = {m["model"]: m["step_s"] for run in report["runs"] for m in run["models"] if m["ranks"] == 1}
    for run in report["runs"]:
        for m in run["models"]:
            b = base.get(m["model"], (float("nan"),) * 2)
            rows.append([m["model"], f"{m['parameters']}", str(m["ranks"]), str(m["local_batch"]), us(m["step_s"]),
                         us(m["compute_s"]), us(m["wait_s"]), us(m["allreduce_s"]),
                         f"{b[0] / m['step_s'][0]:.2f} ({b[1] / m['step_s'][1]:.2f})"])
    print(table(rows, ["model", "params", "ranks", "local B", "step us", "compute us", "wait us", "allreduce us",
                       "speedup"]))
    for run in report["runs"]:
        if "compute_curve" in run:
            print("\ncompute-only step time at local batch B/P (1 process):")
            print(table([[r["model"], str(r["ranks"]), str(r["local_batch"]), us(r["step_s"])]
                         for r in run["compute_curve"]], ["model", "P", "local B", "step us"]))
        if "allreduce" in run:
            fit = run["fit"]
            print(f"\nallreduce on {run['ranks']} ranks: latency {fit['latency_s'] * 1e6:.2f} us, "
                  f"bandwidth {fit['bandwidth_Bps'] / 1e9:.2f} GB/s (medians; fit over >= 1 MiB)")
            print(table([[str(s["bytes"]), us(s["seconds"])] for s in run["allreduce"]], ["bytes", "us"]))


def ring_allreduce_s(p, nbytes, alpha, bandwidth):
    """Ring allreduce: 2(p - 1) messages, each rank sends and receives 2(p - 1)/p of the buffer."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / bandwidth


def halving_doubling_allreduce_s(p, nbytes, alpha, bandwidth):
    """Rabenseifner (reduce-scatter by recursive halving + allgather by doubling): 2 log2(p) messages."""
    return 2 * np.log2(p) * alpha + 2 * (p - 1) / p * nbytes / bandwidth


def predict(report, alpha, bandwidth):
    """Strong scaling (global batch fixed) and weak scaling (local batch fixed) from measured compute."""
    # The fastest round of each compute measurement: closest to an unloaded core.
    curve = [dict(r, step_s=r["step_s"][1]) for run in report["runs"] if "compute_curve" in run
             for r in run["compute_curve"]]
    params = {m["model"]: m["gradient_bytes"] for run in report["runs"] for m in run["models"]}
    print(f"alpha = {alpha * 1e6:g} us, bandwidth = {bandwidth / 1e9:g} GB/s; compute from "
          f"{report['conditions']['cpu']} (fastest rounds, one core per rank); "
          "small allreduce (count, loss, flag) = 2 log2(p) alpha")
    rows = []
    for name, nbytes in params.items():
        mine = {r["ranks"]: r for r in curve if r["model"] == name}
        t1 = mine[1]["step_s"]
        for p, r in sorted(mine.items()):
            small = 2 * np.log2(p) * alpha
            ring = ring_allreduce_s(p, nbytes, alpha, bandwidth) if p > 1 else 0.0
            rab = halving_doubling_allreduce_s(p, nbytes, alpha, bandwidth) if p > 1 else 0.0
            strong = r["step_s"] + small + ring
            rows.append([name, str(nbytes), str(p), str(r["local_batch"]), f"{r['step_s'] * 1e6:.0f}",
                         f"{ring * 1e6:.1f}", f"{rab * 1e6:.1f}", f"{t1 / strong:.2f}",
                         f"{t1 / (t1 + small + ring):.2f}", f"{t1 / (t1 + small + rab):.2f}"])
        for p in (256, 1024):
            small = 2 * np.log2(p) * alpha
            ring = ring_allreduce_s(p, nbytes, alpha, bandwidth)
            rab = halving_doubling_allreduce_s(p, nbytes, alpha, bandwidth)
            rows.append([name, str(nbytes), str(p), "-", "-", f"{ring * 1e6:.1f}", f"{rab * 1e6:.1f}", "-",
                         f"{t1 / (t1 + small + ring):.2f}", f"{t1 / (t1 + small + rab):.2f}"])
    print(table(rows, ["model", "grad bytes", "P", "local B", "compute us", "ring us", "halv-doubl us",
                       "strong speedup (ring)", "weak eff. (ring)", "weak eff. (halv-doubl)"]))


if __name__ == "__main__":
    main()

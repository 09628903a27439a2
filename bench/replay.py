"""Replay buffer throughput (`python bench/replay.py`): tl.ReplayBuffer against a numpy ring buffer, and
both against the machine's copy bandwidth, at sample sizes from 64 B to 1 MB.

One step pushes a batch of `--batch` samples (a copy in) and samples a batch of as many (a copy out into
a preallocated array): the numpy ring buffer writes with fancy indexing and gathers with np.take(out=),
the treadle buffer is firo with samples kept (max_reuse 0, the demo's: a sliding window drawn at random).
Both run in alternating rounds on the calling thread; each round's time per sample is recorded and the
table gives medians. Bandwidth is bytes moved (2 x sample size per sample: in and out) per second; the
reference is the median of np.copyto over 256 MB (one read and one write per byte, as a push or a
sample). Writes bench/results/replay-<time>.{json,md} and latest-replay.{json,md}.
"""
import argparse
import datetime
import statistics
import time
from pathlib import Path

import numpy as np

import treadle as tl
from treadle.bench import machine_info, write_result_files

SIZES = [64, 1024, 16 * 1024, 256 * 1024, 1024 * 1024]  # bytes per sample (float32 vectors)


def copy_bandwidth(repeats):
    src = np.ones(64 * 1024 * 1024, np.float32)  # 256 MB
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: the page faults are not bandwidth
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return src.nbytes / statistics.median(times) / 1e9


class NumpyRing:
    def __init__(self, capacity, width, seed):
        self.x = np.zeros((capacity, width), np.float32)
        self.head = self.filled = 0
        self.rng = np.random.default_rng(seed)

    def push(self, x):
        idx = (self.head + np.arange(len(x))) % len(self.x)
        self.x[idx] = x
        self.head = int((self.head + len(x)) % len(self.x))
        self.filled = min(self.filled + len(x), len(self.x))

    def sample(self, out):
        np.take(self.x, self.rng.integers(0, self.filled, len(out)), axis=0, out=out)


def measure(size, batch, rounds, steps_for):
    width = size // 4
    capacity = max(4 * batch, min(65536, (64 * 1024 * 1024) // size))  # about 64 MB of storage, or 4 batches
    steps = steps_for(size)
    data = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    out = np.empty((batch, width), np.float32)
    ours = tl.ReplayBuffer({"x": (width,)}, capacity=capacity, policy="firo", max_reuse=0, seed=0)
    ring = NumpyRing(capacity, width, 0)
    for _ in range(capacity // batch):  # full before timing
        ours.push(x=data)
        ring.push(data)
    target = {"x": out}
    t_ours, t_ring = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            ours.push(x=data)
            ours.sample(batch, out=target)
        t_ours.append((time.perf_counter() - t0) / (steps * batch))
        t0 = time.perf_counter()
        for _ in range(steps):
            ring.push(data)
            ring.sample(out)
        t_ring.append((time.perf_counter() - t0) / (steps * batch))
    ours_s, ring_s = statistics.median(t_ours), statistics.median(t_ring)
    return {"sample_bytes": size, "capacity": capacity, "batch": batch, "steps_per_round": steps, "rounds": rounds,
            "treadle_ns_per_sample": ours_s * 1e9, "numpy_ns_per_sample": ring_s * 1e9,
            "speedup_vs_numpy": ring_s / ours_s,
            "treadle_GBps": 2 * size / ours_s / 1e9, "numpy_GBps": 2 * size / ring_s / 1e9}


def table(result):
    bw = result["conditions"]["copy_bandwidth_GBps"]
    lines = [f"Replay buffer push + sample ({result['conditions']['cpu']}; 1 thread; copy bandwidth {bw:.1f} GB/s)",
             "",
             "| sample | capacity | treadle ns/sample | numpy ring ns/sample | treadle / numpy speed | treadle GB/s "
             "| fraction of copy bandwidth |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        size = r["sample_bytes"]
        label = f"{size // 1024} KB" if size >= 1024 else f"{size} B"
        lines.append(f"| {label} | {r['capacity']} | {r['treadle_ns_per_sample']:.0f} | {r['numpy_ns_per_sample']:.0f} "
                     f"| {r['speedup_vs_numpy']:.2f}x | {r['treadle_GBps']:.2f} | {r['treadle_GBps'] / bw:.0%} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    steps_for = lambda size: max(4, int(2e6 // (size * args.batch)) + 4)  # noqa: E731 (about 2 MB per round)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "conditions": {"cpu": machine_info()["cpu_model"], "threads": 1, "numpy": np.__version__, "treadle": tl.__version__,
                             "copy_bandwidth_GBps": copy_bandwidth(args.rounds)},
              "rows": [measure(s, args.batch, args.rounds, steps_for) for s in SIZES]}
    text = table(result)
    write_result_files(result, text + "\n", args.out, "replay", latest="latest-replay")
    print(text)


if __name__ == "__main__":
    main()

"""Alternating-round timing shared by the benchmark commands (bench.py, bench_workers.py, ...)."""
import time

import numpy as np

ROUND_SECONDS = 0.01    # one timed round: a few ms, so alternation follows machine noise closely


# -- timing ---------------------------------------------------------------------------------------
def _steps_per_round(run, target=ROUND_SECONDS):
    """How many steps make one round last about `target` seconds (runs the step a few times). The
    first call is not timed: a cold one (lazy initialisation, first-touch pages) can be 100x slower
    and would make rounds of one step, which then take thousands of rounds to fill `min_time`."""
    run(1)
    n = 1
    while True:
        t0 = time.perf_counter()
        run(n)
        dt = time.perf_counter() - t0
        if dt >= target / 4 or n >= 1 << 16:
            return max(1, int(round(n * target / max(dt, 1e-9))))
        n *= 4


def time_alternating(runners, min_time=1.0, warmup=0.2):
    """Median seconds per step of each runner, timed in alternating rounds.

    `runners` maps a name to run(k), which performs k steps. Every runner is warmed up for
    `warmup` seconds; then rounds cycle through the runners until each has accumulated `min_time`
    seconds of timed steps. Returns {name: {"median_s", "p25_s", "p75_s", "min_s", "steps"}}.
    """
    per_round = {}
    for name, run in runners.items():
        per_round[name] = _steps_per_round(run)
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            run(per_round[name])
    samples = {name: [] for name in runners}
    spent = dict.fromkeys(runners, 0.0)
    deadline = time.perf_counter() + 20 * min_time + 1.0  # a runner ignoring k must not hang the suite
    while min(spent.values()) < min_time and time.perf_counter() < deadline:
        for name, run in runners.items():
            k = per_round[name]
            t0 = time.perf_counter()
            run(k)
            dt = time.perf_counter() - t0
            samples[name].append(dt / k)
            spent[name] += dt
    out = {}
    for name, s in samples.items():
        p25, med, p75 = np.percentile(s, [25, 50, 75])
        out[name] = {"median_s": float(med), "p25_s": float(p25), "p75_s": float(p75), "min_s": float(min(s)),
                     "steps": int(per_round[name] * len(s))}
    return out

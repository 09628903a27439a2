"""Online against offline training on the demo's problem (`python bench/online_offline.py`).

The simulation (examples/heat_surrogate.py: RUNS 1-D heat equations restarting with fresh random
initial conditions and diffusivities) runs for --steps coarse steps. Online: one training step between
two simulation steps, on the newest samples plus older ones drawn from a tl.ReplayBuffer (firo,
capacity 4096, samples kept until newer ones push them out: a sliding window). Online reservoir: the
same with a reservoir buffer (a uniform random subset of everything the simulation produced so far). Offline: the simulation first runs to the
end storing every sample, then the model trains on batches drawn uniformly from all of them, for the
same training time as the online run took (measured, so each gets the same compute). Offline with the
online run's memory: the simulation keeps a uniform random subset of everything it produced in a
reservoir buffer of the online buffer's capacity (all an offline trainer holding no more than the online
one can have), then trains on it for the same time. Each reports the held-out rollout error (8 fresh
runs, EPISODE coarse steps) and the samples it had to store; the table gives medians over seeds. One thread. Writes bench/results/online-offline-<time>.{json,md} and
latest-online-offline.{json,md}.
"""
import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import treadle as tl
from treadle.bench import machine_info, write_result_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from heat_surrogate import (EPISODE, NX, RUNS, SCALE, coarse_step, features, held_out_error,  # noqa: E402
                            initial_conditions)

BATCH = 64
CAPACITY = 4096  # the online buffer's samples, and the equal-memory offline run's
KINDS = ("online", "online_reservoir", "offline", "offline_same_memory")


def build(seed, steps):
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(NX + 1, 64), tl.nn.Tanh(), tl.nn.Linear(64, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, NX))
    return net, tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3),
                           schedule=tl.optim.CosineAnnealingLR(T_max=steps, eta_min=1.5e-4))


def simulate(rng, steps, on_step):
    u, r = initial_conditions(rng, RUNS)
    age = rng.integers(0, EPISODE, size=RUNS)
    for step in range(steps):
        u_next = coarse_step(u, r)
        on_step(features(u, r), ((u_next - u) * SCALE).astype(np.float32))
        u, age = u_next, age + 1
        done = age >= EPISODE
        u[done], r[done] = initial_conditions(rng, int(done.sum()))
        age[done] = 0


def online(seed, steps, policy="firo"):
    net, trainer = build(seed, steps)
    buffer = tl.ReplayBuffer({"x": (NX + 1,), "y": (NX,)}, capacity=CAPACITY, policy=policy, max_reuse=0, seed=seed)
    spent = [0.0]

    def step(x, y):
        buffer.push(x=x, y=y)
        old = buffer.sample(min(BATCH - RUNS, len(buffer)))
        t0 = time.perf_counter()
        trainer.step(np.concatenate([x, old["x"]]), np.concatenate([y, old["y"]]))
        spent[0] += time.perf_counter() - t0

    simulate(np.random.default_rng(seed), steps, step)
    return {"error": held_out_error(net, np.random.default_rng([seed, 99])), "train_seconds": spent[0], "stored_samples": buffer.capacity,
            "train_steps": steps}


def train_for(trainer, x, y, budget, draw):
    """Steps on batches drawn uniformly from (x, y) until `budget` seconds of training are spent."""
    spent, done = 0.0, 0
    while spent < budget or done == 0:
        idx = draw.integers(0, len(x), BATCH)
        t0 = time.perf_counter()
        trainer.step(x[idx], y[idx])
        spent += time.perf_counter() - t0
        done += 1
    return spent, done


def offline(seed, steps, budget):
    net, trainer = build(seed, steps)
    xs, ys = [], []
    simulate(np.random.default_rng(seed), steps, lambda x, y: (xs.append(x), ys.append(y)))
    x, y = np.concatenate(xs), np.concatenate(ys)
    spent, done = train_for(trainer, x, y, budget, np.random.default_rng([seed, 7]))
    return {"error": held_out_error(net, np.random.default_rng([seed, 99])), "train_seconds": spent,
            "stored_samples": len(x), "train_steps": done}


def offline_same_memory(seed, steps, budget):
    net, trainer = build(seed, steps)
    kept = tl.ReplayBuffer({"x": (NX + 1,), "y": (NX,)}, capacity=CAPACITY, policy="reservoir", seed=seed)
    simulate(np.random.default_rng(seed), steps, lambda x, y: kept.push(x=x, y=y))
    held = kept.sample(len(kept))  # every sample it kept (distinct), in random order
    spent, done = train_for(trainer, held["x"], held["y"], budget, np.random.default_rng([seed, 7]))
    return {"error": held_out_error(net, np.random.default_rng([seed, 99])), "train_seconds": spent,
            "stored_samples": len(kept), "train_steps": done}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    runs = []
    for seed in range(args.seeds):
        on = online(seed, args.steps)
        runs.append({"seed": seed, "online": on, "online_reservoir": online(seed, args.steps, "reservoir"),
                     "offline": offline(seed, args.steps, on["train_seconds"]),
                     "offline_same_memory": offline_same_memory(seed, args.steps, on["train_seconds"])})
    med = {kind: {key: statistics.median(r[kind][key] for r in runs) for key in runs[0][kind]} for kind in KINDS}
    cpu = machine_info()["cpu_model"]
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "conditions": {"cpu": cpu, "threads": 1, "steps": args.steps, "seeds": args.seeds, "batch": BATCH,
                             "runs": RUNS, "treadle": tl.__version__},
              "runs": runs, "median": med}
    lines = [f"Online vs offline training, heat surrogate ({cpu}; 1 thread; {args.steps} simulation steps of {RUNS} "
             f"runs; batch {BATCH}; medians over {args.seeds} seeds)", "",
             "| training | held-out rollout error | training seconds | training steps | samples stored |",
             "|---|---|---|---|---|"]
    for kind in KINDS:
        m = med[kind]
        lines.append(f"| {kind.replace('_', ' ')} | {m['error']:.4f} | {m['train_seconds']:.2f} | {m['train_steps']:.0f} "
                     f"| {m['stored_samples']:.0f} |")
    text = "\n".join(lines)
    write_result_files(result, text + "\n", args.out, "online-offline", latest="latest-online-offline")
    print(text)


if __name__ == "__main__":
    main()

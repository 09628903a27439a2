"""A simulation that trains a neural surrogate of itself while it runs (the demo, written to be read).

    python examples/heat_surrogate.py [--steps 3000] [--seed 0]

The host is a numpy simulation: an ensemble of 1-D heat equations u_t = kappa u_xx on a periodic grid,
advanced with explicit finite differences, each run with its own random initial condition and
diffusivity. It owns the time loop. Between two of its time steps it hands treadle the newest samples
(state, diffusion number) -> (change of the state over one coarse step) and calls `trainer.step` once.
treadle computes on the calling thread and returns; it starts no thread and keeps nothing running.

`python -m treadle demo` is the same program with more checks (a float64 gradient verification).
"""
import argparse

import numpy as np

import treadle as tl

NX, SUBSTEPS, RUNS, EPISODE = 32, 4, 16, 16   # grid points, solver steps per coarse step, runs, restart age
R_LOW, R_HIGH = 0.05, 0.45                     # diffusion number r = kappa dt / dx^2 (stable below 0.5)
SCALE = 10.0                                   # the network predicts SCALE * (u_next - u): O(1) targets


# ---- the simulation: plain numpy, knows nothing about treadle ----------------------------------------
def coarse_step(u, r):
    """SUBSTEPS explicit finite-difference steps for every run (rows of u)."""
    for _ in range(SUBSTEPS):
        u = u + r[:, None] * (np.roll(u, -1, axis=1) - 2.0 * u + np.roll(u, 1, axis=1))
    return u


def initial_conditions(rng, n):
    """Zero-mean random states made of Fourier modes 1..4 (amplitude ~ 1/k), and a random r per run."""
    x = np.arange(NX) * (2.0 * np.pi / NX)
    u = sum((rng.standard_normal((n, 1)) * np.cos(k * x) + rng.standard_normal((n, 1)) * np.sin(k * x)) / k
            for k in range(1, 5))
    return u, rng.uniform(R_LOW, R_HIGH, size=n)


# ---- the glue: samples for the network --------------------------------------------------------------
def features(u, r):
    r_scaled = (2.0 * (r - R_LOW) / (R_HIGH - R_LOW) - 1.0)[:, None]
    return np.hstack([u, r_scaled]).astype(np.float32)


def surrogate_step(net, u, r):
    return u + net.predict(features(u, r)) / SCALE


def held_out_error(net, rng, runs=8):
    """Fresh runs drawn from `rng`, the surrogate rolled out for EPISODE coarse steps next to the true
    simulation: the relative L2 error of the whole rollout."""
    u_true, r = initial_conditions(rng, runs)
    u_sur, err2, ref2 = u_true, 0.0, 0.0
    for _ in range(EPISODE):
        u_true, u_sur = coarse_step(u_true, r), surrogate_step(net, u_sur, r)
        err2 += np.sum((u_sur - u_true) ** 2)
        ref2 += np.sum(u_true ** 2)
    return float(np.sqrt(err2 / ref2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="simulation time steps (one training step each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tl.manual_seed(args.seed)

    net = tl.nn.Sequential(tl.nn.Linear(NX + 1, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, NX))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3),
                         schedule=tl.optim.CosineAnnealingLR(T_max=args.steps, eta_min=1.5e-4))

    # A replay buffer (first in, random out; samples stay until newer ones push them out): each batch is
    # the newest RUNS samples plus older ones drawn from it.
    batch = 64
    buffer = tl.ReplayBuffer({"x": (NX + 1,), "y": (NX,)}, capacity=4096, policy="firo", max_reuse=0,
                             seed=args.seed)

    u, r = initial_conditions(rng, RUNS)
    age = rng.integers(0, EPISODE, size=RUNS)  # staggered restarts
    for step in range(1, args.steps + 1):
        # --- the simulation's time step ---
        u_next = coarse_step(u, r)
        # --- between time steps: hand over the newest samples, train once, return to the simulation ---
        x_new, y_new = features(u, r), ((u_next - u) * SCALE).astype(np.float32)
        buffer.push(x=x_new, y=y_new)
        old = buffer.sample(min(batch - RUNS, len(buffer)))
        loss = trainer.step(np.concatenate([x_new, old["x"]]), np.concatenate([y_new, old["y"]]))
        if step % (args.steps // 5 or 1) == 0:
            print(f"step {step:5d}  loss {loss:.3e}")
        # --- the simulation goes on; old runs restart from fresh initial conditions ---
        u, age = u_next, age + 1
        done = age >= EPISODE
        u[done], r[done] = initial_conditions(rng, int(done.sum()))
        age[done] = 0

    error = held_out_error(net, np.random.default_rng([args.seed, 1]))
    print(f"held-out rollout relative L2 error: {error:.4f}")


if __name__ == "__main__":
    main()

"""`python -m treadle demo`: a running simulation trains its own surrogate.

The simulation is the "HPC code": an ensemble of 1-D heat equations u_t = kappa u_xx on a periodic
grid, advanced with explicit finite differences, each run with its own random initial condition and
diffusivity. The driver loop (train_in_the_loop) belongs to the simulation: between two of its time
steps it hands the newest (state, parameter) -> next-state samples to treadle and calls `trainer.step`
once; treadle computes on the calling thread and returns. Nothing runs in the background: the host
drives.

The network is a surrogate of one coarse time step (4 solver steps): it maps the state and
the diffusion number r = kappa dt / dx^2 to the change of the state. After training it is checked on
held-out runs (relative L2 error of a multi-step rollout against the true simulation), and its
gradients are verified against float64 central finite differences.
"""
import argparse
import time

import numpy as np

import treadle as tl

NX = 32              # grid points of each run (periodic)
SUBSTEPS = 4         # solver steps per surrogate step
R_RANGE = (0.05, 0.45)  # diffusion number r = kappa dt / dx^2; explicit Euler is stable for r <= 0.5
MODES = 4            # initial conditions: random Fourier modes 1..MODES (zero mean)
EPISODE = 16         # surrogate steps before a run restarts from a fresh initial condition
DELTA_SCALE = 10.0   # targets are 10 * (u_next - u): O(1) numbers for the network
RUNS = 16            # simulation runs advanced together (new samples per driver step)
REPLAY = 4096        # replay buffer capacity (samples)
HELD_OUT_RUNS = 8    # fresh runs the trained surrogate is tested on


# -- the simulation (the host code: numpy, knows nothing about treadle) --------------------------
def heat_substep(u, r):
    """One explicit finite-difference step of u_t = kappa u_xx for every run (rows of u)."""
    return u + r[:, None] * (np.roll(u, -1, axis=1) - 2.0 * u + np.roll(u, 1, axis=1))


def coarse_step(u, r):
    """One surrogate time step: SUBSTEPS solver steps."""
    for _ in range(SUBSTEPS):
        u = heat_substep(u, r)
    return u


def random_initial_conditions(rng, n):
    """n zero-mean states made of Fourier modes 1..MODES with amplitudes ~ 1/k; and their r."""
    x = np.arange(NX) * (2.0 * np.pi / NX)
    k = np.arange(1, MODES + 1)
    amp = rng.standard_normal((n, MODES, 2)) / k[None, :, None]
    u = (amp[:, :, 0, None] * np.cos(k[None, :, None] * x) + amp[:, :, 1, None] * np.sin(k[None, :, None] * x)).sum(1)
    r = rng.uniform(*R_RANGE, size=n)
    return u, r


class HeatEnsemble:
    """RUNS independent heat-equation runs; each restarts after EPISODE surrogate steps."""

    def __init__(self, rng, n_runs=RUNS):
        self.rng = rng
        self.u, self.r = random_initial_conditions(rng, n_runs)
        # Staggered ages, so that restarts (and fresh, fast-changing states) are spread over time.
        self.age = rng.integers(0, EPISODE, size=n_runs)
        self.t = 0

    def advance(self):
        """Advances every run by one surrogate step; returns (u_before, r, u_after)."""
        u0, r = self.u, self.r
        u1 = coarse_step(u0, r)
        self.u, self.age, self.t = u1, self.age + 1, self.t + 1
        done = self.age >= EPISODE
        if done.any():
            self.u = self.u.copy()
            self.r = self.r.copy()
            self.u[done], self.r[done] = random_initial_conditions(self.rng, int(done.sum()))
            self.age[done] = 0
        return u0, r, u1


# -- the glue between the simulation and the network -----------------------------------------------
def features(u, r):
    """Network input: the state and r mapped to [-1, 1], as float32 rows."""
    r_feat = (2.0 * (r - R_RANGE[0]) / (R_RANGE[1] - R_RANGE[0]) - 1.0)[:, None]
    return np.ascontiguousarray(np.hstack([u, r_feat]), dtype=np.float32)


def targets(u0, u1):
    return np.ascontiguousarray((u1 - u0) * DELTA_SCALE, dtype=np.float32)


def surrogate_step(net, u, r):
    """The surrogate's coarse step: u + predicted change."""
    return u + net.predict(features(u, r)).astype(np.float64) / DELTA_SCALE


def replay_buffer(seed):
    """The online-training buffer (tl.ReplayBuffer): first in, random out, samples kept until newer ones
    push them out (max_reuse 0), the oldest leaving first when it is full."""
    return tl.ReplayBuffer({"x": (NX + 1,), "y": (NX,)}, capacity=REPLAY, policy="firo", max_reuse=0, seed=seed)


def training_batch(buffer, x_new, y_new, n):
    """n samples: the newest first, the rest drawn from the buffer (distinct, uniformly)."""
    rest = min(n - len(x_new), len(buffer))
    if rest <= 0:
        return x_new[:n], y_new[:n]
    old = buffer.sample(rest)
    return np.concatenate([x_new, old["x"]]), np.concatenate([y_new, old["y"]])


def build_model(hidden):
    return tl.nn.Sequential(
        tl.nn.Linear(NX + 1, hidden), tl.nn.Tanh(),
        tl.nn.Linear(hidden, hidden), tl.nn.Tanh(),
        tl.nn.Linear(hidden, NX))


# -- the driver: the simulation's time loop, with one training step between time steps ---------------
def train_in_the_loop(args, log):
    rng = np.random.default_rng(args.seed)
    tl.manual_seed(args.seed)
    net = build_model(args.hidden)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=args.lr),
                         schedule=tl.optim.CosineAnnealingLR(T_max=args.steps, eta_min=args.lr * 0.05),
                         seed=args.seed)
    sim = HeatEnsemble(rng)
    buffer = replay_buffer(args.seed)
    report_every = max(args.steps // 5, 1)
    window, train_time, curve = [], 0.0, []
    for step in range(1, args.steps + 1):
        u0, r, u1 = sim.advance()                                  # the simulation's own time step
        x_new, y_new = features(u0, r), targets(u0, u1)
        buffer.push(x=x_new, y=y_new)                              # hand over the newest samples
        x, y = training_batch(buffer, x_new, y_new, args.batch_size)
        t0 = time.perf_counter()
        window.append(trainer.step(x, y))                          # one training step, then back to the host
        train_time += time.perf_counter() - t0
        curve.append(window[-1])
        if step % report_every == 0 or step == args.steps:
            log(f"  step {step:6d}/{args.steps}  simulated steps {sim.t * SUBSTEPS:7d}  "
                f"train loss {np.mean(window):.3e}  lr {trainer.lr:.2e}  replay {len(buffer)}")
            window = []
    return net, train_time, curve


# -- verification -------------------------------------------------------------------------------------
def held_out_error(net, seed, n_runs=HELD_OUT_RUNS, horizon=EPISODE):
    """Relative L2 errors on fresh runs over `horizon` coarse steps.

    rollout: the surrogate fed its own output, vs the simulation (normalised by the true states).
    one_step: the change the surrogate predicts from the true state, vs the true change.
    frozen: the rollout error of keeping the initial state (what "learned nothing" scores).
    """
    u, r = random_initial_conditions(np.random.default_rng([seed, 1]), n_runs)
    u_true, u_sur = u, u
    err2 = ref2 = step_err2 = step_ref2 = base2 = 0.0
    for _ in range(horizon):
        nxt = coarse_step(u_true, r)
        one = surrogate_step(net, u_true, r)        # one step from the true state
        step_err2 += np.sum((one - nxt) ** 2)
        step_ref2 += np.sum((nxt - u_true) ** 2)
        base2 += np.sum((u - nxt) ** 2)             # "nothing happens after t=0" baseline
        u_true, u_sur = nxt, surrogate_step(net, u_sur, r)
        err2 += np.sum((u_sur - u_true) ** 2)
        ref2 += np.sum(u_true ** 2)
    return {"rollout": np.sqrt(err2 / ref2), "one_step": np.sqrt(step_err2 / step_ref2),
            "frozen": np.sqrt(base2 / ref2)}


def gradient_check(net, hidden, x, seed, n_params=64, h=1e-5):
    """Max relative error of trainer.backward's input and parameter gradients vs central differences.

    Runs on a float64 copy of the trained network. For a random cotangent g the checked function is
    L(x, params) = sum(g * net(x)); the relative error is max|analytic - numeric| / max|numeric|
    over the checked entries (all inputs, `n_params` random parameters).
    """
    ref = build_model(hidden).double()
    ref.load_state_dict(net.state_dict())           # converted to float64 on load
    # The trainer is only used for forward/backward: the optimizer never steps.
    trainer = tl.Trainer(ref, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    x = np.ascontiguousarray(x, dtype=np.float64)
    rng = np.random.default_rng([seed, 2])
    g = rng.standard_normal((len(x), NX))
    trainer.zero_grad()
    trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    dparams = ref.flat_gradients().copy()

    def objective(xv):
        return float(np.sum(g * ref.predict(xv)))

    fd_x = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        fd_x[idx] = (objective(xp) - objective(xm)) / (2 * h)
    params = ref.flat_parameters()                  # a writable view of the model's flat buffer
    picked = rng.choice(params.size, size=min(n_params, params.size), replace=False)
    fd_p = np.zeros(len(picked))
    for j, i in enumerate(picked):
        saved = params[i]
        params[i] = saved + h
        plus = objective(x)
        params[i] = saved - h
        minus = objective(x)
        params[i] = saved
        fd_p[j] = (plus - minus) / (2 * h)
    err_x = np.max(np.abs(dx - fd_x)) / np.max(np.abs(fd_x))
    err_p = np.max(np.abs(dparams[picked] - fd_p)) / np.max(np.abs(fd_p))
    return max(err_x, err_p), x.size, len(picked)


# -- entry point -------------------------------------------------------------------------------------
def add_arguments(parser):
    parser.add_argument("--steps", type=int, default=3000,
                        help="simulation time steps, each followed by one training step (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="samples per training step: the newest ones plus replayed ones (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=64,
                        help="width of the surrogate's two hidden layers (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="Adam learning rate, cosine-annealed over the run (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the simulation, the weights and the held-out runs; same seed, same output "
                             "(default: %(default)s)")
    parser.add_argument("--quiet", action="store_true",
                        help="print only the results: held-out error and gradient check")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="also draw the training curve and a held-out rollout against the simulation into "
                             "this file (needs matplotlib: pip install treadle[plot])")
    return parser


def check_arguments(args):
    for name in ("steps", "batch_size", "hidden"):
        if getattr(args, name) <= 0:
            raise ValueError(f"demo: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.batch_size < RUNS:
        raise ValueError(f"demo: --batch-size must be at least {RUNS} (the samples one simulation step makes), "
                         f"got {args.batch_size}")
    if not args.lr > 0:
        raise ValueError(f"demo: --lr must be positive, got {args.lr}")
    if getattr(args, "plot", None):
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("demo: --plot needs matplotlib, which is not installed (pip install matplotlib, or "
                             "treadle[plot])")


def run(args):
    """Runs the demo; returns a dict of the numbers it printed."""
    check_arguments(args)
    log = (lambda *_: None) if args.quiet else print
    log(f"treadle demo: {RUNS} heat-equation runs (periodic, {NX} points, explicit finite differences) train an "
        f"MLP surrogate of {SUBSTEPS} solver steps while they run")
    log(f"  network {NX + 1} -> {args.hidden} -> {args.hidden} -> {NX} (tanh), Adam, batch {args.batch_size}, "
        f"{args.steps} steps, seed {args.seed}")
    t0 = time.perf_counter()
    net, train_time, curve = train_in_the_loop(args, log)
    total = time.perf_counter() - t0
    log(f"  trained in {total:.2f} s ({1e6 * train_time / args.steps:.0f} us per trainer.step, "
        f"the rest is the simulation and the replay buffer)")
    err = held_out_error(net, args.seed)
    print(f"held-out error: relative L2 error of a {EPISODE}-step surrogate rollout vs the simulation "
          f"= {err['rollout']:.4f} ({HELD_OUT_RUNS} unseen runs; one-step change: {err['one_step']:.4f}; "
          f"keeping the initial state: {err['frozen']:.4f})")
    probe = features(*random_initial_conditions(np.random.default_rng([args.seed, 3]), 4))
    grad_err, n_in, n_par = gradient_check(net, args.hidden, probe, args.seed)
    print(f"gradient check: max relative error of trainer.backward vs float64 central differences "
          f"= {grad_err:.2e} ({n_in} input and {n_par} parameter entries)")
    if args.plot:
        plot(args.plot, net, curve, args.seed)
        print(f"wrote {args.plot}")
    return {"rollout_error": err["rollout"], "one_step_error": err["one_step"], "gradient_error": grad_err}


def plot(path, net, curve, seed, snapshots=(0, EPISODE // 4, EPISODE // 2, EPISODE)):
    """The training curve, and one held-out run: the surrogate's rollout against the simulation."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    u, r = random_initial_conditions(np.random.default_rng([seed, 1]), 1)
    true_states, surrogate_states = [u], [u]
    for _ in range(EPISODE):
        true_states.append(coarse_step(true_states[-1], r))
        surrogate_states.append(surrogate_step(net, surrogate_states[-1], r))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, len(curve) + 1)
    left.semilogy(steps, curve, lw=0.6, alpha=0.5, label="per step")
    width = max(len(curve) // 50, 1)
    if len(curve) >= width:
        smooth = np.convolve(curve, np.ones(width) / width, mode="valid")
        left.semilogy(steps[width - 1:], smooth, lw=1.5, label=f"mean of {width}")
    left.set(xlabel="training step (one per simulation step)", ylabel="MSE loss", title="training in the loop")
    left.legend()
    x = np.arange(NX)
    for k, t in enumerate(snapshots):
        color = f"C{k}"
        right.plot(x, true_states[t][0], color=color, lw=1.5, label=f"simulation, step {t}")
        right.plot(x, surrogate_states[t][0], color=color, lw=1.5, ls="--", label=f"surrogate, step {t}")
    right.set(xlabel="grid point", ylabel="u", title=f"held-out run: rollout of {EPISODE} coarse steps")
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = add_arguments(argparse.ArgumentParser(prog="python -m treadle demo", description=__doc__,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as e:
        parser.error(str(e))
    run(args)
    return 0

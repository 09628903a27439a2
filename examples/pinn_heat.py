"""A physics-informed network for the 1-D heat equation: the PDE residual, built from derivatives of
the network's output with respect to its input, is the loss.

    python examples/pinn_heat.py [--steps 4000] [--seed 0]

    u_t = nu u_xx on x in [0, 1], t in [0, 1];  u(x, 0) = sin(pi x);  u(0, t) = u(1, t) = 0

whose solution is u = exp(-nu pi^2 t) sin(pi x). The network u(x, t) never sees it: each step draws
collocation points inside the domain, where the loss asks for u_t - nu u_xx = 0, and points on the
initial line and the two walls, where it asks for the initial and boundary values. The loss takes
the model's input as its third argument and differentiates the output with respect to it twice with
`tl.functional.grad`; the plan records those derivatives as graph ops, so each `trainer.step` is one
planned call that differentiates them once more for the parameters' gradients. At the end the
network is compared with the exact solution on a grid.
"""
import argparse

import numpy as np

import treadle as tl
import treadle.functional as F

NU = 0.1
INTERIOR, BOUNDARY = 512, 128  # collocation points per step; half the boundary points are on t = 0


def heat_loss(u, target, xt):
    """Mean squared PDE residual over the interior points plus the boundary misfit.

    target[:, 0] is the value a boundary point must take and target[:, 1] is 1 on boundary points,
    0 inside. Rows are (x, t)."""
    (du,) = F.grad(u, xt, F.ones_like(u))            # (u_x, u_t) per point
    (d2u,) = F.grad(du[:, 0:1], xt, F.ones_like(u))  # (u_xx, u_xt)
    on_boundary = target[:, 1:2]
    residual = (du[:, 1:2] - NU * d2u[:, 0:1]) * (1 - on_boundary)
    misfit = (u - target[:, 0:1]) * on_boundary
    return (residual ** 2).sum() / INTERIOR + (misfit ** 2).sum() / BOUNDARY


def batch(rng):
    """INTERIOR points inside, then BOUNDARY points on t = 0 and on the walls x = 0, 1."""
    inside = rng.uniform(0, 1, (INTERIOR, 2))
    n0 = BOUNDARY // 2
    initial = np.stack([rng.uniform(0, 1, n0), np.zeros(n0)], 1)
    walls = np.stack([rng.integers(0, 2, BOUNDARY - n0).astype(float), rng.uniform(0, 1, BOUNDARY - n0)], 1)
    xt = np.concatenate([inside, initial, walls])
    value = np.concatenate([np.zeros(INTERIOR), np.sin(np.pi * initial[:, 0]), np.zeros(BOUNDARY - n0)])
    flag = np.concatenate([np.zeros(INTERIOR), np.ones(BOUNDARY)])
    return xt.astype(np.float32), np.stack([value, flag], 1).astype(np.float32)


def exact(xt):
    return np.exp(-NU * np.pi ** 2 * xt[:, 1]) * np.sin(np.pi * xt[:, 0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tl.manual_seed(args.seed)

    width = 32
    net = tl.nn.Sequential(tl.nn.Linear(2, width), tl.nn.Tanh(), tl.nn.Linear(width, width), tl.nn.Tanh(),
                           tl.nn.Linear(width, width), tl.nn.Tanh(), tl.nn.Linear(width, 1))
    trainer = tl.Trainer(net, heat_loss, tl.optim.Adam(lr=3e-3),
                         schedule=tl.optim.CosineAnnealingLR(T_max=args.steps, eta_min=1e-4))
    for step in range(args.steps):
        loss = trainer.step(*batch(rng))
        if step % 500 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss (residual + boundary) {loss:.3e}")

    grid = np.stack(np.meshgrid(np.linspace(0, 1, 101), np.linspace(0, 1, 101)), -1).reshape(-1, 2)
    u = net.predict(grid.astype(np.float32))[:, 0]
    ref = exact(grid)
    relative = float(np.linalg.norm(u - ref) / np.linalg.norm(ref))
    print(f"relative L2 error against the exact solution on a 101 x 101 grid: {relative:.4f}")
    print(f"largest pointwise error: {float(np.max(np.abs(u - ref))):.4f}")


if __name__ == "__main__":
    main()

"""Data-parallel training of an MLP over MPI.

    mpiexec -n 2 python -m mpi4py examples/mpi_train.py [--epochs 20] [--batch 64]

(`python -m mpi4py` makes an uncaught exception on one rank abort the whole job instead of leaving
the other ranks waiting; plain `python examples/mpi_train.py` works too.)

Every rank draws the same global batches from a shared shuffle and trains on its own slice of each,
so the result equals one process training on the whole batch: the last, short batch of an epoch is
split unevenly and still averaged correctly. The host owns MPI: this script picks the communicator
and treadle only uses it.
"""
import argparse

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel


def make_data(n, seed=0):
    """y = sin(x0) * cos(x1) + 0.1 x2^2 + noise, the same on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 3)).astype(np.float32)
    y = np.sin(x[:, :1]) * np.cos(x[:, 1:2]) + 0.1 * x[:, 2:3] ** 2
    return x, (y + 0.01 * rng.standard_normal(y.shape)).astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch size (split over the ranks)")
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    x, y = make_data(args.samples)
    x_val, y_val = make_data(500, seed=1)

    tl.manual_seed(rank)  # different initial weights per rank: DataParallel replaces them with rank 0's
    net = tl.nn.Sequential(tl.nn.Linear(3, 64), tl.nn.Tanh(), tl.nn.Linear(64, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, 1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3),
                         schedule=tl.optim.CosineAnnealingLR(T_max=args.epochs * -(-args.samples // args.batch)))
    dp = DataParallel(trainer, comm)

    shuffle = np.random.default_rng(42)  # the same stream on every rank
    for epoch in range(args.epochs):
        order = shuffle.permutation(args.samples)
        total = 0.0
        for start in range(0, args.samples, args.batch):
            mine = np.array_split(order[start:start + args.batch], size)[rank]
            total += dp.step(x[mine], y[mine]) * len(order[start:start + args.batch])
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            val = trainer.evaluate(x_val, y_val)  # parameters are identical on every rank
            print(f"epoch {epoch + 1:3d}  train loss {total / args.samples:.5f}  val loss {val:.5f}", flush=True)

    drift = dp.parameter_divergence()
    if rank == 0:
        per_step = dp.allreduce_seconds / max(dp.steps, 1) * 1e6
        print(f"{size} ranks, {net.num_parameters()} parameters, {dp.steps} steps; "
              f"gradient allreduce {per_step:.1f} us/step; replicas differ by {drift:g}")


if __name__ == "__main__":
    main()

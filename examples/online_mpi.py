"""Online training across ranks: every rank runs its own simulations, pushes their samples into its own
replay buffer between time steps, exchanges samples with the other ranks, and takes data-parallel
training steps on batches drawn from its buffer.

    mpiexec -n 2 python -m mpi4py examples/online_mpi.py [--steps 1500] [--seed 0]

The simulations are those of examples/heat_surrogate.py (1-D heat equations with random initial
conditions and diffusivities), RUNS of them per rank with their own random draws. Every EXCHANGE_EVERY
steps `buffer.exchange` moves samples round the ranks over the host's communicator, so each rank's
batches mix simulations run elsewhere; `DataParallel` averages the gradients, so every rank holds the
same model. The host owns MPI (the communicator passed in); treadle starts no thread.
"""
import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from heat_surrogate import (EPISODE, NX, RUNS, SCALE, coarse_step, features, held_out_error,  # noqa: E402
                            initial_conditions)

BATCH_PER_RANK, EXCHANGE_EVERY, EXCHANGE_COUNT = 48, 4, 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng([args.seed, rank])  # this rank's own simulations

    tl.manual_seed(args.seed)
    net = tl.nn.Sequential(tl.nn.Linear(NX + 1, 64), tl.nn.Tanh(), tl.nn.Linear(64, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, NX))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3),
                         schedule=tl.optim.CosineAnnealingLR(T_max=args.steps, eta_min=1.5e-4))
    dp = DataParallel(trainer, comm)
    buffer = tl.ReplayBuffer({"x": (NX + 1,), "y": (NX,)}, capacity=4096, policy="firo", max_reuse=0,
                             min_size=BATCH_PER_RANK, seed=args.seed * 1000 + rank)

    u, r = initial_conditions(rng, RUNS)
    age = rng.integers(0, EPISODE, size=RUNS)
    received, loss = 0, float("nan")
    for step in range(1, args.steps + 1):
        u_next = coarse_step(u, r)                                 # the simulation's time step
        buffer.push(x=features(u, r), y=((u_next - u) * SCALE).astype(np.float32))
        if step % EXCHANGE_EVERY == 0:                             # collective: every rank at the same steps
            received += buffer.exchange(comm, EXCHANGE_COUNT, round=step // EXCHANGE_EVERY)
        if comm.allreduce(int(buffer.ready(BATCH_PER_RANK)), op=MPI.MIN):  # every rank filled to its watermark
            batch = buffer.sample(BATCH_PER_RANK)
            loss = dp.step(batch["x"], batch["y"])
        if rank == 0 and step % (args.steps // 5 or 1) == 0:
            print(f"step {step:5d}  loss {loss:.3e}  buffer {len(buffer)}", flush=True)
        u, age = u_next, age + 1
        done = age >= EPISODE
        u[done], r[done] = initial_conditions(rng, int(done.sum()))
        age[done] = 0

    drift = dp.parameter_divergence()
    total_received = comm.allreduce(received)
    if rank == 0:
        error = held_out_error(net, np.random.default_rng([args.seed, 99]))
        print(f"{size} ranks; samples exchanged {total_received}; replicas differ by {drift:g}")
        print(f"held-out rollout relative L2 error: {error:.4f}")


if __name__ == "__main__":
    main()

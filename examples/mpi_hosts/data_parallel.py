"""Data-parallel training from a Python MPI program: the run of data_parallel.c and data_parallel.f90 in
this directory, through mpi4py and tl.distributed.DataParallel, bit for bit the same.

    mpiexec -n 3 python -m mpi4py examples/mpi_hosts/data_parallel.py OUT_DIR

The host splits MPI_COMM_WORLD into groups of two ranks (a last odd rank is a group of one) and lends
each group's communicator to treadle, which trains one model per group on the same data set (a
Park-Miller generator: integer arithmetic, the same numbers in C and Fortran). Step s trains on rows
(s B + k) mod N of the global batch, split over the group's ranks in order. The group's rank 0 prints
its losses and writes its final parameters to OUT_DIR/params_group<G>.bin (raw float32).
"""
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel

N, FEATURES, B, STEPS, SEED = 256, 3, 24, 60, 3
MODEL = {"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [
    {"type": "Linear", "config": {"in_features": 3, "out_features": 32}}, {"type": "Tanh"},
    {"type": "Linear", "config": {"in_features": 32, "out_features": 32}}, {"type": "Tanh"},
    {"type": "Linear", "config": {"in_features": 32, "out_features": 1}}]}}


def make_data():
    draws, v = 12345, np.empty((N, FEATURES))
    for i in range(N):
        for j in range(FEATURES):
            draws = 16807 * draws % 2147483647
            v[i, j] = 4.0 * (draws / 2147483647) - 2.0
    y = v[:, 0] * v[:, 1] - v[:, 2] * v[:, 2] / 2.0 + v[:, 0] / 4.0
    return v.astype(np.float32), y.astype(np.float32).reshape(N, 1)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: data_parallel.py OUT_DIR")
    world = MPI.COMM_WORLD
    group = world.Get_rank() // 2
    comm = world.Split(group, world.Get_rank())
    x, y = make_data()
    tl.manual_seed(SEED)
    net = tl.io.build(json.dumps(MODEL))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.01), seed=SEED)
    dp = DataParallel(trainer, comm, timeout=600)  # a rank that leaves early: TimeoutError, not a hang
    rank, size = comm.Get_rank(), comm.Get_size()
    count = B // size + (1 if rank < B % size else 0)
    first = rank * (B // size) + min(rank, B % size)
    for step in range(STEPS):
        rows = (step * B + first + np.arange(count)) % N
        loss = dp.step(x[rows], y[rows])
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"group {group} step {step + 1} loss {loss:.16e}", flush=True)
    divergence = dp.parameter_divergence()
    if rank == 0:
        net.flat_parameters().tofile(Path(sys.argv[1]) / f"params_group{group}.bin")
        print(f"group {group} of {size} ranks: replicas differ by {divergence:g}", flush=True)
    comm.Free()


if __name__ == "__main__":
    main()

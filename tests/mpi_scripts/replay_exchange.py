"""Under mpiexec: each rank runs its own simulations, pushes their samples into its replay buffer and
exchanges samples with the other ranks for a few rounds; writes what its buffer holds at the end
(<out>/replay_exchange.rank<r>.json). With `mismatch`, rank 1's buffer has another capacity."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import treadle as tl

out_dir, policy = sys.argv[1], sys.argv[2]
mismatch = len(sys.argv) > 3
comm = MPI.COMM_WORLD.Split(0, MPI.COMM_WORLD.Get_rank())  # a sub-communicator, as a host would lend
rank, size = comm.Get_rank(), comm.Get_size()
capacity = 64 + (8 if mismatch and rank == 1 else 0)
buf = tl.ReplayBuffer({"x": (2,), "run": ((), "int64")}, capacity=capacity, policy=policy,
                      seed=rank)  # the policy's reuse default: firo samples move, reservoir ones stay
ids = rank * 1000 + np.arange(16)
buf.push(x=np.stack([ids, ids], 1).astype(np.float32), run=ids)
received, error = [], None
try:
    for r in range(4):
        received.append(buf.exchange(comm, 4, round=r))
except ValueError as e:
    error = str(e)
held = buf.sample(len(buf)) if len(buf) else {"run": np.zeros(0, np.int64), "x": np.zeros((0, 2), np.float32)}
consistent = bool(np.all(held["x"][:, 0] == held["run"]))
with open(os.path.join(out_dir, f"replay_exchange.rank{rank}.json"), "w") as f:
    json.dump({"size": size, "received": received, "runs": sorted(int(i) for i in held["run"]), "consistent": consistent,
               "error": error, "pushed": buf.pushed}, f)

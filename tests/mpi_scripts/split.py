"""mpiexec -n 3 python split.py OUTDIR: world ranks {0, 1} and {2} form two groups with comm.Split;
each group trains its own model with DataParallel on its sub-communicator (group A with root 1),
so the groups' collectives must never meet. Saves OUTDIR/split.rankR.npz."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402

world = MPI.COMM_WORLD
if world.Get_size() != 3:
    raise RuntimeError(f"split.py needs 3 ranks, got {world.Get_size()}")
color = 0 if world.Get_rank() < 2 else 1
group = world.Split(color, key=world.Get_rank())
name = "f64_adam_mse_2" if color == 0 else "f32_single"
spec = cases.CASES["f64_adam_mse_2"] if color == 0 else dict(cases.CASES["f32_sgd_ce_2"], shards=[6])
params, losses = cases.data_parallel(spec, group, root=1 if color == 0 else 0)
np.savez(os.path.join(sys.argv[1], f"split.rank{world.Get_rank()}.npz"), params=params, losses=losses,
         case=name, group_rank=group.Get_rank())
group.Free()

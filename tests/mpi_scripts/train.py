"""mpiexec -n P python train.py OUTDIR CASE...: every rank trains each case data-parallel on
COMM_WORLD and saves OUTDIR/CASE.rankR.npz (final flat parameters and the per-step global losses)."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402

comm = MPI.COMM_WORLD
outdir = sys.argv[1]
for name in sys.argv[2:]:
    params, losses = cases.data_parallel(cases.CASES[name], comm)
    np.savez(os.path.join(outdir, f"{name}.rank{comm.Get_rank()}.npz"), params=params, losses=losses)

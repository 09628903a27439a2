"""mpiexec -n 2 python [-m mpi4py] crash.py: rank 1 dies of an uncaught exception outside treadle
while rank 0 waits in a collective step. Run under `python -m mpi4py` the job must abort promptly."""
import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

comm = MPI.COMM_WORLD
spec = cases.CASES["f64_adam_mse_2"]
dp = DataParallel(cases.build(spec, seed=0), comm)
if comm.Get_rank() == 1:
    raise RuntimeError("host code failed on rank 1")
dp.step(*cases.batch(spec, 4, seed=0))  # rank 0 waits here for a partner that is gone
print("rank 0 was not stopped", flush=True)

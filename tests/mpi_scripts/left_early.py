"""mpiexec -n 2 python left_early.py [native]: rank 1 leaves the training loop after 3 steps and stops calling
the library (it sleeps until the job ends), while rank 0 goes on to a 4th step. (Ending rank 1's process
instead raced under MPICH's launcher: on a loaded machine the job sometimes ended, silently, before rank 0
reported; 2 of ~8 CI runs.) With a timeout, rank 0's step raises
TimeoutError within about the timeout, and every later call on that DataParallel refuses; rank 0 then
ends the job as a host should (comm.Abort). Prints what rank 0 saw and how long it waited."""
import os
import sys
import time

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

TIMEOUT = 2.0
comm = MPI.COMM_WORLD
spec = cases.CASES["f64_adam_mse_2"]
native = True if sys.argv[1:] == ["native"] else None
dp = DataParallel(cases.build(spec, seed=0), comm, timeout=TIMEOUT, native=native)
batch = cases.batch(spec, 4, seed=0)
for _ in range(3):
    dp.step(*batch)
if comm.Get_rank() == 1:
    print("rank 1 leaves", flush=True)
    while True:
        time.sleep(1)
start = time.perf_counter()
try:
    dp.step(*batch)
    print("rank 0 was not stopped", flush=True)
except TimeoutError as e:
    print(f"rank 0 waited {time.perf_counter() - start:.1f} s: TimeoutError: {e}", flush=True)
try:
    dp.step(*batch)
except TimeoutError as e:
    print(f"rank 0 again: TimeoutError: {e}", flush=True)
time.sleep(0.3)  # MPICH's launcher drops output still being forwarded when MPI_Abort ends the job (~1 in 7 runs)
comm.Abort(3)

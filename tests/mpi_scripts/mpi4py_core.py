"""mpiexec -n 2 python mpi4py_core.py OUTDIR: DataParallel over the mpi4py communicator (native=False):
the float64 and float32 cases of cases.py, then a timed step that rank 1 joins 1 s late while a thread
of rank 0 counts ticks (the GIL is released while the rank waits). Saves OUTDIR/mpi4py_core.rankR.json."""
import json
import os
import sys
import threading
import time

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
report = {}
for name in ("f64_adam_mse_2", "f32_sgd_ce_2"):
    params, losses = cases.data_parallel(cases.CASES[name], comm)
    report[name] = dict(params=params.tolist(), losses=losses.tolist())

spec = cases.CASES["f64_adam_mse_2"]
dp = DataParallel(cases.build(spec, seed=0), comm, timeout=30, native=False)
x, y = cases.batch(spec, 4, seed=rank)
ticks, stop = [0], threading.Event()


def count():
    while not stop.is_set():
        ticks[0] += 1
        time.sleep(0.01)


thread = threading.Thread(target=count)
thread.start()
if rank == 1:
    time.sleep(1.0)
start = time.perf_counter()
dp.step(x, y)
report["waited"] = time.perf_counter() - start
stop.set()
thread.join()
report["ticks"] = ticks[0]
with open(os.path.join(sys.argv[1], f"mpi4py_core.rank{rank}.json"), "w") as f:
    json.dump(report, f)

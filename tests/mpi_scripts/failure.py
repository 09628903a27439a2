"""mpiexec -n 3 python failure.py OUTDIR: between good steps, one or more ranks fail inside a step;
every rank must raise the same ValueError, no rank may update, and training then goes on in sync.
Saves OUTDIR/failure.rankR.json (scenario -> message) and failure.rankR.npz (final parameters)."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
spec = cases.CASES["f64_rmsprop_clip_3"]
trainer = cases.build(spec, seed=100 + rank)
cases.warm_up(trainer, spec, rank)
dp = DataParallel(trainer, comm)
x_ok, y_ok = cases.batch(spec, 3, seed=50 + rank)


def host_phases(error):
    """A host scheduler running the phases itself; `error` is what this rank's own work raised."""
    trainer.zero_grad()
    loss = trainer.compute_gradients(x_ok, y_ok)
    dp.allreduce_gradients(len(x_ok), loss, error=error)
    trainer.update()


scenarios = [
    ("bad_shape", lambda: dp.step(x_ok[:, :4] if rank == 1 else x_ok, y_ok)),
    ("bad_lengths", lambda: dp.step(x_ok, y_ok[:2] if rank == 2 else y_ok)),
    ("two_ranks", lambda: dp.step(x_ok.astype(np.float32) if rank != 1 else x_ok, y_ok)),
    ("host_error", lambda: host_phases(RuntimeError("solver diverged") if rank == 1 else None)),
]
messages = {}
for (x, y), (name, fail) in zip(cases.global_batches(spec), scenarios):
    dp.step(*cases.shard(spec, x, y, rank))
    try:
        fail()
        messages[name] = None
    except ValueError as e:
        messages[name] = str(e)
messages["divergence"] = dp.parameter_divergence()
with open(os.path.join(sys.argv[1], f"failure.rank{rank}.json"), "w") as f:
    json.dump(messages, f)
np.savez(os.path.join(sys.argv[1], f"failure.rank{rank}.npz"), params=trainer.model.flat_parameters())

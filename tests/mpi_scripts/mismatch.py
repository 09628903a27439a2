"""mpiexec -n 3 python mismatch.py OUTDIR: one rank at a time sets up differently; every rank must
raise a ValueError from DataParallel(...) (none may hang), and then a matching setup must still
work. Saves OUTDIR/mismatch.rankR.json: scenario -> the message this rank got (or null)."""
import json
import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import treadle as tl  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
spec = cases.CASES["f64_adam_mse_2"]


def no_bias_head(seed):
    trainer = cases.build(spec, seed)
    if rank != 1:
        return trainer
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(cases.IN, 8, dtype="float64"), tl.nn.Tanh(),
                           tl.nn.Linear(8, cases.OUT, bias=False, dtype="float64"))
    return tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.05))


def skipping_on_rank_1(seed):
    """Rank 1 skips non-finite steps that the others apply (or refuse): the replicas would diverge."""
    trainer = cases.build(spec, seed)
    if rank != 1:
        return trainer
    return tl.Trainer(trainer.model, trainer.loss, tl.optim.Adam(lr=0.05), skip_nonfinite=True)


scenarios = {
    "shape": lambda: (cases.build(spec, 0, hidden=9 if rank == 2 else 8), 0),
    "dtype": lambda: (cases.build(spec, 0, dtype="float32" if rank == 1 else None), 0),
    "optimizer": lambda: (cases.build(dict(spec, opt=("Adam", dict(lr=0.5 if rank == 2 else 0.05))), 0), 0),
    "missing": lambda: (no_bias_head(0), 0),
    "guards": lambda: (skipping_on_rank_1(0), 0),
    "root": lambda: (cases.build(spec, 0), 5 if rank == 2 else 0),
    "ok": lambda: (cases.build(spec, 0), 0),
}
messages = {}
for name, make in scenarios.items():
    trainer, root = make()
    try:
        dp = DataParallel(trainer, comm, root=root)
        messages[name] = None
    except ValueError as e:
        messages[name] = str(e)
x, y = cases.batch(spec, 3, seed=rank)
messages["loss_after"] = dp.step(x, y)
# A NaN in a non-root rank's parameters: the divergence must say NaN on every rank, not hide it.
for native in (None, False):  # the C++ class where this build has it, and the Python one
    trainer = cases.build(spec, 0)
    dp = DataParallel(trainer, comm, native=native)
    dp.step(x, y)
    if rank == 2:
        trainer.model.flat_parameters()[1] = float("nan")
    messages[f"divergence_nan_native_{native}"] = repr(dp.parameter_divergence())
with open(os.path.join(sys.argv[1], f"mismatch.rank{rank}.json"), "w") as f:
    json.dump(messages, f)

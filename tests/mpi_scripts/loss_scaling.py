"""mpiexec -n 2 python loss_scaling.py OUTDIR: data-parallel fp16 training with dynamic loss scaling
where only rank 1's shard overflows (an fp16 Inf operand) on some steps. Every rank saves
OUTDIR/loss_scaling.rankR.npz (final flat parameters, the scale before each step, the running
count of skipped steps); rank 0 also trains one process on the whole batches and saves
OUTDIR/loss_scaling.single.npz, the reference (tests/test_loss_scaling.py)."""
import os
import sys

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel

STEPS, SHARD, OVERFLOW_STEPS = 24, 6, (2, 9, 10, 17)
SCALING = {"init_scale": 1024.0, "growth_interval": 3}


def trainer(seed):
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(5, 12), tl.nn.Tanh(), tl.nn.Linear(12, 3)).set_precision("fp16")
    return tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.01), loss_scale=dict(SCALING))


def global_batches():
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        x = rng.standard_normal((2 * SHARD, 5)).astype(np.float32)
        y = rng.standard_normal((2 * SHARD, 3)).astype(np.float32)
        if step in OVERFLOW_STEPS:
            x[SHARD + 1, 2] = 1e5  # in rank 1's shard: Inf once rounded to fp16
        yield x, y


def train(step_fn, t):
    scales, skipped = [], []
    for x, y in global_batches():
        scales.append(t.loss_scale)
        step_fn(x, y)
        skipped.append(t.skipped_steps)
    return t.model.flat_parameters().copy(), np.array(scales), np.array(skipped)


comm = MPI.COMM_WORLD
rank = comm.Get_rank()
t = trainer(seed=10 + rank)  # different weights on purpose: DataParallel broadcasts the root's
dp = DataParallel(t, comm)
params, scales, skipped = train(lambda x, y: dp.step(x[rank * SHARD:(rank + 1) * SHARD], y[rank * SHARD:(rank + 1) * SHARD]), t)
if dp.parameter_divergence() != 0.0:
    raise RuntimeError("replicas diverged")
np.savez(os.path.join(sys.argv[1], f"loss_scaling.rank{rank}.npz"), params=params, scales=scales, skipped=skipped)
if rank == 0:
    single = trainer(seed=10)
    params, scales, skipped = train(single.step, single)
    np.savez(os.path.join(sys.argv[1], "loss_scaling.single.npz"), params=params, scales=scales, skipped=skipped)

"""mpiexec -n 3 python buffers.py OUTDIR: BatchNorm's running statistics (non-trained state that
each rank updates from its own shard) under DataParallel(buffers="root" | "average" | "local"), and
a failed step restoring them. Saves OUTDIR/buffers.rankR.json with what each rank checked."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
SHARDS = [4, 3, 5]
MOMENTUM = 0.1


def build():
    tl.manual_seed(10 + rank)  # different weights per rank: the root's are broadcast
    net = tl.nn.Sequential(tl.nn.Linear(5, 8), tl.nn.BatchNorm1d(8, momentum=MOMENTUM),
                           tl.nn.Tanh(), tl.nn.Linear(8, 3))
    return net, tl.Trainer(net.double(), tl.loss.MSE(), tl.optim.Adam(lr=0.01))


def local_batch(step):
    rng = np.random.default_rng(100 * step + rank)
    return rng.standard_normal((SHARDS[rank], 5)), rng.standard_normal((SHARDS[rank], 3))


def trainable(net):
    return np.concatenate([p.data.ravel() for _, p in net.named_parameter_objects() if p.requires_grad])


def spread(values):
    """Largest difference of an array between the ranks."""
    everyone = comm.allgather(np.asarray(values))
    return float(max(np.max(np.abs(v - everyone[0])) for v in everyone))


out = {}
for mode in ("root", "average", "local"):
    net, trainer = build()
    dp = DataParallel(trainer, comm, buffers=mode)
    worst = 0.0
    for step in range(3):
        x, y = local_batch(step)
        state = net.state_dict()
        hidden = x @ state["0.weight"].T + state["0.bias"]  # what BatchNorm sees on this rank
        means = comm.allgather(hidden.mean(axis=0))
        batch_mean = means[0] if mode == "root" else np.mean(means, axis=0)
        expected = (1 - MOMENTUM) * state["1.running_mean"] + MOMENTUM * batch_mean
        if mode == "local":
            expected = (1 - MOMENTUM) * state["1.running_mean"] + MOMENTUM * hidden.mean(axis=0)
        dp.step(x, y)
        worst = max(worst, float(np.max(np.abs(net.state_dict()["1.running_mean"] - expected))))
    out[mode] = dict(running_mean_error=worst, trainable_spread=spread(trainable(net)),
                     running_mean_spread=spread(net.state_dict()["1.running_mean"]),
                     tracked=float(net.state_dict()["1.num_batches_tracked"]))

# A failed step changes nothing, running statistics included.
net, trainer = build()
dp = DataParallel(trainer, comm)
dp.step(*local_batch(0))
before = net.flat_parameters().copy()
x, y = local_batch(1)
try:
    dp.step(x[:, :4] if rank == 1 else x, y)
    out["failure"] = None
except ValueError as e:
    out["failure"] = str(e)
out["unchanged_after_failure"] = bool(np.array_equal(before, net.flat_parameters()))
out["divergence_after_failure"] = dp.parameter_divergence()
with open(os.path.join(sys.argv[1], f"buffers.rank{rank}.json"), "w") as f:
    json.dump(out, f)

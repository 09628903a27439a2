"""Training cases shared by the MPI scripts (run under mpiexec) and tests/test_distributed.py (which
runs the same case in one process on the whole batch as the reference).

Ranks deliberately start from different weights (seed 100 + rank) and different optimizer states
(rank r takes r + 1 warm-up steps on its own data first): DataParallel must replace both with the
root's, so the reference builds and warms up exactly as the root does.
"""
import numpy as np

import treadle as tl

IN, OUT, CLASSES = 5, 3, 4

CASES = {
    # name: dtype, optimizer, loss, shard sizes of each global batch (one per rank), steps, extras
    "f64_adam_mse_2": dict(dtype="float64", opt=("Adam", dict(lr=0.05)), loss=("MSE", {}), shards=[5, 3], steps=4),
    "f32_sgd_ce_2": dict(dtype="float32", opt=("SGD", dict(lr=0.1, momentum=0.9)), loss=("CrossEntropy", {}),
                         shards=[4, 7], steps=4),
    # The host runs the phases itself: forward, its own MSE gradient, backward, allreduce_gradients, update.
    "f64_host_phases_2": dict(dtype="float64", opt=("SGD", dict(lr=0.1, momentum=0.9)), loss=("MSE", {}),
                              shards=[3, 6], steps=4, host_phases=True),
    "f64_rmsprop_clip_3": dict(dtype="float64", opt=("RMSprop", dict(lr=0.01, momentum=0.5)), loss=("Huber", {}),
                               shards=[6, 1, 0], steps=4, clip=0.5, schedule=("StepLR", dict(step_size=2, gamma=0.5))),
    "f64_sum_3": dict(dtype="float64", opt=("AdamW", dict(lr=0.02)), loss=("MSE", dict(reduction="sum")),
                      shards=[2, 3, 4], steps=3),
    "f32_adam_ce_3": dict(dtype="float32", opt=("Adam", dict(lr=0.01)), loss=("CrossEntropy", {}),
                          shards=[3, 5, 2], steps=4),
}


def classification(spec):
    return spec["loss"][0] == "CrossEntropy"


def build(spec, seed, hidden=8, dtype=None):
    """A small MLP trainer; `seed` fixes its initial weights."""
    dtype = dtype or spec["dtype"]
    tl.manual_seed(seed)
    out = CLASSES if classification(spec) else OUT
    net = tl.nn.Sequential(tl.nn.Linear(IN, hidden, dtype=dtype), tl.nn.Tanh(), tl.nn.Linear(hidden, out, dtype=dtype))
    opt_name, opt_args = spec["opt"]
    loss_name, loss_args = spec["loss"]
    schedule = None
    if "schedule" in spec:
        schedule = getattr(tl.optim, spec["schedule"][0])(**spec["schedule"][1])
    return tl.Trainer(net, getattr(tl.loss, loss_name)(**loss_args), getattr(tl.optim, opt_name)(**opt_args),
                      schedule=schedule, clip_grad_norm=spec.get("clip"))


def batch(spec, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, IN)).astype(spec["dtype"])
    if classification(spec):
        y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    else:
        y = rng.standard_normal((n, OUT)).astype(spec["dtype"])
    return x, y


def warm_up(trainer, spec, rank):
    """Rank-dependent history: rank r takes r + 1 steps on its own data."""
    for i in range(rank + 1):
        trainer.step(*batch(spec, 4, seed=1000 * (rank + 1) + i))


def global_batches(spec):
    return [batch(spec, sum(spec["shards"]), seed=7 + step) for step in range(spec["steps"])]


def shard(spec, x, y, rank):
    start = sum(spec["shards"][:rank])
    stop = start + spec["shards"][rank]
    return x[start:stop], y[start:stop]


def reference(spec, root=0):
    """One process on the whole batch, starting from the root's weights and history."""
    trainer = build(spec, seed=100 + root)
    warm_up(trainer, spec, root)
    losses = [trainer.step(x, y) for x, y in global_batches(spec)]
    return trainer.model.flat_parameters().copy(), np.array(losses)


def data_parallel(spec, comm, root=0):
    """Each rank of `comm` trains on its shard of every global batch; returns (params, losses)."""
    from treadle.distributed import DataParallel

    rank = comm.Get_rank()
    if comm.Get_size() != len(spec["shards"]):
        raise RuntimeError(f"case needs {len(spec['shards'])} ranks, comm has {comm.Get_size()}")
    trainer = build(spec, seed=100 + rank)
    warm_up(trainer, spec, rank)
    dp = DataParallel(trainer, comm, root=root)
    step = host_step if spec.get("host_phases") else (lambda dp, x, y: dp.step(x, y))
    losses = [step(dp, *shard(spec, x, y, rank)) for x, y in global_batches(spec)]
    if dp.parameter_divergence() != 0.0:
        raise RuntimeError("replicas diverged")
    return trainer.model.flat_parameters().copy(), np.array(losses)


def host_step(dp, x, y):
    """What a host scheduler does around DataParallel: its own objective (here MSE, by hand)."""
    trainer = dp.trainer
    trainer.zero_grad()
    pred = trainer.forward(x)
    diff = pred - y
    trainer.backward(2.0 * diff / diff.size)
    loss = float(np.mean(diff * diff))
    global_loss = dp.allreduce_gradients(diff.size, loss)
    trainer.update()
    return global_loss

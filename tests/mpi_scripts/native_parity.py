"""mpiexec -n 2 python native_parity.py OUTDIR: the same training and the same failures twice, once
with treadle.distributed.DataParallel's mpi4py code (native=False) and once through the bound C++
class (native=True, transport "mpi"; needs treadle._distributed). Saves OUTDIR/native.rankR.npz
(per case and implementation: final flat parameters, losses, loss scales, skipped steps) and
OUTDIR/native.rankR.json (per implementation: scenario -> message, and what the ranks checked).
tests/test_distributed_python_bound.py compares the two implementations: bitwise, and text for text."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402

import treadle as tl  # noqa: E402
import treadle.distributed as distributed  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
IMPLEMENTATIONS = {"python": False, "native": True}
TRAINING = ["f64_adam_mse_2", "f32_sgd_ce_2", "f64_host_phases_2"]


def train_case(name, native):
    spec = cases.CASES[name]
    trainer = cases.build(spec, seed=100 + rank)
    cases.warm_up(trainer, spec, rank)
    dp = DataParallel(trainer, comm, transport="mpi", native=native)
    step = cases.host_step if spec.get("host_phases") else (lambda dp, x, y: dp.step(x, y))
    losses = [step(dp, *cases.shard(spec, x, y, rank)) for x, y in cases.global_batches(spec)]
    info = dict(steps=dp.steps, divergence=dp.parameter_divergence(), transport=dp.transport,
                timed=dp.allreduce_seconds >= dp.last_allreduce_seconds >= 0.0 and dp.wait_seconds >= 0.0)
    return dict(params=trainer.model.flat_parameters().copy(), losses=np.array(losses)), info


def train_batchnorm(buffers, native):
    """BatchNorm's running statistics under `buffers`, with an empty shard on rank 1 in one step."""
    tl.manual_seed(10 + rank)
    net = tl.nn.Sequential(tl.nn.Linear(5, 8), tl.nn.BatchNorm1d(8, momentum=0.1), tl.nn.Tanh(), tl.nn.Linear(8, 3))
    trainer = tl.Trainer(net.double(), tl.loss.MSE(), tl.optim.Adam(lr=0.01))
    dp = DataParallel(trainer, comm, buffers=buffers, transport="mpi", native=native)
    losses = []
    for step in range(4):
        rng = np.random.default_rng(100 * step + rank)
        n = 0 if (step == 2 and rank == 1) else 4 + rank
        losses.append(dp.step(rng.standard_normal((n, 5)), rng.standard_normal((n, 3))))
    # A failed step (rank 1's input has the wrong width) must leave the running statistics alone.
    before = trainer.model.flat_parameters().copy()
    x = np.ones((3, 4 if rank == 1 else 5))
    try:
        dp.step(x, np.zeros((3, 3)))
        failure = None
    except ValueError as e:
        failure = str(e)
    unchanged = bool(np.array_equal(before, trainer.model.flat_parameters()))
    return dict(params=trainer.model.flat_parameters().copy(), losses=np.array(losses)), dict(
        failure=failure, unchanged=unchanged, divergence=dp.parameter_divergence())


def train_loss_scaling(native):
    """fp16 with dynamic loss scaling where rank 1's shard overflows on some steps: every rank must
    skip the same steps and keep the same scale."""
    tl.manual_seed(20 + rank)
    net = tl.nn.Sequential(tl.nn.Linear(5, 12), tl.nn.Tanh(), tl.nn.Linear(12, 3)).set_precision("fp16")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.01),
                         loss_scale=dict(init_scale=1024.0, growth_interval=3))
    dp = DataParallel(trainer, comm, transport="mpi", native=native)
    rng = np.random.default_rng(7)
    scales, skipped, losses = [], [], []
    for step in range(12):
        x = rng.standard_normal((8, 5)).astype(np.float32)
        y = rng.standard_normal((8, 3)).astype(np.float32)
        if step in (2, 6, 7) and rank == 1:
            x[5, 0] = np.inf
        scales.append(trainer.loss_scale)
        losses.append(dp.step(x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]))
        skipped.append(trainer.skipped_steps)
    return dict(params=trainer.model.flat_parameters().copy(), losses=np.array(losses), scales=np.array(scales),
                skipped=np.array(skipped)), {}


def failures(native):
    """Scenario -> the message every rank raised (None where nothing was raised)."""
    spec = cases.CASES["f64_adam_mse_2"]
    trainer = cases.build(spec, seed=100 + rank)
    dp = DataParallel(trainer, comm, transport="mpi", native=native)
    x, y = cases.batch(spec, 3, seed=50 + rank)

    def host_phases(count, error):
        trainer.zero_grad()
        loss = trainer.compute_gradients(x, y)
        dp.allreduce_gradients(count, loss, error=error)
        trainer.update()

    scenarios = {
        "bad_shape": lambda: dp.step(x[:, :4] if rank == 1 else x, y),
        "bad_lengths": lambda: dp.step(x, y[:2] if rank == 1 else y),
        "both_ranks": lambda: dp.step(x.astype(np.float32), y),
        "host_error": lambda: host_phases(len(x), RuntimeError("solver diverged") if rank == 1 else None),
        "host_message": lambda: host_phases(len(x), "out of memory" if rank == 0 else None),
        "bad_count": lambda: host_phases(-1 if rank == 1 else len(x), None),
        "float_count": lambda: host_phases(2.5 if rank == 0 else len(x), None),
        "empty": lambda: dp.step(x[:0], y[:0]),
        "ok": lambda: dp.step(x, y),
    }
    out = {}
    for name, run in scenarios.items():
        try:
            run()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    out["steps"] = dp.steps  # one good step; the failed ones updated nothing
    out["trainer_steps"] = trainer.steps
    out["divergence"] = dp.parameter_divergence()
    out["setup"] = {}
    settings = {
        "dtype": lambda: dict(trainer=cases.build(spec, seed=1, dtype="float32" if rank == 1 else None)),
        "root": lambda: dict(trainer=cases.build(spec, seed=1), root=5 if rank == 1 else 0),
        "buffers": lambda: dict(trainer=cases.build(spec, seed=1), buffers="sync" if rank == 0 else "root"),
        "not_a_trainer": lambda: dict(trainer=object() if rank == 1 else cases.build(spec, seed=1)),
    }
    for name, make in settings.items():
        kwargs = make()
        try:
            DataParallel(kwargs.pop("trainer"), comm, transport="mpi", native=native, **kwargs)
            out["setup"][name] = None
        except ValueError as e:
            out["setup"][name] = str(e)
    return out


def mixed():
    """Setups only the C++ class has: ranks choosing different implementations, 'nccl' here."""
    spec = cases.CASES["f64_adam_mse_2"]
    out = {}
    for name, kwargs in {
        "implementations": dict(transport="mpi", native=rank == 0),
        "transports": dict(transport="auto" if rank == 1 else "mpi", native=True),
        "nccl": dict(transport="nccl"),
        "nccl_python": dict(transport="nccl", native=False),
    }.items():
        try:
            DataParallel(cases.build(spec, seed=1), comm, **kwargs)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    dp = DataParallel(cases.build(spec, seed=1), comm, transport="auto")  # CPU model: the mpi4py code
    out["auto"] = [dp.transport, dp._native is None]
    out["has_nccl"] = distributed._native_module().has_nccl
    dp = DataParallel(cases.build(spec, seed=1), comm, transport="auto", native=True)
    out["auto_native"] = [dp.transport, dp._native is None, repr(dp)]
    return out


arrays, report = {}, {}
for label, native in IMPLEMENTATIONS.items():
    runs = {name: (lambda name=name: train_case(name, native)) for name in TRAINING}
    for buffers in ("root", "average", "local"):
        runs[f"bn_{buffers}"] = lambda buffers=buffers: train_batchnorm(buffers, native)
    runs["fp16_dynamic"] = lambda: train_loss_scaling(native)
    report[label] = {}
    for name, run in runs.items():
        results, info = run()
        for key, value in results.items():
            arrays[f"{label}/{name}/{key}"] = value
        report[label][name] = info
    report[label]["failures"] = failures(native)
report["mixed"] = mixed()
outdir = sys.argv[1]
np.savez(os.path.join(outdir, f"native.rank{rank}.npz"), **arrays)
with open(os.path.join(outdir, f"native.rank{rank}.json"), "w") as f:
    json.dump(report, f, indent=1)
print(f"rank {rank}: done", flush=True)

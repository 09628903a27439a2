"""A host task scheduler drives treadle's training steps task by task.

    python examples/python_scheduler.py [--steps 300]
    mpiexec -n 2 python -m mpi4py examples/python_scheduler.py     (data parallel)

The host here is a `concurrent.futures` thread pool standing in for a simulation's own runtime.
`Trainer.begin_step` hands each step out as per-layer tasks with dependencies; the scheduler runs
each task as soon as its dependencies are done and, the moment a layer's backward task finishes,
starts the nonblocking allreduce of that layer's gradients, so communication overlaps the backward
pass of the layers below. `Trainer.finish_step` then applies the update.

The surrogate learns the period-averaged energy of a damped, driven oscillator from its
parameters, sampled by a toy "simulation" in the host loop. With one process the scheduled steps
are checked against `Trainer.step` on a twin model: bitwise equal parameters, or the script fails.
"""
import argparse
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np

import treadle as tl


class SingleProcess:
    """The communicator when mpi4py is absent or one process runs: a reduction over one rank."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


def communicator():
    try:
        from mpi4py import MPI
    except ImportError:
        return SingleProcess(), None
    return MPI.COMM_WORLD, MPI


def simulate(rng, n):
    """Damped driven oscillator x'' + c x' + k x = cos(w t): mean energy over the last 20 time units."""
    params = rng.uniform([0.1, 0.5, 0.5], [0.6, 2.0, 2.0], size=(n, 3))
    c, k, w = (params[:, i:i + 1] for i in range(3))
    dt, steps = 0.05, 800
    x, v, energy = np.zeros_like(c), np.zeros_like(c), np.zeros_like(c)
    for i in range(steps):
        a = np.cos(w * i * dt) - c * v - k * x
        v += dt * a
        x += dt * v
        if i >= steps - 400:
            energy += 0.5 * (v * v + k * x * x) / 400
    return params.astype(np.float32), np.log(energy).astype(np.float32)


def make_trainer(seed=0):
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(3, 64), tl.nn.Tanh(), tl.nn.Linear(64, 64), tl.nn.Tanh(),
                           tl.nn.Linear(64, 1))
    return tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3))


def scheduled_step(trainer, pool, x, y, comm, mpi):
    """One training step, task by task; each layer's gradient allreduce starts when its backward ends."""
    tasks = trainer.begin_step(x, y)
    grads = trainer.model.flat_gradients()  # trainable gradients come first, as grad_ranges index them
    waiting = [len(t.deps) for t in tasks]
    dependents = [[] for _ in tasks]
    for i, task in enumerate(tasks):
        for d in task.deps:
            dependents[d].append(i)
    running = {pool.submit(trainer.run_task, i): i for i, n in enumerate(waiting) if n == 0}
    requests, reduced = [], []
    while running:
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            i = running.pop(future)
            future.result()  # a task that raised ends the step here; the parameters are untouched
            if comm.Get_size() > 1:
                for lo, hi in tasks[i].grad_ranges:
                    requests.append(comm.Iallreduce(mpi.IN_PLACE, grads[lo:hi], op=mpi.SUM))
                    reduced.append((lo, hi))
            for j in dependents[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    running[pool.submit(trainer.run_task, j)] = j
    if requests:
        mpi.Request.Waitall(requests)
        for lo, hi in reduced:
            grads[lo:hi] /= comm.Get_size()
    return trainer.finish_step()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    args = parser.parse_args()
    comm, mpi = communicator()
    rank, size = comm.Get_rank(), comm.Get_size()

    trainer = make_trainer()  # the same seed everywhere: every rank starts from the same weights
    twin = make_trainer() if size == 1 else None
    x_val, y_val = simulate(np.random.default_rng(1000), 256)
    rng = np.random.default_rng(rank)  # each rank simulates its own samples
    first = None
    with ThreadPoolExecutor(max_workers=2) as pool:
        if rank == 0:
            print("tasks per step:", ", ".join(t.name for t in trainer.begin_step(*simulate(rng, 2))))
        for step in range(args.steps):
            x, y = simulate(rng, args.batch)  # the host's own work between training steps
            loss = scheduled_step(trainer, pool, x, y, comm, mpi)
            if twin is not None:
                twin_loss = twin.step(x, y)
                if loss != twin_loss or not np.array_equal(trainer.model.flat_parameters(),
                                                           twin.model.flat_parameters()):
                    raise SystemExit(f"step {step}: the scheduled step differs from Trainer.step")
            if step % 100 == 0 and rank == 0:
                print(f"step {step:4d}  loss {loss:.4e}")
            first = loss if first is None else first
    val = trainer.evaluate(x_val, y_val)
    print(f"rank {rank}: validation loss {val:.4e} after {args.steps} steps (first batch {first:.4e})")
    if size > 1:
        checksum = float(np.sum(trainer.model.flat_parameters(), dtype=np.float64))
        sums = comm.allgather(checksum)
        print(f"rank {rank}: parameters equal on all ranks: {len(set(sums)) == 1}")
    elif twin is not None:
        print("scheduled steps equal Trainer.step bitwise: True")


if __name__ == "__main__":
    main()

"""Python's DataParallel with models on backend "cuda", for the GPU script (tools/gpu_dp_check.sh):

  mpiexec -n 1 python dp_cuda_python.py   transport "nccl" through treadle._distributed (SGD; Adam
                                          with "auto" choosing nccl; BatchNorm with buffers "root"
                                          and "average"), and "mpi" (the mpi4py code and the C++ class)
  mpiexec -n 2 python dp_cuda_python.py   two processes sharing the GPU: "mpi" (both implementations,
                                          shards of 20 and 12), "auto" keeping to mpi, "nccl" refused
                                          with the same ValueError on every rank

Each case trains a small MLP data-parallel for STEPS steps and compares the global loss curve and the
final parameters with one process on "eigen" training on the concatenated batch: max |got - want| /
max |want| <= 1e-5 (SGD with momentum), <= 1e-4 (Adam). Rank 0 prints "PASS name detail", "FAIL name
(rank r) message" or "SKIP name: why" per case, then "dp python cuda checks (N ranks): P passed, F
failed"; exit status 1 if a case failed. Without a CUDA device: "SKIP: no CUDA device (...)", exit 0.
`--backend eigen` runs the same harness with the data-parallel models on the host (the "mpi" cases):
a check of the harness that needs no GPU (tests/test_distributed_python_bound.py).
"""
import sys

import numpy as np
from mpi4py import MPI

import treadle as tl
from treadle.distributed import DataParallel, _native_module

IN, HIDDEN, CLASSES, STEPS, BATCH = 16, 32, 4, 12, 32
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
BACKEND = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "cuda"
SHARDS = [BATCH] if size == 1 else [20, 12] if size == 2 else [BATCH // size + (r < BATCH % size) for r in range(size)]
counts = {"passed": 0, "failed": 0}


def say(text):
    if rank == 0:
        print(text, flush=True)


def report(name, ok, detail):
    """Collective: rank 0 prints one line, with the first failing rank's detail."""
    everyone = comm.allgather((ok, detail))
    bad = next((r for r, (good, _d) in enumerate(everyone) if not good), None)
    counts["passed" if bad is None else "failed"] += 1
    say(f"PASS {name} {detail}" if bad is None else f"FAIL {name} (rank {bad}) {everyone[bad][1]}")


def build(seed, backend, opt, batch_norm):
    tl.manual_seed(seed)
    layers = [tl.nn.Linear(IN, HIDDEN)] + ([tl.nn.BatchNorm1d(HIDDEN)] if batch_norm else [])
    net = tl.nn.Sequential(*layers, tl.nn.Tanh(), tl.nn.Linear(HIDDEN, CLASSES))
    net.set_backend(backend)
    optimizer = tl.optim.Adam(lr=0.01) if opt == "adam" else tl.optim.SGD(lr=0.1, momentum=0.9)
    return net, tl.Trainer(net, tl.loss.CrossEntropy(), optimizer)


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        yield (rng.standard_normal((BATCH, IN)).astype(np.float32),
               rng.integers(0, CLASSES, size=BATCH).astype(np.int64))


def relative_error(got, want):
    return float(np.max(np.abs(np.asarray(got) - want)) / max(np.max(np.abs(want)), 1e-30))


def case(name, transport, opt="sgd", batch_norm=False, buffers="root", native=None, expect=None):
    """Data-parallel on BACKEND against one "eigen" process on the whole batches."""
    try:
        ref_net, ref = build(100, "eigen", opt, batch_norm)  # the root's weights: seed 100
        want_losses = [ref.step(x, y) for x, y in batches()]
        want_params = ref_net.flat_parameters().copy()
        net, trainer = build(100 + rank, BACKEND, opt, batch_norm)
        dp = DataParallel(trainer, comm, buffers=buffers, transport=transport, native=native)
        if expect is not None and dp.transport != expect:
            raise RuntimeError(f"transport {transport!r} resolved to {dp.transport!r}, expected {expect!r}")
        start = sum(SHARDS[:rank])
        losses = [dp.step(x[start:start + SHARDS[rank]], y[start:start + SHARDS[rank]]) for x, y in batches()]
        divergence = dp.parameter_divergence()
        loss_err = relative_error(losses, want_losses)
        param_err = relative_error(net.flat_parameters(), want_params)
        tol = 1e-4 if opt == "adam" else 1e-5
        implementation = "python" if dp._native is None else "C++"
        detail = (f"transport {dp.transport} ({implementation}): losses rel.err {loss_err:.2e}, parameters rel.err "
                  f"{param_err:.2e} (tol {tol:.0e}), loss {want_losses[0]:.4f} -> {want_losses[-1]:.4f}, "
                  f"divergence {divergence:g}")
        ok = loss_err <= tol and param_err <= tol and divergence == 0.0
    except Exception as e:  # reported, the other cases still run
        ok, detail = False, f"{type(e).__name__.lstrip('_')}: {e}"
    report(name, ok, detail)


def refused(name, transport, backend, needle):
    """Construction must raise the same ValueError, containing `needle`, on every rank."""
    try:
        _net, trainer = build(100 + rank, backend, "sgd", False)
        DataParallel(trainer, comm, transport=transport)
        ok, detail = False, f"transport {transport!r} was accepted"
    except ValueError as e:
        ok, detail = needle in str(e), str(e)
    same = len(set(comm.allgather(detail))) == 1
    report(name, ok and same, detail if same else f"ranks raised different errors: {detail}")


def device_problem():
    """Why backend "cuda" cannot run here ("" if it can): one tiny step."""
    if "cuda" not in tl.backends():
        return "this build has no CUDA backend (-DTREADLE_WITH_CUDA=ON)"
    try:
        _net, trainer = build(0, "cuda", "sgd", False)
        x, y = next(batches())
        trainer.step(x, y)
    except Exception as e:
        return f"{type(e).__name__.lstrip('_')}: {e}"  # treadle's _ValueError reads as ValueError
    return ""


def main():
    if BACKEND == "cuda":
        problem = device_problem()
        if any(comm.allgather(bool(problem))):
            say(f"SKIP: no CUDA device ({problem or 'on another rank'})")
            return 0
    module = _native_module()
    nccl = BACKEND == "cuda" and module is not None and module.has_nccl
    if module is None:
        say(f"SKIP C++ class: no treadle._distributed in this build ({_native_module.error})")
    elif not nccl and BACKEND == "cuda":
        say("SKIP nccl: treadle._distributed was built without NCCL (-DTREADLE_WITH_NCCL=ON)")
    case("python_mpi_sgd", "mpi", expect="mpi")
    case("python_mpi_adam", "auto", opt="adam", native=False, expect="mpi")
    if module is not None:
        case("native_mpi_sgd", "mpi", native=True, expect="mpi")
    if size == 1:
        case("python_mpi_batchnorm", "mpi", batch_norm=True, expect="mpi")
    if nccl and size == 1:
        case("nccl_sgd", "nccl", expect="nccl")
        case("nccl_adam_auto", "auto", opt="adam", expect="nccl")
        case("nccl_batchnorm_root", "nccl", batch_norm=True, buffers="root", expect="nccl")
        case("nccl_batchnorm_average", "nccl", batch_norm=True, buffers="average", expect="nccl")
        refused("nccl_host_model", "nccl", "eigen", "needs the model on backend 'cuda'")
    if nccl and size > 1:  # processes sharing one GPU
        case("auto_shared_gpu", "auto", expect="mpi")
        refused("nccl_shared_gpu", "nccl", "cuda", "needs one GPU per process")
    say(f"dp python cuda checks ({size} ranks): {counts['passed']} passed, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

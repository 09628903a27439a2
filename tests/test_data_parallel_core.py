"""treadle._core.DataParallel: the C++ data-parallel algorithm (treadle::DataParallelCore) over an mpi4py
communicator, which treadle.distributed.DataParallel wraps in every build (no MPI linked into _core).

In this process on communicators of size 1, and under `mpiexec -n 2` (tests/mpi_scripts/mpi4py_core.py):
float32 and float64 models against one process on the whole batch, the C++ argument checks with their
Python wording, and other Python threads running while a rank waits in a collective.
"""
import json
import os
import sys

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install 'treadle[mpi]')")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "mpi_scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, HERE)
import cases  # noqa: E402
from test_distributed import MPIEXEC, TOL, launch, world_size_ok  # noqa: E402,F401

from treadle import _core  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402


def test_the_python_class_runs_the_core_class_over_mpi4py():
    dp = DataParallel(cases.build(cases.CASES["f64_adam_mse_2"], seed=0), MPI.COMM_SELF, native=False)
    assert isinstance(dp._impl, _core.DataParallel) and dp._native is None
    assert (dp.rank, dp.size, dp.root, dp.buffers, dp.timeout, dp.transport) == (0, 1, 0, "root", None, "mpi")


@pytest.mark.parametrize("name", ["f64_adam_mse_2", "f32_sgd_ce_2"])
def test_size_one_equals_the_plain_trainer(name):
    spec = dict(cases.CASES[name], shards=[8])
    want_params, want_losses = cases.reference(spec)
    params, losses = cases.data_parallel(spec, MPI.COMM_SELF)
    np.testing.assert_allclose(params, want_params, **TOL[spec["dtype"]])
    np.testing.assert_allclose(losses, want_losses, **TOL[spec["dtype"]])


def test_core_class_directly():
    spec = cases.CASES["f32_sgd_ce_2"]
    trainer = cases.build(spec, seed=0)
    dp = _core.DataParallel(trainer._native, MPI.COMM_SELF, timeout=5)
    x, y = cases.batch(spec, 4, seed=1)
    dp.begin_step("step")
    count = dp.shard_count(x.shape, y.shape)
    loss = dp.end_step(count, trainer.compute_gradients(x, y), "", "step")
    assert np.isfinite(loss) and dp.steps == 1 and trainer.steps == 1 and dp.timeout == 5.0
    assert dp.parameter_divergence() == 0.0 and dp.wait_seconds >= 0.0
    assert dp.allreduce_seconds >= dp.last_allreduce_seconds >= 0.0


def test_arguments_are_checked_in_cpp_with_python_words():
    trainer = cases.build(cases.CASES["f64_adam_mse_2"], seed=0)._native
    bad = {
        "root must be a rank in [0, 1), got True": dict(root=True),
        "root must be a rank in [0, 1), got '0'": dict(root="0"),
        "root must be a rank in [0, 1), got -1": dict(root=-1),
        "root must be a rank in [0, 1), got 5": dict(root=5),
        "root must be a rank in [0, 1), got 18446744073709551616": dict(root=2 ** 64),
        "buffers must be one of ('root', 'average', 'local'), got None": dict(buffers=None),
        "transport must be one of ('auto', 'mpi', 'nccl'), got 'tcp'": dict(transport="tcp"),
        "transport must be one of ('auto', 'mpi', 'nccl'), got 3": dict(transport=3),
        "timeout must be a positive number of seconds or None, got nan": dict(timeout=float("nan")),
    }
    for message, kwargs in bad.items():
        with pytest.raises(ValueError) as info:
            _core.DataParallel(trainer, MPI.COMM_SELF, **kwargs)
        assert str(info.value) == "DataParallel: rank 0 failed: " + message
    assert _core.DataParallel(trainer, MPI.COMM_SELF, root=np.int64(0), timeout=np.float32(1.5)).timeout == 1.5
    with pytest.raises(TypeError, match="DataParallel: comm must be an mpi4py communicator, got int"):
        _core.DataParallel(trainer, 3)
    with pytest.raises(ValueError, match=r"x has 3 samples but y has 2"):
        _core.DataParallel.shard_count((3, 5), (2, 3))
    assert _core.DataParallel.shard_count((3, 5), (3, 2)) == 6


def test_failure_text():
    assert _core.data_parallel_failure(["", "a", "b", "c"], "DataParallel") == \
        "DataParallel: rank 1 failed (and 2 more ranks): a"


def test_two_ranks_over_mpi4py(world_size_ok, tmp_path):  # noqa: F811
    """float32 and float64 models and a timed step over the mpi4py communicator; another thread of each
    rank keeps running while the rank waits in the collective for the late one."""
    launch(2, [os.path.join(SCRIPTS, "mpi4py_core.py"), str(tmp_path)])
    reports = [json.load(open(os.path.join(tmp_path, f"mpi4py_core.rank{r}.json"))) for r in (0, 1)]
    for name in ("f64_adam_mse_2", "f32_sgd_ce_2"):
        spec = cases.CASES[name]
        want_params, want_losses = cases.reference(spec)
        for report in reports:
            np.testing.assert_allclose(report[name]["params"], want_params, **TOL[spec["dtype"]])
            np.testing.assert_allclose(report[name]["losses"], want_losses, **TOL[spec["dtype"]])
        assert reports[0][name] == reports[1][name]  # bitwise the same replicas
    # rank 0 waited about 1 s for rank 1 in the step's first collective, and its thread ran meanwhile
    assert reports[0]["waited"] > 0.5 and reports[0]["ticks"] > 20, reports[0]

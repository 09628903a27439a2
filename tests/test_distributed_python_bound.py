"""treadle.distributed.DataParallel on the bound C++ class (treadle._distributed, built with
-DTREADLE_WITH_MPI=ON -DTREADLE_BUILD_PYTHON=ON) against its own mpi4py code, on the CPU:
tests/mpi_scripts/native_parity.py trains and fails the same way with both under `mpiexec -n 2`
(transport "mpi"), and these tests ask for bitwise the same training and the same error texts.

The extension is taken from TREADLE_BUILD_DIR when that build has it, else built in build/mpi-py
(incremental, ccache-shared). The NCCL transport needs a GPU: tools/gpu_dp_check.sh runs
tests/mpi_scripts/dp_cuda_python.py there.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install 'treadle[mpi]')")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPTS = os.path.join(HERE, "mpi_scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, HERE)
import cases  # noqa: E402
from test_distributed import MPIEXEC, launch  # noqa: E402

import treadle.distributed as distributed  # noqa: E402
from treadle.distributed import DataParallel  # noqa: E402

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found (pip install 'treadle[mpi]')")


def _has_extension(build):
    return bool(build) and bool(glob.glob(os.path.join(build, "python", "_distributed*.so")))


@pytest.fixture(scope="module")
def native_build():
    """A build directory whose python/ holds _core and _distributed."""
    given = os.environ.get("TREADLE_BUILD_DIR")
    if _has_extension(given):
        return given
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: building treadle._distributed needs it")
    build = os.path.join(REPO, "build", "mpi-py")
    env = dict(os.environ, CCACHE_BASEDIR=REPO)
    configure = ["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DTREADLE_WITH_MPI=ON",
                 "-DTREADLE_BUILD_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    proc = subprocess.run(configure, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail("cmake configure failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
    if "treadle::distributed is not built" in proc.stderr or "treadle._distributed is not built" in proc.stderr:
        pytest.skip("CMake found no MPI or no mpi4py headers:\n" + proc.stderr[-2000:])
    proc = subprocess.run(["cmake", "--build", build, "--target", "_core", "_distributed", "-j",
                           str(min(2, os.cpu_count() or 1))], env=env, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, "building treadle._distributed failed:\n" + proc.stdout[-5000:] + proc.stderr[-5000:]
    assert _has_extension(build)
    return build


def launch_with(build, n, args, timeout=240, check=True):
    """launch() with TREADLE_BUILD_DIR=build in the ranks' environment."""
    old = os.environ.get("TREADLE_BUILD_DIR")
    os.environ["TREADLE_BUILD_DIR"] = build  # launch() passes this environment on
    try:
        return launch(n, args, timeout=timeout, check=check)[1]
    finally:
        if old is None:
            del os.environ["TREADLE_BUILD_DIR"]
        else:
            os.environ["TREADLE_BUILD_DIR"] = old


@pytest.fixture(scope="module")
def parity(native_build, tmp_path_factory):
    """Both implementations' results on both ranks: ([npz per rank], [json per rank])."""
    out = tmp_path_factory.mktemp("native")
    text = launch_with(native_build, 2, [os.path.join(SCRIPTS, "native_parity.py"), str(out)])
    assert "rank 0: done" in text and "rank 1: done" in text, text[-3000:]
    arrays = [np.load(os.path.join(out, f"native.rank{r}.npz")) for r in (0, 1)]
    reports = [json.load(open(os.path.join(out, f"native.rank{r}.json"))) for r in (0, 1)]
    return arrays, reports


def test_training_is_bitwise_that_of_the_python_class(parity):
    arrays, _ = parity
    keys = sorted({k.split("/", 1)[1] for k in arrays[0].files})
    assert len(keys) == 3 * 2 + 3 * 2 + 4  # 3 cases + 3 BatchNorm modes (params, losses) + fp16 (4 arrays)
    for r, a in enumerate(arrays):
        for key in keys:
            assert np.array_equal(a["native/" + key], a["python/" + key]), f"rank {r}: {key}"
    for key in arrays[0].files:  # and the replicas agree (BatchNorm "local" keeps its own statistics)
        if not key.split("/")[1] == "bn_local":
            assert np.array_equal(arrays[0][key], arrays[1][key]), key


def test_against_one_process_on_the_whole_batch(parity):
    arrays, _ = parity
    for name in ("f64_adam_mse_2", "f32_sgd_ce_2"):
        spec = cases.CASES[name]
        params, losses = cases.reference(spec)
        tol = dict(rtol=1e-12, atol=1e-12) if spec["dtype"] == "float64" else dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(arrays[0][f"native/{name}/params"], params, **tol)
        np.testing.assert_allclose(arrays[0][f"native/{name}/losses"], losses, **tol)


def test_loss_scaling_skips_the_same_steps(parity):
    arrays, _ = parity
    skipped = arrays[1]["native/fp16_dynamic/skipped"]
    assert skipped[-1] == 3 and np.array_equal(arrays[0]["native/fp16_dynamic/skipped"], skipped)
    assert len(set(arrays[0]["native/fp16_dynamic/scales"])) > 1  # the scale moved (backoff and growth)


def test_attributes_and_batchnorm(parity):
    _, reports = parity
    for report in reports:
        assert report["native"] == report["python"]  # every check, message and attribute
        for name in ("f64_adam_mse_2", "f32_sgd_ce_2", "f64_host_phases_2"):
            assert report["native"][name] == dict(steps=4, divergence=0.0, transport="mpi", timed=True)
        for mode in ("root", "average", "local"):
            bn = report["native"][f"bn_{mode}"]
            assert bn["failure"].startswith("DataParallel.step: rank 1 failed: module '0' (Linear(") and \
                "): linear: " in bn["failure"] and bn["unchanged"]
            assert (bn["divergence"] == 0.0) == (mode != "local")


def test_errors_are_those_of_the_python_class(parity):
    _, reports = parity
    assert reports[0]["native"]["failures"] == reports[1]["native"]["failures"]
    f = reports[0]["native"]["failures"]
    assert f["bad_shape"] == ("DataParallel.step: rank 1 failed: module '0' (Linear(in_features=5, out_features=8, "
                              "bias=True)): linear: expected input of shape (N, 5), got (3, 4)")
    assert f["bad_lengths"] == "DataParallel.step: rank 1 failed: x has 3 samples but y has 2"
    assert f["both_ranks"].startswith("DataParallel.step: rank 0 failed (and 1 more rank): TypeError: model: ")
    assert f["host_error"] == "DataParallel.allreduce_gradients: rank 1 failed: RuntimeError: solver diverged"
    assert f["host_message"] == "DataParallel.allreduce_gradients: rank 0 failed: out of memory"
    assert f["bad_count"] == ("DataParallel.allreduce_gradients: rank 1 failed: count must be a non-negative "
                              "integer, got -1")
    assert f["float_count"].endswith("rank 0 failed: count must be a non-negative integer, got 2.5")
    assert f["empty"] == "DataParallel.step: the global batch is empty (every rank passed count 0)"
    assert f["ok"] is None and f["steps"] == 1 and f["trainer_steps"] == 1 and f["divergence"] == 0.0
    assert f["setup"] == {
        "dtype": "DataParallel: dtype is float32 on rank 1 but float64 on root rank 0",
        "root": "DataParallel: rank 1 failed: root must be a rank in [0, 2), got 5",
        "buffers": "DataParallel: rank 0 failed: buffers must be one of ('root', 'average', 'local'), got 'sync'",
        "not_a_trainer": "DataParallel: rank 1 failed: AttributeError: 'object' object has no attribute 'model'",
    }


def test_choices_that_need_every_rank(parity):
    _, reports = parity
    for r, report in enumerate(reports):
        m = report["mixed"]
        assert m["implementations"] == ("DataParallel: implementation is mpi4py on rank 1 but treadle._distributed "
                                        "on root rank 0")
        assert m["transports"] == "DataParallel: transport is auto on rank 1 but mpi on root rank 0"
        if m["has_nccl"]:  # the C++ class refuses a model on the host
            assert m["nccl"] == ("DataParallel: rank 0 failed (and 1 more rank): transport 'nccl' is not available "
                                 "from Python: the NCCL transport of the C++ treadle::DataParallel "
                                 "needs the model on backend 'cuda', but its backend is automatic host dispatch: set "
                                 "the model's backend to 'cuda' first, or use transport 'mpi'")
        else:  # the refusal says how to get NCCL
            assert m["nccl"].startswith("DataParallel: rank 0 failed (and 1 more rank): transport 'nccl' is not "
                                        "available from Python: treadle._distributed, the binding of the C++ "
                                        "treadle::DataParallel, was built without NCCL: configure with ")
            assert "-DTREADLE_WITH_NCCL=ON" in m["nccl"]
        assert m["nccl_python"].endswith("transport 'nccl' needs the C++ treadle::DataParallel, but native=False "
                                         "asks for the mpi4py implementation; use transport 'mpi'")
        assert m["auto"] == ["mpi", True]  # a CPU model: "auto" keeps to the mpi4py code
        assert m["auto_native"] == ["mpi", False, f"DataParallel(rank={r}, size=2, root=0, transport='mpi')"]


@pytest.mark.parametrize("n", [1, 2])
def test_gpu_script_harness_on_the_host(native_build, n):
    """tests/mpi_scripts/dp_cuda_python.py (what tools/gpu_dp_check.sh runs on a GPU) with the
    data-parallel models on "eigen": its cases, shards, reference and tolerances agree here."""
    text = launch_with(native_build, n, [os.path.join(SCRIPTS, "dp_cuda_python.py"), "--backend", "eigen"])
    assert "FAIL" not in text, text
    assert f"dp python cuda checks ({n} ranks): {4 if n == 1 else 3} passed, 0 failed" in text, text
    assert "PASS native_mpi_sgd transport mpi (C++)" in text


# -- in this process: the Python side of the choice, whatever this build has ------------------------
@pytest.fixture
def without_extension(monkeypatch):
    def missing():
        missing.error = ImportError("No module named 'treadle._distributed'")
        return None
    monkeypatch.setattr(distributed, "_native_module", missing)


def test_without_the_extension_nccl_says_how_to_build_it(without_extension):
    trainer = cases.build(cases.CASES["f64_adam_mse_2"], seed=0)
    with pytest.raises(ValueError) as info:
        DataParallel(trainer, MPI.COMM_SELF, transport="nccl")
    text = str(info.value)
    assert text.startswith("DataParallel: rank 0 failed: transport 'nccl' is not available from Python: it needs "
                           "treadle._distributed, the binding of the C++ treadle::DataParallel, which this "
                           "installation lacks (No module named 'treadle._distributed'): configure with ")
    assert "-DTREADLE_WITH_MPI=ON" in text and "-DTREADLE_WITH_NCCL=ON" in text and text.endswith("use transport 'mpi'")
    with pytest.raises(ValueError, match=r"rank 0 failed: native=True: it needs treadle._distributed"):
        DataParallel(trainer, MPI.COMM_SELF, transport="mpi", native=True)
    for transport in ("auto", "mpi"):  # the mpi4py code, as always
        dp = DataParallel(trainer, MPI.COMM_SELF, transport=transport)
        assert dp.transport == "mpi" and dp._native is None


def test_native_argument_is_checked():
    trainer = cases.build(cases.CASES["f64_adam_mse_2"], seed=0)
    with pytest.raises(ValueError, match=r"native must be None, True or False, got 'yes'"):
        DataParallel(trainer, MPI.COMM_SELF, native="yes")


def test_a_rank_that_leaves_early_times_out_in_cpp(native_build):
    """The timeout in the C++ class: the same TimeoutError, with this class's names, and the same refusal after."""
    from test_distributed import check_left_early
    check_left_early(launch_with(native_build, 2, [os.path.join(SCRIPTS, "left_early.py"), "native"], timeout=60,
                                 check=False))

"""The CUDA variant in CI: configures treadle with TREADLE_WITH_CUDA=ON and TREADLE_BUILD_TESTS=ON in
build/cuda-check (ccache, sm_90 + PTX only), builds libtreadle, the GPU check program test_cuda and the
Python module, and runs the program and the Python side of the GPU check (bench/gpu_check.sh). Without a GPU the program runs its host-side checks (status messages, argument validation,
allocator size classes) and prints "SKIP: no CUDA device (...)"; with one it runs every device test.
So CI, which has no GPU, still compiles and links every CUDA source against cuBLAS(Lt)/cuDNN 9.

Skipped, with the reason, when nvcc, cmake or the NVIDIA wheels (nvidia-cublas, nvidia-cudnn-cu13) are
missing, or with TREADLE_CUDA_CHECK=0 (a quick local run).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from nvidia_wheels import wheel_lib
from opcheck import CUDA_GAPS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(REPO, "build", "cuda-check")
NVCC = os.environ.get("CUDACXX") or "/usr/local/cuda/bin/nvcc"


def skip_reason():
    if os.environ.get("TREADLE_CUDA_CHECK") == "0":
        return "TREADLE_CUDA_CHECK=0"
    if shutil.which("cmake") is None:
        return "cmake is not installed"
    if shutil.which("ninja") is None:
        return "ninja is not installed"
    if not os.access(NVCC, os.X_OK):
        return f"nvcc not found at {NVCC} (install the CUDA toolkit or set CUDACXX)"
    if wheel_lib("libcublasLt.so*") is None:
        return "cuBLASLt not found in site-packages/nvidia/*/lib (pip install nvidia-cublas)"
    if wheel_lib("libcudnn.so.9*") is None:
        return "cuDNN 9 not found in site-packages/nvidia/*/lib (pip install nvidia-cudnn-cu13)"
    return None


def _run(cmd, env, timeout):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return proc, (proc.stdout[-6000:] + proc.stderr[-6000:])


@pytest.fixture(scope="module")
def cuda_build():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ)
    # build/cuda-check sits at the depth of build/dev: with the repository as ccache's base directory the
    # core's objects are hits of a CPU-only build (the CUDA variant compiles them unchanged).
    env.setdefault("CCACHE_BASEDIR", REPO)
    configure = ["cmake", "-S", REPO, "-B", BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DTREADLE_WITH_CUDA=ON", "-DTREADLE_BUILD_TESTS=ON", "-DTREADLE_BUILD_PYTHON=ON",
                 f"-DCMAKE_CUDA_COMPILER={NVCC}", "-DCMAKE_CUDA_ARCHITECTURES=90",
                 f"-DPython3_EXECUTABLE={os.path.realpath(sys.executable)}"]
    if shutil.which("ccache"):
        configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    proc, report = _run(configure, env, 600)
    assert proc.returncode == 0, report
    proc, report = _run(["cmake", "--build", BUILD, "-j2", "--target", "treadle", "test_cuda", "_core"], env, 3600)
    assert proc.returncode == 0, report
    return BUILD


def test_libtreadle_links_the_nvidia_libraries(cuda_build):
    libs = glob.glob(os.path.join(cuda_build, "cpp", "libtreadle.so*"))
    assert libs, f"no libtreadle.so under {cuda_build}/cpp"
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    dyn = subprocess.run(["readelf", "-d", libs[0]], capture_output=True, text=True).stdout
    assert "libcublasLt.so" in dyn and "libcudnn.so.9" in dyn, dyn
    # Found through the RUNPATH at the wheels' directories, with no LD_LIBRARY_PATH.
    assert os.path.dirname(wheel_lib("libcublasLt.so*")) in dyn, dyn
    assert "libcudart.so" not in dyn, "the CUDA runtime should be linked statically"


def test_cuda_check_program(cuda_build):
    exe = os.path.join(cuda_build, "cpp", "tests", "cuda", "test_cuda")
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    proc, report = _run([exe], env, 900)
    assert proc.returncode == 0, report
    out = proc.stdout
    for name in ("status_messages", "argument_validation", "allocator_size_classes"):
        assert f"PASS {name}" in out, report
    assert "FAIL" not in out, report
    if "SKIP: no CUDA device (cudaGetDeviceCount: " in out:
        assert re.search(r"cuda host checks: \d+ passed, 0 failed", out), report
    else:
        assert "cuda tests:" in out and ", 0 failed" in out, report


def _python(cuda_build, args, timeout, **extra):
    env = dict(os.environ, TREADLE_BUILD_DIR=cuda_build, PYTHONPATH=os.path.join(REPO, "python"), **extra)
    env.pop("LD_LIBRARY_PATH", None)
    return _run([sys.executable] + args, env, timeout)


DEVICE_PROBE = "import numpy, treadle._core as c; c.run_op('relu', [numpy.ones(2, 'float32')], {}, None, 'cuda', True, 0)"


def _has_device(cuda_build):
    proc, _ = _python(cuda_build, ["-c", DEVICE_PROBE], 120)
    return proc.returncode == 0


def test_python_module_has_the_cuda_backend(cuda_build):
    proc, report = _python(cuda_build, ["-c", "import treadle as tl; print(tl.backends())"], 120)
    assert proc.returncode == 0, report
    assert proc.stdout.strip() == "['cuda', 'eigen']", report


def cuda_op_suite():
    with open(os.path.join(REPO, "tests", "cuda_op_suite.txt")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def test_op_suite_runs_against_cuda(cuda_build):
    """The op suite with TREADLE_TEST_BACKENDS=cuda, as the GPU check runs it. Coverage is checked with or
    without a device (a plan's kernels are chosen before the device is asked for): a float32 op without
    a CUDA kernel fails its case unless opcheck.CUDA_GAPS lists it (then xfail). Without a device every
    covered case is skipped with "needs a CUDA device" (the error paths, checked in the ops' shape rules
    before any kernel, still run)."""
    proc, report = _python(cuda_build, ["-m", "pytest", "-q", "-rsx", "-p", "no:cacheprovider"] + cuda_op_suite(),
                           900, TREADLE_TEST_BACKENDS="cuda")
    assert proc.returncode == 0, report
    assert "no CUDA kernel for float32" not in proc.stdout, report  # only as a listed gap's xfail
    for gap in CUDA_GAPS:  # a listed gap no case reaches any more is stale
        assert f"cuda gap: {gap}:" in proc.stdout, f"opcheck.CUDA_GAPS lists {gap}, which no case hit\n{report}"
    if not _has_device(cuda_build):
        assert "needs a CUDA device" in proc.stdout, report
        assert " passed" in proc.stdout.splitlines()[-1], report


def test_every_benchmark_workload_compiles_for_cuda(cuda_build):
    """W1-W6 (MLPs, CNN, LSTM regressor, transformer encoder) have a CUDA kernel for every node: their
    training plans get past the coverage pass (without a device they stop at "needs a CUDA device";
    with one, gpu_curves compares their training with Eigen)."""
    proc, report = _python(cuda_build, ["bench/gpu_curves.py", "--steps", "2"], 600)
    lines = [ln for ln in proc.stdout.splitlines() if ln[:5] in ("PASS ", "FAIL ", "SKIP ")]
    assert len(lines) == 6, report
    for line in lines:
        assert line.startswith("PASS") or "needs a CUDA device" in line, report

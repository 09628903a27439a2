"""DataParallel's transports ("auto", "mpi", "nccl") and data-parallel training of models on backend
"cuda", as far as a machine without a GPU can check them:

* the CPU+MPI build (build/mpi-test, shared with test_distributed.py): tests/mpi_scripts/
  dp_transport_check.cpp under `mpiexec -n 2`: "auto"/"mpi" of a host model, the same ValueError on
  every rank for an unknown transport, for "nccl" in a build without NCCL (saying how to build it),
  for one rank asking for "nccl" alone, and for ranks asking for different transports;
* the CUDA+MPI+NCCL build (build/cuda-mpi-check; skipped where nvcc, the NVIDIA wheels incl.
  nvidia-nccl-cu13, mpicc or mpiexec are missing): it configures, compiles and links,
  libtreadle_distributed finds NCCL through its RUNPATH, and without a GPU a model on "cuda" fails
  cleanly on both ranks instead of hanging ("mpi"/"auto": at the first step, with the model's
  "needs a CUDA device"; "nccl": at construction). dp_cuda_check, the program the GPU script runs
  (tools/gpu_dp_check.sh), prints its SKIP line here, and runs its harness with the models on Eigen;
* Python's DataParallel: the transport argument ("nccl" is C++ only).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from nvidia_wheels import wheel_lib

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install 'treadle[mpi]')")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "mpi_scripts"))
import cases  # noqa: E402

from treadle.distributed import DataParallel  # noqa: E402

NVCC = os.environ.get("CUDACXX") or "/usr/local/cuda/bin/nvcc"
TIMEOUT = 60


def find_mpiexec():
    """The launcher installed with this Python's MPI (the mpich wheel), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()


def _configure_and_build(build, options, targets, timeout):
    env = dict(os.environ, CCACHE_BASEDIR=REPO)
    configure = ["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DTREADLE_BUILD_TESTS=ON",
                 "-DTREADLE_BUILD_PYTHON=OFF", *options]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        if "-DTREADLE_WITH_CUDA=ON" in options:
            configure.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    proc = subprocess.run(configure, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, "cmake configure failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    if "treadle::distributed is not built" in proc.stderr:
        pytest.skip("CMake found no MPI (pip install mpich puts mpicc on PATH)")
    proc = subprocess.run(["cmake", "--build", build, "-j", "2", "--target", *targets], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, "build failed:\n" + proc.stdout[-5000:] + proc.stderr[-5000:]
    return os.path.join(build, "cpp", "src", "distributed")


def _launch(n, exe, *args):
    cmd = [MPIEXEC, "-n", str(n), exe, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, start_new_session=True)
    return proc.returncode, proc.stdout + proc.stderr


def _messages(out):
    """{tag: {"rank R": text}} from the "rank R message <tag>: <text>" lines."""
    messages = {}
    for line in out.splitlines():
        if " message " in line:
            rank, rest = line.split(" message ", 1)
            tag, text = rest.split(": ", 1)
            messages.setdefault(tag, {})[rank] = text
    for tag, per_rank in messages.items():  # every rank raised the same error
        assert len(per_rank) == 2 and len(set(per_rank.values())) == 1, (tag, per_rank)
    return {tag: per_rank["rank 0"] for tag, per_rank in messages.items()}


def _check_host_messages(m):
    assert m["unknown"] == ("DataParallel: rank 0 failed (and 1 more rank): transport must be one of "
                            "('auto', 'mpi', 'nccl'), got 'gloo'")
    assert m["mixed"] == "DataParallel: transport is auto on rank 1 but mpi on root rank 0"
    assert m["nccl_one_rank"].startswith("DataParallel: rank 1 failed: transport 'nccl' ")


# -- the CPU+MPI build --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_mpi_bin():
    if MPIEXEC is None or shutil.which("cmake") is None:
        pytest.skip("needs mpiexec and cmake (pip install 'treadle[mpi]')")
    return _configure_and_build(os.path.join(REPO, "build", "mpi-test"), ["-DTREADLE_WITH_MPI=ON"],
                                ["dp_transport_check"], 1200)


def test_transport_errors_without_nccl(cpu_mpi_bin):
    rc, out = _launch(2, os.path.join(cpu_mpi_bin, "dp_transport_check"))
    assert rc == 0 and "FAIL" not in out, out[-4000:]
    assert out.count(" ok: ") == 2 * 3, out[-4000:]
    m = _messages(out)
    assert set(m) == {"unknown", "nccl_host", "nccl_one_rank", "mixed"}
    _check_host_messages(m)
    assert m["nccl_host"] == (
        "DataParallel: rank 0 failed (and 1 more rank): transport 'nccl' is not in this build: configure with "
        "-DTREADLE_WITH_NCCL=ON (which needs -DTREADLE_WITH_CUDA=ON and -DTREADLE_WITH_MPI=ON, and NCCL: pip "
        "install nvidia-nccl-cu13), or use transport 'mpi'")


# -- the CUDA+MPI+NCCL build, on a machine without a GPU ----------------------------------------------
def cuda_skip_reason():
    if os.environ.get("TREADLE_CUDA_CHECK") == "0":
        return "TREADLE_CUDA_CHECK=0"
    if MPIEXEC is None or shutil.which("mpicc") is None:
        return "mpicc / mpiexec not found (pip install mpich)"
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        return "cmake and ninja are needed"
    if not os.access(NVCC, os.X_OK):
        return f"nvcc not found at {NVCC} (install the CUDA toolkit or set CUDACXX)"
    if wheel_lib("libcublasLt.so*") is None or wheel_lib("libcudnn.so.9*") is None:
        return "cuBLASLt / cuDNN 9 wheels not found (pip install nvidia-cublas nvidia-cudnn-cu13)"
    if wheel_lib("libnccl.so*") is None:
        return "NCCL not found in site-packages/nvidia/nccl/lib (pip install nvidia-nccl-cu13)"
    return None


@pytest.fixture(scope="module")
def cuda_mpi_bin():
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    options = ["-DTREADLE_WITH_CUDA=ON", "-DTREADLE_WITH_MPI=ON", "-DTREADLE_WITH_NCCL=ON",
               f"-DCMAKE_CUDA_COMPILER={NVCC}", "-DCMAKE_CUDA_ARCHITECTURES=90",
               f"-DPython3_EXECUTABLE={os.path.realpath(sys.executable)}"]
    return _configure_and_build(os.path.join(REPO, "build", "cuda-mpi-check"), options,
                                ["dp_transport_check", "dp_cuda_check"], 3600)


def test_nccl_build_links_nccl_from_the_wheel(cuda_mpi_bin):
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    lib = os.path.join(cuda_mpi_bin, "libtreadle_distributed.so")
    dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    assert "libnccl.so.2" in dyn, dyn
    assert os.path.dirname(wheel_lib("libnccl.so*")) in dyn, dyn  # RUNPATH: no LD_LIBRARY_PATH needed
    assert "libcudart.so" not in dyn, "the CUDA runtime should be linked statically"


def test_cuda_model_without_gpu_fails_on_every_rank(cuda_mpi_bin):
    rc, out = _launch(2, os.path.join(cuda_mpi_bin, "dp_transport_check"))
    assert rc == 0 and "FAIL" not in out, out[-4000:]
    if "skip: a CUDA device is present" in out:
        pytest.skip("a CUDA device is present: tools/gpu_dp_check.sh checks this machine")
    m = _messages(out)
    _check_host_messages(m)
    assert m["nccl_host"] == (
        "DataParallel: rank 0 failed (and 1 more rank): transport 'nccl' needs the model on backend 'cuda', but "
        "its backend is automatic host dispatch: set the model's backend to 'cuda' first, or use transport 'mpi'")
    for transport in ("mpi", "auto"):  # both resolve to "mpi" here and fail at the first step
        assert m[f"cuda_step_{transport}"].startswith(
            "DataParallel::step: rank 0 failed (and 1 more rank): plan: backend 'cuda' needs a CUDA device for "
            "cuda:0, but "), m
    assert re.match(r"DataParallel: rank 0 failed \(and 1 more rank\): transport 'nccl' needs a CUDA device for "
                    r"cuda:0, but (cudaGetDeviceCount failed: cuda\w+ \(.*\)|this machine has 0 CUDA device)",
                    m["cuda_nccl"]), m["cuda_nccl"]


def test_gpu_check_program_skips_without_gpu_and_its_harness_holds(cuda_mpi_bin):
    exe = os.path.join(cuda_mpi_bin, "dp_cuda_check")
    for n in (1, 2):
        rc, out = _launch(n, exe)
        assert rc == 0, out[-4000:]
        if not out.startswith("SKIP: no CUDA device ("):
            pytest.skip("a CUDA device is present: tools/gpu_dp_check.sh runs this program")
    # The same cases with the data-parallel models on Eigen: shards, reference and tolerances agree.
    for n in (1, 2):
        rc, out = _launch(n, exe, "--backend", "eigen")
        assert rc == 0 and "FAIL" not in out, out[-4000:]
        assert f"dp cuda checks ({n} ranks): {2 if n == 1 else 3} passed, 0 failed" in out, out


# -- Python ----------------------------------------------------------------------------------------------
def test_python_transport_argument():
    trainer = cases.build(cases.CASES["f64_adam_mse_2"], seed=0)
    for transport in ("auto", "mpi"):
        assert DataParallel(trainer, MPI.COMM_SELF, transport=transport).transport == "mpi"
    with pytest.raises(ValueError, match=r"DataParallel: rank 0 failed: transport 'nccl' is not available from "
                                         r"Python: .* C\+\+ treadle::DataParallel"):
        DataParallel(trainer, MPI.COMM_SELF, transport="nccl")
    with pytest.raises(ValueError, match=r"transport must be one of \('auto', 'mpi', 'nccl'\), got 'gloo'"):
        DataParallel(trainer, MPI.COMM_SELF, transport="gloo")

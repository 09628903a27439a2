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


def test_c_api_phases_and_parameters_through_ctypes(treadle_prefix):  # noqa: F811
    """The entry points the C example does not use: host-driven forward/backward/update, gradients,
    get/set parameters, float64 models, and NULL handles reported as TREADLE_ERROR_ARGUMENT."""
    import ctypes

    import numpy as np

    lib_path = sorted(p for p in treadle_prefix.glob("lib*/libtreadle.so*") if not p.is_symlink())[0]
    lib = ctypes.CDLL(str(lib_path))
    lib.treadle_last_error.restype = ctypes.c_char_p
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    shape = (ctypes.c_int64 * 2)(4, 3)
    arg = lambda a: a.ctypes.data_as(ptr)  # noqa: E731
    desc = (b'{"type":"Sequential","layers":[{"type":"Linear","config":{"in_features":3,"out_features":5}},'
            b'{"type":"Tanh"},{"type":"Linear","config":{"in_features":5,"out_features":2}}]}')
    model, trainer = ptr(), ptr()
    assert lib.treadle_model_from_json(desc, 1, ctypes.c_uint64(0), ctypes.byref(model)) == 0, lib.treadle_last_error()
    n = ctypes.c_int64()
    assert lib.treadle_model_num_parameters(model, ctypes.byref(n)) == 0 and n.value >= 3 * 5 + 5 + 5 * 2 + 2  # + alignment padding
    params = np.linspace(-1, 1, n.value)
    assert lib.treadle_model_set_parameters(model, arg(params), i64(n.value)) == 0
    back = np.zeros(n.value)
    assert lib.treadle_model_get_parameters(model, arg(back), i64(n.value)) == 0
    np.testing.assert_array_equal(back, params)
    assert lib.treadle_trainer_create(model, b"mse", b"sgd", b'{"lr": 0.1}', ctypes.c_uint64(0),
                                      ctypes.byref(trainer)) == 0, lib.treadle_last_error()
    x = np.arange(12, dtype=np.float64).reshape(4, 3) / 10
    out, grad = np.zeros((4, 2)), np.ones((4, 2))
    assert lib.treadle_trainer_zero_grad(trainer) == 0
    assert lib.treadle_trainer_forward(trainer, arg(x), 2, shape, arg(out), i64(8)) == 0, lib.treadle_last_error()
    out_shape = (ctypes.c_int64 * 2)(4, 2)
    assert lib.treadle_trainer_backward(trainer, arg(grad), 2, out_shape) == 0, lib.treadle_last_error()
    grads = np.zeros(n.value)
    assert lib.treadle_trainer_get_gradients(trainer, arg(grads), i64(n.value)) == 0
    assert lib.treadle_trainer_update(trainer) == 0
    after = np.zeros(n.value)
    lib.treadle_model_get_parameters(model, arg(after), i64(n.value))
    np.testing.assert_allclose(after, params - 0.1 * grads, rtol=1e-15, atol=1e-15)  # one SGD step
    # The last Linear's bias gradient is the column sums of dL/d(output) (4 rows of ones): two 4.0s.
    assert np.count_nonzero(grads == 4.0) >= 2 and np.count_nonzero(grads) > 20
    assert lib.treadle_model_predict(None, arg(x), 2, shape, arg(out), i64(8)) == 4  # TREADLE_ERROR_ARGUMENT
    assert b"model is NULL" in lib.treadle_last_error()
    assert lib.treadle_trainer_create(model, b"mse", b"lbfgs", None, ctypes.c_uint64(0), ctypes.byref(trainer)) == 1
    assert b"unknown optimizer 'lbfgs'" in lib.treadle_last_error()
    lib.treadle_trainer_free(trainer)
    lib.treadle_model_free(model)

"""treadle from Fortran (fortran/treadle.f90 over the C API), checked as a Fortran host uses it:
programs compiled with the module sources that the CMake package names (TREADLE_FORTRAN_SOURCE) and
linked against the installed library.

The package is the pip-installed wheel's own (`python -m treadle --cmake-dir`) when the imported
treadle is an installed wheel, otherwise `cmake --install` of the C++ core into a temporary prefix
(the `treadle_prefix` fixture of test_examples.py: from $TREADLE_BUILD_DIR when it is set). Either
way the Python side of each comparison is the same build as the library the program links.

- examples/fortran: a toy simulation trains its surrogate between time steps; its losses and
  predictions equal the Python API's for the same JSON model, seed and data, bit for bit.
- tests/fortran/wrapper_check: every other wrapper, and the errors of each.
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import treadle as tl
from treadle.__main__ import cmake_dir
from test_examples import FLOAT, ROOT, cmake, cmake_generator_args, treadle_prefix  # noqa: F401 (fixture)

# As in examples/fortran/main.f90.
BATCH, STEPS, SEED, DT, C, LR = 32, 500, 7, 0.05, 0.5, 0.01
MODEL = {"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [
    {"type": "Linear", "config": {"in_features": 2, "out_features": 32}}, {"type": "Tanh"},
    {"type": "Linear", "config": {"in_features": 32, "out_features": 32}}, {"type": "Tanh"},
    {"type": "Linear", "config": {"in_features": 32, "out_features": 1}}]}}
# Measured: the loss falls from 0.44 to 6.9e-5 over 500 steps; asking for 1e-3.
FINAL_LOSS_BELOW = 1e-3
# Measured: 0.012 after 20 surrogate steps; about 4x margin.
ROLLOUT_ERROR_BELOW = 0.05
LOSS_LINE = re.compile(r"^step (\d+) loss\s+([-+0-9.E]+)$", re.MULTILINE)
WRAPPER_CHECKS = 76  # "ok:" lines of tests/fortran/wrapper_check


def _installed_wheel_cmake_dir():
    """The wheel's CMake package when the imported treadle is an installed wheel (not a development tree)."""
    path = Path(cmake_dir())
    return path if not os.environ.get("TREADLE_BUILD_DIR") and (path / "treadleConfig.cmake").is_file() else None


@pytest.fixture(scope="module")
def package(request):
    """(CMake argument that finds the treadle package, the package's root directory)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    if not (os.environ.get("FC") or shutil.which("gfortran")):
        pytest.skip("no Fortran compiler: gfortran is not on PATH (and FC is not set)")
    wheel = _installed_wheel_cmake_dir()
    if wheel is not None:
        return f"-Dtreadle_DIR={wheel}", wheel.parents[2]
    prefix = request.getfixturevalue("treadle_prefix")
    return f"-DCMAKE_PREFIX_PATH={prefix}", prefix


def build(package, source, build_dir, target):
    cmake("-S", source, "-B", build_dir, package[0], "-DCMAKE_BUILD_TYPE=Release", *cmake_generator_args())
    cmake("--build", build_dir, "-j", "2")
    return build_dir / target


@pytest.fixture(scope="module")
def example(package, tmp_path_factory):
    exe = build(package, ROOT / "examples" / "fortran", tmp_path_factory.mktemp("fortran_example"), "fortran_example")
    out = tmp_path_factory.mktemp("fortran_out")
    proc = subprocess.run([str(exe), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe, out, proc.stdout


def simulate_in_python():
    """The example's run through the Python API: the same simulation (float64, the same operations in the
    same order), the same model from the same description and seed, the same trainer."""
    i = np.arange(1, BATCH + 1)
    q, v = (i - 16.5) / 16, (np.mod(7 * (i - 1), 32) - 15.5) / 32
    tl.manual_seed(SEED)
    net = tl.io.build(json.dumps(MODEL))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=LR), seed=SEED)
    losses = []
    for _ in range(STEPS):
        a = -(q + C * q * q * q)
        # Fortran's x(2, BATCH) and y(1, BATCH) are these row-major (BATCH, 2) and (BATCH, 1) arrays.
        losses.append(trainer.step(np.stack([q, v], axis=1).astype(np.float32),
                                   a.astype(np.float32).reshape(BATCH, 1)))
        v = v + DT * (-(q + C * q * q * q))
        q = q + DT * v
    return net, losses, np.stack([q, v], axis=1).astype(np.float32)


def test_fortran_example_matches_the_python_api(example):
    _, out, stdout = example
    net, losses, x_final = simulate_in_python()
    printed = {int(step): float(value) for step, value in LOSS_LINE.findall(stdout)}
    assert sorted(printed) == [1] + list(range(100, STEPS + 1, 100)), stdout
    # 17 significant digits: the printed losses are the Python losses exactly.
    assert printed == {step: losses[step - 1] for step in printed}, stdout
    assert losses[0] > 0.1 and losses[-1] < FINAL_LOSS_BELOW, losses[-1]

    # The saved model loads in Python with the weights the Python run trained, and both predict what
    # the Fortran program predicted for the final state (its pred(1, BATCH) is row-major (BATCH, 1)).
    saved = tl.load(str(out / "surrogate.safetensors"))
    for (name, a), (_, b) in zip(sorted(saved.state_dict().items()), sorted(net.state_dict().items())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    predicted = np.fromfile(out / "predict.bin", dtype=np.float32).reshape(BATCH, 1)
    np.testing.assert_array_equal(predicted, net.predict(x_final))
    np.testing.assert_array_equal(predicted, saved.predict(x_final))
    assert "reloaded model predicts the same" in stdout


def test_fortran_example_surrogate_steps_the_simulation(example):
    match = re.search(r"surrogate rollout relative error after 20 steps:\s+" + FLOAT, example[2].replace("E", "e"))
    assert match, example[2]
    assert float(match.group(1)) < ROLLOUT_ERROR_BELOW, example[2]


def test_fortran_example_reports_errors(example):
    stdout = example[2]
    # A wrong input size: the C++ core's message, in row-major shapes (Fortran's (3, 32) is (32, 3)).
    assert "wrong input size: status 1, message: linear: expected input of shape (N, 2), got (32, 3)" in stdout
    # The module's own checks read back through the same channel.
    assert ("wrong kind: status 2, message: treadle_model_predict: expected x of float32 values (real(c_float)), "
            "got float64 values (real(c_double))") in stdout
    assert ("transposed output: status 1, message: treadle_model_predict: y has shape (32, 1), the output has "
            "shape (1, 32) (Fortran order: outputs, batch)") in stdout
    assert stdout.rstrip().endswith("done")


def test_fortran_example_reports_bad_arguments(example):
    proc = subprocess.run([str(example[0])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: fortran_example OUT_DIR" in proc.stderr


def test_fortran_wrappers(package, tmp_path):
    exe = build(package, ROOT / "tests" / "fortran" / "wrapper_check", tmp_path / "build", "wrapper_check")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("ok: ") == WRAPPER_CHECKS, proc.stdout
    assert "all checks done" in proc.stdout


def test_package_ships_the_fortran_sources(package):
    """The installed sources (what TREADLE_FORTRAN_SOURCE names) are the repository's."""
    installed = sorted(package[1].glob("**/fortran/treadle*.f90"))
    assert [p.name for p in installed] == ["treadle.f90", "treadle_c.f90", "treadle_distributed.f90",
                                          "treadle_online.f90"], installed
    for path in installed:
        assert path.read_text() == (ROOT / "fortran" / path.name).read_text(), path


def test_set_last_error_through_ctypes(package):
    """treadle_set_last_error: how a binding reports its own checks through treadle_last_error()."""
    import ctypes

    libraries = sorted(p for p in package[1].glob("lib*/libtreadle.so*") if not p.is_symlink())
    assert libraries, f"no libtreadle.so under {package[1]}"
    lib = ctypes.CDLL(str(libraries[0]))
    lib.treadle_last_error.restype = ctypes.c_char_p
    assert lib.treadle_set_last_error(2, b"binding: expected float32 values") == 2
    assert lib.treadle_last_error() == b"binding: expected float32 values"
    assert lib.treadle_set_last_error(0, None) == 0
    assert lib.treadle_last_error() == b""

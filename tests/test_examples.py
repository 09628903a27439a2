"""The examples run as a user runs them.

examples/heat_surrogate.py: the Python demo written for reading.
examples/cpp_host: a C++ host built against the *installed* CMake package (`cmake --install` of this
project into a temporary prefix, then find_package(treadle CONFIG REQUIRED)), so this also checks the
install and export rules: public headers only, no Eigen needed by the host, C++20 carried by the target.

The C++ package is installed from $TREADLE_BUILD_DIR when it is set (after bringing its `treadle`
target up to date), otherwise from a fresh Release build of the core in a temporary directory.
Builds use ccache when it is installed (CCACHE_BASEDIR defaults to /work, or the repository's parent).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import treadle

ROOT = Path(__file__).resolve().parents[1]
FLOAT = r"([0-9.]+(?:e[+-]?[0-9]+)?)"

# Measured: --steps 1000 gives 0.039 (seed 0); about 4x margin.
HEAT_EXAMPLE_MAX_ERROR = 0.15
# Measured: the host's loss falls ~50x over 1000 steps (5.6e-2 -> 1.0e-3); asking for 4x.
CPP_HOST_STEPS = "1000"
CPP_HOST_MIN_REDUCTION = 4.0


def python_env():
    env = dict(os.environ)
    package_root = str(Path(treadle.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def reported_error(script, label, args=(), timeout=180):
    """Runs examples/<script> and returns the number it prints after `label` (the run must succeed)."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, env=python_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    match = re.search(re.escape(label) + " " + FLOAT, proc.stdout)
    assert match, proc.stdout
    return float(match.group(1)), proc.stdout


def test_heat_surrogate_example():
    error, out = reported_error("heat_surrogate.py", "held-out rollout relative L2 error:", ("--steps", "1000"))
    assert error < HEAT_EXAMPLE_MAX_ERROR, out


# Measured: 0.016 with the default 1500 steps (seed 0); the noise floor is ~0.008. About 3x margin.
VAE_MAX_RELATIVE_ERROR = 0.05
# Measured with the default 4000 steps: 0.006 (seed 0), 0.002 (seeds 1 and 2). About 3x margin.
PINN_MAX_RELATIVE_ERROR = 0.02


def test_vae_example():
    error, out = reported_error("vae.py", "held-out reconstruction error relative to the data variance:")
    assert error < VAE_MAX_RELATIVE_ERROR, out


def test_pinn_example_solves_the_heat_equation():
    error, out = reported_error("pinn_heat.py", "relative L2 error against the exact solution on a 101 x 101 grid:",
                                timeout=300)
    assert error < PINN_MAX_RELATIVE_ERROR, out


# -- the C++ host ----------------------------------------------------------------------------------
def cmake_env():
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", "/work" if ROOT.is_relative_to("/work") else str(ROOT.parent))
    return env


def cmake_generator_args():
    args = ["-G", "Ninja"] if shutil.which("ninja") else []
    if shutil.which("ccache"):
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    return args


def cmake(*args, timeout=600):
    proc = subprocess.run(["cmake", *map(str, args)], capture_output=True, text=True, env=cmake_env(), timeout=timeout)
    command = " ".join(map(str, args))
    assert proc.returncode == 0, f"cmake {command} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def treadle_prefix(tmp_path_factory):
    """A temporary prefix holding `cmake --install` of this project's C++ core."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    dev_build = os.environ.get("TREADLE_BUILD_DIR")
    if dev_build and (Path(dev_build) / "cmake_install.cmake").is_file():
        build = Path(dev_build)
    else:
        build = tmp_path_factory.mktemp("core_build")
        cmake("-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", *cmake_generator_args())
    cmake("--build", build, "--target", "treadle", "treadle-verify", "-j", "2")
    prefix = tmp_path_factory.mktemp("treadle_prefix")
    cmake("--install", build, "--prefix", prefix)
    return prefix


def test_installed_package_holds_only_the_public_api(treadle_prefix):
    config = list(treadle_prefix.glob("lib*/cmake/treadle/treadleConfig.cmake"))
    assert len(config) == 1, "treadleConfig.cmake not installed under <prefix>/lib*/cmake/treadle"
    installed = sorted(p.name for p in (treadle_prefix / "include" / "treadle").iterdir())
    # The sources' public headers, plus the one the build generates (treadle/config.hpp includes it).
    public = sorted([p.name for p in (ROOT / "cpp" / "include" / "treadle").iterdir()] + ["build_config.hpp"])
    assert installed == public
    generated = (treadle_prefix / "include" / "treadle" / "build_config.hpp").read_text()
    assert generated.startswith("#pragma once") and "TREADLE_WITH_CUDA" in generated, generated
    assert not list(treadle_prefix.rglob("Eigen*")), "Eigen is private to treadle and must not be installed"


def test_public_classes_have_one_layout_in_every_build(treadle_prefix, tmp_path):
    """A host compiled against the installed headers sees the same size and alignment of every public class
    whether or not TREADLE_WITH_CUDA is defined: a device backend's state hangs off opaque pointers, so a CUDA
    build's library and a program compiled for a CPU one (or the reverse) agree on the objects they share."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "layout.cpp"
    classes = ["Context", "Model", "Trainer", "TrainerOptions", "Optimizer", "Tensor", "Loss", "Model::DeviceBuffers",
               "Optimizer::UpdateRule"]
    src.write_text('#include <cstdio>\n#include "treadle/treadle.hpp"\n#include "treadle/cuda.hpp"\nint main() {\n' +
                   "".join(f'  std::printf("{c} %zu %zu\\n", sizeof(treadle::{c}), alignof(treadle::{c}));\n'
                           for c in classes) + "}\n")
    layouts = []
    for defines in ([], ["-DTREADLE_WITH_CUDA"]):
        exe = tmp_path / f"layout{len(layouts)}"
        proc = subprocess.run(["c++", "-std=c++20", *defines, f"-I{treadle_prefix / 'include'}", str(src), "-o", str(exe)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        layouts.append(subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout)
    assert layouts[0].count("\n") == len(classes), layouts[0]
    assert layouts[0] == layouts[1], f"without CUDA:\n{layouts[0]}with TREADLE_WITH_CUDA:\n{layouts[1]}"


def test_installed_verify_program_checks_the_installed_library(treadle_prefix):
    """<prefix>/bin/treadle-verify finds the installed libtreadle by itself (no LD_LIBRARY_PATH) and passes."""
    exe = treadle_prefix / "bin" / "treadle-verify"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run([str(exe), "--quick"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checks passed" in proc.stdout and "threads:" in proc.stdout


@pytest.fixture(scope="module")
def cpp_host(treadle_prefix, tmp_path_factory):
    """examples/cpp_host configured with only the install prefix (no Eigen, no treadle sources), built."""
    build = tmp_path_factory.mktemp("cpp_host")
    cmake("-S", ROOT / "examples" / "cpp_host", "-B", build, f"-DCMAKE_PREFIX_PATH={treadle_prefix}",
          "-DCMAKE_BUILD_TYPE=Release", *cmake_generator_args())
    cmake("--build", build, "-j", "2")
    return build / "cpp_host"


def test_cpp_host_trains_inside_its_time_loop(cpp_host):
    proc = subprocess.run([str(cpp_host), CPP_HOST_STEPS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = re.search(r"^first loss " + FLOAT, proc.stdout, re.MULTILINE)
    final = re.search(r"^final loss " + FLOAT, proc.stdout, re.MULTILINE)
    assert first and final, proc.stdout
    assert float(final.group(1)) * CPP_HOST_MIN_REDUCTION < float(first.group(1)), proc.stdout


def test_cpp_host_reports_bad_arguments(cpp_host):
    proc = subprocess.run([str(cpp_host), "7"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: cpp_host" in proc.stderr


# -- the Python task scheduler ---------------------------------------------------------------------
# Measured: 150 steps give a validation loss of 0.19 (from 1.23 on the first batch); asking for < 0.4.
SCHEDULER_MAX_VAL_LOSS = 0.4


def test_python_scheduler_example_equals_trainer_step():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "python_scheduler.py"), "--steps", "150"],
                          capture_output=True, text=True, env=python_env(), timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "tasks per step: forward 0, forward 1," in proc.stdout and "backward 0" in proc.stdout
    assert "scheduled steps equal Trainer.step bitwise: True" in proc.stdout
    match = re.search(r"validation loss " + FLOAT, proc.stdout)
    assert match and float(match.group(1)) < SCHEDULER_MAX_VAL_LOSS, proc.stdout


def test_python_scheduler_example_under_mpi():
    pytest.importorskip("mpi4py")
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install mpich)")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "mpi4py",
                           str(ROOT / "examples" / "python_scheduler.py"), "--steps", "150"],
                          capture_output=True, text=True, env=python_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.count("parameters equal on all ranks: True") == 2, proc.stdout
    losses = [float(v) for v in re.findall(r"validation loss " + FLOAT, proc.stdout)]
    assert len(losses) == 2 and losses[0] == losses[1] and losses[0] < SCHEDULER_MAX_VAL_LOSS, proc.stdout

"""The command line and the demo (`python -m treadle demo`), run as a user runs them: in a subprocess."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import treadle

# Thresholds measured on the Eigen backend (x86-64, -march=native) and given about 2x margin:
# --steps 1000 --hidden 32: rollout error 0.081 (seed 0), 0.052-0.082 over seeds 0-4.
# defaults (--steps 3000 --hidden 64): 0.031 (seed 0), 0.041-0.044 for seeds 1 and 2.
# The gradient check prints ~1e-10; anything near 1e-6 means a wrong gradient, not noise.
SMALL_ARGS = ["--steps", "1000", "--hidden", "32", "--seed", "0"]
SMALL_MAX_ERROR = 0.15
DEFAULT_MAX_ERROR = 0.07
GRADIENT_MAX_ERROR = 1e-6

FLOAT = r"([0-9.]+(?:e[+-]?[0-9]+)?)"


def run_treadle(*args, timeout=180):
    """`python -m treadle ARGS` on the same treadle package that this test imported."""
    env = dict(os.environ)
    package_root = str(Path(treadle.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "treadle", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def parse_results(stdout):
    rollout = re.search(r"^held-out error: .* = " + FLOAT, stdout, re.MULTILINE)
    gradient = re.search(r"^gradient check: .* = " + FLOAT, stdout, re.MULTILINE)
    assert rollout and gradient, f"result lines missing from the demo's output:\n{stdout}"
    return float(rollout.group(1)), float(gradient.group(1))


def test_demo_small_settings_learns_and_verifies_gradients():
    proc = run_treadle("demo", *SMALL_ARGS)
    assert proc.returncode == 0, proc.stderr
    rollout, gradient = parse_results(proc.stdout)
    assert rollout < SMALL_MAX_ERROR, proc.stdout
    assert gradient < GRADIENT_MAX_ERROR, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert 5 <= len(lines) <= 12, f"progress should be a few lines, got {len(lines)}:\n{proc.stdout}"
    assert "step" in proc.stdout and "train loss" in proc.stdout


def test_demo_default_settings():
    proc = run_treadle("demo", "--quiet")
    assert proc.returncode == 0, proc.stderr
    rollout, gradient = parse_results(proc.stdout)
    assert rollout < DEFAULT_MAX_ERROR, proc.stdout
    assert gradient < GRADIENT_MAX_ERROR, proc.stdout


def test_demo_quiet_prints_only_results():
    proc = run_treadle("demo", "--steps", "100", "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["held-out error", "gradient check"], proc.stdout


def test_demo_is_deterministic_for_a_seed():
    args = ("demo", "--steps", "200", "--batch-size", "32", "--hidden", "16", "--quiet")
    first, again, other = run_treadle(*args, "--seed", "3"), run_treadle(*args, "--seed", "3"), run_treadle(*args)
    assert first.returncode == again.returncode == other.returncode == 0, first.stderr + other.stderr
    assert first.stdout == again.stdout
    assert parse_results(first.stdout)[0] != parse_results(other.stdout)[0]


def test_help_explains_the_demo_and_its_options():
    top = run_treadle("--help")
    assert top.returncode == 0, top.stderr
    assert "demo" in top.stdout and "--cmake-dir" in top.stdout
    sub = run_treadle("demo", "--help")
    assert sub.returncode == 0, sub.stderr
    for option in ("--steps", "--batch-size", "--hidden", "--seed", "--quiet"):
        assert option in sub.stdout
    assert "heat" in sub.stdout


def test_no_command_prints_help_and_fails():
    proc = run_treadle()
    assert proc.returncode == 2
    assert "demo" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--hidden", "-3"], "--hidden must be positive, got -3"),
    (["--batch-size", "8"], "--batch-size must be at least 16"),
    (["--lr", "0"], "--lr must be positive"),
])
def test_demo_rejects_bad_options(args, message):
    proc = run_treadle("demo", *args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_cmake_dir_prints_the_package_location():
    proc = run_treadle("--cmake-dir")
    path = Path(proc.stdout.strip())
    assert path.parts[-3:] == ("lib", "cmake", "treadle")
    assert path.parents[2].resolve() == Path(treadle.__file__).resolve().parent
    if (path / "treadleConfig.cmake").is_file():
        assert proc.returncode == 0, proc.stderr
    else:  # a development build: says so, clearly, on stderr
        assert proc.returncode == 1
        assert "no treadleConfig.cmake" in proc.stderr


def test_version():
    proc = run_treadle("--version")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == f"treadle {treadle.__version__}"  # then the build facts (tests/test_build_info.py)
    assert lines[1].split() == ["backends"] + [b + "," for b in treadle.backends()[:-1]] + treadle.backends()[-1:]


def test_demo_plot_draws_the_curve_and_the_rollout(tmp_path):
    path = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "treadle", "demo", "--steps", "200", "--quiet", "--plot", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {path}" in proc.stdout
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # two panels of lines, not an empty canvas


def test_demo_plot_without_matplotlib_says_what_it_needs(monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from treadle import demo

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    args = SimpleNamespace(steps=10, batch_size=64, hidden=8, lr=1e-3, plot="out.png")
    with pytest.raises(ValueError, match=r"--plot needs matplotlib, which is not installed"):
        demo.check_arguments(args)

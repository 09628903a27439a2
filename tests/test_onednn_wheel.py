"""The oneDNN wheel: `TREADLE_WITH_ONEDNN=ON` built as a wheel (what `pip install` builds), installed
into a fresh virtual environment, and run from there without LD_LIBRARY_PATH: libdnnl.so.3 must
resolve through the installed library's RPATH, the backend must be listed and must run a training
step (linear layers, and an LSTM's forward/backward pair) with results matching the Eigen reference
of the same package.

Needs the oneDNN wheels (the test extras install them); skipped otherwise, and with
TREADLE_ONEDNN_CHECK=0. Builds in build/onednn-wheel, with ccache when present.
"""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _onednn_wheels_present():
    prefix = Path(sys.prefix)
    return (prefix / "lib" / "libdnnl.so.3").exists() and (prefix / "lib" / "cmake" / "dnnl").is_dir()


pytestmark = [
    pytest.mark.skipif(os.environ.get("TREADLE_ONEDNN_CHECK") == "0", reason="TREADLE_ONEDNN_CHECK=0"),
    pytest.mark.skipif(not _onednn_wheels_present(),
                       reason="the oneDNN wheels are not installed (pip install '.[onednn]')"),
]

SMOKE = """
    import os, subprocess, sys
    import numpy as np
    import treadle as tl
    site = sys.argv[1]
    assert tl.__file__.startswith(site), (tl.__file__, site)
    assert "onednn" in tl.backends(), tl.backends()
    core = [str(p) for p in __import__("pathlib").Path(tl.__file__).parent.rglob("libtreadle.so*")][0]
    ldd = subprocess.run(["ldd", core], capture_output=True, text=True).stdout
    line = [l for l in ldd.splitlines() if "libdnnl.so.3" in l][0]
    assert "not found" not in line, ldd
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
        losses[backend] = [trainer.step(x, y) for _ in range(3)]
        plans[backend] = net._compiled().describe_plans()
    plans = plans["onednn"]
    assert "lstm_layer_backward [onednn]" in plans and "linear [onednn]" in plans, plans
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-5)
    print("wheel ok:", line.strip(), losses["onednn"])
"""


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_onednn_wheel_installs_and_runs_without_ld_library_path(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "TREADLE_BUILD_DIR", "PIP_REQUIRE_VIRTUALENV")}
    args = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-w",
            str(tmp_path / "dist"), "-C", "build-dir=build/onednn-wheel",
            "-C", "cmake.define.TREADLE_WITH_ONEDNN=ON"]
    if shutil.which("ccache"):
        args += ["-C", "cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        env["CCACHE_BASEDIR"] = str(REPO)
    _run(args, env=env, cwd=REPO)
    wheel = next((tmp_path / "dist").glob("treadle-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], env=env)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)], env=env)
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).strip()
    out = _run([str(py), "-c", textwrap.dedent(SMOKE), site], env=env, cwd=tmp_path)
    assert "wheel ok" in out

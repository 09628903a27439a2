"""The oneDNN variant in CI: tools/onednn_check.sh builds treadle with TREADLE_WITH_ONEDNN=ON in its
own build directory and runs the suite on it (every op on "onednn" against the float64 reference,
the oneDNN cross-checks, threads, training). The default wheel is Eigen-only, so without this step
CI would never compile or test the oneDNN backend.

Skipped, with the reason shown, when the oneDNN wheels or cmake are missing, when this process
already runs a oneDNN build (tests/test_onednn.py then covers it directly), or with
TREADLE_ONEDNN_CHECK=0 (a quick local run).
"""
import os
import shutil
import subprocess
import sys

import pytest

import treadle as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DNNL_CONFIG = os.path.join(sys.prefix, "lib", "cmake", "dnnl")


def skip_reason():
    if os.environ.get("TREADLE_ONEDNN_CHECK") == "0":
        return "TREADLE_ONEDNN_CHECK=0"
    if "onednn" in tl.backends():
        return "this treadle already has the oneDNN backend: tests/test_onednn.py covers it"
    if shutil.which("cmake") is None:
        return "cmake is not installed"
    if not os.path.isdir(DNNL_CONFIG):
        return f"no oneDNN CMake package in {DNNL_CONFIG} (pip install '.[onednn]')"
    return None


@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_onednn_build_passes_the_suite():
    env = dict(os.environ)
    env.pop("TREADLE_BUILD_DIR", None)
    proc = subprocess.run([os.path.join(REPO, "tools", "onednn_check.sh")], capture_output=True, text=True,
                          timeout=3600, env=env, cwd=REPO)
    report = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, report
    assert "backends: ['onednn', 'eigen']" in proc.stdout, report
    assert "== oneDNN build: all passed" in proc.stdout, report

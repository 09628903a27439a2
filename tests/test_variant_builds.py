"""The other oneDNN variant in CI: tools/variant_check.sh builds it in its own build directory and
runs tests on it. The installed treadle is normally the oneDNN build (what `pip install .` builds), so
this builds the Eigen-only variant (TREADLE_WITH_ONEDNN=OFF) and runs the core suites on it; where
the installed treadle is Eigen-only it builds the oneDNN variant and runs the whole suite there, so
the oneDNN backend is never left untested.

Skipped, with the reason shown, when cmake is missing, when the oneDNN wheels are missing for a oneDNN
variant, or with TREADLE_ONEDNN_CHECK=0 (a quick local run).
"""
import os
import shutil
import subprocess
import sys

import pytest

import treadle as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DNNL_CONFIG = os.path.join(sys.prefix, "lib", "cmake", "dnnl")
VARIANT = "eigen" if "onednn" in tl.backends() else "onednn"


def skip_reason():
    if os.environ.get("TREADLE_ONEDNN_CHECK") == "0":
        return "TREADLE_ONEDNN_CHECK=0"
    if shutil.which("cmake") is None:
        return "cmake is not installed"
    if VARIANT == "onednn" and not os.path.isdir(DNNL_CONFIG):
        return f"no oneDNN CMake package in {DNNL_CONFIG} (pip install '.[onednn]')"
    return None


@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_the_other_onednn_variant_builds_and_passes():
    env = dict(os.environ)
    env.pop("TREADLE_BUILD_DIR", None)
    proc = subprocess.run([os.path.join(REPO, "tools", "variant_check.sh"), VARIANT], capture_output=True, text=True,
                          timeout=3600, env=env, cwd=REPO)
    report = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, report
    expected = "['onednn', 'eigen']" if VARIANT == "onednn" else "['eigen']"
    assert f"backends: {expected}" in proc.stdout, report
    assert f"== {VARIANT} build: all passed" in proc.stdout, report

"""Runs tools/sanitize.sh (ASan + UBSan build, C++ tests, a Python subset with the runtime
preloaded). Too slow for default CI: only when TREADLE_SANITIZE=1."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(os.environ.get("TREADLE_SANITIZE") != "1",
                                reason="set TREADLE_SANITIZE=1 to build and run under ASan/UBSan (slow)")


def test_sanitizers_clean():
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    proc = subprocess.run([os.path.join(REPO, "tools", "sanitize.sh")], capture_output=True, text=True,
                          timeout=3600)
    report = proc.stdout[-8000:] + proc.stderr[-8000:]
    assert proc.returncode == 0, report
    assert "== sanitizers: clean" in proc.stdout
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report

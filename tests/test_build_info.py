"""treadle.info() and `python -m treadle --version`: what the build has and what it runs on."""
import os
import subprocess
import sys

import treadle as tl


def test_info_names_the_build():
    info = tl.info()
    assert list(info)[:5] == ["version", "backends", "compiled_for", "cpu_features", "eigen"]
    assert info["version"] == tl.__version__
    assert info["backends"].split(", ") == tl.backends()
    assert info["compiled_for"].split()[0] in ("native", "portable")
    assert info["eigen"].startswith("3.")
    if "onednn" in tl.backends():
        assert info["onednn.version"].startswith("3.") and info["onednn.isa"] != "default"
    else:
        assert not any(k.startswith("onednn.") for k in info)


def test_info_starts_no_thread():
    before = len(os.listdir("/proc/self/task"))
    tl.info()
    assert len(os.listdir("/proc/self/task")) == before


def test_version_flag_prints_every_fact():
    out = subprocess.run([sys.executable, "-m", "treadle", "--version"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == f"treadle {tl.__version__}"
    facts = dict(line.split(None, 1) for line in lines[1:])
    assert {k: v.strip() for k, v in facts.items()} == {k: v for k, v in tl.info().items() if k != "version"}

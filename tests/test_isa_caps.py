"""The suite passes on every CPU it can run on: the oneDNN and bf16 suites run again with oneDNN's
instruction set capped (ONEDNN_MAX_CPU_ISA), as on an older or smaller CPU. oneDNN's choice of kernel
depends on the instruction set, and so does whether treadle's dispatcher gives a node to oneDNN or
to Eigen (oneDNN must have a fast kernel for it); every result must match the float64 reference
either way, and no test may expect a placement that only one CPU decides.

A cap at or above this CPU's own instruction set is skipped (the main run covers it). Each cap runs
in a child pytest, whose treadle must report the capped instruction set (treadle.info()).
"""
import os
import subprocess
import sys

import pytest

import treadle as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# oneDNN's instruction sets in increasing order, as ONEDNN_MAX_CPU_ISA spells them.
ORDER = ["avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni", "avx512_core_bf16",
         "avx512_core_fp16", "avx512_core_amx", "avx512_core_amx_fp16"]
CAPS = ["avx2", "avx512_core", "avx512_core_bf16", "avx512_core_amx"]
SUITES = ["tests/test_bf16.py", "tests/test_bf16_conv.py", "tests/test_onednn.py", "tests/test_onednn_conv.py",
          "tests/test_onednn_norm_pool.py", "tests/test_onednn_rnn.py", "tests/test_onednn_rnn_train.py",
          "tests/test_dispatch_auto.py"]
HERE = tl.info().get("onednn.isa")


def skip_reason(cap):
    if HERE is None:
        return "this treadle has no oneDNN backend"
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        return "this run is itself capped (ONEDNN_MAX_CPU_ISA is set)"
    if os.environ.get("TREADLE_ISA_CAPS") == "0":
        return "TREADLE_ISA_CAPS=0"
    if HERE not in ORDER or ORDER.index(cap) >= ORDER.index(HERE):
        return f"this CPU's instruction set is {HERE}: the uncapped run covers {cap}"
    return None


@pytest.mark.parametrize("cap", CAPS)
def test_onednn_suites_pass_with_the_instruction_set_capped(cap):
    reason = skip_reason(cap)
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=cap.upper())
    probe = subprocess.run([sys.executable, "-c", "import treadle; print(treadle.info()['onednn.isa'])"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert probe.stdout.strip() == cap, (probe.stdout, probe.stderr[-2000:])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, f"ONEDNN_MAX_CPU_ISA={cap.upper()}:\n{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"

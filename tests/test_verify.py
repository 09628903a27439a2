"""`python -m treadle verify`: the installation check passes here, covers every forward op, checks
each backend's own kernels (not an Eigen fallback), and fails, naming op, backend and dtype, when a
kernel is wrong (injected below through the check's test-only tamper hook)."""
import json
import re
import subprocess
import sys

import pytest

import treadle as tl
from treadle import verify

CASES = verify.cases()


def test_verify_passes_and_reports_its_matrix(tmp_path):
    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, "-m", "treadle", "verify", "--json", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checks passed" in proc.stdout and "finite differences" in proc.stdout
    report = json.loads(out.read_text())
    assert report["failures"] == []
    assert report["threads"]["before"] == report["threads"]["after"]
    assert len(report["rows"]) == len(CASES)
    expected = {"finite differences", "eigen float32"} | {f"{b} float32" for b in verify.usable_backends()}
    assert expected <= set(report["columns"])
    assert report["build"]["version"] == tl.__version__


def test_every_forward_op_has_a_case():
    forward = {op for op in tl.backend_ops("eigen") if not op.endswith("_backward")}
    covered = {op for _name, op in CASES}
    assert forward - covered == set(verify.uncovered_ops()), forward - covered
    assert covered <= set(tl.backend_ops("eigen")), covered - set(tl.backend_ops("eigen"))
    assert len({name for name, _op in CASES}) == len(CASES)


@pytest.mark.skipif("onednn" not in tl.backends(), reason="treadle was built without oneDNN")
def test_the_onednn_column_checks_onednn_kernels_not_a_fallback():
    """The cases are tiny, below oneDNN's profitability thresholds: verify asks for its kernels anyway."""
    report = verify.run(backends=["onednn"])
    listed = tl.backend_ops("onednn")
    checked = declined = 0
    for row in report["rows"]:
        cell = row["cells"].get("onednn float32")
        if "float32" not in listed.get(row["op"], ()):
            assert cell is None, row
        elif isinstance(cell, dict):
            declined += 1
            assert "on this CPU" in cell["declined"] or "took none of these nodes" in cell["declined"], row
        else:
            checked += 1
            assert cell <= 1.0, row
    assert checked >= 30, (checked, declined)


def _faulty(op, backend, dtype, factor=1.001, output=False):
    """A tamper hook making one kernel wrong: `op` on `backend` in `dtype` returns its first input
    gradient (or its first output) scaled by `factor`."""
    def tamper(name, run_backend, run_dtype, outputs, input_grads):
        if (name, run_backend, run_dtype) != (op, backend, dtype):
            return
        target = outputs if output else input_grads
        if target and target[0] is not None:
            target[0] *= factor

    return tamper


@pytest.mark.parametrize("op,backend,dtype,column,output", [
    ("linear", "eigen", "float64", "finite differences", False),  # a wrong gradient in the reference
    ("softmax", "eigen", "float32", "eigen float32", False),
    ("conv", "eigen", "float32", "eigen float32", True),
    ("layer_norm", "onednn", "float32", "onednn float32", False),
    ("matmul", "onednn", "float32", "onednn float32", True),
])
def test_a_wrong_kernel_fails_verify_naming_op_backend_and_dtype(op, backend, dtype, column, output):
    if backend not in verify.usable_backends():
        pytest.skip(f"{backend} is not built")
    report = verify.run(ops=[op], backends=[backend], tamper=_faulty(op, backend, dtype, output=output))
    failed = {(f["op"], f["check"], f["backend"], f["dtype"]) for f in report["failures"]}
    assert (op, column, backend, dtype) in failed, report["failures"]
    assert all(f["op"] == op for f in report["failures"])


def test_a_wrong_kernel_makes_the_command_exit_nonzero(capsys):
    parser = __import__("argparse").ArgumentParser()
    verify.add_arguments(parser)
    assert verify.main(parser.parse_args(["--ops", "tanh"]), tamper=_faulty("tanh", "eigen", "float32", factor=1.01)) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "tanh" in out and "[eigen float32]" in out


@pytest.mark.parametrize("args,message", [(["--ops", "nope"], "no case for ['nope']"),
                                          (["--backend", "tpu"], "unknown backend")])
def test_bad_filters_are_named(args, message):
    proc = subprocess.run([sys.executable, "-m", "treadle", "verify", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_quick_runs_fewer_finite_differences_and_still_passes():
    quick = verify.run(quick=True, ops=["linear", "conv", "lstm_layer"])
    assert quick["failures"] == [] and quick["quick"]


_C_API_CHILD = r"""
import ctypes, json, sys
import treadle  # loads libtreadle: the C API is the same library

path = next(line.split()[-1] for line in open("/proc/self/maps") if "/libtreadle.so" in line)
lib = ctypes.CDLL(path)
lib.treadle_last_error.restype = ctypes.c_char_p
failures = ctypes.c_int64(7)
rc = lib.treadle_verify(1, b"linear, tanh", None, ctypes.c_uint64(3), sys.argv[1].encode(), 1, ctypes.byref(failures))
print(json.dumps({"rc": rc, "failures": failures.value}))
rc = lib.treadle_verify(0, b"nope", None, ctypes.c_uint64(0), None, 0, ctypes.byref(failures))
print(json.dumps({"rc": rc, "failures": failures.value, "error": lib.treadle_last_error().decode()}))
rc = lib.treadle_verify(0, None, None, ctypes.c_uint64(0), None, 0, None)
print(json.dumps({"rc": rc, "error": lib.treadle_last_error().decode()}))
"""


def test_c_api_treadle_verify(tmp_path):
    """treadle_verify() from C (through ctypes, in a child): filters, JSON, printing, errors by status."""
    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, "-c", _C_API_CHILD, str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rc"')]
    assert lines[0] == {"rc": 0, "failures": 0}
    assert re.search(r"^all \d+ checks passed", proc.stdout, re.MULTILINE), proc.stdout  # printed
    report = json.loads(out.read_text())
    assert {r["op"] for r in report["rows"]} == {"linear", "tanh"} and report["failures"] == []
    assert lines[1]["rc"] == 1 and lines[1]["failures"] == -1 and "no case for ['nope']" in lines[1]["error"]
    assert lines[2] == {"rc": 4, "error": "treadle_verify: failures is NULL"}
